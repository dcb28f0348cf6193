//! Scriptable faults: matched in injection order by method and path, for the next N requests or
//! with a seeded probability.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// One fault to inject into matching ARM requests.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaultSpec {
    /// HTTP method to match (case-insensitive); `None` matches any.
    #[serde(default)]
    pub method: Option<String>,
    /// Substring the request path must contain (case-insensitive); `None` matches any.
    #[serde(default)]
    pub path_contains: Option<String>,
    /// What happens to a matching request.
    pub kind: FaultKind,
    /// Applies to the next N matching requests; `None` means until cleared.
    #[serde(default)]
    pub count: Option<u32>,
    /// Chance (0..=1) that a matching request is hit; `None` means always.
    #[serde(default)]
    pub probability: Option<f64>,
    /// Seed of the random generator behind `probability`.
    #[serde(default)]
    pub seed: Option<u64>,
}

/// The kinds of fault the emulator can inject.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum FaultKind {
    /// Delay the answer by `ms` milliseconds (tokio clock), then handle the request normally.
    /// With `max_ms`, each request hit waits a uniform random time from `ms` to `max_ms`
    /// instead, drawn from the fault's generator (`seed`): a network whose latency jitters.
    Latency {
        /// Added delay in milliseconds (the shortest, with `max_ms`).
        ms: u64,
        /// The longest delay in milliseconds; `None`: always `ms`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_ms: Option<u64>,
    },
    /// Handle the request at once, then hold its answer back `ms` milliseconds (tokio clock):
    /// the answer shows the state as it was when it was handled, as a real answer does after a
    /// slow way back, so a client can receive a list older than its own later write.
    SlowAnswer {
        /// How long the answer travels, in milliseconds (the shortest, with `max_ms`).
        ms: u64,
        /// The longest it travels in milliseconds, drawn as for [`FaultKind::Latency`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_ms: Option<u64>,
    },
    /// Answer with this status and an ARM error body, without handling the request.
    Status {
        /// HTTP status code.
        code: u16,
        /// ARM error code in the body; a default per status when `None`.
        #[serde(default)]
        code_name: Option<String>,
        /// `Retry-After` header in seconds.
        #[serde(default)]
        retry_after_secs: Option<u64>,
    },
    /// Close the connection without an answer, before the write commits.
    DropBeforeCommit,
    /// Commit the write, then close the connection without an answer (the ambiguous case).
    DropAfterCommit,
    /// Answer successfully but without the `ETag` header and body `etag`.
    NoEtag,
    /// Delete the target out of band, then handle the request.
    DeleteBeforeHandling,
    /// The long-running operation started by this write ends `Failed`, with ARM error `code`
    /// (`AllocationFailed`, `ZonalAllocationFailed`, ...; `InternalExecutionError` when `None`).
    LroFailed {
        /// The error code the operation reports.
        #[serde(default)]
        code: Option<String>,
        /// Only the VMs the write creates in this zone are left `Failed`; the others boot (a
        /// partial allocation of a scale set spanning zones, one of which ran short). Without
        /// it, every VM the write creates is left `Failed`. Scale sets only.
        #[serde(default)]
        zone: Option<String>,
    },
    /// Cut the success body in half (malformed JSON).
    Truncate,
    /// A scale set's instance delete (`POST …/delete`) that deletes all but the last `keep` of
    /// the instances it names (by instance id), then ends `Failed` (its operation, or at once when
    /// the delete answers without one): Azure deleting part of a batch. The instances kept are
    /// left `Failed` when `leave_failed`; with `drop_answer` the connection is closed after the
    /// commit, as [`FaultKind::DropAfterCommit`] (the outcome unknown to the client).
    PartialDelete {
        /// How many of the named instances are not deleted.
        keep: u32,
        /// Whether the instances kept are listed `Failed` afterwards.
        #[serde(default)]
        leave_failed: bool,
        /// Whether the answer is lost after the commit.
        #[serde(default)]
        drop_answer: bool,
    },
}

#[derive(Debug)]
pub(crate) struct ActiveFault {
    pub spec: FaultSpec,
    remaining: Option<u32>,
    rng: StdRng,
}

impl ActiveFault {
    pub fn new(spec: FaultSpec) -> Self {
        let rng = match spec.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        ActiveFault {
            remaining: spec.count,
            spec,
            rng,
        }
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        let method_ok = self
            .spec
            .method
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(method));
        let path_ok = self
            .spec
            .path_contains
            .as_deref()
            .is_none_or(|p| path.to_ascii_lowercase().contains(&p.to_ascii_lowercase()));
        method_ok && path_ok && self.remaining != Some(0)
    }
}

/// The faults that apply to one request: accumulated latency (before handling, and after it
/// for the answer's way back) and at most one action.
#[derive(Debug, Default)]
pub(crate) struct FaultPlan {
    pub latency_ms: u64,
    pub answer_delay_ms: u64,
    pub action: Option<FaultKind>,
}

