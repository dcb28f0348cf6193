//! Fencing: the last check before every Azure write.
//!
//! With leader election on, only the replica that holds the Lease may write, and only while its
//! last renewal is younger than the renew deadline on the monotonic clock: a replica that was
//! frozen (SIGSTOP, a long GC-like pause, a partition from the API server) and wakes up after
//! another replica took over must not send a single write. The reconciler asks the fence
//! immediately before each capacity write or instance deletion, not once per pass, because a pass
//! can outlive a lease.

/// Why a write was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceHold {
    /// Another replica holds the Lease (or nobody does and we have not acquired it).
    NotLeader,
    /// We held the Lease, but the last successful renewal is older than the renew deadline.
    RenewalStale,
}

impl FenceHold {
    /// The `reason` label of `writes_held_total`.
    pub fn metric_label(self) -> &'static str {
        match self {
            FenceHold::NotLeader => "not_leader",
            FenceHold::RenewalStale => "lease_stale",
        }
    }
}

impl std::fmt::Display for FenceHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FenceHold::NotLeader => "this replica is not the leader",
            FenceHold::RenewalStale => "the lease renewal is older than the renew deadline",
        })
    }
}

/// Asked just before every Azure write. Must be cheap and must not block.
pub trait WriteFence: Send + Sync + std::fmt::Debug {
    /// `Ok(())` if this replica may write to Azure now.
    fn check(&self) -> Result<(), FenceHold>;
}

/// No leader election: every write may go (the single-replica behaviour of round 1).
#[derive(Debug, Default, Clone, Copy)]
pub struct Unfenced;

impl WriteFence for Unfenced {
    fn check(&self) -> Result<(), FenceHold> {
        Ok(())
    }
}
