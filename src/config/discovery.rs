//! Tag auto-discovery, cluster-autoscaler style: which scale sets (and, with `aksCluster`, which
//! agent pools of that managed cluster) are ours (the `cluster-autoscaler-enabled` and
//! `cluster-autoscaler-name` tags) and their bounds (`min` and `max` tags), plus the
//! `autoDiscovery` block that configures it. Both kinds share one tag reader.

use super::raw::RawAutoDiscovery;
use super::sources::{CloudConfig, EnvReader};
use super::validate::{
    check_cluster_name, check_pool_name, check_resource_group_name, check_scale_set_name,
};
use super::{
    non_empty, AutoDiscovery, NodeGroupKind, NodeGroupSpec, Problems, MAX_SCALE_SET_CAPACITY,
};
use std::collections::BTreeMap;

/// The `autoDiscovery` block, validated. `CLUSTER_NAME` (or azure.json `clusterName`) overrides
/// its `clusterName`; without the block, a cluster name alone enables discovery when no node
/// group is listed (no default bounds: only scale sets with `min`/`max` tags).
pub(super) fn auto_discovery(
    raw: Option<RawAutoDiscovery>,
    env: &EnvReader,
    cc: &CloudConfig,
    no_node_groups: bool,
    problems: &mut Problems,
) -> Option<AutoDiscovery> {
    let Some(ad) = raw else {
        // cluster-autoscaler deployments without --nodes discover by cluster name.
        if !no_node_groups {
            return None;
        }
        let cluster = env
            .get("CLUSTER_NAME")
            .map(|v| v.value)
            .or_else(|| non_empty(cc.cluster_name.clone()));
        return cluster.map(|cluster_name| AutoDiscovery {
            cluster_name,
            default_min: None,
            default_max: None,
            aks_cluster: None,
            aks_resource_group: None,
        });
    };
    let cluster = env
        .get("CLUSTER_NAME")
        .map(|v| v.value)
        .or(non_empty(ad.cluster_name))
        .or(non_empty(cc.cluster_name.clone()));
    let cluster_name = match cluster {
        Some(c) => c,
        None => {
            problems.push(
                "autoDiscovery.clusterName",
                "required (or set CLUSTER_NAME)",
            );
            String::new()
        }
    };
    if let (Some(a), Some(b)) = (ad.default_min, ad.default_max) {
        if a > b {
            problems.push(
                "autoDiscovery.defaultMin",
                format!("defaultMin {a} is greater than defaultMax {b}"),
            );
        }
    }
    if ad.default_max.is_some_and(|m| m > MAX_SCALE_SET_CAPACITY) {
        problems.push(
            "autoDiscovery.defaultMax",
            format!("above the scale-set limit of {MAX_SCALE_SET_CAPACITY}"),
        );
    }
    let (aks_cluster, aks_resource_group) =
        aks_discovery(ad.aks_cluster, ad.aks_resource_group, problems);
    Some(AutoDiscovery {
        cluster_name,
        default_min: ad.default_min,
        default_max: ad.default_max,
        aks_cluster,
        aks_resource_group,
    })
}

/// `autoDiscovery.aksCluster` and `autoDiscovery.aksResourceGroup` (only with a cluster).
fn aks_discovery(
    cluster: Option<String>,
    resource_group: Option<String>,
    problems: &mut Problems,
) -> (Option<String>, Option<String>) {
    let cluster = non_empty(cluster);
    let resource_group = non_empty(resource_group);
    if let Some(c) = &cluster {
        if let Err(m) = check_cluster_name(c) {
            problems.push("autoDiscovery.aksCluster", m);
        }
    }
    if let Some(rg) = &resource_group {
        if cluster.is_none() {
            problems.push(
                "autoDiscovery.aksResourceGroup",
                "only with autoDiscovery.aksCluster (the managed cluster whose pools are discovered)",
            );
        } else if let Err(m) = check_resource_group_name(rg) {
            problems.push("autoDiscovery.aksResourceGroup", m);
        }
    }
    (cluster, resource_group)
}

/// Tag that opts a scale set or agent pool into auto-discovery (value `true`).
pub const TAG_ENABLED: &str = "cluster-autoscaler-enabled";
/// Tag naming the cluster a scale set or agent pool belongs to.
pub const TAG_CLUSTER_NAME: &str = "cluster-autoscaler-name";
/// Tag with the scale set's or agent pool's minimum size.
pub const TAG_MIN: &str = "min";
/// Tag with the scale set's or agent pool's maximum size.
pub const TAG_MAX: &str = "max";

