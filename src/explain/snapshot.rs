//! A [`World`] from files, for `explain --snapshot DIR`: no credentials, no network.
//!
//! Every `*.json` file of the directory is read. A file holds one object, a Kubernetes list
//! (`kubectl get nodes,pods,pdb,daemonsets,pvc,pv,storageclasses,csinodes,namespaces -A -o json`: `items`) or an ARM list (`value`), and
//! each object is taken by what it is: a `Node`, `Pod`, `PodDisruptionBudget` or `DaemonSet` by
//! its `kind`; a scale set or an agent pool by its ARM `type`
//! (`Microsoft.Compute/virtualMachineScaleSets`, `Microsoft.ContainerService/managedClusters/agentPools`).
//! Both ARM's own JSON (`az rest`, the REST API: fields under `properties`) and the Azure CLI's
//! flattened output (`az vmss list -o json`, `az aks nodepool list -o json`) are read. Other
//! kinds are counted and left out. An object that says it is one of these and does not parse is
//! an error naming the file and the object.

use super::controller::ControllerStatus;
use super::{Group, World};
use crate::cache::ScaleSet;
use crate::config::{NodeGroupKind, NodeGroupSpec, PodDemandSettings, ScaleDownSettings, Settings};
use crate::node_groups::Backing;
use crate::pods::record::{NodeRecord, PodRecord};
use crate::pods::topology::NamespaceLabels;
use crate::pods::volumes::Volumes;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a directory of files held.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Nodes.
    pub nodes: Vec<Arc<NodeRecord>>,
    /// Pods.
    pub pods: Vec<Arc<PodRecord>>,
    /// VM instances by node-group name (lower case), where they were listed.
    pub instances: BTreeMap<String, Vec<crate::cache::Instance>>,
    /// PodDisruptionBudgets.
    pub pdbs: Vec<Arc<PodDisruptionBudget>>,
    /// DaemonSets.
    pub daemonsets: Vec<Arc<DaemonSet>>,
    /// PersistentVolumeClaims.
    pub claims: Vec<PersistentVolumeClaim>,
    /// PersistentVolumes.
    pub volumes: Vec<PersistentVolume>,
    /// StorageClasses.
    pub classes: Vec<StorageClass>,
    /// CSINodes.
    pub csi_nodes: Vec<CSINode>,
    /// Namespaces, with their labels.
    pub namespaces: Vec<(String, BTreeMap<String, String>)>,
    /// ConfigMaps (the running controller's status is one of them:
    /// `kubectl -n kube-system get configmap vmss-capacity-controller-status -o json`).
    pub config_maps: Vec<ConfigMap>,
    /// Scale sets, with their resource group.
    pub scale_sets: Vec<(String, ScaleSet)>,
    /// Agent pools, with their managed cluster's resource group and name.
    pub pools: Vec<(String, String, ScaleSet)>,
    /// Compute usages by region (lowercase): `az vm list-usage -l REGION -o json` saved as
    /// `usages-REGION.json`, or ARM's own list.
    pub usages: BTreeMap<String, Vec<crate::capacity::Usage>>,
    /// What reading could not do (said with the explanation).
    pub notes: Vec<String>,
    /// Read from files (`--snapshot`), not from the APIs: the moment it shows is the one its
    /// controller status was written at, not now.
    pub from_files: bool,
    /// Objects of other kinds, counted by kind.
    pub ignored: BTreeMap<String, usize>,
}

/// A file or object that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SnapshotError {
    /// The file (and object) at fault.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

fn err(path: impl Into<String>, message: impl Into<String>) -> SnapshotError {
    SnapshotError {
        path: path.into(),
        message: message.into(),
    }
}

