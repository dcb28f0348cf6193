//! What the reflectors keep of each Pod and Node: the fields the scale-up decision, the
//! scale-down and the drain read, and nothing else (controller-runtime's "strip managed fields"
//! transform, taken further). A real API server's pod carries managed fields, env, probes, a
//! projected token volume and container statuses, a node fifty image names: about 5 and 14 KiB
//! of JSON, several times that once deserialized, and none of it decides anything here. On a
//! 50,000-pod cluster that is the difference between a few hundred MiB and a few GiB
//! (`cargo bench --bench memory`).
//!
//! Kept, for pods: name, namespace, uid, resourceVersion, labels, owner references,
//! creation and deletion timestamps, the annotations cluster-autoscaler defines
//! (`cluster-autoscaler.kubernetes.io/*`) and the mirror-pod mark; per container its name,
//! resources, restart policy and the ports that claim a host port; the node name, selector,
//! affinity, tolerations, topology spread, priority, overhead, scheduler name; of the volumes
//! the local-storage kinds (`hostPath`, `emptyDir`) and persistent claims; the phase and the
//! `PodScheduled`/`Ready` conditions. For nodes: name, uid, resourceVersion, creation time,
//! labels, cluster-autoscaler's annotations, the whole spec (providerID, taints,
//! unschedulable), capacity, allocatable and conditions.

use k8s_openapi::api::core::v1::{Container, Node, Pod, Volume};
use std::collections::BTreeMap;

/// Annotations the controller reads; every other one is dropped.
fn kept_annotation(key: &str) -> bool {
    key.starts_with("cluster-autoscaler.kubernetes.io/")
        || key == "kubernetes.io/config.mirror"
        || key.starts_with("vmss-capacity-controller")
}

fn slim_annotations(a: &mut Option<BTreeMap<String, String>>) {
    if let Some(map) = a {
        map.retain(|k, _| kept_annotation(k));
        if map.is_empty() {
            *a = None;
        }
    }
}

fn slim_container(c: &mut Container) {
    *c = Container {
        name: std::mem::take(&mut c.name),
        resources: c.resources.take(),
        restart_policy: c.restart_policy.take(),
        ports: c.ports.take().and_then(|ports| {
            let host: Vec<_> = ports
                .into_iter()
                .filter(|p| p.host_port.is_some())
                .collect();
            (!host.is_empty()).then_some(host)
        }),
        ..Container::default()
    };
}

fn slim_volume(v: &mut Volume) {
    *v = Volume {
        name: std::mem::take(&mut v.name),
        host_path: v.host_path.take(),
        empty_dir: v.empty_dir.take(),
        persistent_volume_claim: v.persistent_volume_claim.take(),
        ephemeral: v.ephemeral.take(),
        ..Volume::default()
    };
}

/// Drops from `pod` what the controller never reads (see the module documentation).
pub fn pod(pod: &mut Pod) {
    let m = &mut pod.metadata;
    m.managed_fields = None;
    m.generate_name = None;
    slim_annotations(&mut m.annotations);
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers.iter_mut().for_each(slim_container);
        if let Some(init) = spec.init_containers.as_mut() {
            init.iter_mut().for_each(slim_container);
        }
        spec.ephemeral_containers = None;
        if let Some(volumes) = spec.volumes.as_mut() {
            volumes.iter_mut().for_each(slim_volume);
        }
        spec.dns_config = None;
        spec.host_aliases = None;
        spec.image_pull_secrets = None;
        spec.readiness_gates = None;
        spec.security_context = None;
        spec.resource_claims = None;
        spec.scheduling_gates = None;
        spec.service_account = None;
        spec.service_account_name = None;
        spec.subdomain = None;
        spec.hostname = None;
    }
    if let Some(status) = pod.status.as_mut() {
        let conditions = status.conditions.take().map(|cs| {
            cs.into_iter()
                .filter(|c| c.type_ == "PodScheduled" || c.type_ == "Ready")
                .map(|mut c| {
                    c.last_probe_time = None;
                    c
                })
                .collect()
        });
        *status = k8s_openapi::api::core::v1::PodStatus {
            phase: status.phase.take(),
            conditions,
            nominated_node_name: status.nominated_node_name.take(),
            ..Default::default()
        };
    }
}

