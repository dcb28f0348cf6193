//! A [`super::snapshot::Snapshot`] read from the APIs, for `explain` without `--snapshot`: the
//! node groups' scale sets and agent pools from ARM, the nodes, pods, budgets and DaemonSets from
//! the Kubernetes API. GETs and LISTs only: read-only credentials suffice (`Reader` on the
//! resource groups, `get`/`list` in the cluster).

use super::snapshot::Snapshot;
use crate::azure::aks::AgentPools;
use crate::config::{NodeGroupKind, Settings};
use crate::metrics::Metrics;
use crate::pods::record::{NodeRecord, PodRecord};
use anyhow::Context;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Reads what `settings` names: its resource group's scale sets, the pools of every managed
/// cluster its node groups and auto-discovery name, and the cluster `kubernetes.kubeconfig` (or
/// the in-cluster account, or `KUBECONFIG`) reaches.
pub async fn read(settings: &Settings) -> anyhow::Result<Snapshot> {
    let arm = crate::app::arm_client(settings, Arc::new(Metrics::new()))?;
    let mut snap = Snapshot::default();
    let rg = settings.azure.resource_group.clone();
    for s in arm
        .list_scale_sets()
        .await
        .with_context(|| format!("listing the scale sets of resource group {rg}"))?
    {
        snap.scale_sets.push((rg.clone(), s));
    }
    let mut clusters = BTreeSet::new();
    for g in &settings.node_groups {
        if let NodeGroupKind::AksAgentPool { cluster } = &g.kind {
            clusters.insert((
                g.resource_group.clone().unwrap_or_else(|| rg.clone()),
                cluster.clone(),
            ));
        }
    }
    if let Some(c) = settings
        .auto_discovery
        .as_ref()
        .and_then(|a| a.aks_cluster.clone())
    {
        let crg = settings
            .auto_discovery
            .as_ref()
            .and_then(|a| a.aks_resource_group.clone())
            .unwrap_or_else(|| rg.clone());
        clusters.insert((crg, c));
    }
    for (crg, cluster) in clusters {
        let pools = AgentPools::new(arm.clone(), &crg, &cluster)
            .list()
            .await
            .with_context(|| {
                format!(
                    "listing the agent pools of managed cluster {cluster} (resource group {crg})"
                )
            })?;
        for p in pools {
            snap.pools.push((crg.clone(), cluster.clone(), p));
        }
    }
    // The vCPU quota left in every region the groups are in, as the controller reads it.
    let regions: BTreeSet<String> = snap
        .scale_sets
        .iter()
        .map(|(_, s)| s)
        .chain(snap.pools.iter().map(|(_, _, p)| p))
        .filter(|s| !s.location.is_empty())
        .map(|s| s.location.to_ascii_lowercase())
        .collect();
    for region in regions {
        match arm.list_usages(&region).await {
            Ok(rows) => {
                snap.usages.insert(region, rows);
            }
            Err(e) => snap.notes.push(format!(
                "compute usages of {region} not read ({e}): quota not applied here (the role needs Microsoft.Compute/locations/usages/read at subscription scope)"
            )),
        }
    }
    // Each group's instances, as the reconciler lists them: scale-up counts no node coming from
    // a `Failed` or deallocated one, and neither does an explanation.
    for (rg, s) in &snap.scale_sets {
        match arm.list_instances_in(rg, &s.name).await {
            Ok(list) => {
                snap.instances.insert(s.name.to_ascii_lowercase(), list);
            }
            Err(e) => snap.notes.push(format!(
                "instances of scale set {} not listed ({e}): Failed instances count as nodes on their way here",
                s.name
            )),
        }
    }
    for (crg, cluster, p) in &snap.pools {
        match AgentPools::new(arm.clone(), crg, cluster)
            .list_instances(&p.name)
            .await
        {
            Ok(list) => {
                snap.instances.insert(p.name.to_ascii_lowercase(), list);
            }
            Err(e) => snap.notes.push(format!(
                "instances of agent pool {} not listed ({e}): Failed instances count as nodes on their way here",
                p.name
            )),
        }
    }
    let client = crate::app::kube_client(&settings.kubernetes).await?;
    snap.nodes = list::<Node>(&client, "nodes")
        .await?
        .into_iter()
        .map(|n| Arc::new(NodeRecord::of(n)))
        .collect();
    snap.pods = list::<Pod>(&client, "pods")
        .await?
        .into_iter()
        .map(|p| Arc::new(PodRecord::of(p)))
        .collect();
    snap.pdbs = list::<PodDisruptionBudget>(&client, "poddisruptionbudgets (policy/v1)")
        .await?
        .into_iter()
        .map(Arc::new)
        .collect();
    snap.daemonsets = list::<DaemonSet>(&client, "daemonsets (apps/v1)")
        .await?
        .into_iter()
        .map(Arc::new)
        .collect();
    snap.claims = list(&client, "persistentvolumeclaims").await?;
    snap.volumes = list(&client, "persistentvolumes").await?;
    snap.classes = list(&client, "storageclasses (storage.k8s.io/v1)").await?;
    snap.csi_nodes = list(&client, "csinodes (storage.k8s.io/v1)").await?;
    // The running controller's status: what only it knows (holds, backoffs, unneeded times).
    let k = &settings.kubernetes;
    match Api::<ConfigMap>::namespaced(client.clone(), &k.namespace)
        .get_opt(&k.status_config_map)
        .await
    {
        Ok(Some(cm)) => snap.config_maps.push(cm),
        Ok(None) => {}
        Err(e) => snap.notes.push(format!(
            "ConfigMap {}/{} not read ({e}): the role needs get on it",
            k.namespace, k.status_config_map
        )),
    }
    snap.namespaces = list::<Namespace>(&client, "namespaces")
        .await?
        .into_iter()
        .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
        .collect();
    Ok(snap)
}

/// Every object of kind `K` in the cluster; `what` names it in the error.
async fn list<K>(client: &kube::Client, what: &str) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    Ok(Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing {what} (the role needs get/list on them)"))?
        .items)
}
