//! A pod as the reflector reads it off the wire: only the fields a [`super::record::PodRecord`] keeps
//! are built, everything else in the JSON is skipped as it is parsed.
//!
//! A pod as an API server returns it is several KiB of JSON, and most of it is what the
//! controller never reads: managed fields, env, probes, volume mounts, container statuses, a
//! projected token volume. Parsed into k8s-openapi's `Pod`, every one of those is built (strings,
//! maps, nested structs) and then dropped by [`super::record::slim_spec`]; at 50,000 pods that
//! parse was most of the daemon's CPU before its first decision. A [`WirePod`] has the same
//! shape with only the kept fields, so serde skips the rest without allocating, and it turns into
//! the `Pod` the records are made from (`Pod::from`), holding exactly what
//! [`super::record::Interner::record`] would have kept of the full one.
//!
//! It is a Kubernetes resource of its own (kind `Pod`, `v1`, `pods`) for `kube`'s `Api` and
//! watcher. The fields kept are listed once, here; a test parses the same JSON both ways and
//! compares the records.

use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, EmptyDirVolumeSource, EphemeralVolumeSource,
    HostPathVolumeSource, PersistentVolumeClaimVolumeSource, Pod, PodCondition, PodOS, PodSpec,
    PodStatus, ResourceRequirements, Toleration, TopologySpreadConstraint, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::Deserialize;
use std::collections::BTreeMap;

/// A pod with only what the controller keeps (see the module documentation).
#[derive(Debug, Clone, Default)]
pub struct WirePod {
    /// Name, namespace, uid, resourceVersion, labels, annotations, owners, deletionTimestamp.
    pub metadata: ObjectMeta,
    /// The spec's kept fields.
    pub spec: Option<PodSpec>,
    /// Phase, conditions (type, status, reason), nominated node.
    pub status: Option<PodStatus>,
}

impl k8s_openapi::Resource for WirePod {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for WirePod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl From<WirePod> for Pod {
    fn from(p: WirePod) -> Self {
        Pod {
            metadata: p.metadata,
            spec: p.spec,
            status: p.status,
        }
    }
}

impl<'de> Deserialize<'de> for WirePod {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = PodIn::deserialize(d)?;
        Ok(WirePod {
            metadata: w.metadata.map(ObjectMeta::from).unwrap_or_default(),
            spec: w.spec.map(PodSpec::from),
            status: w.status.map(PodStatus::from),
        })
    }
}

#[derive(Deserialize)]
struct PodIn {
    metadata: Option<MetaIn>,
    spec: Option<SpecIn>,
    status: Option<StatusIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaIn {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
}

impl From<MetaIn> for ObjectMeta {
    fn from(m: MetaIn) -> Self {
        ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            labels: m.labels,
            annotations: m.annotations,
            owner_references: m.owner_references,
            deletion_timestamp: m.deletion_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            ..ObjectMeta::default()
        }
    }
}

/// The spec fields [`super::record::slim_spec`] keeps; every other one is skipped.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecIn {
    active_deadline_seconds: Option<i64>,
    affinity: Option<Affinity>,
    containers: Option<Vec<ContainerIn>>,
    #[serde(rename = "hostIPC")]
    host_ipc: Option<bool>,
    host_network: Option<bool>,
    #[serde(rename = "hostPID")]
    host_pid: Option<bool>,
    host_users: Option<bool>,
    init_containers: Option<Vec<ContainerIn>>,
    node_name: Option<String>,
    node_selector: Option<BTreeMap<String, String>>,
    os: Option<PodOS>,
    overhead: Option<BTreeMap<String, Quantity>>,
    preemption_policy: Option<String>,
    priority: Option<i32>,
    priority_class_name: Option<String>,
    resources: Option<ResourceRequirements>,
    runtime_class_name: Option<String>,
    scheduler_name: Option<String>,
    #[serde(rename = "setHostnameAsFQDN")]
    set_hostname_as_fqdn: Option<bool>,
    share_process_namespace: Option<bool>,
    /// Not scheduling's, but a deleted pod's fallback grace period (see
    /// [`super::record::PodRecord::long_terminating`]); dropped by `slim_spec` after.
    termination_grace_period_seconds: Option<i64>,
    tolerations: Option<Vec<Toleration>>,
    topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    volumes: Option<Vec<VolumeIn>>,
}