/// A tag's value, trimmed.
fn tag<'a>(tags: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    // Azure tag names are case-insensitive.
    tags.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v.trim())
}

/// Picks the scale sets that auto-discovery manages: tagged `cluster-autoscaler-enabled=true` and
/// `cluster-autoscaler-name=<cluster>`, with bounds from the `min`/`max` tags (tags win over the
/// defaults). Returns the node groups and the skipped scale sets with the reason, for the log.
/// Scale sets without the two discovery tags are not ours and are not reported.
pub fn discover_node_groups(
    auto: &AutoDiscovery,
    scale_sets: &[(String, BTreeMap<String, String>)],
) -> (Vec<NodeGroupSpec>, Vec<(String, String)>) {
    discover(auto, scale_sets, check_scale_set_name, || {
        (NodeGroupKind::Vmss, None)
    })
}

/// Picks the agent pools of the managed cluster `cluster` (in `resource_group`, `None` meaning
/// `azure.resourceGroup`) that auto-discovery manages, by the same tags and rules as
/// [`discover_node_groups`]; `tagged` holds each pool's name and tags. Pools whose name AKS would
/// not accept are skipped with the reason.
pub fn discover_pools(
    auto: &AutoDiscovery,
    cluster: &str,
    resource_group: Option<&str>,
    tagged: &[(String, BTreeMap<String, String>)],
) -> (Vec<NodeGroupSpec>, Vec<(String, String)>) {
    discover(auto, tagged, check_pool_name, || {
        (
            NodeGroupKind::AksAgentPool {
                cluster: cluster.to_string(),
            },
            resource_group.map(str::to_string),
        )
    })
}

/// The discovery loop shared by both kinds: `check_name` is the kind's naming rule and
/// `backing` what every found group is backed by (kind and resource group).
fn discover(
    auto: &AutoDiscovery,
    tagged: &[(String, BTreeMap<String, String>)],
    check_name: fn(&str) -> Result<(), String>,
    backing: impl Fn() -> (NodeGroupKind, Option<String>),
) -> (Vec<NodeGroupSpec>, Vec<(String, String)>) {
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    for (name, tags) in tagged {
        let Some(bounds) = tagged_bounds(auto, tags) else {
            continue;
        };
        match bounds.and_then(|b| check_name(name).map(|()| b)) {
            Ok((min, max)) => {
                let (kind, resource_group) = backing();
                found.push(NodeGroupSpec {
                    name: name.clone(),
                    kind,
                    resource_group,
                    min_size: min,
                    max_size: max,
                    desired_capacity: None,
                    schedules: Vec::new(),
                    max_scale_down_step: None,
                });
            }
            Err(reason) => skipped.push((name.clone(), reason)),
        }
    }
    (found, skipped)
}

/// `None` if the tags do not opt into discovery for `auto.cluster_name` (not ours); otherwise
/// the bounds from the `min`/`max` tags or the defaults, or why they are unusable.
fn tagged_bounds(
    auto: &AutoDiscovery,
    tags: &BTreeMap<String, String>,
) -> Option<Result<(u32, u32), String>> {
    let enabled = tag(tags, TAG_ENABLED).is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let cluster = tag(tags, TAG_CLUSTER_NAME);
    if !enabled || cluster != Some(auto.cluster_name.as_str()) {
        return None;
    }
    let bound = |key: &str, default: Option<u32>, what: &str| -> Result<u32, String> {
        match tag(tags, key) {
            Some(v) => v
                .parse::<u32>()
                .map_err(|_| format!("{key} tag {v:?} is not a non-negative integer")),
            None => default.ok_or_else(|| format!("no {key} tag and no {what}")),
        }
    };
    Some(
        bound(TAG_MIN, auto.default_min, "defaultMin").and_then(|min| {
            let max = bound(TAG_MAX, auto.default_max, "defaultMax")?;
            if max < min {
                return Err(format!("max {max} is less than min {min}"));
            }
            if max > MAX_SCALE_SET_CAPACITY {
                return Err(format!(
                    "max {max} is above the scale-set limit of {MAX_SCALE_SET_CAPACITY}"
                ));
            }
            Ok((min, max))
        }),
    )
}
