//! Run-to-completion work: the kubelet's end of a run and the Job controller.
//!
//! - **A run ends.** A pod whose containers do not restart in place (`restartPolicy` `Never` or
//!   `OnFailure`) and that carries [`RUNS_FOR_ANNOTATION`] (`"45m"`, `"1h30m"`, `"90s"`) turns
//!   `Succeeded` once it has run that long, counted from when the simulation first saw it
//!   running: its containers `terminated` with `Completed`, `Ready` false with `PodCompleted`,
//!   as a kubelet reports it. A finished pod takes no room; the scheduler and the pods a
//!   controller watches with `status.phase!=Succeeded` leave it out. An evicted pod's run is
//!   lost: its replacement starts from the beginning.
//! - **The Job controller** (`batch/v1`, `NonIndexed`): keeps `min(parallelism, completions -
//!   succeeded)` pods active; a pod gone or going without having succeeded (evicted, deleted,
//!   lost with its node, `Failed`) counts as failed, as the Go controller counts it with its
//!   tracking finalizer; after a failure the next pod waits 10 s, doubling per failure since the
//!   last success, to at most 6 min (`DefaultJobPodFailureBackOff`, `MaxJobPodFailureBackOff`);
//!   `Complete` once `completions` pods succeeded; `Failed` (`BackoffLimitExceeded`, its active
//!   pods deleted) once more than `backoffLimit` failed. What the controller writes is the Go
//!   controller's `status`: `active`, `ready`, `succeeded`, `failed`, `startTime`,
//!   `completionTime`, `conditions`.
//!
//! Not modelled: `Indexed` completion mode, `podFailurePolicy`, `activeDeadlineSeconds`,
//! `suspend`, `ttlSecondsAfterFinished` (a finished Job and its pods stay until deleted).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::kube::resources;
use crate::kube::select::Selector;
use crate::kube::store::{name_of, Store};

use super::clocks::PodClocks;
use super::nodes::now_rfc3339;
use super::scheduler::{namespace_of, write_pod_status};
use super::workloads::{controller_uid, create_pod, pod_ready, uid_of, write_status};

/// How long a pod's work runs once it is running (an emulator knob: a real pod's containers
/// decide when they end). A duration such as `45m`, `1h30m` or `90s`.
pub const RUNS_FOR_ANNOTATION: &str = "emulator-runs-for";

/// The Job controller's first delay after a failure (`DefaultJobPodFailureBackOff`).
pub const FAILURE_BACKOFF: Duration = Duration::from_secs(10);
/// Its longest (`MaxJobPodFailureBackOff`).
pub const MAX_FAILURE_BACKOFF: Duration = Duration::from_secs(360);

/// What the kubelets' runs and the Job controller remember between steps, on the simulation's
/// clock (tokio's: paused in tests and the cost demo).
#[derive(Debug, Default)]
pub(crate) struct JobMemory {
    /// Pods with a run time: since each was first seen running.
    runs: PodClocks,
    /// By Job uid.
    jobs: HashMap<String, Tracked>,
}

/// One Job's pods, as its tracking finalizer would account them.
#[derive(Debug, Default)]
struct Tracked {
    /// Pods last seen active.
    active: HashSet<String>,
    succeeded: HashSet<String>,
    failed: HashSet<String>,
    /// Failures since the last success, and when the last was counted.
    failures_in_row: u32,
    last_failure: Option<Instant>,
}

/// `45m`, `1h30m`, `90s`, `2h`: whole numbers with `h`, `m` or `s`.
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = 0u64;
    let mut digits = String::new();
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let n: u64 = digits.parse().ok()?;
        digits.clear();
        total += n * match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
    }
    (digits.is_empty() && total > 0).then(|| Duration::from_secs(total))
}

fn phase(pod: &Value) -> Option<&str> {
    pod.pointer("/status/phase").and_then(Value::as_str)
}

