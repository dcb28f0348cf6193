//! What backs a node group in Azure, behind one trait, so the ETag protocol exists once.
//!
//! The reconciler speaks only to [`CapacityResource`]: list, read one, write the capacity under a
//! precondition, follow the operation, list instances. Scale sets ([`ArmClient`]) and AKS agent
//! pools ([`AgentPools`]) implement it; the 412 / no-ETag / ambiguous-write / gone / LRO-failed
//! rules live in the reconciler and apply to both. What differs by kind is only how a read is
//! fetched and how a write is shaped (a sparse scale-set PUT, a whole-pool read-modify-write),
//! and two refusals a pool read can carry ([`CapacityResource::write_refusal`],
//! [`CapacityResource::capacity_floor`]).
//!
//! [`Resources`] maps each node group to its resource: one scale-set source for
//! `azure.resourceGroup`, one agent-pool source per managed cluster.

use crate::azure::aks::AgentPools;
use crate::azure::arm::OperationStatus;
use crate::azure::{ArmClient, ArmError, DeleteAccepted, Precondition, PutAccepted};
use crate::cache::{Instance, ScaleSet};
use crate::capacity::UsageSource;
use crate::config::{NodeGroupKind, NodeGroupSpec, Settings};
use crate::hold::WriteRefusal;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One instance to delete, named both ways a node group's resource may need: a scale set deletes
/// by `instance_id`, an AKS agent pool by machine name, which is the node's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Victim {
    /// The scale-set instance id (`"3"`), as [`Instance::instance_id`] has it.
    pub instance_id: String,
    /// The Kubernetes node's name (`aks-general-12345678-vmss000003`): an AKS machine name.
    pub node_name: String,
}

/// What a node group's backing resource can do. Every call is one request (a LIST may page),
/// never retried here: retrying is the reconciler's decision.
#[async_trait::async_trait]
pub trait CapacityResource: Send + Sync + std::fmt::Debug {
    /// `vmss` or `aksAgentPool` (the config spelling and the `kind` label).
    fn kind(&self) -> &'static str;

    /// Every resource of this source (one LIST per cache TTL).
    async fn list(&self) -> Result<Vec<ScaleSet>, ArmError>;

    /// One resource, fresh; `Ok(None)` when it no longer exists.
    async fn get(&self, name: &str) -> Result<Option<ScaleSet>, ArmError>;

    /// Writes `capacity` on the resource as last read (`current`), under `precondition`.
    async fn write_capacity(
        &self,
        current: &ScaleSet,
        capacity: i64,
        precondition: &Precondition,
    ) -> Result<PutAccepted, ArmError>;

    /// Deletes exactly `victims` of the resource as last read (`current`), under `precondition`.
    ///
    /// Scale-down removes a node this way, never by lowering a capacity number (a lower capacity
    /// lets Azure pick which instances go). The capacity drops by the number removed. One
    /// request; a stale `If-Match` is [`ArmError::PreconditionFailed`] and removes nothing (see
    /// [`ArmClient::delete_vm_instances`] for what Azure itself documents). An empty `victims`
    /// sends nothing and answers a final 200.
    async fn delete_instances(
        &self,
        current: &ScaleSet,
        victims: &[Victim],
        precondition: &Precondition,
    ) -> Result<DeleteAccepted, ArmError>;

    /// Polls a write's `Azure-AsyncOperation` once.
    async fn poll_operation(&self, url: &str) -> Result<OperationStatus, ArmError>;

    /// The VM instances behind the resource.
    async fn list_instances(&self, name: &str) -> Result<Vec<Instance>, ArmError>;

    /// Why this resource, as read, must never be written by this controller, if it must not.
    fn write_refusal(&self, _current: &ScaleSet) -> Option<WriteRefusal> {
        None
    }

    /// A refusal of [`CapacityResource::write_refusal`] as a person can act on it: which
    /// object, why, and the command that lifts it.
    fn refusal_problem(&self, name: &str, refusal: WriteRefusal) -> crate::problem::Problem {
        crate::problem::Problem {
            object: format!("{} {name}", self.kind()),
            what: format!("not written ({refusal})"),
            fix: "change the resource so the refusal no longer applies".into(),
        }
    }

