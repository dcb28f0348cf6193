//! What a pod's volumes ask of a node, as kube-scheduler's volume filters decide it:
//!
//! - **`VolumeBinding`**: a claim bound to a volume whose `nodeAffinity` names a zone (a zonal
//!   Azure Disk: `topology.disk.csi.azure.com/zone`) holds the pod to nodes matching it; an
//!   unbound claim of a `WaitForFirstConsumer` class is provisioned where the pod goes, on a
//!   node matching the class's `allowedTopologies` (none: any node); an unbound claim of an
//!   `Immediate` class waits for its volume, not for a node (`pod has unbound immediate
//!   PersistentVolumeClaims`): no node helps it, so no scale-up is planned for it. So does a
//!   claim that does not exist yet, is lost or is being deleted.
//! - **`NodeVolumeLimits`**: a node attaches at most so many volumes of a CSI driver: the
//!   `allocatable.count` its `CSINode` reports for the driver on live nodes, the VM size's
//!   maximum data disks for Azure Disk on a template (the Azure Disk CSI driver's own default;
//!   a node without a limit for a driver has none).
//!
//! The storage objects are read once per decision into a [`Volumes`]; each pod class's needs
//! are worked out once ([`Volumes::of_pod`]) and checked per node by the
//! [`Topology`](super::topology::Topology) alongside the other filters that read more than the
//! pod and the node. Not simulated: static volumes matched to a `WaitForFirstConsumer` claim of
//! a class without a provisioner (local volumes), the `CSIStorageCapacity` check (Azure Disk
//! does not use it), inline in-tree `azureDisk` volumes (deprecated; not kept in pod records).
//! Each claim counts as one attachment on its node, so two pods on one node sharing a claim
//! count it twice (the scheduler counts it once): a conservative error. Pure code.

use super::fit::{NodeState, Unfit};
use super::record::PodRecord;
use k8s_openapi::api::core::v1::{
    NodeSelector, PersistentVolume, PersistentVolumeClaim, PodSpec, TopologySelectorTerm,
};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The Azure Disk CSI driver.
pub const AZURE_DISK_DRIVER: &str = "disk.csi.azure.com";
/// The in-tree Azure Disk plugin, migrated to [`AZURE_DISK_DRIVER`].
const AZURE_DISK_IN_TREE: &str = "kubernetes.io/azure-disk";
/// Set by the PV controller once a claim is bound (`isPVCFullyBound`).
const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// The class annotation older claims carry (read before `storageClassName`).
const BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// The node the scheduler chose for a `WaitForFirstConsumer` claim being provisioned.
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// The CSI driver of a provisioner or in-tree plugin name.
fn driver_of(name: &str) -> &str {
    if name == AZURE_DISK_IN_TREE {
        AZURE_DISK_DRIVER
    } else {
        name
    }
}

#[derive(Debug, Clone)]
struct Claim {
    volume_name: Option<String>,
    bound: bool,
    class: Option<String>,
    lost: bool,
    deleting: bool,
    selected_node: Option<String>,
}

#[derive(Debug, Clone)]
struct Volume {
    affinity: Option<NodeSelector>,
    driver: Option<String>,
}

#[derive(Debug, Clone)]
struct Class {
    wait_for_first_consumer: bool,
    provisioner: String,
    allowed: Vec<TopologySelectorTerm>,
}

/// The storage objects of the cluster, as the volume filters read them.
#[derive(Debug, Clone, Default)]
pub struct Volumes {
    claims: HashMap<(String, String), Claim>,
    volumes: HashMap<String, Volume>,
    classes: HashMap<String, Class>,
    /// By node: per driver, how many volumes it may attach (its `CSINode`).
    limits: HashMap<String, Arc<BTreeMap<String, u32>>>,
}

/// What a pod's claims ask of a node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Needs {
    /// Bound volumes' node affinity: the node must match each.
    affinity: Vec<NodeSelector>,
    /// `WaitForFirstConsumer` claims: the node must match each class's allowed topologies
    /// (an empty list: any node).
    topologies: Vec<Vec<TopologySelectorTerm>>,
    /// A claim being provisioned for this node already: only it will do.
    only_node: Option<String>,
    /// Volumes to attach, per driver.
    attach: BTreeMap<String, u32>,
    /// No node will do (the claims wait for something else).
    nowhere: bool,
}

