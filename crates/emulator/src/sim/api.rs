//! The simulation's Rust API for tests and the demo: ReplicaSets and DaemonSets from a small pod
//! template, scaling, pod counts and the Nodes of each scale set.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::kube::{resources, KubeError, KubeState};

use super::nodes::scale_set_of;
use super::scheduler::is_pending;

/// The pods a workload runs: one container with these requests, placed by these constraints.
#[derive(Debug, Clone, Default)]
pub struct PodTemplate {
    /// Labels of the pods (a ReplicaSet selects on them; `app=<name>` when empty).
    pub labels: BTreeMap<String, String>,
    /// cpu request, e.g. `500m` (`None`: no request).
    pub cpu: Option<String>,
    /// memory request, e.g. `1Gi`.
    pub memory: Option<String>,
    /// `nvidia.com/gpu` request (0: none).
    pub gpus: u32,
    /// `nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// `tolerations`, as Kubernetes writes them.
    pub tolerations: Vec<Value>,
    /// `priority` (`None`: the default, 0).
    pub priority: Option<i64>,
    /// `topologySpreadConstraints`, as Kubernetes writes them.
    pub spread: Vec<Value>,
    /// `affinity.podAntiAffinity` required terms.
    pub anti_affinity: Vec<Value>,
    /// `terminationGracePeriodSeconds` (`None`: Kubernetes' default, 30).
    pub termination_grace_seconds: Option<i64>,
    /// How long each pod's work runs ([`super::RUNS_FOR_ANNOTATION`]; `None`: it runs until
    /// deleted). Only a pod that does not restart in place ends: a Job's.
    pub runs_for: Option<std::time::Duration>,
    /// How long each pod runs before it is Ready ([`super::READY_AFTER_ANNOTATION`]; `None`:
    /// Ready as soon as it runs).
    pub ready_after: Option<std::time::Duration>,
}

impl PodTemplate {
    /// Pods asking for `cpu` and `memory` (quantities such as `500m`, `1Gi`).
    pub fn new(cpu: &str, memory: &str) -> Self {
        PodTemplate {
            cpu: Some(cpu.to_string()),
            memory: Some(memory.to_string()),
            ..PodTemplate::default()
        }
    }

    /// Also asks for `n` GPUs.
    pub fn gpus(mut self, n: u32) -> Self {
        self.gpus = n;
        self
    }

    /// Adds a `nodeSelector` pair.
    pub fn node_selector(mut self, key: &str, value: &str) -> Self {
        self.node_selector
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Tolerates the taint `key=value:effect`.
    pub fn tolerate(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.tolerations
            .push(json!({"key": key, "operator": "Equal", "value": value, "effect": effect}));
        self
    }

    /// Spreads the pods over `topology_key` with `maxSkew` (`DoNotSchedule`), selecting on
    /// their own labels.
    pub fn spread_by(mut self, topology_key: &str, max_skew: u32, name: &str) -> Self {
        let labels = self.labels_or_default(name);
        self.spread.push(json!({
            "maxSkew": max_skew,
            "topologyKey": topology_key,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": labels},
        }));
        self
    }

    /// Counts fewer than `n` domains as domains with no pods (`minDomains` of the last spread
    /// constraint): a zone without a node holds the others back instead of disappearing.
    pub fn min_domains(mut self, n: u32) -> Self {
        if let Some(c) = self.spread.last_mut() {
            c["minDomains"] = json!(n);
        }
        self
    }

    /// Keeps the pods apart: at most one per `topology_key` domain (required anti-affinity on
    /// their own labels).
    pub fn anti_affinity_by(mut self, topology_key: &str, name: &str) -> Self {
        let labels = self.labels_or_default(name);
        self.anti_affinity.push(json!({
            "labelSelector": {"matchLabels": labels},
            "topologyKey": topology_key,
        }));
        self
    }

    /// Each pod's work runs for `d` and then ends (in a Job's pods: `Succeeded`).
    pub fn runs_for(mut self, d: std::time::Duration) -> Self {
        self.runs_for = Some(d);
        self
    }

    /// Each pod is Ready only `d` after it runs (its probes' first success).
    pub fn ready_after(mut self, d: std::time::Duration) -> Self {
        self.ready_after = Some(d);
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    /// The `spec.template` of a workload named `name`.
    pub fn to_json(&self, name: &str) -> Value {
        let labels = self.labels_or_default(name);
        let mut requests = serde_json::Map::new();
        if let Some(c) = &self.cpu {
            requests.insert("cpu".into(), json!(c));
        }
        if let Some(m) = &self.memory {
            requests.insert("memory".into(), json!(m));
        }
        let mut resources = json!({"requests": requests});
        if self.gpus > 0 {
            resources["requests"]["nvidia.com/gpu"] = json!(self.gpus.to_string());
            resources["limits"] = json!({"nvidia.com/gpu": self.gpus.to_string()});
        }
        let mut spec = json!({
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9", "resources": resources}],
        });
        if !self.node_selector.is_empty() {
            spec["nodeSelector"] = json!(self.node_selector);
        }
        if !self.tolerations.is_empty() {
            spec["tolerations"] = json!(self.tolerations);
        }
        if let Some(p) = self.priority {
            spec["priority"] = json!(p);
        }
        if let Some(g) = self.termination_grace_seconds {
            spec["terminationGracePeriodSeconds"] = json!(g);
        }
        if !self.spread.is_empty() {
            spec["topologySpreadConstraints"] = json!(self.spread);
        }
        if !self.anti_affinity.is_empty() {
            spec["affinity"] = json!({"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": self.anti_affinity
            }});
        }
        let mut metadata = json!({"labels": labels});
        for (key, d) in [
            (super::RUNS_FOR_ANNOTATION, self.runs_for),
            (super::READY_AFTER_ANNOTATION, self.ready_after),
        ] {
            if let Some(d) = d {
                metadata["annotations"][key] = json!(format!("{}s", d.as_secs().max(1)));
            }
        }
        json!({"metadata": metadata, "spec": spec})
    }

    fn labels_or_default(&self, name: &str) -> BTreeMap<String, String> {
        if self.labels.is_empty() {
            BTreeMap::from([("app".to_string(), name.to_string())])
        } else {
            self.labels.clone()
        }
    }
}

/// Pods by state (see [`KubeState::pod_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCounts {
    /// Unbound, not being deleted, phase `Pending`.
    pub pending: usize,
    /// Phase `Running`.
    pub running: usize,
}

