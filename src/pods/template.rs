//! Node templates: what a new node of a group would offer, for planning before it exists.
//!
//! From a live Ready node of the group when there is one (its allocatable, labels and taints);
//! else, to scale from zero, from the VM size (a built-in table of common Azure sizes, minus the
//! kubelet and system reservations AKS documents) plus cluster-autoscaler's template tags on a
//! scale set (`k8s.io_cluster-autoscaler_node-template_label_*`, `..._taint_*`,
//! `..._resources_*`) or an agent pool's `nodeLabels`, `nodeTaints` and `maxPods`; its
//! `ephemeral-storage` from the kubelet's disk, its `kubernetes.io/os` from the VM profile, and
//! for a spot group AKS's `kubernetes.azure.com/scalesetpriority=spot` label and `NoSchedule`
//! taint. Then what the cluster's DaemonSets would place on the new node is taken off. Pure code.

use super::fit::{NodeState, Resources, HOSTNAME};
use super::quantity;
use super::record::{NodeRecord, PodRecord};
use crate::cache::VmProfile;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, Taint};
use std::collections::BTreeMap;
use std::sync::Arc;

pub use vm_sizes::{sizes, vm_size, VmSize};

/// AKS's default OS disk size when the pool or scale set does not set one (`osDiskSizeGB: 0`).
pub const AKS_DEFAULT_OS_DISK_GIB: u32 = 128;

/// The share of the kubelet's disk kept free by AKS's hard eviction threshold
/// (`nodefs.available<10%`), which the kubelet takes off allocatable `ephemeral-storage`.
const NODEFS_EVICTION_PERCENT: i128 = 10;

/// What AKS reserves on a node ("Resource reservations", AKS 1.29 and later): kube-reserved CPU
/// by core count (60m for 1 core, 100m for 2, 140m for 4, then 10m per further core: 180m for
/// 8, 740m for 64), kube-reserved memory the lesser of 20 MiB per pod + 50 MiB and 25 % of the
/// memory, plus a 100 MiB hard-eviction threshold. Returns `(cpu milli, memory bytes)`.
pub fn aks_reserved(vcpu: u32, memory_mib: u64, max_pods: u32) -> (i128, i128) {
    let n = i128::from(vcpu.max(1));
    let cpu = match n {
        1 => 60,
        2 => 100,
        3..=4 => 100 + 20 * (n - 2),
        _ => 140 + 10 * (n - 4),
    };
    let kube_mib = (20 * u64::from(max_pods) + 50).min(memory_mib / 4);
    let mem_mib = kube_mib + 100;
    (cpu, i128::from(mem_mib) * 1024 * 1024)
}

/// Why no template could be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The VM size is not in the built-in table, no live node shows the group's shape, and the
    /// group's tags do not give its cpu and memory.
    #[error(
        "node group {group}: VM size {size:?} is not in the built-in table, the group has no Ready node to copy and its tags give no cpu and memory, so no pod is planned onto it from zero; fix: tag it with its shape ({TAG_RESOURCE}cpu and {TAG_RESOURCE}memory: `az vmss update -g RESOURCE_GROUP -n {group} --set tags.{TAG_RESOURCE}cpu=8 tags.{TAG_RESOURCE}memory=32Gi`, for an agent pool `az aks nodepool update --tags ...`), or keep one node (minSize: 1)"
    )]
    UnknownVmSize {
        /// The group.
        group: String,
        /// Its VM size.
        size: String,
    },
    /// Neither a Ready node nor the group's VM size and tags are known yet.
    #[error("node group {group}: no Ready node and no VM size to build a template from")]
    NoShape {
        /// The group.
        group: String,
    },
}

const TAG_LABEL: &str = "k8s.io_cluster-autoscaler_node-template_label_";
const TAG_TAINT: &str = "k8s.io_cluster-autoscaler_node-template_taint_";
const TAG_RESOURCE: &str = "k8s.io_cluster-autoscaler_node-template_resources_";

/// A tag name's key part, decoded as cluster-autoscaler's Azure provider does: `_` stands for
/// `/` (Azure tag names cannot hold one) and `~2` for `_`.
fn decode_tag_key(s: &str) -> String {
    s.replace('_', "/").replace("~2", "_")
}

