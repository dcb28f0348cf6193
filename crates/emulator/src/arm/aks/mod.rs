//! AKS managed clusters and agent pools: GUID ETags, and the scoping rule of the seeds: a
//! cluster-level write changes the cluster ETag and every agent pool's, an agent-pool write only
//! that pool's. Shapes follow the AKS REST specification (2024-09-01 and later): the cluster's
//! ETag is its top-level `eTag`, a pool's is `properties.eTag` (pools have no top-level `etag`);
//! both also come back in the `ETag` header. Each pool is backed by a scale set in the cluster's
//! node resource group ([`backing`]).

mod backing;
mod out_of_band;
mod pool;

use std::collections::BTreeMap;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::scale_sets::{
    add_lro_headers, decide, not_found, parse_json_object, parse_tags, prevalidate, same_location,
    Ctx, Decision, WriteKind,
};
use super::state::{Data, Settings};
use super::Reply;
use backing::Backing;
pub use out_of_band::{AgentPoolSeed, AgentPoolView, ClusterSeed, ClusterView};
pub(crate) use pool::Pool;
use pool::{Mode, PoolBody};

const PROVIDER: &str = "Microsoft.ContainerService";
const CLUSTER_TYPE: &str = "Microsoft.ContainerService/ManagedClusters";
const POOL_TYPE: &str = "Microsoft.ContainerService/managedClusters/agentPools";
const DEFAULT_K8S: &str = "1.30.6";

/// One managed cluster and its agent pools (keyed by lowercased pool name).
#[derive(Clone, Debug)]
pub(crate) struct Cluster {
    pub sub: String,
    pub rg: String,
    pub name: String,
    pub location: String,
    pub kubernetes_version: String,
    pub node_resource_group: String,
    pub tags: BTreeMap<String, String>,
    pub etag: String,
    pub pools: BTreeMap<String, Pool>,
    pub busy_until: Instant,
    pub failed: bool,
}

fn new_etag() -> String {
    super::state::new_uuid()
}

fn cluster_key(sub: &str, rg: &str, name: &str) -> String {
    format!(
        "/subscriptions/{sub}/resourcegroups/{rg}/providers/microsoft.containerservice/managedclusters/{name}"
    )
    .to_ascii_lowercase()
}

impl Cluster {
    fn id(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/{PROVIDER}/managedClusters/{}",
            self.sub, self.rg, self.name
        )
    }

    fn key(&self) -> String {
        cluster_key(&self.sub, &self.rg, &self.name)
    }

    fn pool_key(&self, pool: &str) -> String {
        format!("{}/agentpools/{}", self.key(), pool.to_ascii_lowercase())
    }

    fn state(&self, now: Instant) -> &'static str {
        if now < self.busy_until {
            "Updating"
        } else if self.failed {
            "Failed"
        } else {
            "Succeeded"
        }
    }

    fn to_json(&self, now: Instant) -> Value {
        let profiles: Vec<Value> = self.pools.values().map(|p| p.profile_json(now)).collect();
        json!({
            "id": self.id(),
            "name": self.name,
            "type": CLUSTER_TYPE,
            "location": self.location,
            "tags": self.tags,
            "eTag": self.etag,
            "properties": {
                "provisioningState": self.state(now),
                "powerState": {"code": "Running"},
                "kubernetesVersion": self.kubernetes_version,
                "currentKubernetesVersion": self.kubernetes_version,
                "nodeResourceGroup": self.node_resource_group,
                "agentPoolProfiles": profiles,
            },
        })
    }

    fn pool_json(&self, p: &Pool, now: Instant) -> Value {
        json!({
            "id": format!("{}/agentPools/{}", self.id(), p.name),
            "name": p.name,
            "type": POOL_TYPE,
            "properties": p.properties_json(now),
        })
    }

    fn backing(&self, p: &Pool) -> Backing {
        Backing::of(
            &self.sub,
            &self.node_resource_group,
            &self.id(),
            &self.location,
            p,
        )
    }

    fn counts(&self) -> BTreeMap<String, i64> {
        self.pools
            .values()
            .map(|p| (p.name.clone(), p.count))
            .collect()
    }

    /// The mode a new pool gets when its body names none: the first pool is the System pool.
    fn default_mode(&self) -> Mode {
        if self.pools.values().any(|p| p.mode == Mode::System) {
            Mode::User
        } else {
            Mode::System
        }
    }
}

