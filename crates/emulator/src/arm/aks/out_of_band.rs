//! What tests, the demo and the control API do to AKS without an ARM request: seed a cluster,
//! look at a cluster or pool, and make a rival's cluster-level or pool-level write. Seeding goes
//! through the same body parser and constructors as a PUT, so a seeded cluster is one AKS would
//! have accepted.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::super::state::{Data, MAX_CAPACITY, SEED_WRITER};
use super::super::{EmulatorError, Reply, ReplyBody};
use super::pool::{Pool, PoolBody};
use super::{
    cluster_key, commit_cluster, delete_cluster_out_of_band, new_cluster, new_etag,
    parse_cluster_body,
};
/// An agent pool to create with a [`ClusterSeed`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AgentPoolSeed {
    /// Pool name (AKS allows `^[a-z][a-z0-9]{0,11}$`).
    pub name: String,
    /// `properties.count`.
    pub count: i64,
    /// `System` or `User`; by default the first pool is `System`, the others `User`.
    #[serde(default)]
    pub mode: Option<String>,
    /// `properties.enableAutoScaling` (needs `min_count` and `max_count`).
    #[serde(default)]
    pub enable_auto_scaling: bool,
    /// `properties.minCount`.
    #[serde(default)]
    pub min_count: Option<i64>,
    /// `properties.maxCount`.
    #[serde(default)]
    pub max_count: Option<i64>,
    /// `properties.tags` (persisted on the pool's scale set too).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// `properties.vmSize` (`None`: `Standard_D2s_v5`).
    #[serde(default)]
    pub vm_size: Option<String>,
    /// `properties.nodeLabels`.
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
    /// `properties.nodeTaints`, `key=value:Effect`.
    #[serde(default)]
    pub node_taints: Vec<String>,
    /// `properties.maxPods` (`None`: 110).
    #[serde(default)]
    pub max_pods: Option<i64>,
    /// `properties.availabilityZones` (empty: regional).
    #[serde(default)]
    pub availability_zones: Vec<String>,
    /// `properties.scaleSetPriority` (`Spot` or `Regular`; `None`: Regular).
    #[serde(default)]
    pub scale_set_priority: Option<String>,
    /// `properties.scaleSetEvictionPolicy` of a spot pool (`Delete` or `Deallocate`).
    #[serde(default)]
    pub scale_set_eviction_policy: Option<String>,
}

impl AgentPoolSeed {
    /// A pool of `count` nodes with the default mode, no autoscaler and no tags.
    pub fn new(name: &str, count: i64) -> Self {
        AgentPoolSeed {
            name: name.to_string(),
            count,
            mode: None,
            enable_auto_scaling: false,
            min_count: None,
            max_count: None,
            tags: BTreeMap::new(),
            vm_size: None,
            node_labels: BTreeMap::new(),
            node_taints: Vec::new(),
            max_pods: None,
            availability_zones: Vec::new(),
            scale_set_priority: None,
            scale_set_eviction_policy: None,
        }
    }

    /// In these availability zones (`["1", "2", "3"]`).
    pub fn zones(mut self, zones: &[&str]) -> Self {
        self.availability_zones = zones.iter().map(|z| z.to_string()).collect();
        self
    }

    /// A spot pool with this eviction policy (`Delete` or `Deallocate`).
    pub fn spot(mut self, eviction_policy: &str) -> Self {
        self.scale_set_priority = Some("Spot".into());
        self.scale_set_eviction_policy = Some(eviction_policy.into());
        self
    }

    /// With this VM size.
    pub fn vm_size(mut self, size: &str) -> Self {
        self.vm_size = Some(size.to_string());
        self
    }

    /// With this node taint, `key=value:Effect`.
    pub fn node_taint(mut self, taint: &str) -> Self {
        self.node_taints.push(taint.to_string());
        self
    }

    /// With this node label.
    pub fn node_label(mut self, key: &str, value: &str) -> Self {
        self.node_labels.insert(key.to_string(), value.to_string());
        self
    }
}

/// A managed cluster to create (or replace) through [`crate::EmulatorState::seed_cluster`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterSeed {
    /// Subscription id.
    pub subscription: String,
    /// Resource group of the managed cluster.
    pub resource_group: String,
    /// Managed cluster name.
    pub name: String,
    /// Azure region; also the last part of the node resource group's name.
    #[serde(default = "default_location")]
    pub location: String,
    /// Cluster tags.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Agent pools, the first one `System` unless told otherwise.
    pub pools: Vec<AgentPoolSeed>,
}