/// Parses `value:Effect` (a template taint tag) or `key=value:Effect` (an AKS `nodeTaints`
/// entry) into a taint.
fn parse_taint(key: Option<&str>, text: &str) -> Option<Taint> {
    let (rest, effect) = text.rsplit_once(':')?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return None;
    }
    let (key, value) = match key {
        Some(k) => (k.to_string(), rest.to_string()),
        None => match rest.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (rest.to_string(), String::new()),
        },
    };
    Some(Taint {
        key,
        value: (!value.is_empty()).then_some(value),
        effect: effect.to_string(),
        time_added: None,
    })
}

/// The label and taint key AKS sets on spot nodes (`kubernetes.azure.com/scalesetpriority=spot`,
/// the taint with effect `NoSchedule`).
pub const SPOT_KEY: &str = "kubernetes.azure.com/scalesetpriority";

/// What the group says about its future nodes.
#[derive(Debug, Clone, Default)]
pub struct GroupShape<'a> {
    /// Node-group name (the AKS pool name for pools).
    pub name: &'a str,
    /// VM size (`Standard_D4s_v5`).
    pub vm_size: &'a str,
    /// The scale set's tags (template tags are read from them).
    pub tags: BTreeMap<String, String>,
    /// An agent pool's `nodeLabels`.
    pub node_labels: BTreeMap<String, String>,
    /// An agent pool's `nodeTaints` (`key=value:Effect`).
    pub node_taints: Vec<String>,
    /// An agent pool's `maxPods` (default 110).
    pub max_pods: Option<u32>,
    /// Whether it is an AKS agent pool (adds `kubernetes.azure.com/agentpool`).
    pub aks_pool: bool,
    /// OS, OS disk and kubelet disk of its VMs.
    pub profile: VmProfile,
    /// Azure region (`westeurope`); empty when unknown.
    pub location: &'a str,
    /// Availability zones its instances go to (`["1", "2"]`); empty: regional.
    pub zones: &'a [String],
}

/// Allocatable `ephemeral-storage` of a new node, in bytes: the kubelet's disk (the OS disk as
/// set, else AKS's default; the temporary disk with `kubeletDiskType: Temporary`) less AKS's
/// `nodefs.available<10%` hard eviction threshold. (cluster-autoscaler's Azure template takes
/// the OS disk's `diskSizeGB` whole.)
pub fn ephemeral_storage_bytes(size: &VmSize, profile: &VmProfile) -> i128 {
    let gib = if profile.kubelet_on_temp_disk && size.temp_disk_gib > 0 {
        size.temp_disk_gib
    } else {
        profile.os_disk_gib.unwrap_or(AKS_DEFAULT_OS_DISK_GIB)
    };
    let bytes = i128::from(gib) << 30;
    bytes - bytes * NODEFS_EVICTION_PERCENT / 100
}

/// The shape of a VM size the built-in table does not know, from cluster-autoscaler's template
/// tags: `..._resources_cpu` and `..._resources_memory` (both needed), `..._resources_nvidia.com_gpu`
/// if any. Its quota family is unknown (no quota cap), it has no temporary disk, and it may
/// attach two data disks per vCPU up to 32, as Azure's general-purpose and memory-optimized
/// sizes do (D2s_v5 4, D4s_v5 8, D8s_v5 16, D16s_v5 and larger 32).
fn size_from_tags(tags: &BTreeMap<String, String>) -> Option<VmSize> {
    let tag = |k: &str| {
        tags.get(&format!("{TAG_RESOURCE}{k}"))
            .and_then(|v| quantity::parse(v).ok())
    };
    // Quantities are in thousandths: 8 cores = 8000, 32Gi = 32 Gi bytes x 1000.
    let cpu = tag("cpu").filter(|c| *c > 0)?;
    let memory = tag("memory").filter(|m| *m > 0)?;
    let vcpu = u32::try_from((cpu + 999) / 1000).ok()?;
    Some(VmSize {
        vcpu,
        memory_mib: u64::try_from(memory / 1000 / (1024 * 1024)).ok()?,
        gpu: tag("nvidia.com_gpu").map_or(0, |g| u32::try_from(g / 1000).unwrap_or(0)),
        temp_disk_gib: 0,
        family: "",
        max_data_disks: vcpu.saturating_mul(2).min(32),
    })
}

