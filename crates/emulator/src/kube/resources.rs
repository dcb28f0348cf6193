//! The resource types served, and what each one needs (scope, subresources, generation).

/// One served resource type.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceType {
    /// API group, `""` for core.
    pub group: &'static str,
    /// Version, e.g. `v1`.
    pub version: &'static str,
    /// Plural resource name, as in paths.
    pub plural: &'static str,
    /// Singular name (discovery).
    pub singular: &'static str,
    /// `kind`.
    pub kind: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Short names (discovery, for kubectl).
    pub short_names: &'static [&'static str],
    /// Has a `status` subresource: the main resource's writes keep the stored status.
    pub status_subresource: bool,
    /// `metadata.generation` is kept and bumped when `spec` changes.
    pub generation: bool,
}

impl ResourceType {
    /// `group/version`, or `version` for core.
    pub fn group_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The store key of the type: `group/version/plural`.
    pub fn id(&self) -> String {
        format!("{}/{}/{}", self.group, self.version, self.plural)
    }

    /// `pods` or `leases.coordination.k8s.io`, as messages name them.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

// One row of the `RESOURCES` table: positional so each type fits in a few lines.
#[allow(clippy::too_many_arguments)]
const fn rt(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    status_subresource: bool,
    generation: bool,
) -> ResourceType {
    ResourceType {
        group,
        version,
        plural,
        singular,
        kind,
        namespaced,
        short_names,
        status_subresource,
        generation,
    }
}

/// Every served type.
pub static RESOURCES: &[ResourceType] = &[
    rt(
        "",
        "v1",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["ns"],
        true,
        false,
    ),
    rt(
        "",
        "v1",
        "nodes",
        "node",
        "Node",
        false,
        &["no"],
        true,
        false,
    ),
    rt("", "v1", "pods", "pod", "Pod", true, &["po"], true, false),
    rt(
        "",
        "v1",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &["cm"],
        false,
        false,
    ),
    rt(
        "",
        "v1",
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        false,
        false,
    ),
    rt(
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        true,
        &[],
        false,
        false,
    ),
    rt(
        "events.k8s.io",
        "v1",
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        false,
        false,
    ),
    rt(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        &["pdb"],
        true,
        true,
    ),
    rt(
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
        &["deploy"],
        true,
        true,
    ),
    rt(
        "apps",
        "v1",
        "replicasets",
        "replicaset",
        "ReplicaSet",
        true,
        &["rs"],
        true,
        true,
    ),
    rt(
        "",
        "v1",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        true,
        false,
    ),
    rt(
        "",
        "v1",
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        false,
        &["pv"],
        true,
        false,
    ),
    rt(
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "storageclass",
        "StorageClass",
        false,
        &["sc"],
        false,
        false,
    ),
    rt(
        "storage.k8s.io",
        "v1",
        "csinodes",
        "csinode",
        "CSINode",
        false,
        &[],
        false,
        false,
    ),
    rt(
        "apps",
        "v1",
        "daemonsets",
        "daemonset",
        "DaemonSet",
        true,
        &["ds"],
        true,
        true,
    ),
    // Jobs: the simulation runs their pods to completion (`sim::jobs`).
    rt("batch", "v1", "jobs", "job", "Job", true, &[], true, true),
    // ResourceQuotas: `status.hard`/`status.used` are written by kube-controller-manager's
    // quota controller through the status subresource (a test writes them so here).
    rt(
        "",
        "v1",
        "resourcequotas",
        "resourcequota",
        "ResourceQuota",
        true,
        &["quota"],
        true,
        false,
    ),
    rt(
        "",
        "v1",
        "podtemplates",
        "podtemplate",
        "PodTemplate",
        true,
        &[],
        false,
        false,
    ),
    // cluster-autoscaler's CRD (`autoscaling.x-k8s.io_provisioningrequests.yaml`): a status
    // subresource, and `metadata.generation` as for every custom resource.
    rt(
        "autoscaling.x-k8s.io",
        "v1",
        "provisioningrequests",
        "provisioningrequest",
        "ProvisioningRequest",
        true,
        &["provreq", "provreqs"],
        true,
        true,
    ),
    // cluster-autoscaler 1.35's CapacityBuffer CRD (`autoscaling.x-k8s.io_capacitybuffers.yaml`):
    // namespaced, short name `cb`, a status subresource, no printer columns (NAME, AGE).
    rt(
        "autoscaling.x-k8s.io",
        "v1beta1",
        "capacitybuffers",
        "capacitybuffer",
        "CapacityBuffer",
        true,
        &["cb"],
        true,
        true,
    ),
];

/// The type served at `group/version/plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The type whose store key is `id`.
pub fn by_id(id: &str) -> Option<&'static ResourceType> {
    RESOURCES.iter().find(|r| r.id() == id)
}

/// Served API groups (not core), in discovery order, each with its versions, the preferred
/// first (a group's CRDs of several versions, as `autoscaling.x-k8s.io`'s `v1`
/// ProvisioningRequests and `v1beta1` CapacityBuffers: the API server orders them by version
/// priority, GA before beta).
pub fn groups() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, versions)) if !versions.contains(&r.version) => versions.push(r.version),
            Some(_) => {}
            None => out.push((r.group, vec![r.version])),
        }
    }
    for (_, versions) in &mut out {
        versions.sort_by_key(|v| version_priority(v));
    }
    out
}

/// Kubernetes' version order, highest first: GA (`v2` before `v1`), then beta, then alpha.
fn version_priority(v: &str) -> (u8, std::cmp::Reverse<u32>, std::cmp::Reverse<u32>) {
    let rest = v.strip_prefix('v').unwrap_or(v);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    let (class, minor) = if tail.is_empty() {
        (0, "")
    } else if let Some(m) = tail.strip_prefix("beta") {
        (1, m)
    } else if let Some(m) = tail.strip_prefix("alpha") {
        (2, m)
    } else {
        (3, "")
    };
    (
        class,
        std::cmp::Reverse(major),
        std::cmp::Reverse(minor.parse().unwrap_or(0)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_of_two_versions_lists_both_ga_before_beta() {
        let all = groups();
        let (_, versions) = all
            .iter()
            .find(|(g, _)| *g == "autoscaling.x-k8s.io")
            .expect("served");
        assert_eq!(versions, &["v1", "v1beta1"]);
        let mut vs = vec!["v1alpha1", "v1beta2", "v1beta1", "v2", "v1"];
        vs.sort_by_key(|v| version_priority(v));
        assert_eq!(vs, ["v2", "v1", "v1beta2", "v1beta1", "v1alpha1"]);
    }

    #[test]
    fn capacity_buffers_are_served_namespaced_with_a_status_subresource_and_short_name_cb() {
        let rt = find("autoscaling.x-k8s.io", "v1beta1", "capacitybuffers").expect("served");
        assert!(rt.namespaced && rt.status_subresource && rt.generation);
        assert_eq!(rt.short_names, ["cb"]);
        assert_eq!(rt.kind, "CapacityBuffer");
    }
}