    /// The lowest capacity the resource, as read, may have whatever the config says.
    fn capacity_floor(&self, _current: &ScaleSet) -> u32 {
        0
    }
}

/// Why an agent pool, as read, must never be written: AKS's own autoscaler scales a pool with
/// `enableAutoScaling: true`, and writing its count would fight it. (`explain` asks the same.)
pub fn pool_refusal(current: &ScaleSet) -> Option<WriteRefusal> {
    current
        .agent_pool
        .as_ref()
        .is_some_and(|p| p.enable_auto_scaling)
        .then_some(WriteRefusal::AksAutoscaler)
}

#[async_trait::async_trait]
impl CapacityResource for ArmClient {
    fn kind(&self) -> &'static str {
        NodeGroupKind::Vmss.as_str()
    }

    async fn list(&self) -> Result<Vec<ScaleSet>, ArmError> {
        self.list_scale_sets().await
    }

    async fn get(&self, name: &str) -> Result<Option<ScaleSet>, ArmError> {
        self.get_scale_set(name).await
    }

    async fn write_capacity(
        &self,
        current: &ScaleSet,
        capacity: i64,
        precondition: &Precondition,
    ) -> Result<PutAccepted, ArmError> {
        self.put_capacity(current, capacity, precondition).await
    }

    async fn delete_instances(
        &self,
        current: &ScaleSet,
        victims: &[Victim],
        precondition: &Precondition,
    ) -> Result<DeleteAccepted, ArmError> {
        let ids: Vec<String> = victims.iter().map(|v| v.instance_id.clone()).collect();
        self.delete_vm_instances(current, &ids, precondition).await
    }

    async fn poll_operation(&self, url: &str) -> Result<OperationStatus, ArmError> {
        ArmClient::poll_operation(self, url).await
    }

    async fn list_instances(&self, name: &str) -> Result<Vec<Instance>, ArmError> {
        ArmClient::list_instances(self, name).await
    }
}

#[async_trait::async_trait]
impl CapacityResource for AgentPools {
    fn kind(&self) -> &'static str {
        "aksAgentPool"
    }

    async fn list(&self) -> Result<Vec<ScaleSet>, ArmError> {
        AgentPools::list(self).await
    }

    async fn get(&self, name: &str) -> Result<Option<ScaleSet>, ArmError> {
        AgentPools::get(self, name).await
    }

    async fn write_capacity(
        &self,
        current: &ScaleSet,
        capacity: i64,
        precondition: &Precondition,
    ) -> Result<PutAccepted, ArmError> {
        self.put_count(current, capacity, precondition).await
    }

    async fn delete_instances(
        &self,
        current: &ScaleSet,
        victims: &[Victim],
        precondition: &Precondition,
    ) -> Result<DeleteAccepted, ArmError> {
        let names: Vec<String> = victims.iter().map(|v| v.node_name.clone()).collect();
        self.delete_machines(current, &names, precondition).await
    }

    async fn poll_operation(&self, url: &str) -> Result<OperationStatus, ArmError> {
        self.arm().poll_operation(url).await
    }

    async fn list_instances(&self, name: &str) -> Result<Vec<Instance>, ArmError> {
        AgentPools::list_instances(self, name).await
    }

    fn write_refusal(&self, current: &ScaleSet) -> Option<WriteRefusal> {
        pool_refusal(current)
    }

    fn refusal_problem(&self, name: &str, refusal: WriteRefusal) -> crate::problem::Problem {
        match refusal {
            WriteRefusal::AksAutoscaler => {
                crate::problem::Problem::aks_autoscaler(self.resource_group(), self.cluster(), name)
            }
        }
    }

    fn capacity_floor(&self, current: &ScaleSet) -> u32 {
        // AKS refuses a System pool with no node: the cluster's system pods live there.
        u32::from(current.agent_pool.as_ref().is_some_and(|p| p.is_system()))
    }
}

/// Which resource serves which node group: one scale-set source, one source per managed cluster.
#[derive(Debug, Clone)]
pub struct Resources {
    scale_sets: Arc<dyn CapacityResource>,
    list_scale_sets: bool,
    pools: BTreeMap<(String, String), Arc<dyn CapacityResource>>,
    /// `(resource group, cluster)` of `autoDiscovery.aksCluster`.
    discovery: Option<(String, String)>,
    default_resource_group: String,
    /// Where the regions' compute usages (vCPU quota) are read; `None`: quota is not read.
    usages: Option<Arc<dyn UsageSource>>,
}

