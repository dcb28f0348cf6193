//! Tag auto-discovery, cluster-autoscaler style: which scale sets are ours (the
//! `cluster-autoscaler-enabled` and `cluster-autoscaler-name` tags) and their bounds (`min` and
//! `max` tags), plus the `autoDiscovery` block that configures it.

use super::raw::RawAutoDiscovery;
use super::sources::{CloudConfig, EnvReader};
use super::validate::check_scale_set_name;
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
    Some(AutoDiscovery {
        cluster_name,
        default_min: ad.default_min,
        default_max: ad.default_max,
    })
}

/// Tag that opts a scale set into auto-discovery (value `true`).
pub const TAG_ENABLED: &str = "cluster-autoscaler-enabled";
/// Tag naming the cluster a scale set belongs to.
pub const TAG_CLUSTER_NAME: &str = "cluster-autoscaler-name";
/// Tag with the scale set's minimum size.
pub const TAG_MIN: &str = "min";
/// Tag with the scale set's maximum size.
pub const TAG_MAX: &str = "max";

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
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    for (name, tags) in scale_sets {
        let enabled = tag(tags, TAG_ENABLED).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let cluster = tag(tags, TAG_CLUSTER_NAME);
        if !enabled || cluster != Some(auto.cluster_name.as_str()) {
            continue;
        }
        let bound = |key: &str, default: Option<u32>, what: &str| -> Result<u32, String> {
            match tag(tags, key) {
                Some(v) => v
                    .parse::<u32>()
                    .map_err(|_| format!("{key} tag {v:?} is not a non-negative integer")),
                None => default.ok_or_else(|| format!("no {key} tag and no {what}")),
            }
        };
        let result = bound(TAG_MIN, auto.default_min, "defaultMin").and_then(|min| {
            let max = bound(TAG_MAX, auto.default_max, "defaultMax")?;
            if max < min {
                return Err(format!("max {max} is less than min {min}"));
            }
            if max > MAX_SCALE_SET_CAPACITY {
                return Err(format!(
                    "max {max} is above the scale-set limit of {MAX_SCALE_SET_CAPACITY}"
                ));
            }
            check_scale_set_name(name)?;
            Ok((min, max))
        });
        match result {
            Ok((min, max)) => found.push(NodeGroupSpec {
                name: name.clone(),
                kind: NodeGroupKind::Vmss,
                resource_group: None,
                min_size: min,
                max_size: max,
                desired_capacity: None,
                schedules: Vec::new(),
                max_scale_down_step: None,
            }),
            Err(reason) => skipped.push((name.clone(), reason)),
        }
    }
    (found, skipped)
}