fn terminating(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// The run time of a pod that ends on its own, if it is one.
fn runs_for(pod: &Value) -> Option<Duration> {
    let restarts_in_place = !matches!(
        pod.pointer("/spec/restartPolicy").and_then(Value::as_str),
        Some("Never" | "OnFailure")
    );
    if restarts_in_place {
        return None;
    }
    pod.pointer("/metadata/annotations")
        .and_then(|a| a.get(RUNS_FOR_ANNOTATION))
        .and_then(Value::as_str)
        .and_then(parse_duration)
}

/// The status a kubelet writes when a pod's containers all exited 0.
fn succeeded(pod: &Value) -> Value {
    let now = now_rfc3339();
    let mut status = pod.get("status").cloned().unwrap_or(json!({}));
    status["phase"] = json!("Succeeded");
    if let Some(cs) = status
        .get_mut("containerStatuses")
        .and_then(Value::as_array_mut)
    {
        for c in cs.iter_mut() {
            let started = c
                .pointer("/state/running/startedAt")
                .cloned()
                .unwrap_or(json!(now));
            c["state"] = json!({"terminated": {"exitCode": 0, "reason": "Completed",
                "startedAt": started, "finishedAt": now}});
            c["ready"] = json!(false);
            c["started"] = json!(false);
        }
    }
    if let Some(conds) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conds.iter_mut() {
            if matches!(c["type"].as_str(), Some("Ready" | "ContainersReady")) {
                *c = json!({"type": c["type"], "status": "False", "reason": "PodCompleted",
                    "lastProbeTime": null, "lastTransitionTime": now});
            }
        }
    }
    status
}

/// Ends the runs that are due (the kubelets' part). Returns when the next one is due.
pub(crate) fn finish_runs(
    store: &mut Store,
    memory: &mut JobMemory,
    now: Instant,
) -> Option<Instant> {
    let pods_rt = resources::find("", "v1", "pods")?;
    let pods = store
        .list(pods_rt, None, &Selector::default(), None, None)
        .items;
    for pod in &pods {
        let Some(run) = runs_for(pod) else { continue };
        let running = phase(pod) == Some("Running")
            && !terminating(pod)
            && pod
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
        if running && memory.runs.elapsed(uid_of(pod), run, now) {
            write_pod_status(store, pod, succeeded(pod));
        }
    }
    memory.runs.end_pass()
}

fn int_at(obj: &Value, pointer: &str) -> Option<i64> {
    obj.pointer(pointer).and_then(Value::as_i64)
}

fn has_condition(job: &Value, kind: &str) -> bool {
    job.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == kind && c["status"] == "True")
        })
}