fn describe_counts(old: &BTreeMap<String, i64>, new: &BTreeMap<String, i64>) -> String {
    let mut parts = Vec::new();
    for (name, count) in new {
        match old.get(name) {
            Some(o) if o != count => parts.push(format!("pool {name} count {o} -> {count}")),
            None => parts.push(format!("pool {name} added with count {count}")),
            _ => {}
        }
    }
    for name in old.keys().filter(|n| !new.contains_key(*n)) {
        parts.push(format!("pool {name} removed"));
    }
    if parts.is_empty() {
        "cluster write".to_string()
    } else {
        parts.join(", ")
    }
}

struct ClusterBody {
    location: Option<String>,
    tags: Option<BTreeMap<String, String>>,
    kubernetes_version: Option<String>,
    node_resource_group: Option<String>,
    profiles: Vec<(String, PoolBody)>,
}

fn invalid(msg: &str) -> Reply {
    Reply::arm_error(400, "InvalidParameter", msg)
}

fn parse_cluster_body(body: &[u8]) -> Result<ClusterBody, Reply> {
    let m = parse_json_object(body)?;
    let props = m.get("properties").and_then(Value::as_object);
    let mut profiles = Vec::new();
    if let Some(list) = props
        .and_then(|p| p.get("agentPoolProfiles"))
        .filter(|v| !v.is_null())
    {
        let Some(list) = list.as_array() else {
            return Err(invalid("'agentPoolProfiles' must be a list."));
        };
        for p in list {
            let Some(obj) = p.as_object() else {
                return Err(invalid("an agent pool profile must be an object."));
            };
            let Some(name) = obj.get("name").and_then(Value::as_str) else {
                return Err(invalid("an agent pool profile needs a 'name'."));
            };
            profiles.push((name.to_string(), PoolBody::parse(obj)?));
        }
    }
    let text = |key: &str| {
        props
            .and_then(|p| p.get(key))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    Ok(ClusterBody {
        location: m
            .get("location")
            .and_then(Value::as_str)
            .map(str::to_string),
        tags: match m.get("tags") {
            Some(t) => parse_tags(t)?,
            None => None,
        },
        kubernetes_version: text("kubernetesVersion"),
        node_resource_group: text("nodeResourceGroup"),
        profiles,
    })
}

/// Records new versions for the cluster and all its pools after a cluster-level write, and
/// brings every pool's scale set in line.
fn commit_cluster(d: &mut Data, key: &str, writer: &str, change: &str) {
    let Some(c) = d.clusters.get_mut(key) else {
        return;
    };
    c.etag = new_etag();
    for p in c.pools.values_mut() {
        p.etag = new_etag();
        p.busy_until = c.busy_until;
        p.failed = c.failed;
    }
    let mut versions = vec![(c.key(), c.etag.clone())];
    versions.extend(
        c.pools
            .values()
            .map(|p| (c.pool_key(&p.name), p.etag.clone())),
    );
    let backings: Vec<Backing> = c.pools.values().map(|p| c.backing(p)).collect();
    let (busy_until, failed) = (c.busy_until, c.failed);
    for (i, (k, etag)) in versions.into_iter().enumerate() {
        // One write, one journal entry (the cluster's); every pool still has its new version.
        if i == 0 {
            d.record_version(&k, &etag, writer, change.to_string());
        } else {
            d.remember_version(&k, &etag, writer, change.to_string());
        }
        d.mark_seen(writer, &k, &etag);
    }
    for b in backings {
        b.apply(d, busy_until, failed);
    }
}

/// Builds a new cluster from a create body.
fn new_cluster(
    sub: &str,
    rg: &str,
    name: &str,
    p: ClusterBody,
    busy_until: Instant,
    failed: bool,
) -> Result<Cluster, Reply> {
    let Some(location) = p.location else {
        return Err(Reply::arm_error(
            400,
            "LocationRequired",
            "The location property is required for this definition.",
        ));
    };
    let mut c = Cluster {
        sub: sub.to_string(),
        rg: rg.to_string(),
        name: name.to_string(),
        node_resource_group: p
            .node_resource_group
            .unwrap_or_else(|| backing::default_node_resource_group(rg, name, &location)),
        location,
        kubernetes_version: p
            .kubernetes_version
            .unwrap_or_else(|| DEFAULT_K8S.to_string()),
        tags: p.tags.unwrap_or_default(),
        etag: String::new(),
        pools: BTreeMap::new(),
        busy_until,
        failed,
    };
    for (pname, pb) in p.profiles {
        let pool = Pool::new(
            &pname,
            pb,
            c.default_mode(),
            &c.kubernetes_version,
            String::new(),
            busy_until,
            failed,
        )?;
        c.pools.insert(pname.to_ascii_lowercase(), pool);
    }
    Ok(c)
}

/// Applies an update body to a copy of the cluster; nothing changes if any part is invalid.
fn updated_cluster(c: &Cluster, p: ClusterBody) -> Result<Cluster, Reply> {
    let mut next = c.clone();
    if let Some(loc) = &p.location {
        if !same_location(loc, &c.location) {
            return Err(invalid(&format!(
                "The location '{loc}' does not match the cluster's location '{}'.",
                c.location
            )));
        }
    }
    if let Some(t) = p.tags {
        next.tags = t;
    }
    if let Some(v) = p.kubernetes_version {
        // An upgrade of the control plane takes the pools that ran its version along.
        for pool in next.pools.values_mut() {
            if pool.orchestrator_version == next.kubernetes_version {
                pool.orchestrator_version = v.clone();
            }
        }
        next.kubernetes_version = v;
    }
    for (pname, pb) in p.profiles {
        let lower = pname.to_ascii_lowercase();
        let pool = match next.pools.get(&lower) {
            Some(existing) => existing.merged(pb)?,
            None => Pool::new(
                &pname,
                pb,
                next.default_mode(),
                &next.kubernetes_version,
                String::new(),
                c.busy_until,
                c.failed,
            )?,
        };
        next.pools.insert(lower, pool);
    }
    Ok(next)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn cluster(
    d: &mut Data,
    s: &Settings,
    ctx: &Ctx,
    sub: &str,
    rg: &str,
    name: &str,
    method: &str,
    body: &[u8],
    if_match: Option<&str>,
    if_none_match: Option<&str>,
) -> Reply {
    let key = cluster_key(sub, rg, name);
    if method == "GET" {
        let Some(c) = d.clusters.get(&key) else {
            return not_found(CLUSTER_TYPE, name, rg);
        };
        let (etag, body) = (c.etag.clone(), c.to_json(ctx.now));
        let pools: Vec<(String, String)> = c
            .pools
            .values()
            .map(|p| (c.pool_key(&p.name), p.etag.clone()))
            .collect();
        d.mark_seen(&ctx.writer, &key, &etag);
        for (k, e) in pools {
            d.mark_seen(&ctx.writer, &k, &e);
        }
        return Reply::json(200, body).header("ETag", etag);
    }
    let kind = match method {
        "PUT" => WriteKind::Put,
        "PATCH" => WriteKind::Patch,
        _ => WriteKind::Delete,
    };
    if let Err(r) = prevalidate(if_match, if_none_match) {
        return r;
    }
    let parsed = match kind {
        WriteKind::Delete => None,
        _ => match parse_cluster_body(body) {
            Ok(p) => Some(p),
            Err(r) => return r,
        },
    };
    let current = d.clusters.get(&key).map(|c| c.etag.clone());
    let busy_until = ctx.now + s.lro_delay;
    match decide(kind, if_match, if_none_match, current.as_deref(), || {
        not_found(CLUSTER_TYPE, name, rg)
    }) {
        Decision::Answer(r) => r,
        Decision::Create => {
            let Some(p) = parsed else {
                return Reply::empty(204);
            };
            let c = match new_cluster(sub, rg, name, p, busy_until, ctx.lro_failed) {
                Ok(c) => c,
                Err(r) => return r,
            };
            let change = describe_counts(&BTreeMap::new(), &c.counts());
            let location = c.location.clone();
            d.clusters.insert(key.clone(), c);
            commit_cluster(d, &key, &ctx.writer, &format!("created: {change}"));
            reply_cluster(d, s, ctx, &key, 201, sub, &location)
        }
        Decision::Update if kind == WriteKind::Delete => {
            let Some(c) = d.clusters.remove(&key) else {
                return Reply::empty(204);
            };
            for p in c.pools.values() {
                c.backing(p).remove(d);
            }
            d.check_lost(
                &ctx.writer,
                &key,
                &c.id(),
                &c.etag,
                ctx.seq,
                ctx.if_match.as_deref(),
            );
            let mut reply = Reply::empty(200);
            add_lro_headers(d, s, ctx, &mut reply, sub, PROVIDER, &c.location);
            reply
        }
        Decision::Update => {
            let Some(p) = parsed else {
                return Reply::empty(204);
            };
            let Some(c) = d.clusters.get_mut(&key) else {
                return not_found(CLUSTER_TYPE, name, rg);
            };
            let mut next = match updated_cluster(c, p) {
                Ok(n) => n,
                Err(r) => return r,
            };
            next.busy_until = busy_until;
            next.failed = ctx.lro_failed;
            let change = describe_counts(&c.counts(), &next.counts());
            let (old_etag, id, location) = (c.etag.clone(), c.id(), c.location.clone());
            *c = next;
            d.check_lost(
                &ctx.writer,
                &key,
                &id,
                &old_etag,
                ctx.seq,
                ctx.if_match.as_deref(),
            );
            commit_cluster(d, &key, &ctx.writer, &change);
            reply_cluster(d, s, ctx, &key, 200, sub, &location)
        }
    }
}

fn reply_cluster(
    d: &mut Data,
    s: &Settings,
    ctx: &Ctx,
    key: &str,
    status: u16,
    sub: &str,
    location: &str,
) -> Reply {
    let Some(c) = d.clusters.get(key) else {
        return Reply::arm_error(500, "InternalServerError", "cluster vanished");
    };
    let mut reply = Reply::json(status, c.to_json(ctx.now)).header("ETag", c.etag.clone());
    add_lro_headers(d, s, ctx, &mut reply, sub, PROVIDER, location);
    reply
}

pub(crate) fn pools(d: &mut Data, ctx: &Ctx, sub: &str, rg: &str, cluster: &str) -> Reply {
    let key = cluster_key(sub, rg, cluster);
    let Some(c) = d.clusters.get(&key) else {
        return not_found(CLUSTER_TYPE, cluster, rg);
    };
    let value: Vec<Value> = c.pools.values().map(|p| c.pool_json(p, ctx.now)).collect();
    let seen: Vec<(String, String)> = c
        .pools
        .values()
        .map(|p| (c.pool_key(&p.name), p.etag.clone()))
        .collect();
    for (k, e) in seen {
        d.mark_seen(&ctx.writer, &k, &e);
    }
    Reply::json(200, json!({ "value": value }))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn pool(
    d: &mut Data,
    s: &Settings,
    ctx: &Ctx,
    sub: &str,
    rg: &str,
    cluster: &str,
    pool: &str,
    method: &str,
    body: &[u8],
    if_match: Option<&str>,
    if_none_match: Option<&str>,
) -> Reply {
    let key = cluster_key(sub, rg, cluster);
    let pool_lower = pool.to_ascii_lowercase();
    let pool_not_found = || pool_not_found(pool, cluster, rg);
    if method == "GET" {
        let Some(c) = d.clusters.get(&key) else {
            return not_found(CLUSTER_TYPE, cluster, rg);
        };
        let Some(p) = c.pools.get(&pool_lower) else {
            return pool_not_found();
        };
        let (pk, etag, body) = (c.pool_key(&p.name), p.etag.clone(), c.pool_json(p, ctx.now));
        d.mark_seen(&ctx.writer, &pk, &etag);
        return Reply::json(200, body).header("ETag", etag);
    }
    let kind = match method {
        "PUT" => WriteKind::Put,
        "PATCH" => WriteKind::Patch,
        _ => WriteKind::Delete,
    };
    if let Err(r) = prevalidate(if_match, if_none_match) {
        return r;
    }
    let parsed = match kind {
        WriteKind::Delete => PoolBody::default(),
        _ => match parse_json_object(body).and_then(|m| {
            let props = m
                .get("properties")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            PoolBody::parse(&props)
        }) {
            Ok(p) => p,
            Err(r) => return r,
        },
    };
    let Some(c) = d.clusters.get_mut(&key) else {
        return match kind {
            WriteKind::Delete => Reply::empty(204),
            _ => not_found(CLUSTER_TYPE, cluster, rg),
        };
    };
    let current = c.pools.get(&pool_lower).map(|p| p.etag.clone());
    let pk = c.pool_key(pool);
    let (id, location) = (format!("{}/agentPools/{pool}", c.id()), c.location.clone());
    let busy_until = ctx.now + s.lro_delay;
    let decision = decide(
        kind,
        if_match,
        if_none_match,
        current.as_deref(),
        pool_not_found,
    );
    let (status, change, next) = match decision {
        Decision::Answer(r) => return r,
        Decision::Create => {
            let created = match Pool::new(
                pool,
                parsed,
                c.default_mode(),
                &c.kubernetes_version,
                String::new(),
                busy_until,
                ctx.lro_failed,
            ) {
                Ok(p) => p,
                Err(r) => return r,
            };
            let change = format!("pool {} created with count {}", created.name, created.count);
            (201, change, created)
        }
        Decision::Update if kind == WriteKind::Delete => {
            if let Some(p) = c.pools.remove(&pool_lower) {
                let backing = c.backing(&p);
                backing.remove(d);
                d.check_lost(
                    &ctx.writer,
                    &pk,
                    &id,
                    &p.etag,
                    ctx.seq,
                    ctx.if_match.as_deref(),
                );
            }
            let mut reply = Reply::empty(200);
            add_lro_headers(d, s, ctx, &mut reply, sub, PROVIDER, &location);
            return reply;
        }
        Decision::Update => {
            let Some(p) = c.pools.get(&pool_lower) else {
                return pool_not_found();
            };
            let next = match kind {
                WriteKind::Put => p.replaced(parsed),
                _ => p.merged(parsed),
            };
            let mut next = match next {
                Ok(n) => n,
                Err(r) => return r,
            };
            next.busy_until = busy_until;
            next.failed = ctx.lro_failed;
            let change = Pool::describe_change(p, &next);
            let old_etag = p.etag.clone();
            d.check_lost(
                &ctx.writer,
                &pk,
                &id,
                &old_etag,
                ctx.seq,
                ctx.if_match.as_deref(),
            );
            (200, change, next)
        }
    };
    let mut next = next;
    next.etag = new_etag();
    let etag = next.etag.clone();
    let Some(c) = d.clusters.get_mut(&key) else {
        return not_found(CLUSTER_TYPE, cluster, rg);
    };
    let body = c.pool_json(&next, ctx.now);
    let backing = c.backing(&next);
    c.pools.insert(pool_lower, next);
    backing.apply(d, busy_until, ctx.lro_failed);
    d.record_version(&pk, &etag, &ctx.writer, change);
    d.mark_seen(&ctx.writer, &pk, &etag);
    let mut reply = Reply::json(status, body).header("ETag", etag);
    add_lro_headers(d, s, ctx, &mut reply, sub, PROVIDER, &location);
    reply
}

fn pool_not_found(pool: &str, cluster: &str, rg: &str) -> Reply {
    Reply::arm_error(
        404,
        "NotFound",
        format!("Agent pool '{pool}' of managed cluster '{cluster}' in resource group '{rg}' was not found."),
    )
}

/// `POST {pool}/deleteMachines` with `{"machineNames": [..]}`: deletes exactly the named
/// machines (node names) from the pool's scale set, lowers `count` by as many, gives the pool a
/// new ETag and answers 202 with a long-running operation, as a pool PUT does. Preconditions
/// are evaluated as on a PUT of the existing pool (a stale `If-Match` is a 412 and changes
/// nothing); a name that is not a machine of the pool is a 400 naming it, and nothing changes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn delete_machines(
    d: &mut Data,
    s: &Settings,
    ctx: &Ctx,
    sub: &str,
    rg: &str,
    cluster: &str,
    pool: &str,
    body: &[u8],
    if_match: Option<&str>,
    if_none_match: Option<&str>,
) -> Reply {
    let m = match parse_json_object(body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let names: Vec<String> = match m.get("machineNames") {
        Some(Value::Array(a)) if !a.is_empty() => {
            match a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
            {
                Some(n) => n,
                None => return invalid("'machineNames' must be a list of machine name strings."),
            }
        }
        _ => return invalid("'machineNames' must be a non-empty list of machine names."),
    };
    let key = cluster_key(sub, rg, cluster);
    let Some(c) = d.clusters.get(&key) else {
        return not_found(CLUSTER_TYPE, cluster, rg);
    };
    let pool_lower = pool.to_ascii_lowercase();
    let Some(p) = c.pools.get(&pool_lower) else {
        return pool_not_found(pool, cluster, rg);
    };
    if let Decision::Answer(r) = decide(
        WriteKind::Patch,
        if_match,
        if_none_match,
        Some(&p.etag),
        || pool_not_found(pool, cluster, rg),
    ) {
        return r;
    }
    let backing = c.backing(p);
    let ids = match backing.instances_of(d, &names) {
        Ok(ids) => ids,
        Err(name) => {
            return invalid(&format!(
                "The machine '{name}' is not a machine of agent pool '{}' of managed cluster '{cluster}'.",
                p.name
            ))
        }
    };
    let busy_until = ctx.now + s.lro_delay;
    let mut next = p.clone();
    next.count = (p.count - i64::try_from(ids.len()).unwrap_or(i64::MAX)).max(0);
    if let Err(r) = next.validate() {
        return r;
    }
    next.busy_until = busy_until;
    next.failed = ctx.lro_failed;
    next.etag = new_etag();
    let (pk, id, location) = (
        c.pool_key(&p.name),
        format!("{}/agentPools/{}", c.id(), p.name),
        c.location.clone(),
    );
    let (old_etag, etag) = (p.etag.clone(), next.etag.clone());
    let change = format!(
        "pool {} count {} -> {} (machines deleted: {})",
        p.name,
        p.count,
        next.count,
        names.join(", ")
    );
    backing.remove_instances(d, &ids, busy_until, ctx.lro_failed);
    d.deletions.push(super::state::InstanceDeletion {
        seq: ctx.seq,
        writer: ctx.writer.clone(),
        scale_set: backing.name.clone(),
        pool: Some(next.name.clone()),
        machines: ids
            .iter()
            .map(|id| backing::machine_name(&backing.name, *id))
            .collect(),
        capacity_after: next.count,
    });
    d.check_lost(
        &ctx.writer,
        &pk,
        &id,
        &old_etag,
        ctx.seq,
        ctx.if_match.as_deref(),
    );
    if let Some(c) = d.clusters.get_mut(&key) {
        c.pools.insert(pool_lower, next);
    }
    d.record_version(&pk, &etag, &ctx.writer, change);
    d.mark_seen(&ctx.writer, &pk, &etag);
    let mut reply = Reply::empty(202);
    add_lro_headers(d, s, ctx, &mut reply, sub, PROVIDER, &location);
    reply
}

/// The region of managed cluster `name`, if it exists.
pub(crate) fn cluster_location(d: &Data, sub: &str, rg: &str, name: &str) -> Option<String> {
    d.clusters
        .get(&cluster_key(sub, rg, name))
        .map(|c| c.location.clone())
}

/// The agent pool behind each backing scale set, keyed by the scale set's lowercased id.
pub(crate) fn backing_pools(
    d: &Data,
) -> std::collections::HashMap<String, super::inventory::PoolInventory> {
    let mut out = std::collections::HashMap::new();
    for c in d.clusters.values() {
        for p in c.pools.values() {
            out.insert(
                c.backing(p).key(),
                super::inventory::PoolInventory {
                    name: p.name.clone(),
                    node_labels: p.node_labels.clone(),
                    node_taints: p.node_taints.clone(),
                    max_pods: p.max_pods,
                },
            );
        }
    }
    out
}

/// Deletes a cluster (and its pools' scale sets) without a request (a fault or the control API).
pub(crate) fn delete_cluster_out_of_band(d: &mut Data, sub: &str, rg: &str, name: &str) -> bool {
    let Some(c) = d.clusters.remove(&cluster_key(sub, rg, name)) else {
        return false;
    };
    for p in c.pools.values() {
        c.backing(p).remove(d);
    }
    true
}

/// Deletes an agent pool (and its scale set) without a request.
pub(crate) fn delete_pool_out_of_band(
    d: &mut Data,
    sub: &str,
    rg: &str,
    cluster: &str,
    pool: &str,
) -> bool {
    let Some(c) = d.clusters.get_mut(&cluster_key(sub, rg, cluster)) else {
        return false;
    };
    let Some(p) = c.pools.remove(&pool.to_ascii_lowercase()) else {
        return false;
    };
    let backing = c.backing(&p);
    backing.remove(d);
    true
}
