//! What the Go API server always sends: the fields of `k8s.io/api` types whose json tags lack
//! `omitempty` (serialized even when empty: `""`, `0`, `false`, `null`) and the struct-typed
//! fields (`omitempty` never omits a struct), filled into every stored object so a strict client
//! (the Python `kubernetes` client 37.x refuses a Node without `status.nodeInfo.bootID`) reads
//! the emulator's objects as it reads a real server's. Checked against kube-apiserver 1.20's
//! answers for the same objects.

use serde_json::{json, Map, Value};

use super::resources::ResourceType;

/// One rule: at `path` (segments split by `/`, `*` for every element of an array), insert
/// `value` when the key is absent. A missing parent skips the rule (parents come first).
type Rule = (&'static str, fn() -> Value);

fn obj() -> Value {
    json!({})
}
fn null() -> Value {
    Value::Null
}
fn empty() -> Value {
    json!("")
}
fn zero() -> Value {
    json!(0)
}
fn no() -> Value {
    json!(false)
}
fn kubelet_endpoint() -> Value {
    json!({"kubeletEndpoint": {"Port": 0}})
}
fn port() -> Value {
    json!({"Port": 0})
}
fn template_meta() -> Value {
    json!({"creationTimestamp": null})
}

/// A PodSpec's always-sent fields, under `prefix` (`spec`, or `spec/template/spec`).
const POD_SPEC: &[Rule] = &[
    ("containers", null),
    ("containers/*/resources", obj),
    ("initContainers/*/resources", obj),
    ("containers/*/ports/*/protocol", tcp),
    ("initContainers/*/ports/*/protocol", tcp),
];

fn tcp() -> Value {
    json!("TCP")
}

/// A PodTemplate's `template` (a struct, not a pointer, in Go: always sent).
const CORE_POD_TEMPLATE: &[Rule] = &[
    ("template", obj),
    ("template/metadata", template_meta),
    ("template/metadata/creationTimestamp", null),
    ("template/spec", obj),
];

const POD_TEMPLATE: &[Rule] = &[
    ("spec/template", obj),
    ("spec/template/metadata", template_meta),
    ("spec/template/metadata/creationTimestamp", null),
    ("spec/template/spec", obj),
];

const POD: &[Rule] = &[
    ("spec", obj),
    ("status", obj),
    ("status/conditions/*/lastProbeTime", null),
    ("status/conditions/*/lastTransitionTime", null),
    ("status/containerStatuses/*/state", obj),
    ("status/containerStatuses/*/lastState", obj),
    ("status/containerStatuses/*/ready", no),
    ("status/containerStatuses/*/restartCount", zero),
    ("status/containerStatuses/*/image", empty),
    ("status/containerStatuses/*/imageID", empty),
    ("status/containerStatuses/*/state/running/startedAt", null),
    ("status/initContainerStatuses/*/state", obj),
    ("status/initContainerStatuses/*/lastState", obj),
    ("status/initContainerStatuses/*/ready", no),
    ("status/initContainerStatuses/*/restartCount", zero),
    ("status/initContainerStatuses/*/image", empty),
    ("status/initContainerStatuses/*/imageID", empty),
];

const NODE: &[Rule] = &[
    ("spec", obj),
    ("spec/taints/*/key", empty),
    ("spec/taints/*/effect", empty),
    ("status", obj),
    ("status/conditions/*/lastHeartbeatTime", null),
    ("status/conditions/*/lastTransitionTime", null),
    ("status/daemonEndpoints", kubelet_endpoint),
    ("status/daemonEndpoints/kubeletEndpoint", port),
    ("status/daemonEndpoints/kubeletEndpoint/Port", zero),
    ("status/nodeInfo", obj),
    ("status/nodeInfo/machineID", empty),
    ("status/nodeInfo/systemUUID", empty),
    ("status/nodeInfo/bootID", empty),
    ("status/nodeInfo/kernelVersion", empty),
    ("status/nodeInfo/osImage", empty),
    ("status/nodeInfo/containerRuntimeVersion", empty),
    ("status/nodeInfo/kubeletVersion", empty),
    ("status/nodeInfo/kubeProxyVersion", empty),
    ("status/nodeInfo/operatingSystem", empty),
    ("status/nodeInfo/architecture", empty),
];

const CORE_EVENT: &[Rule] = &[
    ("involvedObject", obj),
    ("source", obj),
    ("firstTimestamp", null),
    ("lastTimestamp", null),
    ("eventTime", null),
    ("reportingComponent", empty),
    ("reportingInstance", empty),
];

const EVENTS_EVENT: &[Rule] = &[
    ("eventTime", null),
    ("regarding", obj),
    ("deprecatedSource", obj),
    ("deprecatedFirstTimestamp", null),
    ("deprecatedLastTimestamp", null),
];

/// events.k8s.io/v1 fields with `omitempty` that the core twin carries as `""`.
const EVENTS_OMITTED_WHEN_EMPTY: &[&str] = &[
    "reportingController",
    "reportingInstance",
    "action",
    "reason",
    "note",
    "type",
];

const SPEC: &[Rule] = &[("spec", obj)];
const SPEC_AND_STATUS: &[Rule] = &[("spec", obj), ("status", obj)];

const PDB: &[Rule] = &[
    ("spec", obj),
    ("status", obj),
    ("status/disruptionsAllowed", zero),
    ("status/currentHealthy", zero),
    ("status/desiredHealthy", zero),
    ("status/expectedPods", zero),
    ("status/conditions/*/lastTransitionTime", null),
    ("status/conditions/*/reason", empty),
    ("status/conditions/*/message", empty),
];

const DEPLOYMENT: &[Rule] = &[
    ("spec", obj),
    ("spec/strategy", obj),
    ("status", obj),
    ("status/conditions/*/lastUpdateTime", null),
    ("status/conditions/*/lastTransitionTime", null),
];

const REPLICA_SET: &[Rule] = &[("spec", obj), ("status", obj), ("status/replicas", zero)];

const JOB: &[Rule] = &[("spec", obj), ("status", obj)];

const DAEMON_SET: &[Rule] = &[
    ("spec", obj),
    ("spec/updateStrategy", obj),
    ("status", obj),
    ("status/currentNumberScheduled", zero),
    ("status/numberMisscheduled", zero),
    ("status/desiredNumberScheduled", zero),
    ("status/numberReady", zero),
];

const PVC: &[Rule] = &[("spec", obj), ("spec/resources", obj), ("status", obj)];

const STORAGE_CLASS: &[Rule] = &[("provisioner", empty)];

const CSI_NODE: &[Rule] = &[
    ("spec", obj),
    ("spec/drivers", null),
    ("spec/drivers/*/nodeID", empty),
    ("spec/drivers/*/topologyKeys", null),
];

/// Inserts `make()` at `path` under `v` where absent; parents must exist.
fn fill(v: &mut Value, path: &[&str], make: fn() -> Value) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    if *first == "*" {
        if let Some(items) = v.as_array_mut() {
            for item in items {
                fill(item, rest, make);
            }
        }
        return;
    }
    let Some(map) = v.as_object_mut() else {
        return;
    };
    if rest.is_empty() {
        map.entry(first.to_string()).or_insert_with(make);
    } else if let Some(child) = map.get_mut(*first) {
        fill(child, rest, make);
    }
}

