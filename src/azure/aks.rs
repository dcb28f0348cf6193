//! AKS agent pools as node groups: LIST, GET and the conditional whole-object PUT of a pool.
//!
//! The agent-pool PUT replaces the pool, so a capacity write is a read-modify-write: the body is
//! the pool exactly as last read with `properties.count` changed and the read-only fields dropped,
//! sent with `If-Match: <the pool's ETag>`. That is the case ETags exist for: without the
//! precondition, a write built from a stale read silently reverts whatever changed since (a node
//! label, a version, an autoscaler switch) as well as the count.
//!
//! **Which ETag wins.** The AKS REST specification (2024-09-01 and later) puts the pool's ETag at
//! `properties.eTag`; some answers also carry a top-level `etag`, and a PUT may answer with an
//! `ETag` header. The order is `properties.eTag`, then top-level `etag`, then the header: the
//! property is what the specification defines for `If-Match`, the others are fallbacks.
//!
//! There is no Rust management SDK for `Microsoft.ContainerService` at the version in use, so
//! these calls go through [`ArmClient::send_json`]: the same `Retry-After` gates, token, error
//! classes and metrics as the scale-set calls.

use crate::azure::arm::{ArmClient, ArmError, ArmOp, DeleteAccepted, JsonAnswer, PutAccepted};
use crate::azure::Precondition;
use crate::cache::{AgentPoolFacts, Instance, ScaleSet};
use azure_core::Url;
use parking_lot::Mutex;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The AKS API version spoken (the first with `properties.eTag` on agent pools).
pub const AKS_API_VERSION: &str = "2024-09-01";

/// Tag AKS puts on the scale set that backs a pool, naming the pool.
pub const POOL_NAME_TAG: &str = "aks-managed-poolName";

/// Read-only properties of an agent pool: dropped from the PUT body.
const READ_ONLY_PROPERTIES: &[&str] = &[
    "provisioningState",
    "eTag",
    "nodeImageVersion",
    "currentOrchestratorVersion",
];

/// Read-only top-level fields of an agent pool: dropped from the PUT body.
const READ_ONLY_FIELDS: &[&str] = &["id", "type", "etag", "systemData"];

/// The agent pools of one managed cluster.
pub struct AgentPools {
    arm: Arc<ArmClient>,
    resource_group: String,
    cluster: String,
    /// `(node resource group, pool → backing scale-set name)`, learned on first need.
    backing: Mutex<Option<(String, BTreeMap<String, String>)>>,
    /// The managed cluster's region, learned with the backing: the pools' region (the pool
    /// JSON does not carry one), which quota is counted in.
    location: Mutex<Option<String>>,
}

