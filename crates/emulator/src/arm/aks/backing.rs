//! The scale sets behind agent pools. As AKS does, each pool's nodes are a VM scale set in the
//! cluster's node resource group (`MC_<rg>_<cluster>_<location>`), named
//! `aks-<pool>-<8 digits>-vmss` and tagged `aks-managed-poolName`; its instances follow the pool's
//! `count`. The scale sets are ordinary emulator scale sets, so the compute API lists and reads
//! them like any other.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

use super::super::scale_sets::remove_instances;
use super::super::state::{describe_change, vmss_key, Data, ScaleSetSeed};
use super::pool::Pool;

/// Writer recorded for the versions the AKS resource provider itself makes of a backing scale set.
pub(crate) const AKS_WRITER: &str = "aks-resource-provider";
/// Tag naming the agent pool a scale set belongs to.
pub(crate) const POOL_NAME_TAG: &str = "aks-managed-poolName";

/// The default node resource group of a cluster, `MC_<rg>_<cluster>_<location>`.
pub(crate) fn default_node_resource_group(rg: &str, cluster: &str, location: &str) -> String {
    format!("MC_{rg}_{cluster}_{location}")
}

/// The 8 digits AKS puts in a cluster's scale-set names: the same for every pool of a cluster
/// and stable across restarts (FNV-1a of the lowercased cluster id, not a per-process hasher).
pub(crate) fn name_suffix(cluster_id: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in cluster_id.to_ascii_lowercase().bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{:08}", h % 100_000_000)
}

/// `aks-<pool>-<8 digits>-vmss`.
pub(crate) fn scale_set_name(cluster_id: &str, pool: &str) -> String {
    format!(
        "aks-{}-{}-vmss",
        pool.to_ascii_lowercase(),
        name_suffix(cluster_id)
    )
}

/// The AKS machine name of instance `id` of scale set `scale_set`: the node's name
/// (`aks-general-12345678-vmss000003`), as the cluster simulation names nodes.
pub(crate) fn machine_name(scale_set: &str, id: u64) -> String {
    crate::sim::nodes::node_name(scale_set, id)
}

/// Where a pool's scale set lives and what it should look like.
pub(crate) struct Backing {
    pub sub: String,
    pub node_rg: String,
    pub name: String,
    pub location: String,
    pub vm_size: String,
    pub capacity: i64,
    pub tags: BTreeMap<String, String>,
    pub zones: Vec<String>,
    pub priority: Option<String>,
    pub eviction_policy: Option<String>,
}

impl Backing {
    /// The scale set that backs `pool` of the cluster `cluster_id` (in `node_rg`).
    pub fn of(sub: &str, node_rg: &str, cluster_id: &str, location: &str, pool: &Pool) -> Backing {
        let suffix = name_suffix(cluster_id);
        // Pool tags are "persisted on the agent pool virtual machine scale set" (the spec); the
        // aks-managed-* tags are AKS's own and win.
        let mut tags = pool.tags.clone();
        tags.insert(POOL_NAME_TAG.to_string(), pool.name.clone());
        tags.insert(
            "aks-managed-orchestrator".to_string(),
            format!("Kubernetes:{}", pool.orchestrator_version),
        );
        tags.insert("aks-managed-resourceNameSuffix".to_string(), suffix);
        Backing {
            sub: sub.to_string(),
            node_rg: node_rg.to_string(),
            name: scale_set_name(cluster_id, &pool.name),
            location: location.to_string(),
            vm_size: pool.vm_size.clone(),
            capacity: pool.count,
            tags,
            zones: pool.availability_zones.clone(),
            priority: pool.priority.clone(),
            eviction_policy: pool.eviction_policy.clone(),
        }
    }

    pub(crate) fn key(&self) -> String {
        vmss_key(&self.sub, &self.node_rg, &self.name)
    }