/// Reads every `*.json` file of `dir`.
pub fn load(dir: &Path) -> Result<Snapshot, SnapshotError> {
    let shown = dir.display().to_string();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| err(&shown, format!("cannot read the directory: {e}")))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("json"))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(err(
            &shown,
            "no *.json file: save `kubectl get nodes,pods,pdb,daemonsets,pvc,pv,storageclasses,csinodes,namespaces -A -o json` and `az vmss list -g <node resource group> -o json` (or `az aks nodepool list ... -o json`) there",
        ));
    }
    let mut out = Snapshot {
        from_files: true,
        ..Snapshot::default()
    };
    for file in files {
        let name = file.display().to_string();
        let text =
            std::fs::read_to_string(&file).map_err(|e| err(&name, format!("cannot read: {e}")))?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| err(&name, format!("not JSON: {e}")))?;
        let items: Vec<Value> = match value {
            Value::Array(items) => items,
            Value::Object(ref m) => match (m.get("items"), m.get("value")) {
                (Some(Value::Array(items)), _) | (_, Some(Value::Array(items))) => items.clone(),
                _ => vec![value],
            },
            _ => return Err(err(&name, "neither an object nor a list of objects")),
        };
        for (i, item) in items.into_iter().enumerate() {
            let at = format!("{name}[{i}]");
            if let Some(usage) = usage_of(&item) {
                // `az vm list-usage` does not say the region: the file name does.
                let file_name = file
                    .file_name()
                    .map(|n| n.to_string_lossy().to_ascii_lowercase())
                    .unwrap_or_default();
                let region = file_name
                    .strip_prefix("usages-")
                    .and_then(|n| n.strip_suffix(".json"))
                    .filter(|r| !r.is_empty())
                    .ok_or_else(|| {
                        err(
                            &at,
                            "a compute usage, in a file not named usages-REGION.json: name the file for its region (az vm list-usage -l westeurope -o json > usages-westeurope.json)",
                        )
                    })?;
                let usage = usage.map_err(|m| err(&at, m))?;
                out.usages
                    .entry(region.to_ascii_lowercase())
                    .or_default()
                    .push(usage);
                continue;
            }
            out.add(item, &at)?;
        }
    }
    Ok(out)
}

/// A compute usage (`name.value`, `currentValue`, `limit`; the Azure CLI writes the numbers as
/// strings), if `item` is one: `Some(Err)` when it is one that does not parse.
fn usage_of(item: &Value) -> Option<Result<crate::capacity::Usage, String>> {
    let name = item.pointer("/name/value")?.as_str()?;
    let (current, limit) = (item.get("currentValue")?, item.get("limit")?);
    let number = |v: &Value| {
        v.as_i64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
    };
    Some(match (number(current), number(limit)) {
        (Some(current), Some(limit)) => Ok(crate::capacity::Usage {
            name: name.to_string(),
            current,
            limit,
        }),
        _ => Err(format!(
            "compute usage {name}: currentValue {current} and limit {limit} must be integers"
        )),
    })
}