/// What [`Volumes::of_pod`] finds.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// No claim: nothing to check.
    None,
    /// Claims a node must satisfy.
    Needs(Arc<Needs>),
    /// Waiting for something no new node brings (kube-scheduler's words).
    Waiting(String),
    /// Asks what this controller does not simulate.
    NotSimulated(&'static str),
}

impl Volumes {
    /// The objects, as listed (claims, volumes, classes, CSI nodes).
    pub fn new<'a>(
        claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
        volumes: impl IntoIterator<Item = &'a PersistentVolume>,
        classes: impl IntoIterator<Item = &'a StorageClass>,
        csi_nodes: impl IntoIterator<Item = &'a CSINode>,
    ) -> Self {
        let mut out = Volumes::default();
        for c in claims {
            let m = &c.metadata;
            let (Some(name), spec) = (m.name.clone(), c.spec.as_ref()) else {
                continue;
            };
            let annotations = m.annotations.as_ref();
            let annotation = |k: &str| annotations.and_then(|a| a.get(k)).cloned();
            let volume_name = spec
                .and_then(|s| s.volume_name.clone())
                .filter(|v| !v.is_empty());
            out.claims.insert(
                (
                    m.namespace.clone().unwrap_or_else(|| "default".into()),
                    name,
                ),
                Claim {
                    bound: volume_name.is_some() && annotation(BIND_COMPLETED).is_some(),
                    volume_name,
                    class: annotation(BETA_CLASS)
                        .or_else(|| spec.and_then(|s| s.storage_class_name.clone()))
                        .filter(|c| !c.is_empty()),
                    lost: c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost"),
                    deleting: m.deletion_timestamp.is_some(),
                    selected_node: annotation(SELECTED_NODE).filter(|n| !n.is_empty()),
                },
            );
        }
        for v in volumes {
            let Some(name) = v.metadata.name.clone() else {
                continue;
            };
            let spec = v.spec.as_ref();
            let driver = spec.and_then(|s| {
                s.csi
                    .as_ref()
                    .map(|c| c.driver.clone())
                    .or_else(|| s.azure_disk.as_ref().map(|_| AZURE_DISK_DRIVER.to_string()))
            });
            out.volumes.insert(
                name,
                Volume {
                    affinity: spec
                        .and_then(|s| s.node_affinity.as_ref())
                        .and_then(|a| a.required.clone()),
                    driver,
                },
            );
        }
        for c in classes {
            let Some(name) = c.metadata.name.clone() else {
                continue;
            };
            out.classes.insert(
                name,
                Class {
                    wait_for_first_consumer: c.volume_binding_mode.as_deref()
                        == Some("WaitForFirstConsumer"),
                    provisioner: c.provisioner.clone(),
                    allowed: c.allowed_topologies.clone().unwrap_or_default(),
                },
            );
        }
        for n in csi_nodes {
            let Some(name) = n.metadata.name.clone() else {
                continue;
            };
            let limits: BTreeMap<String, u32> = n
                .spec
                .drivers
                .iter()
                .filter_map(|d| {
                    let count = d.allocatable.as_ref()?.count?;
                    Some((d.name.clone(), u32::try_from(count.max(0)).unwrap_or(0)))
                })
                .collect();
            if !limits.is_empty() {
                out.limits.insert(name, Arc::new(limits));
            }
        }
        out
    }

    /// No storage objects at all.
    pub fn none() -> &'static Volumes {
        static NONE: std::sync::LazyLock<Volumes> = std::sync::LazyLock::new(Volumes::default);
        &NONE
    }

    /// Whether there is nothing to read (no claim and no limit).
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty() && self.limits.is_empty()
    }

    /// The attach limits of live node `name`, per driver.
    pub fn limits(&self, name: &str) -> Option<Arc<BTreeMap<String, u32>>> {
        self.limits.get(name).cloned()
    }

    /// The claims of `pod` (its `persistentVolumeClaim` volumes, and its generic ephemeral
    /// volumes, whose claim is `<pod>-<volume>`), each with the message kube-scheduler gives
    /// when the claim is missing.
    fn claims_of(pod: &PodRecord) -> Vec<(String, String)> {
        pod.spec()
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| {
                if let Some(c) = &v.persistent_volume_claim {
                    Some((
                        c.claim_name.clone(),
                        format!("persistentvolumeclaim \"{}\" not found", c.claim_name),
                    ))
                } else if v.ephemeral.is_some() {
                    let name = format!("{}-{}", pod.name, v.name);
                    let missing = format!("waiting for ephemeral volume controller to create the persistentvolumeclaim \"{name}\"");
                    Some((name, missing))
                } else {
                    None
                }
            })
            .collect()
    }

    /// What `pod`'s claims ask of a node (see the module documentation).
    pub fn of_pod(&self, pod: &PodRecord) -> Verdict {
        let claims = Self::claims_of(pod);
        if claims.is_empty() {
            return Verdict::None;
        }
        let mut needs = Needs::default();
        let mut immediate = false;
        for (name, missing) in claims {
            let Some(c) = self.claims.get(&(pod.namespace.clone(), name.clone())) else {
                return Verdict::Waiting(missing);
            };
            if c.deleting {
                return Verdict::Waiting(format!(
                    "persistentvolumeclaim \"{name}\" is being deleted"
                ));
            }
            if c.lost {
                return Verdict::Waiting(format!(
                    "persistentvolumeclaim \"{name}\" bound to non-existent persistentvolume \"{}\"",
                    c.volume_name.as_deref().unwrap_or_default()
                ));
            }
            if c.bound {
                let v = c.volume_name.as_deref().unwrap_or_default();
                let Some(volume) = self.volumes.get(v) else {
                    return Verdict::Waiting(
                        "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
                            .into(),
                    );
                };
                if let Some(a) = &volume.affinity {
                    needs.affinity.push(a.clone());
                }
                if let Some(d) = &volume.driver {
                    *needs.attach.entry(d.clone()).or_default() += 1;
                }
                continue;
            }
            let class = c.class.as_deref().and_then(|n| self.classes.get(n));
            match class {
                Some(class) if class.wait_for_first_consumer && c.volume_name.is_none() => {
                    if class.provisioner.is_empty()
                        || class.provisioner == "kubernetes.io/no-provisioner"
                    {
                        return Verdict::NotSimulated(
                            "claim of a WaitForFirstConsumer class without a provisioner (static volumes)",
                        );
                    }
                    if let Some(n) = &c.selected_node {
                        needs.only_node = Some(n.clone());
                    }
                    needs.topologies.push(class.allowed.clone());
                    *needs
                        .attach
                        .entry(driver_of(&class.provisioner).to_string())
                        .or_default() += 1;
                }
                _ => immediate = true,
            }
        }
        if immediate {
            return Verdict::Waiting("pod has unbound immediate PersistentVolumeClaims".into());
        }
        Verdict::Needs(Arc::new(needs))
    }

    /// The volumes a pod bound to a node has attached there, per driver (its claims that
    /// name a volume or a class; the rest count nowhere).
    pub fn attached(&self, pod: &PodRecord) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        for (name, _) in Self::claims_of(pod) {
            let Some(c) = self.claims.get(&(pod.namespace.clone(), name)) else {
                continue;
            };
            let driver = c
                .volume_name
                .as_deref()
                .and_then(|v| self.volumes.get(v))
                .and_then(|v| v.driver.clone())
                .or_else(|| {
                    let class = self.classes.get(c.class.as_deref()?)?;
                    Some(driver_of(&class.provisioner).to_string())
                });
            if let Some(d) = driver {
                *out.entry(d).or_default() += 1;
            }
        }
        out
    }
}