/// A template from the VM size and the group's tags or pool properties.
pub fn from_shape(shape: &GroupShape) -> Result<NodeState, TemplateError> {
    let size = vm_size(shape.vm_size)
        .or_else(|| size_from_tags(&shape.tags))
        .ok_or_else(|| TemplateError::UnknownVmSize {
            group: shape.name.into(),
            size: shape.vm_size.into(),
        })?;
    let max_pods = shape.max_pods.unwrap_or(110);
    let (cpu_reserved, mem_reserved) = aks_reserved(size.vcpu, size.memory_mib, max_pods);
    let mut alloc = Resources::from([
        (
            "cpu".to_string(),
            i128::from(size.vcpu) * 1000 - cpu_reserved,
        ),
        (
            "memory".to_string(),
            (i128::from(size.memory_mib) * 1024 * 1024 - mem_reserved) * 1000,
        ),
        ("pods".to_string(), i128::from(max_pods) * 1000),
        (
            "ephemeral-storage".to_string(),
            ephemeral_storage_bytes(&size, &shape.profile) * 1000,
        ),
    ]);
    if size.gpu > 0 {
        alloc.insert("nvidia.com/gpu".into(), i128::from(size.gpu) * 1000);
    }
    let name = format!("template-{}", shape.name);
    let mut labels = BTreeMap::from([
        (
            "kubernetes.io/os".to_string(),
            if shape.profile.windows {
                "windows"
            } else {
                "linux"
            }
            .to_string(),
        ),
        ("kubernetes.io/arch".to_string(), "amd64".to_string()),
        (
            "node.kubernetes.io/instance-type".to_string(),
            shape.vm_size.to_string(),
        ),
        (
            "beta.kubernetes.io/instance-type".to_string(),
            shape.vm_size.to_string(),
        ),
        (HOSTNAME.to_string(), name.clone()),
    ]);
    if shape.aks_pool {
        labels.insert("kubernetes.azure.com/agentpool".into(), shape.name.into());
        labels.insert("agentpool".into(), shape.name.into());
    }
    let mut taints = Vec::new();
    for (tag, value) in &shape.tags {
        if let Some(k) = tag.strip_prefix(TAG_LABEL).filter(|k| !k.is_empty()) {
            labels.insert(decode_tag_key(k), value.clone());
        } else if let Some(k) = tag.strip_prefix(TAG_TAINT).filter(|k| !k.is_empty()) {
            taints.extend(parse_taint(Some(&decode_tag_key(k)), value));
        } else if let Some(k) = tag.strip_prefix(TAG_RESOURCE).filter(|k| !k.is_empty()) {
            if let Ok(q) = quantity::parse(value) {
                alloc.insert(decode_tag_key(k), q);
            }
        }
    }
    labels.extend(shape.node_labels.clone());
    taints.extend(
        shape
            .node_taints
            .iter()
            .filter_map(|t| parse_taint(None, t)),
    );
    if shape.profile.spot {
        // AKS puts both on every spot node, whatever the pool's own labels and taints say, so a
        // pod lands there only if it tolerates eviction.
        labels.insert(SPOT_KEY.into(), "spot".into());
        if !taints
            .iter()
            .any(|t| t.key == SPOT_KEY && t.effect == "NoSchedule")
        {
            taints.push(Taint {
                key: SPOT_KEY.into(),
                value: Some("spot".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            });
        }
    }
    let mut t = NodeState::new(&name, labels, taints, alloc);
    // A new node attaches as many Azure Disks as its size allows (the CSI driver's default
    // limit; a pool that changed `--volume-attach-limit` shows it on a live node's CSINode).
    if size.max_data_disks > 0 {
        t.set_volume_limits(Some(Arc::new(BTreeMap::from([(
            super::volumes::AZURE_DISK_DRIVER.to_string(),
            size.max_data_disks,
        )]))));
    }
    Ok(t)
}

/// The labels cluster-autoscaler's template tags give (`k8s.io_cluster-autoscaler_node-template_label_*`),
/// keys decoded.
fn tag_labels(tags: &BTreeMap<String, String>) -> impl Iterator<Item = (String, String)> + '_ {
    tags.iter().filter_map(|(tag, value)| {
        let k = tag.strip_prefix(TAG_LABEL).filter(|k| !k.is_empty())?;
        Some((decode_tag_key(k), value.clone()))
    })
}