fn default_location() -> String {
    "westeurope".to_string()
}

impl ClusterSeed {
    /// A cluster in `westeurope` without tags, with these pools.
    pub fn new(sub: &str, rg: &str, name: &str, pools: Vec<AgentPoolSeed>) -> Self {
        ClusterSeed {
            subscription: sub.to_string(),
            resource_group: rg.to_string(),
            name: name.to_string(),
            location: default_location(),
            tags: BTreeMap::new(),
            pools,
        }
    }

    /// The ARM create body this seed stands for, so seeding and a PUT share one path.
    fn body(&self) -> Value {
        let profiles: Vec<Value> = self
            .pools
            .iter()
            .map(|p| {
                let mut profile = json!({
                    "name": p.name,
                    "count": p.count,
                    "mode": p.mode,
                    "enableAutoScaling": p.enable_auto_scaling,
                    "minCount": p.min_count,
                    "maxCount": p.max_count,
                    "tags": p.tags,
                });
                if let Some(size) = &p.vm_size {
                    profile["vmSize"] = json!(size);
                }
                if !p.node_labels.is_empty() {
                    profile["nodeLabels"] = json!(p.node_labels);
                }
                if !p.node_taints.is_empty() {
                    profile["nodeTaints"] = json!(p.node_taints);
                }
                if let Some(max_pods) = p.max_pods {
                    profile["maxPods"] = json!(max_pods);
                }
                if !p.availability_zones.is_empty() {
                    profile["availabilityZones"] = json!(p.availability_zones);
                }
                if let Some(v) = &p.scale_set_priority {
                    profile["scaleSetPriority"] = json!(v);
                }
                if let Some(v) = &p.scale_set_eviction_policy {
                    profile["scaleSetEvictionPolicy"] = json!(v);
                }
                profile
            })
            .collect();
        json!({
            "location": self.location,
            "tags": self.tags,
            "properties": {"agentPoolProfiles": profiles},
        })
    }
}

/// What a test or the demo sees of one agent pool.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AgentPoolView {
    /// `properties.count`.
    pub count: i64,
    /// `properties.eTag` (a GUID, unquoted).
    pub etag: String,
    /// `System` or `User`.
    pub mode: String,
    /// `properties.enableAutoScaling`.
    pub enable_auto_scaling: bool,
    /// `Updating` while an operation runs, then `Succeeded` (or `Failed`).
    pub provisioning_state: String,
    /// The node resource group holding the pool's scale set.
    pub scale_set_resource_group: String,
    /// The pool's scale set, `aks-<pool>-<8 digits>-vmss`.
    pub scale_set_name: String,
}

/// What a test or the demo sees of one managed cluster.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClusterView {
    /// Top-level `eTag` (a GUID, unquoted).
    pub etag: String,
    /// `properties.nodeResourceGroup`.
    pub node_resource_group: String,
    /// Cluster tags.
    pub tags: BTreeMap<String, String>,
    /// Pool names, in order.
    pub pools: Vec<String>,
}

fn reply_message(r: &Reply) -> String {
    match &r.body {
        ReplyBody::Json(v) => v
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("invalid")
            .to_string(),
        _ => format!("status {}", r.status),
    }
}

fn aks_not_found(what: String) -> EmulatorError {
    EmulatorError::AksNotFound { resource: what }
}

impl Data {
    /// Creates or replaces a managed cluster, its pools and their scale sets; returns the
    /// cluster's ETag.
    pub(crate) fn seed_cluster(
        &mut self,
        seed: ClusterSeed,
        now: Instant,
    ) -> Result<String, EmulatorError> {
        let invalid = |r: Reply| EmulatorError::InvalidSeed {
            message: reply_message(&r),
        };
        let body = serde_json::to_vec(&seed.body()).map_err(|e| EmulatorError::InvalidSeed {
            message: e.to_string(),
        })?;
        let parsed = parse_cluster_body(&body).map_err(invalid)?;
        let (sub, rg, name) = (&seed.subscription, &seed.resource_group, &seed.name);
        let c = new_cluster(sub, rg, name, parsed, now, false).map_err(invalid)?;
        delete_cluster_out_of_band(self, sub, rg, name);
        let key = c.key();
        self.clusters.insert(key.clone(), c);
        commit_cluster(self, &key, SEED_WRITER, "seeded");
        Ok(self
            .clusters
            .get(&key)
            .map(|c| c.etag.clone())
            .unwrap_or_default())
    }