/// Whether `spec` has a claim (a `persistentVolumeClaim` or generic ephemeral volume).
pub fn has_claims(spec: &PodSpec) -> bool {
    spec.volumes
        .iter()
        .flatten()
        .any(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some())
}

impl Needs {
    /// Needs no node meets: the pod's claims wait for something no node brings.
    pub fn nowhere() -> Self {
        Needs {
            nowhere: true,
            ..Needs::default()
        }
    }

    /// Whether these needs hold the pod to some nodes by where they are (a bound volume's
    /// affinity, allowed topologies, a chosen node), not only by how many volumes they have.
    pub fn pins(&self) -> bool {
        self.nowhere
            || !self.affinity.is_empty()
            || self.only_node.is_some()
            || self.topologies.iter().any(|t| !t.is_empty())
    }

    /// Whether `node`, with `attached` volumes per driver already, takes a pod with these
    /// needs, or kube-scheduler's reason.
    pub fn fits(
        &self,
        node: &NodeState,
        attached: Option<&BTreeMap<String, u32>>,
    ) -> Result<(), Unfit> {
        if self.nowhere {
            return Err(Unfit::VolumeBinding);
        }
        // kube-scheduler's order: NodeVolumeLimits, then VolumeBinding.
        if let Some(limits) = node.volume_limits() {
            for (driver, want) in &self.attach {
                let Some(limit) = limits.get(driver) else {
                    continue;
                };
                let have = attached.and_then(|a| a.get(driver)).copied().unwrap_or(0);
                if have + want > *limit {
                    return Err(Unfit::VolumeCount);
                }
            }
        }
        if !self.affinity.iter().all(|a| node.matches_node_selector(a)) {
            return Err(Unfit::VolumeNodeAffinity);
        }
        if self.only_node.as_deref().is_some_and(|n| n != node.name)
            || !self.topologies.iter().all(|t| node.matches_topology(t))
        {
            return Err(Unfit::VolumeBinding);
        }
        Ok(())
    }