impl std::fmt::Debug for AgentPools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentPools")
            .field("resource_group", &self.resource_group)
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl AgentPools {
    /// The pools of managed cluster `cluster` in `resource_group`, through `arm`.
    pub fn new(arm: Arc<ArmClient>, resource_group: &str, cluster: &str) -> Self {
        Self {
            arm,
            resource_group: resource_group.to_string(),
            cluster: cluster.to_string(),
            backing: Mutex::new(None),
            location: Mutex::new(None),
        }
    }

    /// The ARM client the calls go through.
    pub fn arm(&self) -> &ArmClient {
        &self.arm
    }

    /// The managed cluster's name.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The managed cluster's resource group.
    pub fn resource_group(&self) -> &str {
        &self.resource_group
    }

    fn url(&self, tail: &str) -> Result<Url, ArmError> {
        let t = self.arm.target();
        let path = format!(
            "subscriptions/{}/resourceGroups/{}/providers/Microsoft.ContainerService/managedClusters/{}{tail}",
            t.subscription, self.resource_group, self.cluster
        );
        let mut url = t.endpoint.join(&path).map_err(|e| ArmError::Decode {
            op: ArmOp::GetAgentPool,
            scale_set: self.cluster.clone(),
            detail: format!("cannot build the agent-pool URL: {e}"),
        })?;
        url.query_pairs_mut()
            .append_pair("api-version", AKS_API_VERSION);
        Ok(url)
    }

    /// LIST the cluster's agent pools (follows `nextLink` on the ARM endpoint only).
    pub async fn list(&self) -> Result<Vec<ScaleSet>, ArmError> {
        let op = ArmOp::ListAgentPools;
        let mut url = self.url("/agentPools")?;
        let mut out = Vec::new();
        for _page in 0..1000 {
            let answer = self
                .arm
                .send_json(
                    op,
                    &self.cluster,
                    reqwest::Method::GET,
                    url,
                    None,
                    &Precondition::None,
                )
                .await?;
            let page: Value = decode(op, &self.cluster, &answer.body)?;
            let items =
                page.get("value")
                    .and_then(Value::as_array)
                    .ok_or_else(|| ArmError::Decode {
                        op,
                        scale_set: self.cluster.clone(),
                        detail: "agent-pool list has no `value` array".into(),
                    })?;
            for item in items {
                out.push(
                    pool_from_json(&self.cluster, item.clone(), None).map_err(|detail| {
                        ArmError::Decode {
                            op,
                            scale_set: self.cluster.clone(),
                            detail,
                        }
                    })?,
                );
            }
            match page.get("nextLink").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => url = self.same_host(op, next)?,
                _ => {
                    if let Some(location) = self.location.lock().clone() {
                        for pool in &mut out {
                            pool.location.clone_from(&location);
                        }
                    }
                    return Ok(out);
                }
            }
        }
        Err(ArmError::Decode {
            op,
            scale_set: self.cluster.clone(),
            detail: "agent-pool list did not end after 1000 pages".into(),
        })
    }

    /// A `nextLink` is followed only on the ARM endpoint: the token goes nowhere else.
    fn same_host(&self, op: ArmOp, link: &str) -> Result<Url, ArmError> {
        let endpoint = &self.arm.target().endpoint;
        let url = Url::parse(link).map_err(|e| ArmError::Decode {
            op,
            scale_set: self.cluster.clone(),
            detail: format!("bad nextLink: {e}"),
        })?;
        if url.host_str() != endpoint.host_str()
            || url.port_or_known_default() != endpoint.port_or_known_default()
        {
            return Err(ArmError::Decode {
                op,
                scale_set: self.cluster.clone(),
                detail: format!(
                    "nextLink is not on the ARM endpoint: {}",
                    url.host_str().unwrap_or("")
                ),
            });
        }
        Ok(url)
    }

    /// GET one pool; `Ok(None)` when it (or its cluster) does not exist.
    pub async fn get(&self, pool: &str) -> Result<Option<ScaleSet>, ArmError> {
        let op = ArmOp::GetAgentPool;
        let url = self.url(&format!("/agentPools/{pool}"))?;
        let answer = match self
            .arm
            .send_json(
                op,
                pool,
                reqwest::Method::GET,
                url,
                None,
                &Precondition::None,
            )
            .await
        {
            Ok(a) => a,
            Err(ArmError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let value = decode(op, pool, &answer.body)?;
        let mut read = pool_from_json(&self.cluster, value, answer.etag).map_err(|detail| {
            ArmError::Decode {
                op,
                scale_set: pool.into(),
                detail,
            }
        })?;
        if let Some(location) = self.location.lock().clone() {
            read.location = location;
        }
        Ok(Some(read))
    }

    /// PUT the pool as last read with `count` changed, under `precondition`. One request.
    pub async fn put_count(
        &self,
        current: &ScaleSet,
        count: i64,
        precondition: &Precondition,
    ) -> Result<PutAccepted, ArmError> {
        let op = ArmOp::PutAgentPool;
        let body = pool_write_body(current, count).map_err(|detail| ArmError::Decode {
            op,
            scale_set: current.name.clone(),
            detail,
        })?;
        let url = self.url(&format!("/agentPools/{}", current.name))?;
        let answer: JsonAnswer = self
            .arm
            .send_json(
                op,
                &current.name,
                reqwest::Method::PUT,
                url,
                Some(&body),
                precondition,
            )
            .await?;
        // The write committed (2xx): an unreadable body must not turn that into an error.
        let parsed = serde_json::from_slice::<Value>(&answer.body)
            .map_err(|e| e.to_string())
            .and_then(|v| pool_from_json(&self.cluster, v, answer.etag.clone()));
        let scale_set = match parsed {
            Ok(s) => s,
            Err(detail) => {
                tracing::warn!(pool = %current.name, %detail, "agent-pool PUT accepted but its body is unreadable; using the header ETag");
                ScaleSet {
                    capacity: Some(count),
                    etag: answer.etag.clone(),
                    ..current.clone()
                }
            }
        };
        Ok(PutAccepted {
            status: answer.status,
            etag: scale_set.etag.clone(),
            async_operation: answer.async_operation,
            retry_after: answer.retry_after,
            scale_set,
        })
    }

    /// Deletes exactly the machines `machine_names` of pool `current`:
    /// `POST {pool}/deleteMachines?api-version=2024-09-01` with body `{"machineNames": [..]}`
    /// (AKS's machine names are the node names, e.g. `aks-general-12345678-vmss000003`), one
    /// request, never retried here. AKS lowers `properties.count` by the number removed and
    /// gives the pool a new `properties.eTag`.
    ///
    /// `If-Match` is sent when `precondition` asks for it. The AKS specification documents it for
    /// the agent-pool PUT and DELETE, not for this action; the emulator enforces it as on a PUT
    /// (a stale ETag is a 412, [`ArmError::PreconditionFailed`], and nothing is deleted), Azure
    /// is not known to. A name that is not a machine of the pool is a 400 ([`ArmError::Http`])
    /// whose message names it. A 200 is final; a 202 carries the operation to poll
    /// (`Azure-AsyncOperation`, else `Location`). An empty `machine_names` sends nothing and
    /// answers a final 200.
    pub async fn delete_machines(
        &self,
        current: &ScaleSet,
        machine_names: &[String],
        precondition: &Precondition,
    ) -> Result<DeleteAccepted, ArmError> {
        let op = ArmOp::DeleteMachines;
        if machine_names.is_empty() {
            return Ok(DeleteAccepted {
                status: 200,
                async_operation: None,
                retry_after: None,
            });
        }
        let url = self.url(&format!("/agentPools/{}/deleteMachines", current.name))?;
        let body = serde_json::json!({ "machineNames": machine_names });
        let answer = self
            .arm
            .send_json(
                op,
                &current.name,
                reqwest::Method::POST,
                url,
                Some(&body),
                precondition,
            )
            .await?;
        Ok(DeleteAccepted::from_answer(&answer))
    }

    /// The VM instances behind a pool: those of the scale set tagged
    /// `aks-managed-poolName: <pool>` in the cluster's node resource group.
    pub async fn list_instances(&self, pool: &str) -> Result<Vec<Instance>, ArmError> {
        let known = self
            .backing
            .lock()
            .as_ref()
            .map(|(rg, m)| (rg.clone(), m.get(pool).cloned()));
        let (node_rg, vmss) = match known {
            Some((rg, Some(vmss))) => (rg, vmss),
            _ => {
                let (rg, map) = self.learn_backing().await?;
                let vmss = map.get(pool).cloned();
                *self.backing.lock() = Some((rg.clone(), map));
                match vmss {
                    Some(v) => (rg, v),
                    None => return Ok(Vec::new()),
                }
            }
        };
        match self.arm.list_instances_in(&node_rg, &vmss).await {
            Err(ArmError::NotFound { .. }) => {
                // The backing scale set was replaced (a node-image upgrade does that): relearn.
                *self.backing.lock() = None;
                Ok(Vec::new())
            }
            other => other,
        }
    }

    async fn learn_backing(&self) -> Result<(String, BTreeMap<String, String>), ArmError> {
        let op = ArmOp::GetManagedCluster;
        let answer = self
            .arm
            .send_json(
                op,
                &self.cluster,
                reqwest::Method::GET,
                self.url("")?,
                None,
                &Precondition::None,
            )
            .await?;
        let cluster: Value = decode(op, &self.cluster, &answer.body)?;
        if let Some(location) = cluster.get("location").and_then(Value::as_str) {
            *self.location.lock() = Some(location.to_string());
        }
        let node_rg = cluster
            .pointer("/properties/nodeResourceGroup")
            .and_then(Value::as_str)
            .ok_or_else(|| ArmError::Decode {
                op,
                scale_set: self.cluster.clone(),
                detail: "managed cluster has no properties.nodeResourceGroup".into(),
            })?
            .to_string();
        let map = self
            .arm
            .list_scale_sets_in(&node_rg)
            .await?
            .into_iter()
            .filter_map(|s| s.tags.get(POOL_NAME_TAG).cloned().map(|p| (p, s.name)))
            .collect();
        Ok((node_rg, map))
    }
}

fn decode(op: ArmOp, name: &str, body: &[u8]) -> Result<Value, ArmError> {
    serde_json::from_slice(body).map_err(|e| ArmError::Decode {
        op,
        scale_set: name.into(),
        detail: format!("agent-pool answer is not JSON: {e}"),
    })
}

/// What the controller keeps of an agent pool, from its JSON. `header_etag` is the answer's
/// `ETag` header, the last resort (see the module docs for which ETag wins).
pub fn pool_from_json(
    cluster: &str,
    value: Value,
    header_etag: Option<String>,
) -> Result<ScaleSet, String> {
    let name = value
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or("agent pool has no name")?
        .to_string();
    let props = value
        .get("properties")
        .and_then(Value::as_object)
        .ok_or_else(|| format!("agent pool {name} has no properties"))?;
    let str_prop = |k: &str| props.get(k).and_then(Value::as_str).map(str::to_string);
    let count =
        match props.get("count") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_i64().filter(|c| *c >= 0).ok_or_else(|| {
                format!("agent pool {name}: properties.count is not a count: {v}")
            })?),
        };
    let etag = str_prop("eTag")
        .or_else(|| {
            value
                .get("etag")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .or(header_etag);
    let string_map = |k: &str| -> BTreeMap<String, String> {
        props
            .get(k)
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default()
    };
    let vm_profile = crate::cache::VmProfile {
        windows: str_prop("osType").is_some_and(|t| t.eq_ignore_ascii_case("windows")),
        os_disk_gib: props
            .get("osDiskSizeGB")
            .and_then(Value::as_u64)
            .and_then(|g| u32::try_from(g).ok())
            .filter(|g| *g > 0),
        kubelet_on_temp_disk: str_prop("kubeletDiskType")
            .is_some_and(|t| t.eq_ignore_ascii_case("temporary")),
        spot: str_prop("scaleSetPriority").is_some_and(|p| p.eq_ignore_ascii_case("spot")),
    };
    let facts = AgentPoolFacts {
        cluster: cluster.to_string(),
        enable_auto_scaling: props
            .get("enableAutoScaling")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        mode: str_prop("mode"),
        max_pods: props.get("maxPods").and_then(Value::as_i64),
        node_labels: string_map("nodeLabels"),
        node_taints: props
            .get("nodeTaints")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|t| t.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        body: value.clone(),
    };
    Ok(ScaleSet {
        name,
        location: String::new(),
        sku_name: str_prop("vmSize"),
        sku_tier: None,
        capacity: count,
        etag,
        tags: string_map("tags"),
        provisioning_state: str_prop("provisioningState"),
        extended_location: None,
        agent_pool: Some(Arc::new(facts)),
        vm_profile,
        zones: props
            .get("availabilityZones")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|z| z.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// The PUT body of a capacity write: the pool as last read, `count` changed, read-only fields
/// dropped. Fails when the read kept no body (never a write from a partial object).
pub fn pool_write_body(current: &ScaleSet, count: i64) -> Result<Value, String> {
    let facts = current
        .agent_pool
        .as_ref()
        .ok_or_else(|| format!("{} was not read as an agent pool", current.name))?;
    let mut body: Map<String, Value> = facts
        .body
        .as_object()
        .cloned()
        .ok_or_else(|| format!("agent pool {} was read without a body", current.name))?;
    for k in READ_ONLY_FIELDS {
        body.remove(*k);
    }
    let props = body
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| format!("agent pool {}: properties is not an object", current.name))?;
    for k in READ_ONLY_PROPERTIES {
        props.remove(*k);
    }
    props.insert("count".into(), Value::from(count));
    Ok(Value::Object(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> ScaleSet {
        pool_from_json("c1", v, Some("\"header\"".into())).expect("pool")
    }

    #[test]
    fn the_property_etag_wins_over_the_top_level_one_and_the_header() {
        let p =
            read(json!({"name": "np", "etag": "top", "properties": {"count": 3, "eTag": "prop"}}));
        assert_eq!(p.etag.as_deref(), Some("prop"));
        let p = read(json!({"name": "np", "etag": "top", "properties": {"count": 3}}));
        assert_eq!(p.etag.as_deref(), Some("top"));
        let p = read(json!({"name": "np", "properties": {"count": 3}}));
        assert_eq!(p.etag.as_deref(), Some("\"header\""));
    }

    #[test]
    fn a_pool_read_keeps_what_planning_and_refusals_need() {
        let p = read(json!({"name": "sys", "properties": {
            "count": 2, "vmSize": "Standard_D4s_v5", "mode": "System", "enableAutoScaling": true,
            "maxPods": 110, "nodeLabels": {"a": "b"}, "nodeTaints": ["k=v:NoSchedule"],
            "tags": {"min": "1"}, "provisioningState": "Succeeded"}}));
        let f = p.agent_pool.as_ref().expect("facts");
        assert_eq!(p.capacity, Some(2));
        assert_eq!(p.sku_name.as_deref(), Some("Standard_D4s_v5"));
        assert!(f.enable_auto_scaling && f.is_system());
        assert_eq!(f.max_pods, Some(110));
        assert_eq!(f.node_labels.get("a").map(String::as_str), Some("b"));
        assert_eq!(f.node_taints, vec!["k=v:NoSchedule".to_string()]);
        assert_eq!(p.tags.get("min").map(String::as_str), Some("1"));
        assert_eq!(p.vm_profile, crate::cache::VmProfile::default());
    }

    #[test]
    fn a_windows_pool_with_its_kubelet_on_the_temporary_disk_reads_so() {
        let p = read(json!({"name": "win", "properties": {
            "count": 0, "vmSize": "Standard_D8ds_v5", "osType": "Windows", "osDiskSizeGB": 0,
            "kubeletDiskType": "Temporary"}}));
        assert_eq!(
            p.vm_profile,
            crate::cache::VmProfile {
                windows: true,
                os_disk_gib: None,
                kubelet_on_temp_disk: true,
                spot: false,
            }
        );
    }

    #[test]
    fn a_spot_pool_in_zones_reads_as_a_spot_offering_in_those_zones() {
        let p = read(json!({"name": "spot", "properties": {
            "count": 0, "vmSize": "Standard_D4s_v5", "scaleSetPriority": "Spot",
            "scaleSetEvictionPolicy": "Delete", "availabilityZones": ["3", "1"]}}));
        assert!(p.vm_profile.spot);
        assert_eq!(p.zones, ["3", "1"]);
        let mut p = p;
        p.location = "westeurope".into();
        let o = p.offering().expect("a size");
        assert_eq!(
            (o.spot, o.zones.clone()),
            (true, vec!["1".to_string(), "3".to_string()])
        );
        let regular =
            read(json!({"name": "r", "properties": {"count": 0, "vmSize": "Standard_D4s_v5"}}));
        assert!(!regular.vm_profile.spot && regular.zones.is_empty());
    }

    #[test]
    fn a_pool_with_a_negative_or_non_numeric_count_is_refused_by_name() {
        for bad in [json!(-1), json!("3")] {
            let err = pool_from_json(
                "c1",
                json!({"name": "np", "properties": {"count": bad}}),
                None,
            )
            .unwrap_err();
            assert!(
                err.contains("np") && err.contains("properties.count"),
                "{err}"
            );
        }
    }

    #[test]
    fn the_write_body_is_the_pool_as_read_with_only_the_count_changed_and_read_only_fields_dropped()
    {
        let p = read(json!({"id": "/x", "name": "np", "type": "t", "etag": "e",
            "properties": {"count": 3, "eTag": "e", "provisioningState": "Succeeded",
            "vmSize": "Standard_D2s_v5", "nodeLabels": {"team": "a"}, "mode": "User",
            "orchestratorVersion": "1.30.6"}}));
        let body = pool_write_body(&p, 5).expect("body");
        assert_eq!(
            body,
            json!({"name": "np", "properties": {"count": 5, "vmSize": "Standard_D2s_v5",
                "nodeLabels": {"team": "a"}, "mode": "User", "orchestratorVersion": "1.30.6"}})
        );
    }

    #[test]
    fn a_scale_set_never_becomes_an_agent_pool_write() {
        let s = crate::cache::tests::scale_set("vmss", 3, "e");
        assert!(pool_write_body(&s, 4).is_err());
    }
}
