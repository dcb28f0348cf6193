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

/// Served API groups (not core), in discovery order, each with its one version.
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}