/// Drops from `node` what the controller never reads (see the module documentation).
pub fn node(node: &mut Node) {
    let m = &mut node.metadata;
    m.managed_fields = None;
    slim_annotations(&mut m.annotations);
    if let Some(status) = node.status.as_mut() {
        let conditions = status.conditions.take().map(|cs| {
            cs.into_iter()
                .map(|mut c| {
                    c.last_heartbeat_time = None;
                    c.message = None;
                    c
                })
                .collect()
        });
        *status = k8s_openapi::api::core::v1::NodeStatus {
            allocatable: status.allocatable.take(),
            capacity: status.capacity.take(),
            conditions,
            ..Default::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod_of(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_slim_pod_keeps_what_fit_drain_and_blockers_read() {
        let mut p = pod_of(json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
                "labels": {"app": "web"},
                "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                    "kubernetes.io/config.mirror": "abc", "prometheus.io/scrape": "true"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": true}],
                "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
            "spec": {
                "nodeName": "n1", "priority": 5, "nodeSelector": {"pool": "a"},
                "tolerations": [{"key": "sku", "operator": "Exists"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["1"]}]}]}}},
                "containers": [{"name": "app", "image": "app:1", "env": [{"name": "A", "value": "b"}],
                    "resources": {"requests": {"cpu": "1"}},
                    "ports": [{"containerPort": 80}, {"containerPort": 8080, "hostPort": 8080}]}],
                "initContainers": [{"name": "sidecar", "restartPolicy": "Always", "image": "s", "resources": {"requests": {"cpu": "100m"}}}],
                "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "logs", "hostPath": {"path": "/var/log"}},
                    {"name": "token", "projected": {"sources": []}}],
            },
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "image": "app:1", "imageID": "x"}]},
        }));
        super::pod(&mut p);
        let m = &p.metadata;
        assert_eq!(m.uid.as_deref(), Some("u1"));
        assert_eq!(m.resource_version.as_deref(), Some("7"));
        assert!(m.managed_fields.is_none());
        let a = m.annotations.as_ref().unwrap();
        assert_eq!(a.len(), 2, "{a:?}");
        assert!(a.contains_key("kubernetes.io/config.mirror"));
        assert_eq!(m.owner_references.as_ref().unwrap()[0].kind, "ReplicaSet");
        let s = p.spec.as_ref().unwrap();
        assert_eq!(s.node_name.as_deref(), Some("n1"));
        assert_eq!(s.priority, Some(5));
        assert!(s.affinity.is_some() && s.node_selector.is_some() && s.tolerations.is_some());
        let c = &s.containers[0];
        assert!(c.env.is_none() && c.image.is_none());
        assert!(c.resources.is_some());
        assert_eq!(c.ports.as_ref().unwrap().len(), 1, "only the host port");
        let init = &s.init_containers.as_ref().unwrap()[0];
        assert_eq!(init.restart_policy.as_deref(), Some("Always"));
        assert!(init.resources.is_some());
        let v = s.volumes.as_ref().unwrap();
        assert!(v[0].empty_dir.is_some() && v[1].host_path.is_some() && v[2].projected.is_none());
        let st = p.status.as_ref().unwrap();
        assert_eq!(st.phase.as_deref(), Some("Running"));
        let types: Vec<_> = st
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types, ["PodScheduled", "Ready"]);
        assert!(st.container_statuses.is_none() && st.pod_ip.is_none());
    }

    #[test]
    fn a_slim_node_keeps_its_group_room_taints_and_readiness() {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "uid": "u", "resourceVersion": "3", "creationTimestamp": "2026-11-24T06:00:00Z",
                "labels": {"kubernetes.azure.com/agentpool": "a"},
                "annotations": {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true", "node.alpha.kubernetes.io/ttl": "0"},
                "managedFields": [{"manager": "kubelet"}]},
            "spec": {"providerID": "azure:///x", "unschedulable": true, "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "4"}, "capacity": {"cpu": "4"},
                "conditions": [{"type": "Ready", "status": "True", "message": "kubelet is posting ready status"}],
                "images": [{"names": ["a"], "sizeBytes": 1}], "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b",
                    "kernelVersion": "k", "osImage": "o", "containerRuntimeVersion": "c", "kubeletVersion": "v", "kubeProxyVersion": "v",
                    "operatingSystem": "linux", "architecture": "amd64"}},
        }))
        .unwrap();
        super::node(&mut n);
        assert!(n.metadata.managed_fields.is_none());
        assert!(n.metadata.creation_timestamp.is_some());
        assert_eq!(n.metadata.annotations.as_ref().unwrap().len(), 1);
        let spec = n.spec.as_ref().unwrap();
        assert_eq!(spec.provider_id.as_deref(), Some("azure:///x"));
        assert_eq!(spec.unschedulable, Some(true));
        assert_eq!(spec.taints.as_ref().unwrap().len(), 1);
        let st = n.status.as_ref().unwrap();
        assert!(st.allocatable.is_some() && st.capacity.is_some());
        assert_eq!(st.conditions.as_ref().unwrap()[0].status, "True");
        assert!(st.images.is_none() && st.node_info.is_none());
    }
}