    /// The volumes a pod with these needs attaches, per driver.
    pub fn attach(&self) -> &BTreeMap<String, u32> {
        &self.attach
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::pods::fit::Resources;
    use serde_json::json;

    /// A claim `name` in `default`: bound to `volume` (with the PV controller's annotation),
    /// or unbound of `class`.
    pub(crate) fn claim(name: &str, volume: Option<&str>, class: &str) -> PersistentVolumeClaim {
        let mut c = json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"]}});
        if let Some(v) = volume {
            c["spec"]["volumeName"] = json!(v);
            c["metadata"]["annotations"] = json!({BIND_COMPLETED: "yes"});
            c["status"] = json!({"phase": "Bound"});
        }
        serde_json::from_value(c).unwrap()
    }

    /// A zonal Azure Disk volume in `zone` (its node affinity, as the CSI driver makes it).
    pub(crate) fn disk(name: &str, zone: &str) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
            "csi": {"driver": AZURE_DISK_DRIVER, "volumeHandle": format!("/disks/{name}")},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.disk.csi.azure.com/zone", "operator": "In", "values": [zone]}]}]}}}}))
        .unwrap()
    }

    /// A storage class: `WaitForFirstConsumer` or `Immediate`, with allowed zones (none: any).
    pub(crate) fn class(name: &str, mode: &str, zones: &[&str]) -> StorageClass {
        let mut c = json!({"metadata": {"name": name}, "provisioner": AZURE_DISK_DRIVER,
            "volumeBindingMode": mode});
        if !zones.is_empty() {
            c["allowedTopologies"] = json!([{"matchLabelExpressions": [
                {"key": "topology.disk.csi.azure.com/zone", "values": zones}]}]);
        }
        serde_json::from_value(c).unwrap()
    }

    fn pod_with(claims: &[&str]) -> PodRecord {
        let volumes: Vec<_> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        PodRecord::of(
            serde_json::from_value(json!({"metadata": {"name": "db-0", "namespace": "default"},
                "spec": {"containers": [{"name": "c"}], "volumes": volumes}}))
            .unwrap(),
        )
    }

    fn node_in(zone: &str) -> NodeState {
        NodeState::new(
            "n",
            BTreeMap::from([(
                "topology.disk.csi.azure.com/zone".to_string(),
                zone.to_string(),
            )]),
            Vec::new(),
            Resources::new(),
        )
    }

