//! Why Azure would not allocate: its error codes, classified. A write's synchronous answer and an
//! operation's final error are classified alike, here where ARM's errors are read; what each
//! class means for an offering (how long it stays out) is [`crate::capacity::offerings`]'s.

/// Why Azure would not allocate: the failure classes that mark an offering unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllocationFailure {
    /// The subscription's vCPU quota does not cover the request (`QuotaExceeded`,
    /// `OperationNotAllowed` with a quota message): marks the VM family, which quota counts.
    Quota,
    /// The size is not offered here to this subscription (`SkuNotAvailable`).
    SkuNotAvailable,
    /// Azure has no capacity for the size now (`AllocationFailed`, `ZonalAllocationFailed`,
    /// `OverconstrainedAllocationRequest`, `OverconstrainedZonalAllocationRequest`).
    NoCapacity,
    /// Azure took spot VMs of the offering back (an eviction, seen as its nodes vanishing and
    /// the scale set shrinking without a delete of ours).
    SpotEvicted,
}

impl AllocationFailure {
    /// Every class, for tests and metrics.
    pub const ALL: [AllocationFailure; 4] = [
        AllocationFailure::Quota,
        AllocationFailure::SkuNotAvailable,
        AllocationFailure::NoCapacity,
        AllocationFailure::SpotEvicted,
    ];

    /// The class of an ARM error code and message, if it is an allocation failure. A write's
    /// synchronous answer and an operation's final error are classified alike.
    pub fn classify(code: &str, message: &str) -> Option<Self> {
        let code_lc = code.to_ascii_lowercase();
        match code_lc.as_str() {
            "skunotavailable" => Some(AllocationFailure::SkuNotAvailable),
            "allocationfailed"
            | "zonalallocationfailed"
            | "overconstrainedallocationrequest"
            | "overconstrainedzonalallocationrequest" => Some(AllocationFailure::NoCapacity),
            c if c.contains("quota") => Some(AllocationFailure::Quota),
            "operationnotallowed" if message.to_ascii_lowercase().contains("quota") => {
                Some(AllocationFailure::Quota)
            }
            _ => None,
        }
    }

    /// Whether ARM's error `code` is about one zone (`ZonalAllocationFailed`,
    /// `OverconstrainedZonalAllocationRequest`): for a group spanning several zones, the zone
    /// that ran short is the one its allocation left `Failed` VMs in (the code does not name it).
    pub fn zonal_code(code: &str) -> bool {
        code.eq_ignore_ascii_case("ZonalAllocationFailed")
            || code.eq_ignore_ascii_case("OverconstrainedZonalAllocationRequest")
    }

    /// The `reason` label (metrics, Events, the status).
    pub fn label(self) -> &'static str {
        match self {
            AllocationFailure::Quota => "quota",
            AllocationFailure::SkuNotAvailable => "sku_not_available",
            AllocationFailure::NoCapacity => "allocation_failed",
            AllocationFailure::SpotEvicted => "spot_evicted",
        }
    }

    /// The class a [`AllocationFailure::label`] names (the status ConfigMap's `reason`).
    pub fn from_label(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.label() == label)
    }
}

impl std::fmt::Display for AllocationFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AllocationFailure::Quota => "vCPU quota exceeded",
            AllocationFailure::SkuNotAvailable => "VM size not available here",
            AllocationFailure::NoCapacity => "Azure had no capacity for the VM size",
            AllocationFailure::SpotEvicted => "Azure evicted spot VMs of the size",
        })
    }
}