/// Per CSI driver, how many volumes a node may attach (its `CSINode`).
pub type AttachLimits = Arc<BTreeMap<String, u32>>;

/// Where a group's template comes from: cluster-autoscaler's order of truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateSource {
    /// A Ready live node of the group, sanitized.
    LiveNode,
    /// The VM size and the group's tags or pool properties (scale from zero).
    Generated,
}

/// A group's template, in cluster-autoscaler's order of truth (its Azure provider's
/// `processVMSSTemplate` and core's mixed template provider):
/// - a Ready live node of the group, when there is one ([`from_live_node`]). A single-zone or
///   regional group keeps the node's zone labels (what AKS, or a kubelet's `--node-labels`,
///   really put there); a group spanning several zones gets one variant per zone ([`zoned`]),
///   since the next node's zone is Azure's choice;
/// - else the generated template ([`from_shape`], then [`zoned`]), on which **the node-template
///   tags override the generated labels**, zone included: an operator who tags a regional
///   group `..._label_topology.kubernetes.io_zone=westeurope-1` is believed.
///
/// `live_limits` are the live node's CSI attach limits (its `CSINode`), copied as
/// cluster-autoscaler copies the example node's `CSINode`.
pub fn template_for(
    group: &str,
    live: Option<(&NodeRecord, Option<AttachLimits>)>,
    shape: Option<&GroupShape>,
) -> Result<(NodeState, TemplateSource), TemplateError> {
    let (location, zones) = shape.map_or(("", &[][..]), |s| (s.location, s.zones));
    if let Some((node, limits)) = live {
        let mut t = from_live_node(node, group);
        if let Some(limits) = limits {
            t.set_volume_limits(Some(limits));
        }
        if zones.len() > 1 {
            zoned(&mut t, location, zones);
        } else if !location.is_empty() {
            // The region is the group's wherever the node says nothing; its zone stays the node's.
            Arc::make_mut(&mut t.labels)
                .entry(REGION_LABEL.into())
                .or_insert_with(|| location.to_ascii_lowercase());
        }
        return Ok((t, TemplateSource::LiveNode));
    }
    let Some(shape) = shape else {
        return Err(TemplateError::NoShape {
            group: group.into(),
        });
    };
    let mut t = from_shape(shape)?;
    zoned(&mut t, location, zones);
    let tagged: Vec<(String, String)> = tag_labels(&shape.tags).collect();
    if !tagged.is_empty() {
        Arc::make_mut(&mut t.labels).extend(tagged.iter().cloned());
        if let Some(variants) = t.zone_variants() {
            let variants = variants
                .iter()
                .map(|v| {
                    let mut v = v.clone();
                    v.extend(tagged.iter().cloned());
                    v
                })
                .collect();
            t.set_zone_variants(variants);
        }
    }
    Ok((t, TemplateSource::Generated))
}

/// A template copied from a live node of the group: its allocatable, labels (with a fresh
/// hostname) and taints, without its pods.
pub fn from_live_node(node: &NodeRecord, group: &str) -> NodeState {
    let mut t = NodeState::from_node(node, std::iter::empty());
    t.name = format!("template-{group}");
    Arc::make_mut(&mut t.labels).insert(HOSTNAME.into(), t.name.clone());
    // Taints the node carries only for a while (cordon, not-ready, our own scale-down taint)
    // would not be on a new node.
    Arc::make_mut(&mut t.taints).retain(|x| {
        !x.key.starts_with("node.kubernetes.io/") && !x.key.starts_with("vmss-capacity-controller")
    });
    t
}

/// The zone label kube-scheduler's topology filters and zonal volumes look at.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The region label.
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
/// The zone label the Azure Disk CSI driver sets (zonal disks' PV node affinity names it).
pub const DISK_ZONE_LABEL: &str = "topology.disk.csi.azure.com/zone";
const LEGACY_ZONE_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";