fn apply(v: &mut Value, prefix: &str, rules: &[Rule]) {
    for (path, make) in rules {
        let full = if prefix.is_empty() {
            (*path).to_string()
        } else {
            format!("{prefix}/{path}")
        };
        let segs: Vec<&str> = full.split('/').collect();
        fill(v, &segs, *make);
    }
}

/// Fills the fields the Go API server always sends for an object of type `rt`.
pub fn always_sent(rt: &ResourceType, v: &mut Value) {
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.entry("creationTimestamp").or_insert(Value::Null);
    }
    match (rt.group, rt.plural) {
        ("", "pods") => {
            apply(v, "", POD);
            apply(v, "spec", POD_SPEC);
        }
        ("", "nodes") => apply(v, "", NODE),
        ("", "namespaces") | ("", "persistentvolumes") => apply(v, "", SPEC_AND_STATUS),
        ("", "events") => apply(v, "", CORE_EVENT),
        ("events.k8s.io", "events") => {
            apply(v, "", EVENTS_EVENT);
            if let Some(m) = v.as_object_mut() {
                drop_empty(m, EVENTS_OMITTED_WHEN_EMPTY);
            }
        }
        ("coordination.k8s.io", "leases") => apply(v, "", SPEC),
        ("policy", "poddisruptionbudgets") => apply(v, "", PDB),
        ("apps", "deployments") => templated(v, DEPLOYMENT),
        ("apps", "replicasets") => templated(v, REPLICA_SET),
        ("apps", "daemonsets") => templated(v, DAEMON_SET),
        ("batch", "jobs") => templated(v, JOB),
        ("", "podtemplates") => {
            apply(v, "", CORE_POD_TEMPLATE);
            apply(v, "template/spec", POD_SPEC);
        }
        ("", "persistentvolumeclaims") => apply(v, "", PVC),
        ("storage.k8s.io", "storageclasses") => apply(v, "", STORAGE_CLASS),
        ("storage.k8s.io", "csinodes") => apply(v, "", CSI_NODE),
        _ => {}
    }
}

fn templated(v: &mut Value, rules: &[Rule]) {
    apply(v, "", rules);
    apply(v, "", POD_TEMPLATE);
    apply(v, "spec/template/spec", POD_SPEC);
}

fn drop_empty(m: &mut Map<String, Value>, keys: &[&str]) {
    for k in keys {
        if m.get(*k).and_then(Value::as_str) == Some("") {
            m.remove(*k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::resources;

    #[test]
    fn a_bare_node_gets_every_node_info_field_and_the_kubelet_endpoint() {
        let rt = resources::find("", "v1", "nodes").unwrap();
        let mut node = json!({"metadata": {"name": "n"}, "status": {"nodeInfo": {"kubeletVersion": "v1.30.6"}}});
        always_sent(rt, &mut node);
        let info = &node["status"]["nodeInfo"];
        assert_eq!(info["kubeletVersion"], "v1.30.6");
        for f in [
            "machineID",
            "systemUUID",
            "bootID",
            "kernelVersion",
            "osImage",
            "containerRuntimeVersion",
            "kubeProxyVersion",
            "operatingSystem",
            "architecture",
        ] {
            assert_eq!(info[f], "", "{f}");
        }
        assert_eq!(
            node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
            0
        );
        assert_eq!(node["spec"], json!({}));
        assert_eq!(node["metadata"]["creationTimestamp"], Value::Null);
    }

    #[test]
    fn array_rules_fill_each_element_and_skip_missing_parents() {
        let rt = resources::find("", "v1", "pods").unwrap();
        let mut pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "resources": {"limits": {}}}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        always_sent(rt, &mut pod);
        assert_eq!(pod["spec"]["containers"][0]["resources"], json!({}));
        assert_eq!(
            pod["spec"]["containers"][1]["resources"],
            json!({"limits": {}})
        );
        assert_eq!(pod["status"]["conditions"][0]["lastProbeTime"], Value::Null);
        assert!(pod["spec"].get("initContainers").is_none());
    }
}