impl Snapshot {
    fn add(&mut self, item: Value, at: &str) -> Result<(), SnapshotError> {
        let shown = item
            .pointer("/metadata/name")
            .or_else(|| item.get("name"))
            .and_then(Value::as_str)
            .map(|n| format!("{at} ({n})"))
            .unwrap_or_else(|| at.to_string());
        let label = || shown.clone();
        let kind = item.get("kind").and_then(Value::as_str).unwrap_or_default();
        let arm_type = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_ascii_lowercase();
        match kind {
            "Node" => {
                let node: Node = serde_json::from_value(item.clone())
                    .map_err(|e| err(label(), format!("not a Node: {e}")))?;
                self.nodes.push(Arc::new(NodeRecord::of(node)));
                return Ok(());
            }
            "Pod" => {
                let pod: Pod = serde_json::from_value(item.clone())
                    .map_err(|e| err(label(), format!("not a Pod: {e}")))?;
                self.pods.push(Arc::new(PodRecord::of(pod)));
                return Ok(());
            }
            "PodDisruptionBudget" => {
                let pdb: PodDisruptionBudget =
                    serde_json::from_value(item.clone()).map_err(|e| {
                        err(
                            label(),
                            format!("not a PodDisruptionBudget (policy/v1): {e}"),
                        )
                    })?;
                self.pdbs.push(Arc::new(pdb));
                return Ok(());
            }
            "DaemonSet" => {
                let ds: DaemonSet = serde_json::from_value(item.clone())
                    .map_err(|e| err(label(), format!("not a DaemonSet: {e}")))?;
                self.daemonsets.push(Arc::new(ds));
                return Ok(());
            }
            "PersistentVolumeClaim" => {
                self.claims.push(
                    serde_json::from_value(item.clone())
                        .map_err(|e| err(label(), format!("not a PersistentVolumeClaim: {e}")))?,
                );
                return Ok(());
            }
            "PersistentVolume" => {
                self.volumes.push(
                    serde_json::from_value(item.clone())
                        .map_err(|e| err(label(), format!("not a PersistentVolume: {e}")))?,
                );
                return Ok(());
            }
            "StorageClass" => {
                self.classes
                    .push(serde_json::from_value(item.clone()).map_err(|e| {
                        err(
                            label(),
                            format!("not a StorageClass (storage.k8s.io/v1): {e}"),
                        )
                    })?);
                return Ok(());
            }
            "Namespace" => {
                let ns: Namespace = serde_json::from_value(item.clone())
                    .map_err(|e| err(label(), format!("not a Namespace: {e}")))?;
                if let Some(name) = ns.metadata.name {
                    self.namespaces
                        .push((name, ns.metadata.labels.unwrap_or_default()));
                }
                return Ok(());
            }
            "ConfigMap" => {
                self.config_maps.push(
                    serde_json::from_value(item.clone())
                        .map_err(|e| err(label(), format!("not a ConfigMap: {e}")))?,
                );
                return Ok(());
            }
            "CSINode" => {
                self.csi_nodes
                    .push(serde_json::from_value(item.clone()).map_err(|e| {
                        err(label(), format!("not a CSINode (storage.k8s.io/v1): {e}"))
                    })?);
                return Ok(());
            }
            "" => {}
            other => {
                *self.ignored.entry(other.to_string()).or_default() += 1;
                return Ok(());
            }
        }
        let id = item
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let segment = |key: &str| -> Option<String> {
            let parts: Vec<&str> = id.split('/').collect();
            parts
                .iter()
                .position(|p| p.eq_ignore_ascii_case(key))
                .and_then(|i| parts.get(i + 1))
                .map(|s| s.to_string())
        };
        if arm_type == "microsoft.compute/virtualmachinescalesets" {
            let rg = segment("resourceGroups").unwrap_or_default();
            let model = serde_json::from_value(arm_shape(item.clone(), SCALE_SET_ENVELOPE))
                .map_err(|e| err(label(), format!("not a scale set: {e}")))?;
            let etag = item.get("etag").and_then(Value::as_str).map(str::to_string);
            let ss = crate::azure::arm::scale_set_from_model(model, etag)
                .map_err(|e| err(label(), e))?;
            self.scale_sets.push((rg, ss));
        } else if arm_type == "microsoft.containerservice/managedclusters/agentpools" {
            let (Some(rg), Some(cluster)) = (segment("resourceGroups"), segment("managedClusters"))
            else {
                return Err(err(
                    label(),
                    "an agent pool whose id names no resource group and managed cluster",
                ));
            };
            let ss =
                crate::azure::aks::pool_from_json(&cluster, arm_shape(item, POOL_ENVELOPE), None)
                    .map_err(|e| err(label(), e))?;
            self.pools.push((rg, cluster, ss));
        } else {
            let what = if arm_type.is_empty() {
                "no kind".to_string()
            } else {
                arm_type
            };
            *self.ignored.entry(what).or_default() += 1;
        }
        Ok(())
    }