/// The Job controller's pass over every Job. Returns when a Job waiting out its failure backoff
/// may create its next pod.
pub(crate) fn reconcile_jobs(
    store: &mut Store,
    memory: &mut JobMemory,
    now: Instant,
) -> Option<Instant> {
    let jobs_rt = resources::find("batch", "v1", "jobs")?;
    let pods_rt = resources::find("", "v1", "pods")?;
    let all = Selector::default();
    let jobs = store.list(jobs_rt, None, &all, None, None).items;
    let live: HashSet<String> = jobs.iter().map(|j| uid_of(j).to_string()).collect();
    memory.jobs.retain(|uid, _| live.contains(uid));
    if jobs.is_empty() {
        return None;
    }
    let pods = store.list(pods_rt, None, &all, None, None).items;
    let mut next: Option<Instant> = None;
    for job in &jobs {
        if terminating(job) {
            continue;
        }
        let uid = uid_of(job).to_string();
        let ns = namespace_of(job);
        let owned: Vec<&Value> = pods
            .iter()
            .filter(|p| controller_uid(p) == Some(uid.as_str()) && namespace_of(p) == ns)
            .collect();
        let t = memory.jobs.entry(uid.clone()).or_default();
        let mut active: HashSet<String> = HashSet::new();
        for p in &owned {
            let pod_uid = uid_of(p).to_string();
            match phase(p) {
                Some("Succeeded") => {
                    if t.succeeded.insert(pod_uid) {
                        t.failures_in_row = 0;
                    }
                }
                Some("Failed") => {
                    if t.failed.insert(pod_uid) {
                        t.failures_in_row += 1;
                        t.last_failure = Some(now);
                    }
                }
                _ if terminating(p) => {
                    if t.failed.insert(pod_uid) {
                        t.failures_in_row += 1;
                        t.last_failure = Some(now);
                    }
                }
                _ => {
                    active.insert(pod_uid);
                }
            }
        }
        // Active last time and gone now, without a success: deleted or lost with its node.
        let vanished: Vec<String> = t
            .active
            .iter()
            .filter(|u| !active.contains(*u) && !t.succeeded.contains(*u) && !t.failed.contains(*u))
            .cloned()
            .collect();
        for u in vanished {
            t.failed.insert(u);
            t.failures_in_row += 1;
            t.last_failure = Some(now);
        }
        let completions = int_at(job, "/spec/completions").unwrap_or(1).max(0) as usize;
        let parallelism = int_at(job, "/spec/parallelism").unwrap_or(1).max(0) as usize;
        let backoff_limit = int_at(job, "/spec/backoffLimit").unwrap_or(6).max(0) as usize;
        let complete = has_condition(job, "Complete") || t.succeeded.len() >= completions;
        let failed = has_condition(job, "Failed") || t.failed.len() > backoff_limit;
        if failed && !active.is_empty() {
            for p in owned.iter().filter(|p| active.contains(uid_of(p))) {
                let _ = store.delete(pods_rt, &ns, name_of(p).unwrap_or(""), None);
            }
            active.clear();
        }
        if !complete && !failed {
            let want = parallelism.min(completions - t.succeeded.len());
            let missing = want.saturating_sub(active.len());
            let wait_until = (t.failures_in_row > 0)
                .then(|| {
                    let doublings = (t.failures_in_row - 1).min(16);
                    let delay = FAILURE_BACKOFF
                        .saturating_mul(1 << doublings)
                        .min(MAX_FAILURE_BACKOFF);
                    t.last_failure.map(|at| at + delay)
                })
                .flatten();
            match wait_until {
                Some(until) if missing > 0 && now < until => {
                    next = Some(next.map_or(until, |n| n.min(until)));
                }
                _ => {
                    for _ in 0..missing {
                        if let Some(p) = create_pod(store, pods_rt, &ns, job, "Job", "batch/v1") {
                            active.insert(uid_of(&p).to_string());
                        }
                    }
                }
            }
        }
        t.active = active.clone();
        let ready = owned
            .iter()
            .filter(|p| active.contains(uid_of(p)) && pod_ready(p))
            .count();
        let mut status = json!({
            "active": active.len(),
            "ready": ready,
            "succeeded": t.succeeded.len(),
            "failed": t.failed.len(),
            "startTime": job.pointer("/status/startTime").cloned().unwrap_or_else(|| json!(now_rfc3339())),
        });
        let old_conditions = job.pointer("/status/conditions").cloned();
        if complete {
            let at = job
                .pointer("/status/completionTime")
                .cloned()
                .unwrap_or_else(|| json!(now_rfc3339()));
            status["completionTime"] = at.clone();
            status["conditions"] = old_conditions.unwrap_or_else(|| {
                json!([{"type": "Complete", "status": "True", "lastProbeTime": at,
                    "lastTransitionTime": at}])
            });
        } else if failed {
            let now_text = json!(now_rfc3339());
            status["conditions"] = old_conditions.unwrap_or_else(|| {
                json!([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                    "lastProbeTime": now_text, "lastTransitionTime": now_text}])
            });
        }
        write_status(store, jobs_rt, job, status);
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_time_is_whole_hours_minutes_and_seconds() {
        assert_eq!(parse_duration("45m"), Some(Duration::from_secs(2700)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration(" 90s "), Some(Duration::from_secs(90)));
        for bad in ["", "0s", "45", "m", "1.5h", "4d", "-3m"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_a_pod_that_does_not_restart_in_place_ends_its_run() {
        let pod = |policy: &str| {
            json!({"metadata": {"annotations": {RUNS_FOR_ANNOTATION: "20m"}},
                "spec": {"restartPolicy": policy}})
        };
        assert_eq!(runs_for(&pod("Never")), Some(Duration::from_secs(1200)));
        assert_eq!(runs_for(&pod("OnFailure")), Some(Duration::from_secs(1200)));
        assert_eq!(runs_for(&pod("Always")), None);
    }
}