    /// A rival's cluster-level write (a tag change on the managed cluster, as an upgrade or a
    /// portal edit would be): the cluster's ETag and every pool's change. Returns the cluster's
    /// new ETag. Never a lost update itself: the rival read what it replaced.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rival_cluster_write(
        &mut self,
        sub: &str,
        rg: &str,
        cluster: &str,
        tags: BTreeMap<String, String>,
        writer: &str,
        busy_until: Instant,
    ) -> Result<String, EmulatorError> {
        let key = cluster_key(sub, rg, cluster);
        let Some(c) = self.clusters.get_mut(&key) else {
            return Err(aks_not_found(format!("{sub}/{rg}/{cluster}")));
        };
        let mut seen = vec![(c.key(), c.etag.clone())];
        seen.extend(
            c.pools
                .values()
                .map(|p| (c.pool_key(&p.name), p.etag.clone())),
        );
        c.tags.extend(tags);
        c.busy_until = busy_until;
        c.failed = false;
        for (k, e) in seen {
            self.mark_seen(writer, &k, &e);
        }
        commit_cluster(self, &key, writer, "cluster-level write: tags changed");
        Ok(self
            .clusters
            .get(&key)
            .map(|c| c.etag.clone())
            .unwrap_or_default())
    }

    /// A rival's agent-pool write setting `count`: only that pool's ETag changes. Returns the
    /// pool's new ETag.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rival_set_pool_count(
        &mut self,
        sub: &str,
        rg: &str,
        cluster: &str,
        pool: &str,
        count: i64,
        writer: &str,
        busy_until: Instant,
    ) -> Result<String, EmulatorError> {
        if !(0..=MAX_CAPACITY).contains(&count) {
            return Err(EmulatorError::InvalidCapacity { capacity: count });
        }
        let key = cluster_key(sub, rg, cluster);
        let missing = || aks_not_found(format!("{sub}/{rg}/{cluster}/agentPools/{pool}"));
        let c = self.clusters.get_mut(&key).ok_or_else(missing)?;
        let lower = pool.to_ascii_lowercase();
        let p = c.pools.get(&lower).ok_or_else(missing)?;
        let body = PoolBody {
            count: Some(count),
            ..PoolBody::default()
        };
        let mut next = p.merged(body).map_err(|r| EmulatorError::InvalidSeed {
            message: reply_message(&r),
        })?;
        let change = Pool::describe_change(p, &next);
        let old_etag = p.etag.clone();
        next.etag = new_etag();
        next.busy_until = busy_until;
        next.failed = false;
        let (pk, etag) = (c.pool_key(&next.name), next.etag.clone());
        let backing = c.backing(&next);
        c.pools.insert(lower, next);
        backing.apply(self, busy_until, false);
        self.mark_seen(writer, &pk, &old_etag);
        self.record_version(&pk, &etag, writer, change);
        self.mark_seen(writer, &pk, &etag);
        Ok(etag)
    }

    /// The current state of one agent pool, if it exists.
    pub(crate) fn agent_pool_view(
        &self,
        sub: &str,
        rg: &str,
        cluster: &str,
        pool: &str,
        now: Instant,
    ) -> Option<AgentPoolView> {
        let c = self.clusters.get(&cluster_key(sub, rg, cluster))?;
        let p = c.pools.get(&pool.to_ascii_lowercase())?;
        let b = c.backing(p);
        Some(AgentPoolView {
            count: p.count,
            etag: p.etag.clone(),
            mode: p.mode.as_str().to_string(),
            enable_auto_scaling: p.enable_auto_scaling,
            provisioning_state: p.state(now).to_string(),
            scale_set_resource_group: b.node_rg,
            scale_set_name: b.name,
        })
    }

    /// The current state of one managed cluster, if it exists.
    pub(crate) fn cluster_view(&self, sub: &str, rg: &str, name: &str) -> Option<ClusterView> {
        let c = self.clusters.get(&cluster_key(sub, rg, name))?;
        Some(ClusterView {
            etag: c.etag.clone(),
            node_resource_group: c.node_resource_group.clone(),
            tags: c.tags.clone(),
            pools: c.pools.values().map(|p| p.name.clone()).collect(),
        })
    }
}