    /// The world `explain` looks at: the node groups of `settings` (and its auto-discovery), or,
    /// without settings, every scale set and pool of the snapshot with bounds from its
    /// cluster-autoscaler `min`/`max` tags (0 and 1000 when untagged). Notes say what was
    /// assumed.
    pub fn world(mut self, settings: Option<&Settings>) -> (World, Vec<String>) {
        let mut notes = std::mem::take(&mut self.notes);
        let find_ss = |g: &NodeGroupSpec, rg: &str| {
            self.scale_sets
                .iter()
                .find(|(r, s)| {
                    s.name.eq_ignore_ascii_case(&g.name)
                        && (rg.is_empty() || r.eq_ignore_ascii_case(rg))
                })
                .map(|(r, s)| (r.clone(), s.clone()))
        };
        let mut groups = Vec::new();
        match settings {
            Some(settings) => {
                let mut specs = settings.node_groups.clone();
                if let Some(auto) = &settings.auto_discovery {
                    let tagged: Vec<(String, BTreeMap<String, String>)> = self
                        .scale_sets
                        .iter()
                        .map(|(_, s)| (s.name.clone(), s.tags.clone()))
                        .collect();
                    for g in crate::config::discover_node_groups(auto, &tagged).0 {
                        if !specs.iter().any(|s| s.name.eq_ignore_ascii_case(&g.name)) {
                            specs.push(g);
                        }
                    }
                }
                for spec in specs {
                    let group = match &spec.kind {
                        NodeGroupKind::Vmss => {
                            let rg = spec
                                .resource_group
                                .clone()
                                .unwrap_or_else(|| settings.azure.resource_group.clone());
                            let found = find_ss(&spec, &rg);
                            if found.is_none() {
                                notes.push(format!("scale set {} (resource group {rg}) is not in the snapshot: its size is unknown and it is never planned", spec.name));
                            }
                            Group {
                                backing: Backing::ScaleSet {
                                    resource_group: rg,
                                    name: spec.name.clone(),
                                },
                                resource: found.map(|(_, s)| s),
                                instances: Vec::new(),
                                spec,
                            }
                        }
                        NodeGroupKind::AksAgentPool { cluster } => {
                            let found = self
                                .pools
                                .iter()
                                .find(|(_, c, p)| {
                                    c.eq_ignore_ascii_case(cluster)
                                        && p.name.eq_ignore_ascii_case(&spec.name)
                                })
                                .map(|(_, _, p)| p.clone());
                            if found.is_none() {
                                notes.push(format!("agent pool {} of cluster {cluster} is not in the snapshot: its size is unknown and it is never planned", spec.name));
                            }
                            Group {
                                backing: Backing::AgentPool {
                                    pool: spec.name.clone(),
                                },
                                resource: found,
                                instances: Vec::new(),
                                spec,
                            }
                        }
                    };
                    groups.push(group);
                }
            }
            None => {
                let bounds = |tags: &BTreeMap<String, String>| {
                    let get = |k: &str| tags.get(k).and_then(|v| v.parse::<u32>().ok());
                    (get(crate::config::TAG_MIN), get(crate::config::TAG_MAX))
                };
                let mut untagged = Vec::new();
                for (rg, s) in &self.scale_sets {
                    let (min, max) = bounds(&s.tags);
                    if min.is_none() || max.is_none() {
                        untagged.push(s.name.clone());
                    }
                    groups.push(Group {
                        spec: spec(&s.name, NodeGroupKind::Vmss, min, max),
                        backing: Backing::ScaleSet {
                            resource_group: rg.clone(),
                            name: s.name.clone(),
                        },
                        resource: Some(s.clone()),
                        instances: Vec::new(),
                    });
                }
                for (rg, cluster, p) in &self.pools {
                    let (min, max) = bounds(&p.tags);
                    if min.is_none() || max.is_none() {
                        untagged.push(p.name.clone());
                    }
                    let mut s = spec(
                        &p.name,
                        NodeGroupKind::AksAgentPool {
                            cluster: cluster.clone(),
                        },
                        min,
                        max,
                    );
                    s.resource_group = Some(rg.clone());
                    groups.push(Group {
                        spec: s,
                        backing: Backing::AgentPool {
                            pool: p.name.clone(),
                        },
                        resource: Some(p.clone()),
                        instances: Vec::new(),
                    });
                }
                notes.push("no --config: every scale set and agent pool of the snapshot is a node group, with cluster-autoscaler's podDemand and scaleDown defaults".into());
                if !untagged.is_empty() {
                    notes.push(format!(
                        "no min/max tags on {}: bounds 0 to 1000 assumed (give --config for real ones)",
                        untagged.join(", ")
                    ));
                }
            }
        }
        if !self.ignored.is_empty() {
            notes.push(format!(
                "left out: {}",
                self.ignored
                    .iter()
                    .map(|(k, n)| format!("{n} {k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let (pod_demand, scale_down) = match settings {
            Some(s) => (s.pod_demand.clone(), s.scale_down.clone()),
            None => (PodDemandSettings::default(), ScaleDownSettings::default()),
        };
        // Explaining reads no prices online: the configured rates and the embedded list prices.
        let prices = settings.map(|s| s.prices.clone()).unwrap_or_default();
        let consolidation = settings
            .map(|s| s.consolidation.clone())
            .unwrap_or_default();
        let mut now = k8s_openapi::jiff::Timestamp::now();
        let kube = settings.map(|s| s.kubernetes.clone()).unwrap_or_default();
        let status_config_map = format!("{}/{}", kube.namespace, kube.status_config_map);
        let controller = self
            .config_maps
            .iter()
            .find(|cm| {
                cm.metadata.name.as_deref() == Some(kube.status_config_map.as_str())
                    && cm
                        .metadata
                        .namespace
                        .as_deref()
                        .is_none_or(|ns| ns == kube.namespace)
            })
            .and_then(|cm| match ControllerStatus::from_config_map(cm) {
                Ok(c) => Some(c),
                Err(e) => {
                    notes.push(format!(
                        "{e}: the running controller's status is not applied"
                    ));
                    None
                }
            });
        match &controller {
            Some(c) if self.from_files => {
                // Files show one moment: judge holds, backoffs and unneeded times at the time
                // the status among them was written, as the controller did then.
                now = c.written;
                notes.push(format!(
                    "the running controller's status ({}, leader {}) is applied as of when it was written, {}: the explanation is of that moment",
                    c.source, c.leader, c.written
                ));
            }
            Some(c) => {
                let age = c.age(now);
                notes.push(format!(
                    "the running controller's status ({}, leader {}) was written {} ago: its holds, backoffs, refused offerings and unneeded times are applied",
                    c.source,
                    c.leader,
                    humantime::format_duration(std::time::Duration::from_secs(age.as_secs()))
                ));
                if age > super::controller::STALE_AFTER {
                    notes.push(format!(
                        "that status is older than {}: the controller may not be running; its holds and backoffs are applied until their end, how long nodes have been unneeded is not",
                        humantime::format_duration(super::controller::STALE_AFTER)
                    ));
                }
            }
            None => notes.push(super::not_known(&status_config_map)),
        }
        // Each group's instances, where they were listed (a live read lists them).
        for g in &mut groups {
            if let Some(list) = self.instances.get(&g.spec.name.to_ascii_lowercase()) {
                g.instances = list.clone();
            }
        }
        let world = World {
            groups,
            nodes: self.nodes,
            // Finished pods take no room and ask for none: the loops never see them (their
            // watch selects unfinished pods), and neither does an explanation.
            pods: self.pods.into_iter().filter(|p| !p.finished()).collect(),
            pdbs: self.pdbs,
            daemonsets: self.daemonsets,
            volumes: Arc::new(Volumes::new(
                &self.claims,
                &self.volumes,
                &self.classes,
                &self.csi_nodes,
            )),
            namespaces: Arc::new(NamespaceLabels::new(self.namespaces)),
            quota: {
                // Never refreshed here: one read, one explanation.
                let cache = crate::capacity::QuotaCache::new(std::time::Duration::from_secs(3600));
                for (region, rows) in &self.usages {
                    cache.insert(
                        region,
                        crate::capacity::Usages::new(rows, tokio::time::Instant::now()),
                    );
                }
                Arc::new(cache)
            },
            pod_demand,
            scale_down,
            consolidation,
            prices,
            controller,
            status_config_map,
            now,
        };
        (world, notes)
    }
}

fn spec(name: &str, kind: NodeGroupKind, min: Option<u32>, max: Option<u32>) -> NodeGroupSpec {
    NodeGroupSpec {
        name: name.into(),
        kind,
        resource_group: None,
        min_size: min.unwrap_or(0),
        max_size: max.unwrap_or(1000),
        desired_capacity: None,
        schedules: Vec::new(),
        max_scale_down_step: None,
    }
}

/// A scale set's ARM envelope: every other top-level key of the CLI's flattened output belongs
/// under `properties`.
const SCALE_SET_ENVELOPE: &[&str] = &[
    "id",
    "name",
    "type",
    "location",
    "tags",
    "sku",
    "zones",
    "etag",
    "identity",
    "plan",
    "extendedLocation",
    "properties",
    "resourceGroup",
];

/// An agent pool's ARM envelope.
const POOL_ENVELOPE: &[&str] = &["id", "name", "type", "properties", "resourceGroup"];

/// `value` in ARM's own shape: the Azure CLI's flattened output (no `properties`) has its
/// property keys moved under `properties`; ARM's JSON is left as it is.
fn arm_shape(value: Value, envelope: &[&str]) -> Value {
    let Value::Object(map) = value else {
        return value;
    };
    if map.contains_key("properties") {
        return Value::Object(map);
    }
    let mut outer = serde_json::Map::new();
    let mut properties = serde_json::Map::new();
    for (k, v) in map {
        if envelope.contains(&k.as_str()) {
            outer.insert(k, v);
        } else {
            properties.insert(k, v);
        }
    }
    outer.insert("properties".into(), Value::Object(properties));
    Value::Object(outer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_azure_clis_flattened_scale_sets_and_pools_read_like_arms_own_json() {
        let dir = tempfile::tempdir().unwrap();
        // `az vmss list -o json`: properties flattened to the top.
        let vmss = json!([{
            "id": "/subscriptions/s/resourceGroups/MC_rg_aks_westeurope/providers/Microsoft.Compute/virtualMachineScaleSets/aks-user-1",
            "name": "aks-user-1", "type": "Microsoft.Compute/virtualMachineScaleSets",
            "location": "westeurope", "etag": "\"7\"", "zones": ["1", "2"],
            "sku": {"name": "Standard_D4s_v5", "tier": "Standard", "capacity": 3},
            "tags": {"min": "1", "max": "9"}, "resourceGroup": "MC_rg_aks_westeurope",
            "provisioningState": "Succeeded", "overprovision": false, "uniqueId": "u",
            "virtualMachineProfile": {"osProfile": {"computerNamePrefix": "aks-user-1"}}
        }]);
        // `az aks nodepool list -o json`.
        let pools = json!([{
            "id": "/subscriptions/s/resourcegroups/rg-prod/providers/Microsoft.ContainerService/managedClusters/aks-prod/agentPools/user2",
            "name": "user2", "type": "Microsoft.ContainerService/managedClusters/agentPools",
            "count": 2, "vmSize": "Standard_D8s_v5", "mode": "User", "enableAutoScaling": true,
            "minCount": 1, "maxCount": 5, "tags": {"min": "0", "max": "4"},
            "provisioningState": "Succeeded", "resourceGroup": "rg-prod"
        }]);
        std::fs::write(dir.path().join("vmss.json"), vmss.to_string()).unwrap();
        std::fs::write(dir.path().join("pools.json"), pools.to_string()).unwrap();
        std::fs::write(
            dir.path().join("ns.json"),
            json!({"kind": "List", "items": [{"kind": "Namespace", "metadata": {"name": "a"}},
                {"kind": "Service", "metadata": {"name": "s", "namespace": "a"}}]})
            .to_string(),
        )
        .unwrap();
        let snap = load(dir.path()).unwrap();
        let (rg, ss) = &snap.scale_sets[0];
        assert_eq!(rg, "MC_rg_aks_westeurope");
        assert_eq!(ss.capacity, Some(3));
        assert_eq!(ss.sku_name.as_deref(), Some("Standard_D4s_v5"));
        assert_eq!(ss.etag.as_deref(), Some("\"7\""));
        assert_eq!(ss.zones, vec!["1", "2"]);
        assert_eq!(ss.provisioning_state.as_deref(), Some("Succeeded"));
        let (prg, cluster, pool) = &snap.pools[0];
        assert_eq!((prg.as_str(), cluster.as_str()), ("rg-prod", "aks-prod"));
        assert_eq!(pool.capacity, Some(2));
        assert!(pool.agent_pool.as_ref().unwrap().enable_auto_scaling);
        assert_eq!(
            snap.namespaces.len(),
            1,
            "namespaces are read for their labels"
        );
        assert_eq!(snap.ignored.get("Service"), Some(&1));

        let (world, notes) = snap.world(None);
        assert_eq!(world.groups.len(), 2);
        assert_eq!(
            (world.groups[0].spec.min_size, world.groups[0].spec.max_size),
            (1, 9),
            "bounds from cluster-autoscaler's tags"
        );
        assert!(notes.iter().any(|n| n.contains("1 Service")), "{notes:?}");
        // A pool AKS's own autoscaler scales is out of scale-up, and says so.
        let g = world.group("user2").unwrap();
        assert!(
            g.out_of_scale_up
                .as_deref()
                .is_some_and(|w| w.contains("autoscaler")),
            "{g:?}"
        );
    }

    /// A snapshot of scale set `ss` (D4s_v5, capacity 2): instance 0 has Ready node `n0`,
    /// holding `on_n0`; instance 1 has no node; `pending` waits for 3 cpus.
    fn one_node_snapshot(on_n0: serde_json::Value) -> Snapshot {
        let dir = tempfile::tempdir().unwrap();
        let vmss = json!([{
            "id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss",
            "name": "ss", "type": "Microsoft.Compute/virtualMachineScaleSets",
            "location": "westeurope", "etag": "\"1\"",
            "sku": {"name": "Standard_D4s_v5", "tier": "Standard", "capacity": 2},
            "tags": {"min": "0", "max": "5"}, "properties": {"provisioningState": "Succeeded"}
        }]);
        let pod = |name: &str, cpu: &str, node: Option<&str>, phase: &str| {
            let mut spec =
                json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]});
            if let Some(n) = node {
                spec["nodeName"] = json!(n);
            }
            json!({"kind": "Pod", "metadata": {"name": name, "namespace": "default",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": name, "controller": true}]},
                "spec": spec,
                "status": {"phase": phase, "conditions": [{"type": "PodScheduled", "status": if node.is_some() { "True" } else { "False" }, "reason": "Unschedulable"}]}})
        };
        let items = json!([
            {"kind": "Node", "metadata": {"name": "n0", "labels": {"kubernetes.io/hostname": "n0"}},
                "spec": {"providerID": "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines/0"},
                "status": {"allocatable": {"cpu": "3860m", "memory": "12Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}]}},
            pod("pending", "3", None, "Pending"),
            pod(on_n0["name"].as_str().unwrap(), on_n0["cpu"].as_str().unwrap(), Some("n0"), on_n0["phase"].as_str().unwrap()),
        ]);
        std::fs::write(dir.path().join("vmss.json"), vmss.to_string()).unwrap();
        std::fs::write(
            dir.path().join("cluster.json"),
            json!({"kind": "List", "items": items}).to_string(),
        )
        .unwrap();
        load(dir.path()).unwrap()
    }

    /// Issue 41: `explain` counts as the loops count. An instance Azure lists `Failed` brings
    /// no node, so it is no room on its way; a finished pod takes no room on its node.
    #[test]
    fn explain_ignores_failed_instances_and_finished_pods_exactly_as_the_loops_do() {
        let full = json!({"name": "busy", "cpu": "3500m", "phase": "Running"});
        let snap = one_node_snapshot(full.clone());
        let (world, _) = snap.world(None);
        let e = world.pod("default/pending").unwrap();
        assert_eq!(e.outcome, "roomOnItsWay", "{e:?}");
        let mut snap = one_node_snapshot(full);
        let instance = |id: &str, state: &str| crate::cache::Instance {
            instance_id: id.into(),
            provisioning_state: Some(state.into()),
            computer_name: None,
            power_state: None,
            zone: None,
        };
        snap.instances.insert(
            "ss".into(),
            vec![instance("0", "Succeeded"), instance("1", "Failed")],
        );
        let (world, _) = snap.world(None);
        let e = world.pod("default/pending").unwrap();
        assert_eq!(e.outcome, "scaleUp", "{e:?}");
        assert_eq!(e.scale_up.as_ref().map(|s| s.to), Some(3));
        // A Succeeded pod of 3.5 cpus on n0 takes nothing: the pending pod fits there.
        let snap = one_node_snapshot(json!({"name": "done", "cpu": "3500m", "phase": "Succeeded"}));
        let (world, _) = snap.world(None);
        let e = world.pod("default/pending").unwrap();
        assert_ne!(e.outcome, "scaleUp", "{e:?}");
    }

    #[test]
    fn an_object_that_does_not_parse_is_named_by_file_index_and_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("cluster.json"),
            json!({"kind": "List", "items": [
                {"kind": "Node", "metadata": {"name": "ok"}},
                {"kind": "Pod", "metadata": {"name": "bad"}, "spec": {"containers": "nope"}}
            ]})
            .to_string(),
        )
        .unwrap();
        let e = load(dir.path()).unwrap_err();
        assert!(e.path.ends_with("cluster.json[1] (bad)"), "{e}");
        assert!(e.message.starts_with("not a Pod"), "{e}");
    }
}