impl From<SpecIn> for PodSpec {
    fn from(s: SpecIn) -> Self {
        let containers = |c: Vec<ContainerIn>| c.into_iter().map(Container::from).collect();
        PodSpec {
            active_deadline_seconds: s.active_deadline_seconds,
            affinity: s.affinity,
            containers: s.containers.map(containers).unwrap_or_default(),
            host_ipc: s.host_ipc,
            host_network: s.host_network,
            host_pid: s.host_pid,
            host_users: s.host_users,
            init_containers: s.init_containers.map(containers),
            node_name: s.node_name,
            node_selector: s.node_selector,
            os: s.os,
            overhead: s.overhead,
            preemption_policy: s.preemption_policy,
            priority: s.priority,
            priority_class_name: s.priority_class_name,
            resources: s.resources,
            runtime_class_name: s.runtime_class_name,
            scheduler_name: s.scheduler_name,
            set_hostname_as_fqdn: s.set_hostname_as_fqdn,
            share_process_namespace: s.share_process_namespace,
            termination_grace_period_seconds: s.termination_grace_period_seconds,
            tolerations: s.tolerations,
            topology_spread_constraints: s.topology_spread_constraints,
            volumes: s.volumes.map(|v| v.into_iter().map(Volume::from).collect()),
            ..PodSpec::default()
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerIn {
    name: Option<String>,
    resources: Option<ResourceRequirements>,
    restart_policy: Option<String>,
    ports: Option<Vec<ContainerPort>>,
}

impl From<ContainerIn> for Container {
    fn from(c: ContainerIn) -> Self {
        Container {
            name: c.name.unwrap_or_default(),
            resources: c.resources,
            restart_policy: c.restart_policy,
            ports: c.ports,
            ..Container::default()
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeIn {
    name: Option<String>,
    host_path: Option<HostPathVolumeSource>,
    empty_dir: Option<EmptyDirVolumeSource>,
    persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    ephemeral: Option<EphemeralVolumeSource>,
}

impl From<VolumeIn> for Volume {
    fn from(v: VolumeIn) -> Self {
        Volume {
            name: v.name.unwrap_or_default(),
            host_path: v.host_path,
            empty_dir: v.empty_dir,
            persistent_volume_claim: v.persistent_volume_claim,
            ephemeral: v.ephemeral,
            ..Volume::default()
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusIn {
    phase: Option<String>,
    conditions: Option<Vec<ConditionIn>>,
    nominated_node_name: Option<String>,
    start_time: Option<Time>,
}

#[derive(Deserialize)]
struct ConditionIn {
    #[serde(rename = "type")]
    type_: Option<String>,
    status: Option<String>,
    reason: Option<String>,
}

impl From<StatusIn> for PodStatus {
    fn from(s: StatusIn) -> Self {
        PodStatus {
            phase: s.phase,
            conditions: s.conditions.map(|c| {
                c.into_iter()
                    .map(|c| PodCondition {
                        type_: c.type_.unwrap_or_default(),
                        status: c.status.unwrap_or_default(),
                        reason: c.reason,
                        ..PodCondition::default()
                    })
                    .collect()
            }),
            nominated_node_name: s.nominated_node_name,
            start_time: s.start_time,
            ..PodStatus::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::record::Interner;
    use serde_json::{json, Value};

    /// A pod as an API server returns it, with every kind of field the records keep or drop.
    fn api_server_pod(bound: bool) -> Value {
        let now = "2026-11-26T10:00:00Z";
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-7d4b9c-x2x7k", "generateName": "web-7d4b9c-", "namespace": "shop",
                "uid": "6c1f0b5e-1111-4e8f-9a3c-0c9f2d6e7a10", "resourceVersion": "48213",
                "creationTimestamp": now,
                "labels": {"app": "web", "pod-template-hash": "7d4b9c"},
                "annotations": {
                    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                    "kubernetes.io/config.mirror": "abc",
                    "kubectl.kubernetes.io/restartedAt": now,
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"big\": true}"
                },
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u0"},
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c", "uid": "u1",
                     "controller": true, "blockOwnerDeletion": true}
                ],
                "finalizers": ["example.com/keep"],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                    "apiVersion": "v1", "time": now, "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}}]
            },
            "spec": {
                "hostNetwork": true, "hostIPC": false, "hostPID": true, "hostUsers": false,
                "setHostnameAsFQDN": true, "shareProcessNamespace": true,
                "activeDeadlineSeconds": 600, "runtimeClassName": "kata", "os": {"name": "linux"},
                "containers": [{
                    "name": "app", "image": "contoso.azurecr.io/web:1.4",
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}, {"containerPort": 9100, "hostPort": 9100, "protocol": "TCP"}],
                    "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
                    "volumeMounts": [{"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets", "readOnly": true}],
                    "securityContext": {"runAsNonRoot": true}
                }],
                "initContainers": [{"name": "proxy", "image": "envoy", "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "100m"}}}],
                "volumes": [
                    {"name": "kube-api-access-abcde", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}},
                    {"name": "eph", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "managed-csi", "resources": {"requests": {"storage": "1Gi"}}}}}},
                    {"name": "cfg", "configMap": {"name": "cfg"}}
                ],
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}},
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}, "minDomains": 3}],
                "overhead": {"cpu": "10m"}, "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                "priority": 1000, "priorityClassName": "high", "preemptionPolicy": "Never",
                "schedulerName": "default-scheduler",
                "serviceAccountName": "web", "dnsPolicy": "ClusterFirst", "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 30, "securityContext": {"fsGroup": 2000},
                "imagePullSecrets": [{"name": "acr"}], "enableServiceLinks": true
            },
            "status": {
                "phase": "Pending", "qosClass": "Burstable", "nominatedNodeName": "aks-pool-0",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/3 nodes are available", "lastProbeTime": null, "lastTransitionTime": now}]
            }
        });
        if bound {
            pod["spec"]["nodeName"] = json!("aks-pool-1");
            pod["metadata"]["deletionTimestamp"] = json!(now);
            pod["status"] = json!({
                "phase": "Running", "hostIP": "10.0.0.4", "startTime": now,
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
                "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "image": "web",
                    "imageID": "sha256:00", "state": {"running": {"startedAt": now}}}]
            });
        }
        pod
    }

    #[test]
    fn a_pod_read_off_the_wire_makes_the_same_record_as_the_full_object() {
        for bound in [false, true] {
            let text = api_server_pod(bound).to_string();
            let full: Pod = serde_json::from_str(&text).expect("a Pod");
            let wire: WirePod = serde_json::from_str(&text).expect("a WirePod");
            let a = Interner::default().record(full);
            let b = Interner::default().record(wire.into());
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "bound: {bound}");
        }
    }

    /// Every `PodSpec` field, named: a k8s-openapi update that adds one fails to compile here,
    /// and whoever updates decides whether [`super::record::slim_spec`] keeps it (then `SpecIn`
    /// reads it) or drops it.
    #[test]
    fn every_pod_spec_field_is_read_off_the_wire_or_dropped_by_slim_spec() {
        let PodSpec {
            // Read off the wire (`SpecIn`) and kept.
            active_deadline_seconds: _,
            affinity: _,
            containers: _,
            host_ipc: _,
            host_network: _,
            host_pid: _,
            host_users: _,
            init_containers: _,
            node_name: _,
            node_selector: _,
            os: _,
            overhead: _,
            preemption_policy: _,
            priority: _,
            priority_class_name: _,
            resources: _,
            runtime_class_name: _,
            scheduler_name: _,
            set_hostname_as_fqdn: _,
            share_process_namespace: _,
            // Read for a deleted pod's grace period, then dropped by `slim_spec`.
            termination_grace_period_seconds: _,
            tolerations: _,
            topology_spread_constraints: _,
            volumes: _,
            // Dropped by `slim_spec`, skipped on the wire.
            automount_service_account_token: _,
            dns_config: _,
            dns_policy: _,
            enable_service_links: _,
            ephemeral_containers: _,
            host_aliases: _,
            hostname: _,
            image_pull_secrets: _,
            readiness_gates: _,
            resource_claims: _,
            restart_policy: _,
            scheduling_gates: _,
            security_context: _,
            service_account: _,
            service_account_name: _,
            subdomain: _,
        } = PodSpec::default();
    }

    #[test]
    fn a_pod_with_what_the_wire_may_leave_out_or_null_still_reads() {
        for text in [
            r#"{}"#,
            r#"{"metadata": null, "spec": null, "status": null}"#,
            r#"{"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "ports": null}], "volumes": null}}"#,
            r#"{"metadata": {"name": "p"}, "status": {"conditions": [{"type": "Ready"}]}}"#,
        ] {
            let wire: WirePod =
                serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let _ = Interner::default().record(wire.into());
        }
        let bad = serde_json::from_str::<WirePod>(r#"{"spec": {"priority": "high"}}"#)
            .expect_err("a priority that is not a number");
        assert!(bad.to_string().contains("invalid type"), "{bad}");
    }
}
