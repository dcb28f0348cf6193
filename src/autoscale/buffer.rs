//! CapacityBuffers' I/O around [`crate::pods::buffer`]: the scale-up loop lists the buffers (and
//! what each refers to) every scan interval, decides them in its decision (their virtual pods
//! after the real pending pods: a buffer is headroom, the lowest priority, as
//! cluster-autoscaler injects its fake pods after the pods that really wait), and then writes
//! the status updates the decision asked for, each under the `resourceVersion` read. A 409
//! re-reads that buffer and decides it again at the next look; nothing is ever written blind.

use crate::kube::buffer::BufferStore;
use crate::pods::buffer::{Buffer, Referents};
use crate::pods::provreq::Update;
use std::sync::Arc;
use tokio::time::Instant;
use tracing::warn;

/// What the scale-up loop keeps of the buffers between looks.
#[derive(Debug)]
pub struct Buffers {
    store: Arc<dyn BufferStore>,
    /// `capacityBufferPodInjectionEnabled`: the buffers' virtual pods join the decisions.
    pub(crate) inject: bool,
    /// The buffers as last read (a write's answer replaces its entry).
    pub(crate) buffers: Vec<Buffer>,
    /// What they refer to, as last read.
    pub(crate) referents: Referents,
    /// When to list them again.
    pub(crate) next_poll: Option<Instant>,
    /// The writes the last decision asked for.
    pub(crate) updates: Vec<Update>,
}

impl Buffers {
    /// Buffers read and written through `store`; `inject`: their pods join the decisions.
    pub fn new(store: Arc<dyn BufferStore>, inject: bool) -> Self {
        Self {
            store,
            inject,
            buffers: Vec::new(),
            referents: Referents::new(),
            next_poll: None,
            updates: Vec::new(),
        }
    }

    /// Lists buffers and what they refer to; on an error keeps what it had (logged).
    pub async fn refresh(&mut self) {
        match self.store.list().await {
            Ok((buffers, referents)) => {
                self.buffers = buffers;
                self.referents = referents;
            }
            Err(e) => {
                warn!(error = %e, reason = e.metric_label(), "could not list CapacityBuffers: deciding from the last list");
            }
        }
    }

    /// Whether a buffer of ours asks for a decision (its status to write, its pods to provide
    /// for).
    pub fn due(&self) -> bool {
        self.buffers.iter().any(Buffer::ours)
    }

    /// Writes the updates the last decision asked for. Returns whether one met a conflict (the
    /// buffer is read afresh: decide again soon).
    pub async fn write(&mut self) -> bool {
        let updates = std::mem::take(&mut self.updates);
        super::status_writes::write(self.store.as_ref(), &mut self.buffers, updates).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::provreq::{ProvReqError, Result};
    use crate::pods::buffer::{decide, RefKey, Referent};
    use k8s_openapi::api::core::v1::PodTemplate;
    use parking_lot::Mutex;
    use serde_json::{json, Value};

    /// One buffer in memory, versioned as an API server versions it, and its PodTemplate.
    #[derive(Debug)]
    struct OneBuffer {
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

    fn referents() -> Referents {
        let t: PodTemplate = serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "default"},
            "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}},
        }))
        .unwrap();
        Referents::from([(
            RefKey::Template("default".into(), "t".into()),
            Referent::Template(Arc::new(t)),
        )])
    }

    impl OneBuffer {
        fn new() -> Arc<Self> {
            Arc::new(Self {
                stored: Mutex::new(json!({
                    "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
                    "metadata": {"name": "headroom", "namespace": "default", "resourceVersion": "1", "generation": 1},
                    "spec": {"podTemplateRef": {"name": "t"}, "replicas": 2},
                })),
                writes: Mutex::new(Vec::new()),
                gets: Mutex::new(0),
            })
        }

        /// Another writer changes the spec (a new version).
        fn rival(&self) {
            let mut s = self.stored.lock();
            let next = rv(&s).parse::<u64>().unwrap() + 1;
            s["metadata"]["resourceVersion"] = json!(next.to_string());
            s["spec"]["replicas"] = json!(5);
        }
    }

    #[async_trait::async_trait]
    impl BufferStore for OneBuffer {
        async fn list(&self) -> Result<(Vec<Buffer>, Referents)> {
            Ok((
                vec![Buffer::of(self.stored.lock().clone()).unwrap()],
                referents(),
            ))
        }
    }

    #[async_trait::async_trait]
    impl crate::kube::status_object::StatusStore<Buffer> for OneBuffer {
        async fn get(&self, _: &str, _: &str) -> Result<Option<Buffer>> {
            *self.gets.lock() += 1;
            Ok(Some(Buffer::of(self.stored.lock().clone()).unwrap()))
        }
        async fn replace_status(&self, object: &Value) -> Result<Buffer> {
            self.writes.lock().push(object.clone());
            let mut s = self.stored.lock();
            if rv(object) != rv(&s) {
                return Err(ProvReqError::Conflict("default/headroom".into()));
            }
            let next = rv(&s).parse::<u64>().unwrap() + 1;
            s["status"] = object["status"].clone();
            s["metadata"]["resourceVersion"] = json!(next.to_string());
            Ok(Buffer::of(s.clone()).unwrap())
        }
    }

    #[tokio::test]
    async fn a_buffer_status_write_from_a_stale_read_is_refused_then_decided_again_from_a_fresh_read(
    ) {
        let now = "2026-11-28T00:00:00Z".parse().unwrap();
        let store = OneBuffer::new();
        let mut b = Buffers::new(store.clone(), true);
        b.refresh().await;
        b.updates = decide(&b.buffers, &b.referents, true, now).updates;
        assert_eq!(b.updates.len(), 1);
        store.rival();
        assert!(
            b.write().await,
            "the conflict is reported, to decide again soon"
        );
        assert_eq!(
            store.writes.lock().len(),
            1,
            "one write, never retried blind"
        );
        assert_eq!(*store.gets.lock(), 1, "the buffer is read afresh");
        assert_eq!(
            b.buffers[0].spec.replicas,
            Some(5),
            "the fresh spec replaces the stale one"
        );
        // Decided again from the fresh read: the status says the new count.
        b.updates = decide(&b.buffers, &b.referents, true, now).updates;
        assert!(!b.write().await);
        let stored = store.stored.lock().clone();
        assert_eq!(rv(&stored), "3");
        assert_eq!(stored["status"]["replicas"], 5);
        assert_eq!(
            stored["status"]["conditions"][0]["type"],
            "ReadyForProvisioning"
        );
        assert_eq!(
            rv(&b.buffers[0].object),
            "3",
            "the answer is kept as the last read"
        );
    }
}
