//! ProvisioningRequests' I/O around [`crate::pods::provreq`]: the scale-up loop lists the
//! requests and PodTemplates every scan interval, decides them with the pending pods (bookings
//! first), and then writes the status updates the decision asked for, each under the
//! `resourceVersion` read. A 409 re-reads that request and decides it again at the next look;
//! nothing is ever written blind. At most [`crate::pods::provreq::MAX_UPDATES_PER_LOOP`]
//! updates per loop.

use crate::kube::provreq::ProvReqStore;
use crate::pods::provreq::{Booking, Request, Templates, Update};
use crate::pods::record::PodRecord;
use parking_lot::RwLock;
use std::sync::Arc;
use tokio::time::Instant;
use tracing::warn;

/// What the bookings hold.
#[derive(Debug, Default)]
pub struct Held {
    /// Per request.
    pub bookings: Vec<Booking>,
    /// Their pods (virtual: scale-down places them on the nodes they fit).
    pub pods: Vec<Arc<PodRecord>>,
    /// CapacityBuffers' virtual pods (see [`super::buffer`]): after the booked ones, they too
    /// sit on the nodes they fit in scale-down's simulation, so buffer room is not removed.
    pub buffers: Vec<Arc<PodRecord>>,
}

impl Held {
    /// Every pod that holds room: the booked ones first, then the buffers'.
    pub fn all(&self) -> Vec<Arc<PodRecord>> {
        self.pods.iter().chain(&self.buffers).cloned().collect()
    }
}

/// The room held (ProvisioningRequests' bookings, CapacityBuffers), as the last decision left
/// it (scale-down reads it).
#[derive(Debug, Default)]
pub struct Bookings(RwLock<Arc<Held>>);

impl Bookings {
    /// The bookings now.
    pub fn get(&self) -> Arc<Held> {
        self.0.read().clone()
    }

    fn set(&self, bookings: Vec<Booking>, pods: Vec<Arc<PodRecord>>) {
        let mut held = self.0.write();
        *held = Arc::new(Held {
            bookings,
            pods,
            buffers: held.buffers.clone(),
        });
    }

    /// Keeps the buffers' virtual pods the last decision injected.
    pub(crate) fn set_buffers(&self, buffers: Vec<Arc<PodRecord>>) {
        let mut held = self.0.write();
        *held = Arc::new(Held {
            bookings: held.bookings.clone(),
            pods: held.pods.clone(),
            buffers,
        });
    }
}

/// What the scale-up loop keeps of the requests between looks.
#[derive(Debug)]
pub struct ProvReqs {
    store: Arc<dyn ProvReqStore>,
    /// The requests as last read (a write's answer replaces its entry).
    pub(crate) requests: Vec<Request>,
    /// The PodTemplates as last read.
    pub(crate) templates: Templates,
    /// When to list them again.
    pub(crate) next_poll: Option<Instant>,
    /// The writes the last decision asked for.
    pub(crate) updates: Vec<Update>,
    /// The bookings of the last decision (shared with the buffers, see [`Bookings`]).
    pub bookings: Arc<Bookings>,
}

impl ProvReqs {
    /// Requests read and written through `store`.
    pub fn new(store: Arc<dyn ProvReqStore>) -> Self {
        Self {
            store,
            requests: Vec::new(),
            templates: Templates::new(),
            next_poll: None,
            updates: Vec::new(),
            bookings: Arc::default(),
        }
    }

    /// Lists requests and templates; on an error keeps what it had (logged).
    pub async fn refresh(&mut self) {
        match self.store.list().await {
            Ok((requests, templates)) => {
                self.requests = requests;
                self.templates = templates;
            }
            Err(e) => {
                warn!(error = %e, reason = e.metric_label(), "could not list ProvisioningRequests: deciding from the last list");
            }
        }
    }

    /// Whether a request of ours asks for a decision (not finished: waiting, or booked).
    pub fn due(&self) -> bool {
        self.requests
            .iter()
            .any(|r| r.class().is_some() && !r.finished())
    }

    /// Keeps the bookings the decision left.
    pub(crate) fn set_bookings(&self, bookings: Vec<Booking>, pods: Vec<Arc<PodRecord>>) {
        self.bookings.set(bookings, pods);
    }

