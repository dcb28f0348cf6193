//! A read-only view of every scale set's instances, for the cluster simulation
//! (`emulator::sim`), which turns instances into Nodes. It reads; it never writes ARM state.

use std::collections::{BTreeMap, HashMap};

use tokio::time::Instant;

use super::state::{vmss_key, EmulatorState};

/// One scale set and its instances, as the cluster simulation reads them.
#[derive(Clone, Debug, PartialEq)]
pub struct ScaleSetInventory {
    /// Subscription id.
    pub subscription: String,
    /// Resource group, as the scale set was created.
    pub resource_group: String,
    /// Scale set name.
    pub name: String,
    /// Azure region.
    pub location: String,
    /// VM size.
    pub sku_name: String,
    /// Resource tags (cluster-autoscaler template tags among them).
    pub tags: BTreeMap<String, String>,
    /// Instance ids, when each one's provisioning finishes, and its zone (`None`: regional).
    pub instances: Vec<(u64, Instant, Option<String>)>,
    /// The agent pool, when the scale set backs one.
    pub pool: Option<PoolInventory>,
    /// Availability zones (each instance in one of them); empty: regional.
    pub zones: Vec<String>,
    /// Spot priority: its Nodes carry AKS's spot label and taint.
    pub spot: bool,
    /// Instances stopped and deallocated (a spot eviction with `Deallocate`): their kubelets
    /// post nothing, so their Nodes are NotReady.
    pub deallocated: std::collections::BTreeSet<u64>,
    /// Instances a failed operation created (`lroFailed`): they never boot, so they get no Node.
    pub failed: std::collections::BTreeSet<u64>,
    /// The labels and taints its new Nodes register with beyond its tags (a kubelet's
    /// `--node-labels`, `--register-with-taints`).
    pub registration: super::registration::NodeRegistration,
}

/// What an agent pool tells its nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolInventory {
    /// Pool name.
    pub name: String,
    /// `nodeLabels`.
    pub node_labels: BTreeMap<String, String>,
    /// `nodeTaints`, `key=value:Effect`.
    pub node_taints: Vec<String>,
    /// `maxPods`.
    pub max_pods: i64,
}

impl EmulatorState {
    /// Every scale set with its instances, in name order (AKS backing sets name their pool).
    pub fn inventory(&self) -> Vec<ScaleSetInventory> {
        let d = self.lock();
        let pools: HashMap<String, PoolInventory> = super::aks::backing_pools(&d);
        let mut out: Vec<ScaleSetInventory> = d
            .scale_sets
            .values()
            .map(|ss| ScaleSetInventory {
                subscription: ss.sub.clone(),
                resource_group: ss.rg.clone(),
                name: ss.name.clone(),
                location: ss.location.clone(),
                sku_name: ss.sku_name.clone(),
                tags: ss.tags.clone(),
                instances: ss
                    .instances
                    .iter()
                    .map(|(id, inst)| (*id, inst.ready_at, inst.zone.clone()))
                    .collect(),
                pool: pools.get(&vmss_key(&ss.sub, &ss.rg, &ss.name)).cloned(),
                zones: ss.zones.clone(),
                spot: ss.spot(),
                deallocated: ss
                    .instances
                    .iter()
                    .filter(|(_, i)| i.deallocated)
                    .map(|(id, _)| *id)
                    .collect(),
                failed: ss
                    .instances
                    .iter()
                    .filter(|(_, i)| i.failed)
                    .map(|(id, _)| *id)
                    .collect(),
                registration: d
                    .node_registrations
                    .get(&vmss_key(&ss.sub, &ss.rg, &ss.name))
                    .cloned()
                    .unwrap_or_default(),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}