    fn needs(v: &Volumes, pod: &PodRecord) -> Arc<Needs> {
        match v.of_pod(pod) {
            Verdict::Needs(n) => n,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_bound_zonal_disk_holds_its_pod_to_nodes_of_its_zone() {
        let v = Volumes::new(
            &[claim("data-db-0", Some("pv-1"), "managed-csi")],
            &[disk("pv-1", "westeurope-2")],
            &[class("managed-csi", "WaitForFirstConsumer", &[])],
            &[],
        );
        let n = needs(&v, &pod_with(&["data-db-0"]));
        assert_eq!(n.fits(&node_in("westeurope-2"), None), Ok(()));
        let refused = n.fits(&node_in("westeurope-1"), None).unwrap_err();
        assert_eq!(refused, Unfit::VolumeNodeAffinity);
        assert_eq!(
            refused.to_string(),
            "node(s) had volume node affinity conflict"
        );
        assert_eq!(refused.label(), "volume_node_affinity");
    }

    #[test]
    fn an_unbound_wait_for_first_consumer_claim_goes_where_its_class_allows() {
        let v = Volumes::new(
            &[
                claim("any", None, "managed-csi"),
                claim("two", None, "zone-two"),
            ],
            &[],
            &[
                class("managed-csi", "WaitForFirstConsumer", &[]),
                class("zone-two", "WaitForFirstConsumer", &["westeurope-2"]),
            ],
            &[],
        );
        let any = needs(&v, &pod_with(&["any"]));
        assert_eq!(any.fits(&node_in("westeurope-1"), None), Ok(()));
        let two = needs(&v, &pod_with(&["two"]));
        assert_eq!(two.fits(&node_in("westeurope-2"), None), Ok(()));
        assert_eq!(
            two.fits(&node_in("westeurope-3"), None)
                .unwrap_err()
                .to_string(),
            "node(s) didn't find available persistent volumes to bind"
        );
    }

    #[test]
    fn claims_that_wait_for_something_no_node_brings_say_so_in_the_schedulers_words() {
        let v = Volumes::new(
            &[claim("now", None, "immediate"), {
                let mut c = claim("going", Some("pv-1"), "managed-csi");
                c.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::now(),
                    ));
                c
            }],
            &[],
            &[class("immediate", "Immediate", &[])],
            &[],
        );
        let waiting = |claims: &[&str]| match v.of_pod(&pod_with(claims)) {
            Verdict::Waiting(why) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            waiting(&["now"]),
            "pod has unbound immediate PersistentVolumeClaims"
        );
        assert_eq!(
            waiting(&["missing"]),
            "persistentvolumeclaim \"missing\" not found"
        );
        assert_eq!(
            waiting(&["going"]),
            "persistentvolumeclaim \"going\" is being deleted"
        );
        // Bound, but its volume is gone.
        let v = Volumes::new(
            &[claim("orphan", Some("pv-x"), "managed-csi")],
            &[],
            &[],
            &[],
        );
        assert!(matches!(
            v.of_pod(&pod_with(&["orphan"])),
            Verdict::Waiting(w) if w.contains("non-existent pv")
        ));
        assert_eq!(v.of_pod(&pod_with(&[])), Verdict::None);
    }

    #[test]
    fn a_node_attaches_no_more_disks_than_its_csinode_or_vm_size_allows() {
        let csi: CSINode =
            serde_json::from_value(json!({"metadata": {"name": "n"}, "spec": {"drivers": [
            {"name": AZURE_DISK_DRIVER, "nodeID": "n", "allocatable": {"count": 2}}]}}))
            .unwrap();
        let v = Volumes::new(
            &[
                claim("a", None, "managed-csi"),
                claim("b", None, "managed-csi"),
            ],
            &[],
            &[class("managed-csi", "WaitForFirstConsumer", &[])],
            &[csi],
        );
        let mut node = node_in("westeurope-1");
        node.set_volume_limits(v.limits("n"));
        let two = needs(&v, &pod_with(&["a", "b"]));
        assert_eq!(two.fits(&node, None), Ok(()));
        let one_there = BTreeMap::from([(AZURE_DISK_DRIVER.to_string(), 1)]);
        let refused = two.fits(&node, Some(&one_there)).unwrap_err();
        assert_eq!(refused.to_string(), "node(s) exceed max volume count");
        // A node without a limit for the driver has none.
        assert_eq!(two.fits(&node_in("westeurope-1"), Some(&one_there)), Ok(()));
        // A template's limit is its VM size's data disks.
        let d2 = crate::pods::template::vm_size("Standard_D2s_v5").unwrap();
        assert_eq!(d2.max_data_disks, 4);
    }