    /// Writes the updates the last decision asked for. Returns whether one met a conflict (the
    /// request is read afresh: decide again soon).
    pub async fn write(&mut self) -> bool {
        let updates = std::mem::take(&mut self.updates);
        super::status_writes::write(self.store.as_ref(), &mut self.requests, updates).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::provreq::{ProvReqError, Result};
    use parking_lot::Mutex;
    use serde_json::{json, Value};

    /// One request in memory, versioned as an API server versions it.
    #[derive(Debug)]
    struct OneRequest {
        stored: Mutex<Value>,
        writes: Mutex<Vec<Value>>,
        gets: Mutex<usize>,
    }

    fn rv(v: &Value) -> String {
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    impl OneRequest {
        fn new() -> Arc<Self> {
            Arc::new(Self {
                stored: Mutex::new(json!({
                    "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
                    "metadata": {"name": "train", "namespace": "default", "resourceVersion": "1"},
                    "spec": {"provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
                        "podSets": [{"podTemplateRef": {"name": "t"}, "count": 1}]},
                })),
                writes: Mutex::new(Vec::new()),
                gets: Mutex::new(0),
            })
        }

        /// Another writer changes the status (a new version).
        fn rival(&self) {
            let mut s = self.stored.lock();
            let next = rv(&s).parse::<u64>().unwrap() + 1;
            s["metadata"]["resourceVersion"] = json!(next.to_string());
            s["status"] = json!({"provisioningClassDetails": {"rival": "was here"}});
        }
    }

    #[async_trait::async_trait]
    impl ProvReqStore for OneRequest {
        async fn list(&self) -> Result<(Vec<Request>, Templates)> {
            Ok((
                vec![Request::of(self.stored.lock().clone()).unwrap()],
                Templates::new(),
            ))
        }
    }

    #[async_trait::async_trait]
    impl crate::kube::status_object::StatusStore<Request> for OneRequest {
        async fn get(&self, _: &str, _: &str) -> Result<Option<Request>> {
            *self.gets.lock() += 1;
            Ok(Some(Request::of(self.stored.lock().clone()).unwrap()))
        }
        async fn replace_status(&self, object: &Value) -> Result<Request> {
            self.writes.lock().push(object.clone());
            let mut s = self.stored.lock();
            if rv(object) != rv(&s) {
                return Err(ProvReqError::Conflict("default/train".into()));
            }
            let next = rv(&s).parse::<u64>().unwrap() + 1;
            s["status"] = object["status"].clone();
            s["metadata"]["resourceVersion"] = json!(next.to_string());
            Ok(Request::of(s.clone()).unwrap())
        }
    }

    fn update_of(req: &Request) -> Update {
        let mut object = req.object.clone();
        object["status"] = json!({"conditions": [{"type": "Accepted", "status": "True",
            "reason": "Accepted", "message": "", "lastTransitionTime": "2026-11-28T00:00:00Z"}]});
        Update {
            key: req.key(),
            object,
            set: vec![("Accepted", true, "Accepted")],
        }
    }

    #[tokio::test]
    async fn a_status_write_from_a_stale_read_is_refused_then_the_request_is_read_afresh_not_rewritten(
    ) {
        let store = OneRequest::new();
        let mut p = ProvReqs::new(store.clone());
        p.refresh().await;
        p.updates = vec![update_of(&p.requests[0])];
        store.rival();
        assert!(
            p.write().await,
            "the conflict is reported, to decide again soon"
        );
        assert_eq!(
            store.writes.lock().len(),
            1,
            "one write, never retried blind"
        );
        assert_eq!(*store.gets.lock(), 1, "the request is read afresh");
        assert_eq!(
            rv(&p.requests[0].object),
            "2",
            "the fresh version replaces the stale one"
        );
        assert_eq!(
            p.requests[0].object["status"]["provisioningClassDetails"]["rival"],
            "was here"
        );
        // Decided again from the fresh read, the write goes through and keeps the rival's field.
        let mut u = update_of(&p.requests[0]);
        u.object["status"]["provisioningClassDetails"] = json!({"rival": "was here"});
        p.updates = vec![u];
        assert!(!p.write().await);
        let stored = store.stored.lock().clone();
        assert_eq!(rv(&stored), "3");
        assert_eq!(stored["status"]["conditions"][0]["type"], "Accepted");
        assert_eq!(
            stored["status"]["provisioningClassDetails"]["rival"],
            "was here"
        );
        assert_eq!(
            rv(&p.requests[0].object),
            "3",
            "the answer is kept as the last read"
        );
    }
}
