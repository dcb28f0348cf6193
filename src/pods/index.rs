//! The pods by where they are, kept across decisions: per node, the pods bound to it and what
//! they take ([`Placed`]); per node, the pods nominated to it (a preemption under way); and the
//! pods on no node. The pods reflector updates it event by event ([`PodIndex::replace`]) and
//! publishes it with its objects, so a decision starts from each node's pods already summed
//! instead of placing every pod of the cluster again: a node's [`Placed`] is shared with the
//! decision's [`NodeState`](super::fit::NodeState) and copied only where a simulation adds a
//! pod.
//!
//! A relist builds a new index aside from the listed pods, as it builds the objects.

use super::fit::Placed;
use super::record::PodRecord;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Pods by where they are. Cloning copies the maps of pointers, not the pods.
#[derive(Debug, Clone, Default)]
pub struct PodIndex {
    /// Pods with `spec.nodeName`, by node.
    bound: FxHashMap<String, Arc<Placed>>,
    /// Pods without `spec.nodeName` and with `status.nominatedNodeName`, by that node.
    nominated: FxHashMap<String, Arc<Placed>>,
    /// Pods on no node and nominated to none, by `namespace/name`.
    unplaced: BTreeMap<String, Arc<PodRecord>>,
    len: usize,
    /// Pods with volume claims.
    with_claims: usize,
}

/// Where a pod sits in the index.
enum Slot<'a> {
    Bound(&'a str),
    Nominated(&'a str),
    Unplaced,
}

fn slot(pod: &PodRecord) -> Slot<'_> {
    match (pod.node_name.as_deref(), pod.nominated_node.as_deref()) {
        (Some(n), _) => Slot::Bound(n),
        (None, Some(n)) => Slot::Nominated(n),
        (None, None) => Slot::Unplaced,
    }
}