impl KubeState {
    /// Creates an `apps/v1` ReplicaSet of `replicas` pods from `template`; with the cluster
    /// simulation on, its pods follow.
    pub fn create_replica_set(
        &self,
        namespace: &str,
        name: &str,
        replicas: i64,
        template: &PodTemplate,
    ) -> Result<Value, KubeError> {
        let labels = template.labels_or_default(name);
        self.create(
            "apps/v1",
            "replicasets",
            namespace,
            json!({
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": labels},
                    "template": template.to_json(name),
                },
            }),
        )
    }

    /// Creates a `batch/v1` Job of `pods` pods from `template`, all run at once (`parallelism`
    /// and `completions` both `pods`), not restarted in place (`restartPolicy: Never`); with the
    /// simulation on, it keeps its pods running until `pods` of them succeeded (each runs for
    /// [`PodTemplate::runs_for`]), an evicted one replaced and run again from the start.
    pub fn create_job(
        &self,
        namespace: &str,
        name: &str,
        pods: i64,
        template: &PodTemplate,
    ) -> Result<Value, KubeError> {
        let mut spec = template.to_json(name);
        spec["spec"]["restartPolicy"] = json!("Never");
        self.create(
            "batch/v1",
            "jobs",
            namespace,
            json!({
                "metadata": {"name": name, "labels": template.labels_or_default(name)},
                "spec": {"parallelism": pods, "completions": pods, "template": spec},
            }),
        )
    }

    /// Sets a ReplicaSet's `spec.replicas`.
    pub fn scale_replica_set(
        &self,
        namespace: &str,
        name: &str,
        replicas: i64,
    ) -> Result<Value, KubeError> {
        let Some(rt) = resources::find("apps", "v1", "replicasets") else {
            return Err(crate::kube::status::no_route());
        };
        // Read and write under one lock: the simulation writes the status in between otherwise,
        // and the write would meet a 409.
        self.with_store(|store| {
            let mut rs = store.get(rt, namespace, name)?;
            rs["spec"]["replicas"] = json!(replicas);
            if let Some(m) = rs["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
            store.update(rt, namespace, name, rs, None)
        })
    }

    /// Creates an `apps/v1` DaemonSet from `template`: with the simulation on, one pod on each
    /// `Ready` Node it accepts.
    pub fn create_daemon_set(
        &self,
        namespace: &str,
        name: &str,
        template: &PodTemplate,
    ) -> Result<Value, KubeError> {
        let labels = template.labels_or_default(name);
        self.create(
            "apps/v1",
            "daemonsets",
            namespace,
            json!({
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "selector": {"matchLabels": labels},
                    "template": template.to_json(name),
                },
            }),
        )
    }

    /// Pending and running pods in `namespace` (every namespace when `None`).
    pub fn pod_counts(&self, namespace: Option<&str>) -> PodCounts {
        let pods = self.list_all("v1", "pods", namespace);
        PodCounts {
            pending: pods.iter().filter(|p| is_pending(p)).count(),
            running: pods
                .iter()
                .filter(|p| p.pointer("/status/phase").and_then(Value::as_str) == Some("Running"))
                .count(),
        }
    }

    /// Node names by the scale set in their `spec.providerID` (Nodes without an Azure VMSS
    /// providerID are left out), each list in name order.
    pub fn nodes_by_scale_set(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for node in self.list_all("v1", "nodes", None) {
            let Some(ss) = node
                .pointer("/spec/providerID")
                .and_then(Value::as_str)
                .and_then(scale_set_of)
            else {
                continue;
            };
            let name = node
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            out.entry(ss.to_string()).or_default().push(name);
        }
        for names in out.values_mut() {
            names.sort();
        }
        out
    }

    /// Names of the `Ready` Nodes.
    pub fn ready_nodes(&self) -> Vec<String> {
        self.list_all("v1", "nodes", None)
            .into_iter()
            .filter(super::nodes::is_ready)
            .filter_map(|n| {
                n.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .collect()
    }
}