impl Resources {
    /// The sources `settings` needs, all through `arm` (one token, one set of throttle gates).
    /// Scale sets are listed when a scale-set group is configured, auto-discovery of scale sets
    /// is on, or no agent pool is configured; each managed cluster named by a pool group or by
    /// `autoDiscovery.aksCluster` gets a pool source.
    pub fn new(settings: &Settings, arm: Arc<ArmClient>) -> Self {
        let default_resource_group = arm.target().resource_group.clone();
        let mut pools: BTreeMap<(String, String), Arc<dyn CapacityResource>> = BTreeMap::new();
        let mut any_vmss = settings.auto_discovery.is_some();
        let mut add = |rg: &str, cluster: &str| {
            pools
                .entry((rg.to_string(), cluster.to_string()))
                .or_insert_with(|| Arc::new(AgentPools::new(arm.clone(), rg, cluster)));
        };
        for g in &settings.node_groups {
            match &g.kind {
                NodeGroupKind::Vmss => any_vmss = true,
                NodeGroupKind::AksAgentPool { cluster } => add(
                    g.resource_group
                        .as_deref()
                        .unwrap_or(&default_resource_group),
                    cluster,
                ),
            }
        }
        let discovery = settings.auto_discovery.as_ref().and_then(|a| {
            let cluster = a.aks_cluster.as_deref()?;
            let rg = a
                .aks_resource_group
                .as_deref()
                .unwrap_or(&default_resource_group);
            add(rg, cluster);
            Some((rg.to_string(), cluster.to_string()))
        });
        Self {
            discovery,
            list_scale_sets: any_vmss || pools.is_empty(),
            usages: Some(arm.clone()),
            scale_sets: arm,
            pools,
            default_resource_group,
        }
    }

    /// Every node group backed by `resource`, whatever its kind (the reconciler's unit tests).
    #[cfg(test)]
    pub(crate) fn only(resource: Arc<dyn CapacityResource>) -> Self {
        Self {
            scale_sets: resource,
            list_scale_sets: true,
            pools: BTreeMap::new(),
            discovery: None,
            default_resource_group: String::new(),
            usages: None,
        }
    }

    /// Where the regions' compute usages are read, if they are.
    pub fn usages(&self) -> Option<&Arc<dyn UsageSource>> {
        self.usages.as_ref()
    }

    /// The resource backing `group`.
    pub fn for_group(&self, group: &NodeGroupSpec) -> Arc<dyn CapacityResource> {
        match &group.kind {
            NodeGroupKind::Vmss => self.scale_sets.clone(),
            NodeGroupKind::AksAgentPool { cluster } => {
                let rg = group
                    .resource_group
                    .as_deref()
                    .unwrap_or(&self.default_resource_group);
                match self.pools.get(&(rg.to_string(), cluster.clone())) {
                    Some(p) => p.clone(),
                    // A group discovered at run time in a cluster not known at start cannot
                    // happen (discovery only covers `autoDiscovery.aksCluster`), but never panic.
                    None => self.scale_sets.clone(),
                }
            }
        }
    }

    /// The sources to LIST on a full refresh.
    pub fn sources(&self) -> Vec<Arc<dyn CapacityResource>> {
        let mut out = Vec::new();
        if self.list_scale_sets {
            out.push(self.scale_sets.clone());
        }
        out.extend(self.pools.values().cloned());
        out
    }

    /// The pool source of `autoDiscovery.aksCluster`, whose LIST feeds pool discovery.
    pub fn discovery_pools(&self) -> Option<Arc<dyn CapacityResource>> {
        self.discovery
            .as_ref()
            .and_then(|key| self.pools.get(key).cloned())
    }

    /// Whether `group` is served by `source`.
    pub fn serves(&self, source: &Arc<dyn CapacityResource>, group: &NodeGroupSpec) -> bool {
        Arc::ptr_eq(&self.for_group(group), source)
    }
}