/// Where a new node of a group lands, on its template: the region label; with one zone, the
/// zone labels AKS sets (`<location>-<zone>`); with several, Azure chooses the zone, so the
/// template carries no zone label and one variant of its labels per zone, and a node selector or
/// required node affinity must match in every one of them: a pod that needs one zone is never
/// counted on a group that may put its node in another (for zonal workloads, one group per zone
/// is the supported layout, as cluster-autoscaler's FAQ says). A regional group's generated
/// template carries zone `0`, as AKS labels such nodes, and an empty disk zone, unless its
/// template tags say otherwise ([`template_for`] applies them after this). A live node's
/// template goes through here only for a group spanning several zones (its zone is that node's,
/// not the next one's).
pub fn zoned(t: &mut NodeState, location: &str, zones: &[String]) {
    if location.is_empty() {
        return;
    }
    let location = location.to_ascii_lowercase();
    let labels = Arc::make_mut(&mut t.labels);
    labels.insert(REGION_LABEL.into(), location.clone());
    match zones {
        // AKS labels a node outside any zone with zone `0`; the Azure Disk CSI driver reports
        // an empty disk zone for it (its NodeGetInfo), which a disk made there names.
        [] => {
            labels.insert(ZONE_LABEL.into(), "0".into());
            labels.insert(DISK_ZONE_LABEL.into(), String::new());
        }
        [zone] => {
            let z = format!("{location}-{zone}");
            labels.insert(ZONE_LABEL.into(), z.clone());
            labels.insert(DISK_ZONE_LABEL.into(), z);
        }
        several => {
            for k in [ZONE_LABEL, DISK_ZONE_LABEL, LEGACY_ZONE_LABEL] {
                labels.remove(k);
            }
            let base = labels.clone();
            let variants = several
                .iter()
                .map(|zone| {
                    let mut l = base.clone();
                    let z = format!("{location}-{zone}");
                    l.insert(ZONE_LABEL.into(), z.clone());
                    l.insert(DISK_ZONE_LABEL.into(), z);
                    l
                })
                .collect();
            t.set_zone_variants(variants);
        }
    }
}

/// The pod each DaemonSet would run on a new node, from its pod template (built once per
/// decision, then tried on every group's template).
pub fn daemonset_pods(daemonsets: &[Arc<DaemonSet>]) -> Vec<Arc<PodRecord>> {
    daemonsets
        .iter()
        .filter_map(|ds| {
            let template = &ds.spec.as_ref()?.template;
            let mut metadata = template.metadata.clone().unwrap_or_default();
            metadata.namespace = ds.metadata.namespace.clone();
            metadata.name = ds.metadata.name.clone();
            Some(Arc::new(PodRecord::of(Pod {
                metadata,
                spec: Some(template.spec.clone()?),
                status: None,
            })))
        })
        .collect()
}