impl PodIndex {
    /// The index of these pods (a relist, a test, a saved snapshot).
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a Arc<PodRecord>>) -> Self {
        let mut index = Self::default();
        for p in pods {
            index.insert(p);
        }
        index
    }

    /// A pod changed: `old` as it was (none for a new pod), `new` as it is (none when deleted).
    pub fn replace(&mut self, old: Option<&Arc<PodRecord>>, new: Option<&Arc<PodRecord>>) {
        if let Some(old) = old {
            self.remove(old);
        }
        if let Some(new) = new {
            self.insert(new);
        }
    }

    fn insert(&mut self, pod: &Arc<PodRecord>) {
        self.len += 1;
        self.with_claims += usize::from(pod.facts().has_claims());
        match slot(pod) {
            Slot::Bound(n) => {
                Arc::make_mut(self.bound.entry(n.to_string()).or_default()).add(pod.clone())
            }
            Slot::Nominated(n) => {
                Arc::make_mut(self.nominated.entry(n.to_string()).or_default()).add(pod.clone())
            }
            Slot::Unplaced => {
                // The same key twice (a hand-made snapshot) is one pod: the last one.
                if let Some(old) = self.unplaced.insert(pod.key(), pod.clone()) {
                    self.len -= 1;
                    self.with_claims -= usize::from(old.facts().has_claims());
                }
            }
        }
    }

    fn remove(&mut self, pod: &PodRecord) {
        let from_node = |map: &mut FxHashMap<String, Arc<Placed>>, node: &str| {
            let Some(placed) = map.get_mut(node) else {
                return false;
            };
            let removed = Arc::make_mut(placed).remove(pod);
            if placed.pods().is_empty() {
                map.remove(node);
            }
            removed
        };
        let removed = match slot(pod) {
            Slot::Bound(n) => from_node(&mut self.bound, n),
            Slot::Nominated(n) => from_node(&mut self.nominated, n),
            Slot::Unplaced => self.unplaced.remove(&pod.key()).is_some(),
        };
        if removed {
            self.len -= 1;
            self.with_claims -= usize::from(pod.facts().has_claims());
        }
    }

    /// The pods bound to `node`, summed.
    pub fn bound(&self, node: &str) -> Option<&Arc<Placed>> {
        self.bound.get(node)
    }

    /// The pods nominated to `node` and not bound yet.
    pub fn nominated(&self, node: &str) -> Option<&Arc<Placed>> {
        self.nominated.get(node)
    }

    /// Whether any pod is nominated to a node.
    pub fn any_nominated(&self) -> bool {
        !self.nominated.is_empty()
    }

    /// The pods on no node and nominated to none, by `namespace/name`.
    pub fn unplaced(&self) -> impl Iterator<Item = &Arc<PodRecord>> {
        self.unplaced.values()
    }

    /// Every pod: bound (node by node), nominated, then unplaced.
    pub fn all(&self) -> impl Iterator<Item = &Arc<PodRecord>> {
        self.bound
            .values()
            .chain(self.nominated.values())
            .flat_map(|p| p.pods())
            .chain(self.unplaced.values())
    }

    /// Whether any pod has volume claims (only then are the storage objects worth reading).
    pub fn any_claims(&self) -> bool {
        self.with_claims > 0
    }

    /// How many pods.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no pod.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::record::Interner;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pod(name: &str, node: Option<&str>, nominated: Option<&str>, cpu: &str) -> Arc<PodRecord> {
        let mut spec =
            json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]});
        if let Some(n) = node {
            spec["nodeName"] = json!(n);
        }
        let mut status = json!({"phase": if node.is_some() { "Running" } else { "Pending" }});
        if let Some(n) = nominated {
            status["nominatedNodeName"] = json!(n);
        }
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": spec,
            "status": status,
        }))
        .unwrap();
        Arc::new(Interner::default().record(p))
    }

    fn cpu(index: &PodIndex, node: &str) -> i128 {
        index
            .bound(node)
            .and_then(|p| p.requested().get("cpu").copied())
            .unwrap_or(0)
    }

    #[test]
    fn a_pod_moving_from_pending_to_a_node_and_away_is_counted_where_it_is_each_time() {
        let pending = pod("a", None, None, "500m");
        let mut index = PodIndex::of([&pending]);
        assert_eq!(index.unplaced().count(), 1);
        let nominated = pod("a", None, Some("n1"), "500m");
        index.replace(Some(&pending), Some(&nominated));
        assert_eq!(index.unplaced().count(), 0);
        assert_eq!(index.nominated("n1").map(|p| p.pods().len()), Some(1));
        assert_eq!(cpu(&index, "n1"), 0, "nominated is not bound");
        let bound = pod("a", Some("n1"), None, "500m");
        index.replace(Some(&nominated), Some(&bound));
        assert!(!index.any_nominated());
        assert_eq!(cpu(&index, "n1"), 500);
        index.replace(Some(&bound), None);
        assert!(
            index.bound("n1").is_none(),
            "an empty node leaves the index"
        );
        assert!(index.is_empty());
    }

    #[test]
    fn removing_one_pod_of_a_node_keeps_the_others_sums_exact() {
        let (a, b, c) = (
            pod("a", Some("n1"), None, "100m"),
            pod("b", Some("n1"), None, "250m"),
            pod("c", Some("n2"), None, "1"),
        );
        let mut index = PodIndex::of([&a, &b, &c]);
        assert_eq!((cpu(&index, "n1"), cpu(&index, "n2")), (350, 1000));
        let snapshot = index.clone();
        index.replace(Some(&a), None);
        assert_eq!(cpu(&index, "n1"), 250);
        assert_eq!(index.len(), 2);
        // A published copy is not changed by later events.
        assert_eq!(cpu(&snapshot, "n1"), 350);
        // Deleting a pod the index never saw changes nothing.
        index.replace(Some(&pod("z", Some("n1"), None, "1")), None);
        assert_eq!((cpu(&index, "n1"), index.len()), (250, 2));
    }

    #[test]
    fn an_index_kept_event_by_event_equals_one_built_from_the_final_pods() {
        let mut pods: BTreeMap<String, Arc<PodRecord>> = BTreeMap::new();
        let mut index = PodIndex::default();
        // A seeded walk of creates, binds, moves and deletes over three nodes.
        let mut x: u64 = 7;
        for step in 0..400 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let name = format!("p{}", (x >> 33) % 25);
            let node = match (x >> 20) % 5 {
                0 => None,
                k => Some(format!("n{}", k % 3)),
            };
            let nominated = (x >> 40).is_multiple_of(7).then_some("n0");
            let new = pod(
                &name,
                node.as_deref(),
                nominated,
                &format!("{}m", 10 + step),
            );
            let key = new.key();
            if (x >> 50).is_multiple_of(4) {
                let old = pods.remove(&key);
                index.replace(old.as_ref(), None);
            } else {
                let old = pods.insert(key, new.clone());
                index.replace(old.as_ref(), Some(&new));
            }
        }
        let built = PodIndex::of(pods.values());
        assert_eq!(index.len(), built.len());
        for n in ["n0", "n1", "n2"] {
            assert_eq!(cpu(&index, n), cpu(&built, n), "{n}");
            let keys = |placed: Option<&Arc<Placed>>| {
                let mut k: Vec<String> = placed
                    .map(|p| p.pods().iter().map(|p| p.key()).collect())
                    .unwrap_or_default();
                k.sort();
                k
            };
            assert_eq!(keys(index.bound(n)), keys(built.bound(n)), "{n}");
            assert_eq!(keys(index.nominated(n)), keys(built.nominated(n)), "{n}");
        }
        assert_eq!(index.any_nominated(), built.any_nominated());
        let unplaced = |i: &PodIndex| i.unplaced().map(|p| p.key()).collect::<Vec<_>>();
        assert_eq!(unplaced(&index), unplaced(&built));
    }
}