    #[test]
    fn ephemeral_claims_are_the_pods_own_and_a_chosen_node_holds_its_claim() {
        // A generic ephemeral volume `scratch` of pod `db-0` is claim `db-0-scratch`.
        let pod = PodRecord::of(
            serde_json::from_value(json!({"metadata": {"name": "db-0", "namespace": "default"},
                "spec": {"containers": [{"name": "c"}], "volumes": [{"name": "scratch",
                    "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}}]}}))
            .unwrap(),
        );
        let class = || class("managed-csi", "WaitForFirstConsumer", &[]);
        let v = Volumes::new(&[], &[], &[class()], &[]);
        assert_eq!(
            v.of_pod(&pod),
            Verdict::Waiting(
                "waiting for ephemeral volume controller to create the persistentvolumeclaim \"db-0-scratch\"".into()
            )
        );
        // Being provisioned for node n1 (the scheduler chose it): only n1 will do.
        let mut c = claim("db-0-scratch", None, "managed-csi");
        c.metadata.annotations = Some(BTreeMap::from([(
            SELECTED_NODE.to_string(),
            "n1".to_string(),
        )]));
        let v = Volumes::new(&[c], &[], &[class()], &[]);
        let n = needs(&v, &pod);
        let mut n1 = node_in("westeurope-1");
        n1.name = "n1".into();
        assert_eq!(n.fits(&n1, None), Ok(()));
        assert_eq!(
            n.fits(&node_in("westeurope-1"), None),
            Err(Unfit::VolumeBinding)
        );
    }

    #[test]
    fn classes_are_read_as_the_scheduler_reads_them() {
        // The beta annotation names the class before `storageClassName`; a class without a
        // provisioner means static volumes, which are not simulated.
        let mut c = claim("local", None, "managed-csi");
        c.metadata.annotations = Some(BTreeMap::from([(
            BETA_CLASS.to_string(),
            "local-storage".to_string(),
        )]));
        let mut local = class("local-storage", "WaitForFirstConsumer", &[]);
        local.provisioner = "kubernetes.io/no-provisioner".into();
        let v = Volumes::new(
            &[c],
            &[],
            &[class("managed-csi", "WaitForFirstConsumer", &[]), local],
            &[],
        );
        assert!(matches!(
            v.of_pod(&pod_with(&["local"])),
            Verdict::NotSimulated(_)
        ));
    }

    #[test]
    fn a_running_pods_disks_count_on_its_node_in_tree_ones_as_the_csi_driver() {
        let in_tree: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "old"},
            "spec": {"azureDisk": {"diskName": "d", "diskURI": "/disks/d"}}}))
        .unwrap();
        let v = Volumes::new(
            &[
                claim("a", Some("old"), "managed-csi"),
                claim("b", None, "managed-csi"),
            ],
            &[in_tree],
            &[class("managed-csi", "WaitForFirstConsumer", &[])],
            &[],
        );
        assert_eq!(
            v.attached(&pod_with(&["a", "b", "gone"])),
            BTreeMap::from([(AZURE_DISK_DRIVER.to_string(), 2)])
        );
    }

    #[test]
    fn every_vm_size_in_the_table_knows_its_data_disks() {
        for (name, ..) in crate::pods::template::sizes() {
            let size = crate::pods::template::vm_size(name).unwrap();
            assert!(size.max_data_disks > 0, "{name}");
        }
    }
}