/// Consumes the faults that match this request, in injection order.
pub(crate) fn take(faults: &mut Vec<ActiveFault>, method: &str, path: &str) -> FaultPlan {
    let mut plan = FaultPlan::default();
    for fault in faults.iter_mut() {
        if !fault.matches(method, path) {
            continue;
        }
        let is_latency = matches!(
            fault.spec.kind,
            FaultKind::Latency { .. } | FaultKind::SlowAnswer { .. }
        );
        if !is_latency && plan.action.is_some() {
            continue;
        }
        if let Some(p) = fault.spec.probability {
            if fault.rng.gen::<f64>() >= p {
                continue;
            }
        }
        if let Some(n) = fault.remaining.as_mut() {
            *n = n.saturating_sub(1);
        }
        match &fault.spec.kind {
            FaultKind::Latency { ms, max_ms } => {
                plan.latency_ms += draw(&mut fault.rng, *ms, *max_ms);
            }
            FaultKind::SlowAnswer { ms, max_ms } => {
                plan.answer_delay_ms += draw(&mut fault.rng, *ms, *max_ms);
            }
            other => plan.action = Some(other.clone()),
        }
    }
    faults.retain(|f| f.remaining != Some(0));
    plan
}

/// A delay from `ms` to `max_ms` (uniform, both included), or `ms` without a `max_ms` above it.
fn draw(rng: &mut StdRng, ms: u64, max_ms: Option<u64>) -> u64 {
    match max_ms {
        Some(max) if max > ms => rng.gen_range(ms..=max),
        _ => ms,
    }
}

/// Azure's message for an allocation failure code, if it is one the emulator knows.
pub(crate) fn code_message(code: &str) -> Option<&'static str> {
    Some(match code {
        "SkuNotAvailable" => "The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions' is currently not available in location. Please try another size or deploy to a different location or different zone.",
        "AllocationFailed" => "Allocation failed. We do not have sufficient capacity for the requested VM size in this region. Read more about improving likelihood of allocation success at http://aka.ms/allocation-guidance",
        "ZonalAllocationFailed" => "Allocation failed. We do not have sufficient capacity for the requested VM size in this zone. Read more about improving likelihood of allocation success at http://aka.ms/allocation-guidance",
        "OverconstrainedAllocationRequest" => "Allocation failed. VM(s) with the following constraints cannot be allocated, because the condition is too restrictive. Please remove some constraints and try again.",
        "OverconstrainedZonalAllocationRequest" => "Allocation failed. VM(s) with the following constraints cannot be allocated, because the condition is too restrictive. Please remove some constraints and try again.",
        "QuotaExceeded" => "Operation could not be completed as it results in exceeding approved Total Regional Cores quota.",
        _ => return None,
    })
}

/// The ARM error code and message a status fault answers with.
pub(crate) fn status_error(code: u16, code_name: Option<&str>) -> (String, String) {
    let (default_code, message) = match code {
        400 => ("BadRequest", "The request is invalid."),
        404 => ("NotFound", "The resource was not found."),
        408 => ("RequestTimeout", "The request timed out."),
        409 => (
            "OperationNotAllowed",
            "Operation could not be completed as it results in exceeding approved standardDSv5Family Cores quota.",
        ),
        412 => ("PreconditionFailed", "The precondition failed."),
        429 => ("TooManyRequests", "The request is being throttled."),
        500 => ("InternalServerError", "An internal server error occurred."),
        502 => ("BadGateway", "The gateway received an invalid response."),
        503 => ("ServiceUnavailable", "The service is temporarily unavailable."),
        504 => ("GatewayTimeout", "The gateway timed out."),
        _ => ("Error", "Injected fault."),
    };
    let message = code_name.and_then(code_message).unwrap_or(message);
    (
        code_name.unwrap_or(default_code).to_string(),
        format!("{message} (injected fault)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latency(ms: u64, max_ms: Option<u64>, seed: u64) -> Vec<ActiveFault> {
        vec![ActiveFault::new(FaultSpec {
            method: None,
            path_contains: Some("/resourceGroups/rg-a/".into()),
            kind: FaultKind::Latency { ms, max_ms },
            count: None,
            probability: None,
            seed: Some(seed),
        })]
    }

    #[test]
    fn a_latency_with_a_maximum_draws_each_delay_between_the_two_from_its_seed() {
        let path = "/subscriptions/s/resourceGroups/rg-a/providers/x";
        let draws = |seed| {
            let mut f = latency(10, Some(80), seed);
            (0..200)
                .map(|_| take(&mut f, "GET", path).latency_ms)
                .collect::<Vec<_>>()
        };
        let a = draws(3);
        assert!(a.iter().all(|ms| (10..=80).contains(ms)), "{a:?}");
        assert!(
            a.iter().any(|ms| *ms < 20) && a.iter().any(|ms| *ms > 70),
            "{a:?}"
        );
        assert_eq!(a, draws(3), "the same seed, the same delays");
        assert_ne!(a, draws(4));
        // Another resource group's requests are not hit; without a maximum the delay is fixed.
        let mut f = latency(10, Some(80), 3);
        assert_eq!(
            take(&mut f, "GET", "/subscriptions/s/resourceGroups/rg-b/x").latency_ms,
            0
        );
        let mut f = latency(25, None, 3);
        assert_eq!(take(&mut f, "GET", path).latency_ms, 25);
    }

    #[test]
    fn a_latencys_maximum_is_read_from_json_and_may_be_left_out() {
        let k: FaultKind =
            serde_json::from_str(r#"{"type":"latency","ms":10,"max_ms":80}"#).expect("parses");
        assert!(matches!(
            k,
            FaultKind::Latency {
                ms: 10,
                max_ms: Some(80)
            }
        ));
        let k: FaultKind =
            serde_json::from_str(r#"{"type":"slowAnswer","ms":10}"#).expect("parses");
        assert!(matches!(
            k,
            FaultKind::SlowAnswer {
                ms: 10,
                max_ms: None
            }
        ));
    }
}