    /// Creates the scale set, or resizes and retags it; a change is a new version by AKS.
    pub fn apply(self, d: &mut Data, busy_until: Instant, failed: bool) {
        let key = self.key();
        let Some(ss) = d.scale_sets.get_mut(&key) else {
            let mut seed = ScaleSetSeed::new(&self.sub, &self.node_rg, &self.name, self.capacity);
            seed.location = self.location;
            seed.sku_name = self.vm_size;
            seed.tags = self.tags;
            seed.zones = self.zones;
            seed.priority = self.priority;
            seed.eviction_policy = self.eviction_policy;
            d.create_scale_set(seed, AKS_WRITER, busy_until, failed);
            return;
        };
        if ss.capacity == self.capacity && ss.tags == self.tags {
            return;
        }
        let (old_cap, old_tags) = (ss.capacity, ss.tags.clone());
        ss.tags = self.tags;
        ss.busy_until = busy_until;
        ss.failed = failed;
        ss.resize(self.capacity, busy_until);
        let change = describe_change(Some((old_cap, &old_tags)), ss.capacity, &ss.tags);
        let version = d.next_version(&key);
        if let Some(ss) = d.scale_sets.get_mut(&key) {
            ss.version = version;
            let etag = ss.etag();
            d.record_version(&key, &etag, AKS_WRITER, change);
        }
    }

    /// The instance ids behind `machines` (AKS machine names: the nodes' names), each machine
    /// once; `Err(name)` names the first that is not a machine of this scale set.
    pub fn instances_of(&self, d: &Data, machines: &[String]) -> Result<BTreeSet<u64>, String> {
        let ss = d.scale_sets.get(&self.key());
        let mut out = BTreeSet::new();
        for m in machines {
            let id = ss.and_then(|ss| {
                ss.instances
                    .keys()
                    .copied()
                    .find(|id| machine_name(&ss.name, *id).eq_ignore_ascii_case(m.trim()))
            });
            match id {
                Some(id) => {
                    out.insert(id);
                }
                None => return Err(m.clone()),
            }
        }
        Ok(out)
    }

    /// Deletes exactly the instances `ids` of the scale set, lowering its capacity by as many: a
    /// new version by AKS. Returns how many went.
    pub fn remove_instances(
        &self,
        d: &mut Data,
        ids: &BTreeSet<u64>,
        busy_until: Instant,
        failed: bool,
    ) -> i64 {
        let key = self.key();
        let Some(ss) = d.scale_sets.get_mut(&key) else {
            return 0;
        };
        let (old_cap, old_tags) = (ss.capacity, ss.tags.clone());
        let removed = remove_instances(ss, ids);
        ss.busy_until = busy_until;
        ss.failed = failed;
        let change = format!(
            "{} ({removed} machines deleted)",
            describe_change(Some((old_cap, &old_tags)), ss.capacity, &ss.tags)
        );
        let version = d.next_version(&key);
        if let Some(ss) = d.scale_sets.get_mut(&key) {
            ss.version = version;
            let etag = ss.etag();
            d.record_version(&key, &etag, AKS_WRITER, change);
        }
        removed
    }

    /// Deletes the scale set (with the pool or the cluster).
    pub fn remove(&self, d: &mut Data) {
        let key = self.key();
        if d.scale_sets.remove(&key).is_some() {
            d.next_version(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c";

    #[test]
    fn the_name_suffix_is_fixed_for_a_cluster_id_whatever_its_case() {
        // A fixed value: a change of hash would rename every pool's scale set.
        assert_eq!(name_suffix(ID), "66116893");
        assert_eq!(name_suffix(&ID.to_ascii_uppercase()), "66116893");
        assert_ne!(name_suffix(&ID.replace("/c", "/d")), "66116893");
    }

    #[test]
    fn machine_names_are_the_node_names_of_the_backing_scale_set() {
        assert_eq!(
            machine_name("aks-general-12345678-vmss", 3),
            "aks-general-12345678-vmss000003"
        );
        assert_eq!(
            machine_name("aks-general-12345678-vmss", 36),
            "aks-general-12345678-vmss000010"
        );
    }

    #[test]
    fn scale_set_names_follow_aks() {
        assert_eq!(
            scale_set_name(ID, "NodePool1"),
            "aks-nodepool1-66116893-vmss"
        );
        assert_eq!(
            default_node_resource_group("rg", "c", "westeurope"),
            "MC_rg_c_westeurope"
        );
    }
}