/// Takes off what the DaemonSets that would run on the template take: the requests of each
/// DaemonSet pod ([`daemonset_pods`]) that fits the (empty) node.
pub fn subtract_daemonsets(template: &mut NodeState, daemonset_pods: &[Arc<PodRecord>]) {
    for pod in daemonset_pods {
        if template.fits(pod).is_ok() {
            template.place(pod.clone());
        }
    }
    // The DaemonSet pods stay placed: their requests, ports and labels count on the template.
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sizes_are_found_with_or_without_the_standard_prefix_in_any_case() {
        let d4 = vm_size("Standard_D4s_v5").unwrap();
        assert_eq!((d4.vcpu, d4.memory_mib, d4.gpu), (4, 16 * 1024, 0));
        assert_eq!(vm_size("d4s_v5"), Some(d4));
        assert_eq!(vm_size("standard_nc6s_v3").unwrap().gpu, 1);
        assert_eq!(vm_size("Standard_Z99"), None);
    }

    /// AKS's documented table: 1, 2, 4, 8, 16, 32, 64 cores reserve 60, 100, 140, 180, 260,
    /// 420, 740 millicores.
    #[test]
    fn cpu_reservations_follow_the_aks_table() {
        for (cores, milli) in [
            (1, 60),
            (2, 100),
            (4, 140),
            (8, 180),
            (16, 260),
            (32, 420),
            (64, 740),
        ] {
            assert_eq!(
                aks_reserved(cores, 64 * 1024, 110).0,
                milli,
                "{cores} cores"
            );
        }
    }

    #[test]
    fn memory_reservation_is_per_pod_capped_at_a_quarter_plus_the_eviction_threshold() {
        // 110 pods: 20 * 110 + 50 = 2250 MiB (< 4 GiB, a quarter of 16 GiB), + 100 MiB.
        assert_eq!(aks_reserved(4, 16 * 1024, 110).1, 2350 * 1024 * 1024);
        // A 4 GiB node: capped at a quarter (1024 MiB), + 100 MiB.
        assert_eq!(aks_reserved(2, 4 * 1024, 110).1, 1124 * 1024 * 1024);
    }

    #[test]
    fn a_size_missing_from_the_table_takes_its_shape_from_the_resource_tags_or_says_how_to_give_it()
    {
        let mut shape = GroupShape {
            name: "future",
            vm_size: "Standard_Z8s_v9",
            ..Default::default()
        };
        let err = from_shape(&shape).unwrap_err().to_string();
        assert!(!err.contains('\n'), "one line: {err}");
        assert!(
            err.starts_with(
                "node group future: VM size \"Standard_Z8s_v9\" is not in the built-in table"
            ),
            "{err}"
        );
        assert!(err.contains(&format!("`az vmss update -g RESOURCE_GROUP -n future --set tags.{TAG_RESOURCE}cpu=8 tags.{TAG_RESOURCE}memory=32Gi`")), "{err}");
        assert!(err.contains("or keep one node (minSize: 1)"));
        // cpu alone is not a shape.
        shape.tags = BTreeMap::from([(format!("{TAG_RESOURCE}cpu"), "8".to_string())]);
        assert!(from_shape(&shape).is_err());
        shape
            .tags
            .insert(format!("{TAG_RESOURCE}memory"), "32Gi".into());
        shape
            .tags
            .insert(format!("{TAG_RESOURCE}nvidia.com_gpu"), "2".into());
        let t = from_shape(&shape).expect("the tags give the shape");
        assert_eq!(t.allocatable["cpu"], 8000, "the tag's cpu, as allocatable");
        assert_eq!(t.allocatable["memory"], (32i128 << 30) * 1000);
        assert_eq!(t.allocatable["nvidia.com/gpu"], 2000);
        assert_eq!(
            t.labels["node.kubernetes.io/instance-type"],
            "Standard_Z8s_v9"
        );
        // Two data disks per vCPU, as the D and E series attach.
        assert_eq!(size_from_tags(&shape.tags).unwrap().max_data_disks, 16);
    }

    #[test]
    fn a_scale_set_template_reads_cluster_autoscalers_tags() {
        let shape = GroupShape {
            name: "gpu",
            vm_size: "Standard_NC6s_v3",
            tags: BTreeMap::from([
                (format!("{TAG_LABEL}accelerator"), "nvidia".to_string()),
                (
                    format!("{TAG_LABEL}example.com_team~2name"),
                    "ml".to_string(),
                ),
                (
                    format!("{TAG_TAINT}nvidia.com_gpu"),
                    "true:NoSchedule".to_string(),
                ),
                (format!("{TAG_RESOURCE}example.com_fpga"), "2".to_string()),
                ("unrelated".to_string(), "x".to_string()),
            ]),
            ..Default::default()
        };
        let t = from_shape(&shape).unwrap();
        assert_eq!(t.labels["accelerator"], "nvidia");
        assert_eq!(t.labels["example.com/team_name"], "ml");
        assert_eq!(
            t.labels["node.kubernetes.io/instance-type"],
            "Standard_NC6s_v3"
        );
        assert_eq!(t.taints.len(), 1);
        assert_eq!(t.taints[0].key, "nvidia.com/gpu");
        assert_eq!(t.taints[0].value.as_deref(), Some("true"));
        assert_eq!(t.allocatable["nvidia.com/gpu"], 1000);
        assert_eq!(t.allocatable["example.com/fpga"], 2000);
        assert_eq!(t.allocatable["cpu"], 6000 - (140 + 20));
    }

    #[test]
    fn an_agent_pool_template_reads_its_labels_taints_and_max_pods() {
        let shape = GroupShape {
            name: "mem",
            vm_size: "Standard_E8s_v5",
            node_labels: BTreeMap::from([("workload".to_string(), "memory".to_string())]),
            node_taints: vec!["dedicated=mem:NoSchedule".to_string(), "bogus".to_string()],
            max_pods: Some(30),
            aks_pool: true,
            ..Default::default()
        };
        let t = from_shape(&shape).unwrap();
        assert_eq!(t.labels["workload"], "memory");
        assert_eq!(t.labels["kubernetes.azure.com/agentpool"], "mem");
        assert_eq!(t.taints.len(), 1, "an unparseable taint is skipped");
        assert_eq!(t.allocatable["pods"], 30_000);
        // 64 GiB: kube-reserved 20 * 30 + 50 = 650 MiB, + 100 MiB eviction.
        assert_eq!(
            t.allocatable["memory"],
            ((64 * 1024 - 750) as i128) * 1024 * 1024 * 1000
        );
    }

    #[test]
    fn a_spot_group_template_carries_aks_spot_label_and_taint_once() {
        use crate::cache::VmProfile;
        let spot = VmProfile {
            spot: true,
            ..VmProfile::default()
        };
        let shape = GroupShape {
            name: "spot",
            vm_size: "Standard_D4s_v5",
            // The pool already names the taint: it is not doubled.
            node_taints: vec!["kubernetes.azure.com/scalesetpriority=spot:NoSchedule".into()],
            aks_pool: true,
            profile: spot,
            ..GroupShape::default()
        };
        let t = from_shape(&shape).expect("template");
        assert_eq!(t.labels[SPOT_KEY], "spot");
        assert_eq!(t.taints.len(), 1, "{:?}", t.taints);
        let t = from_shape(&GroupShape {
            node_taints: vec![],
            aks_pool: false,
            ..shape.clone()
        })
        .expect("template");
        assert_eq!(t.taints.len(), 1);
        assert_eq!(t.taints[0].key, SPOT_KEY);
        assert_eq!(t.taints[0].value.as_deref(), Some("spot"));
        assert_eq!(t.taints[0].effect, "NoSchedule");
        // A regular group carries neither.
        let t = from_shape(&GroupShape {
            profile: VmProfile::default(),
            node_taints: vec![],
            ..shape
        })
        .expect("template");
        assert!(!t.labels.contains_key(SPOT_KEY));
        assert!(t.taints.iter().all(|x| x.key != SPOT_KEY), "{:?}", t.taints);
    }

    #[test]
    fn an_unknown_size_without_a_live_node_is_an_error_that_names_it() {
        let e = from_shape(&GroupShape {
            name: "x",
            vm_size: "Standard_Q1",
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("Standard_Q1"));
    }

    #[test]
    fn a_live_node_template_keeps_shape_and_drops_transient_taints() {
        let n: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
            "metadata": {"name": "aks-gen-1", "labels": {"kubernetes.io/hostname": "aks-gen-1", "pool": "gen"}},
            "spec": {"taints": [
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                {"key": "dedicated", "value": "gen", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "3860m", "memory": "13Gi", "pods": "110"}},
        }))
        .unwrap();
        let t = from_live_node(&NodeRecord::of(n), "gen");
        assert_eq!(t.allocatable["cpu"], 3860);
        assert_eq!(t.labels[HOSTNAME], "template-gen");
        assert_eq!(t.taints.len(), 1);
        assert!(t.pods().is_empty());
    }

    #[test]
    fn daemonsets_that_would_run_on_the_new_node_take_their_share() {
        let mut t = from_shape(&GroupShape {
            name: "g",
            vm_size: "Standard_D4s_v5",
            ..Default::default()
        })
        .unwrap();
        let ds = |name: &str, cpu: &str, selector: serde_json::Value| -> Arc<DaemonSet> {
            Arc::new(
                serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "kube-system"},
                    "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"nodeSelector": selector, "containers": [
                            {"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}},
                }))
                .unwrap(),
            )
        };
        let before = t.free("cpu");
        subtract_daemonsets(
            &mut t,
            &daemonset_pods(&[
                ds("kube-proxy", "100m", json!({})),
                ds("gpu-plugin", "50m", json!({"accelerator": "nvidia"})),
            ]),
        );
        assert_eq!(
            before - t.free("cpu"),
            100,
            "only the DaemonSet that would run counts"
        );
        assert_eq!(t.free("pods"), 109 * 1000);
    }

    fn pod(requests: serde_json::Value, selector: serde_json::Value) -> Arc<PodRecord> {
        Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {"nodeSelector": selector, "containers": [
                    {"name": "c", "resources": {"requests": requests}}]}
            }))
            .unwrap(),
        ))
    }

    #[test]
    fn a_pod_asking_for_ephemeral_storage_fits_a_template_built_from_zero() {
        // A LimitRange default gives every container an ephemeral-storage request.
        let t = from_shape(&GroupShape {
            name: "g",
            vm_size: "Standard_D4s_v5",
            ..Default::default()
        })
        .unwrap();
        let asks = pod(
            json!({"cpu": "500m", "ephemeral-storage": "2Gi"}),
            json!({}),
        );
        assert_eq!(t.fits(&asks), Ok(()));
        // AKS's default 128 GiB OS disk less the 10 % hard eviction threshold.
        let disk = 128_i128 << 30;
        let allocatable = disk - disk / 10;
        assert_eq!(t.allocatable["ephemeral-storage"], allocatable * 1000);
        let too_much = pod(json!({"ephemeral-storage": "120Gi"}), json!({}));
        assert!(t.fits(&too_much).is_err(), "115.2 GiB allocatable");
    }

    #[test]
    fn the_kubelets_disk_is_the_os_disk_as_set_or_the_temporary_disk_when_the_pool_says_so() {
        let d8ds = vm_size("Standard_D8ds_v5").unwrap();
        let os = |gib: Option<u32>, temp: bool| {
            ephemeral_storage_bytes(
                &d8ds,
                &VmProfile {
                    os_disk_gib: gib,
                    kubelet_on_temp_disk: temp,
                    ..Default::default()
                },
            ) >> 30
        };
        assert_eq!(os(Some(30), false), 27);
        assert_eq!(os(None, false), 115);
        assert_eq!(os(Some(30), true), 270, "the 300 GiB temporary disk");
        // A size without a temporary disk keeps the OS disk.
        let d8s = vm_size("Standard_D8s_v5").unwrap();
        assert_eq!(
            ephemeral_storage_bytes(
                &d8s,
                &VmProfile {
                    os_disk_gib: Some(64),
                    kubelet_on_temp_disk: true,
                    ..Default::default()
                }
            ) >> 30,
            57
        );
    }

    #[test]
    fn a_windows_pool_builds_a_windows_template_that_linux_pods_do_not_fit() {
        let windows = from_shape(&GroupShape {
            name: "win",
            vm_size: "Standard_D4s_v5",
            aks_pool: true,
            profile: VmProfile {
                windows: true,
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap();
        assert_eq!(windows.labels["kubernetes.io/os"], "windows");
        let linux_pod = pod(json!({"cpu": "100m"}), json!({"kubernetes.io/os": "linux"}));
        assert!(windows.fits(&linux_pod).is_err());
        let windows_pod = pod(
            json!({"cpu": "100m"}),
            json!({"kubernetes.io/os": "windows"}),
        );
        assert_eq!(windows.fits(&windows_pod), Ok(()));
    }

    #[test]
    fn daemonsets_ephemeral_storage_is_taken_off_the_template() {
        let mut t = from_shape(&GroupShape {
            name: "g",
            vm_size: "Standard_D4s_v5",
            profile: VmProfile {
                os_disk_gib: Some(30),
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap();
        let before = t.free("ephemeral-storage");
        let ds: Arc<DaemonSet> = Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "logs", "namespace": "kube-system"},
                "spec": {"selector": {"matchLabels": {"app": "logs"}}, "template": {
                    "metadata": {"labels": {"app": "logs"}},
                    "spec": {"containers": [{"name": "c", "resources": {"requests":
                        {"cpu": "50m", "ephemeral-storage": "5Gi"}}}]}}},
            }))
            .unwrap(),
        );
        subtract_daemonsets(&mut t, &daemonset_pods(&[ds]));
        assert_eq!(before - t.free("ephemeral-storage"), (5_i128 << 30) * 1000);
        // 27 GiB allocatable, 5 taken by the DaemonSet: a pod asking for 23 GiB does not fit.
        let big = pod(json!({"ephemeral-storage": "23Gi"}), json!({}));
        assert!(t.fits(&big).is_err());
    }
}
