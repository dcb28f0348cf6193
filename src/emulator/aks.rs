//! AKS managed clusters and agent pools: GUID ETags, and the scoping rule of the seeds: a
//! cluster-level write changes the cluster ETag and every agent pool's, an agent-pool write only
//! that pool's.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::arm::{
    add_lro_headers, decide, not_found, parse_count, parse_json_object, prevalidate, same_location,
    Ctx, Decision, WriteKind,
};
use super::state::{Data, Settings};
use super::Reply;

const PROVIDER: &str = "Microsoft.ContainerService";
const CLUSTER_TYPE: &str = "Microsoft.ContainerService/ManagedClusters";
const POOL_TYPE: &str = "Microsoft.ContainerService/managedClusters/agentPools";
const DEFAULT_K8S: &str = "1.30.6";
const DEFAULT_VM_SIZE: &str = "Standard_D2s_v5";

#[derive(Clone, Debug)]
pub(crate) struct Pool {
    pub name: String,
    pub count: i64,
    pub vm_size: String,
    pub mode: String,
    pub etag: String,
}

#[derive(Clone, Debug)]
pub(crate) struct Cluster {
    pub sub: String,
    pub rg: String,
    pub name: String,
    pub location: String,
    pub kubernetes_version: String,
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
        let profiles: Vec<Value> = self
            .pools
            .values()
            .map(|p| {
                json!({"name": p.name, "count": p.count, "vmSize": p.vm_size, "mode": p.mode, "eTag": p.etag})
            })
            .collect();
        json!({
            "id": self.id(),
            "name": self.name,
            "type": CLUSTER_TYPE,
            "location": self.location,
            "etag": self.etag,
            "properties": {
                "provisioningState": self.state(now),
                "kubernetesVersion": self.kubernetes_version,
                "agentPoolProfiles": profiles,
            },
        })
    }

    fn pool_json(&self, p: &Pool, now: Instant) -> Value {
        json!({
            "id": format!("{}/agentPools/{}", self.id(), p.name),
            "name": p.name,
            "type": POOL_TYPE,
            "etag": p.etag,
            "properties": {
                "count": p.count,
                "vmSize": p.vm_size,
                "mode": p.mode,
                "provisioningState": self.state(now),
            },
        })
    }

    fn counts(&self) -> BTreeMap<String, i64> {
        self.pools
            .values()
            .map(|p| (p.name.clone(), p.count))
            .collect()
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

/// A pool profile or agent-pool body: fields absent keep their value.
#[derive(Default)]
struct PoolBody {
    count: Option<i64>,
    vm_size: Option<String>,
    mode: Option<String>,
}

fn parse_pool_fields(m: &serde_json::Map<String, Value>) -> Result<PoolBody, Reply> {
    let mut out = PoolBody::default();
    if let Some(c) = m.get("count").filter(|v| !v.is_null()) {
        out.count = Some(parse_count(c, "count")?);
    }
    out.vm_size = m.get("vmSize").and_then(Value::as_str).map(str::to_string);
    out.mode = m.get("mode").and_then(Value::as_str).map(str::to_string);
    Ok(out)
}

fn apply_pool(pool: &mut Pool, body: PoolBody) {
    if let Some(c) = body.count {
        pool.count = c;
    }
    if let Some(v) = body.vm_size {
        pool.vm_size = v;
    }
    if let Some(m) = body.mode {
        pool.mode = m;
    }
}

struct ClusterBody {
    location: Option<String>,
    kubernetes_version: Option<String>,
    profiles: Vec<(String, PoolBody)>,
}

fn parse_cluster_body(body: &[u8]) -> Result<ClusterBody, Reply> {
    let m = parse_json_object(body)?;
    let props = m.get("properties").and_then(Value::as_object);
    let mut profiles = Vec::new();
    if let Some(list) = props.and_then(|p| p.get("agentPoolProfiles")) {
        let Some(list) = list.as_array() else {
            return Err(Reply::arm_error(
                400,
                "InvalidParameter",
                "'agentPoolProfiles' must be a list.",
            ));
        };
        for p in list {
            let Some(obj) = p.as_object() else {
                return Err(Reply::arm_error(
                    400,
                    "InvalidParameter",
                    "an agent pool profile must be an object.",
                ));
            };
            let Some(name) = obj.get("name").and_then(Value::as_str) else {
                return Err(Reply::arm_error(
                    400,
                    "InvalidParameter",
                    "an agent pool profile needs a 'name'.",
                ));
            };
            profiles.push((name.to_string(), parse_pool_fields(obj)?));
        }
    }
    Ok(ClusterBody {
        location: m
            .get("location")
            .and_then(Value::as_str)
            .map(str::to_string),
        kubernetes_version: props
            .and_then(|p| p.get("kubernetesVersion"))
            .and_then(Value::as_str)
            .map(str::to_string),
        profiles,
    })
}

fn new_pool(name: &str, body: PoolBody, first: bool) -> Pool {
    let mut pool = Pool {
        name: name.to_string(),
        count: 1,
        vm_size: DEFAULT_VM_SIZE.to_string(),
        mode: if first { "System" } else { "User" }.to_string(),
        etag: new_etag(),
    };
    apply_pool(&mut pool, body);
    pool
}

/// Records new versions for the cluster and all its pools after a cluster-level write.
fn commit_cluster(d: &mut Data, key: &str, ctx: &Ctx, change: &str) {
    let Some(c) = d.clusters.get_mut(key) else {
        return;
    };
    c.etag = new_etag();
    let mut versions = vec![(c.key(), c.etag.clone())];
    for p in c.pools.values_mut() {
        p.etag = new_etag();
    }
    for p in c.pools.values() {
        versions.push((c.pool_key(&p.name), p.etag.clone()));
    }
    for (k, etag) in versions {
        d.record_version(&k, &etag, &ctx.writer, change.to_string());
        d.mark_seen(&ctx.writer, &k, &etag);
    }
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
            let Some(location) = p.location else {
                return Reply::arm_error(
                    400,
                    "LocationRequired",
                    "The location property is required for this definition.",
                );
            };
            let mut pools = BTreeMap::new();
            for (i, (pname, pb)) in p.profiles.into_iter().enumerate() {
                pools.insert(pname.to_ascii_lowercase(), new_pool(&pname, pb, i == 0));
            }
            let c = Cluster {
                sub: sub.to_string(),
                rg: rg.to_string(),
                name: name.to_string(),
                location: location.clone(),
                kubernetes_version: p
                    .kubernetes_version
                    .unwrap_or_else(|| DEFAULT_K8S.to_string()),
                etag: String::new(),
                pools,
                busy_until,
                failed: ctx.lro_failed,
            };
            let change = describe_counts(&BTreeMap::new(), &c.counts());
            d.clusters.insert(key.clone(), c);
            commit_cluster(d, &key, ctx, &format!("created: {change}"));
            reply_cluster(d, s, ctx, &key, 201, sub, &location)
        }
        Decision::Update if kind == WriteKind::Delete => {
            let Some(c) = d.clusters.remove(&key) else {
                return Reply::empty(204);
            };
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
            if let Some(loc) = &p.location {
                if !same_location(loc, &c.location) {
                    return Reply::arm_error(
                        400,
                        "InvalidParameter",
                        format!(
                            "The location '{loc}' does not match the cluster's location '{}'.",
                            c.location
                        ),
                    );
                }
            }
            let old_counts = c.counts();
            let old_etag = c.etag.clone();
            if let Some(v) = p.kubernetes_version {
                c.kubernetes_version = v;
            }
            let first = c.pools.is_empty();
            for (i, (pname, pb)) in p.profiles.into_iter().enumerate() {
                match c.pools.get_mut(&pname.to_ascii_lowercase()) {
                    Some(pool) => apply_pool(pool, pb),
                    None => {
                        c.pools.insert(
                            pname.to_ascii_lowercase(),
                            new_pool(&pname, pb, first && i == 0),
                        );
                    }
                }
            }
            c.busy_until = busy_until;
            c.failed = ctx.lro_failed;
            let change = describe_counts(&old_counts, &c.counts());
            let (id, location) = (c.id(), c.location.clone());
            d.check_lost(
                &ctx.writer,
                &key,
                &id,
                &old_etag,
                ctx.seq,
                ctx.if_match.as_deref(),
            );
            commit_cluster(d, &key, ctx, &change);
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
    let pool_not_found = || {
        Reply::arm_error(
            404,
            "NotFound",
            format!("Agent pool '{pool}' of managed cluster '{cluster}' in resource group '{rg}' was not found."),
        )
    };
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
            parse_pool_fields(&props)
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
    let decision = decide(
        kind,
        if_match,
        if_none_match,
        current.as_deref(),
        pool_not_found,
    );
    let change: String;
    let status = match decision {
        Decision::Answer(r) => return r,
        Decision::Create => {
            let first = c.pools.is_empty();
            let created = new_pool(pool, parsed, first);
            change = format!("pool {} created with count {}", created.name, created.count);
            c.pools.insert(pool_lower.clone(), created);
            201
        }
        Decision::Update if kind == WriteKind::Delete => {
            if let Some(p) = c.pools.remove(&pool_lower) {
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
            let Some(p) = c.pools.get_mut(&pool_lower) else {
                return pool_not_found();
            };
            let (old_count, old_etag) = (p.count, p.etag.clone());
            apply_pool(p, parsed);
            change = if old_count == p.count {
                format!("pool {} updated", p.name)
            } else {
                format!("pool {} count {old_count} -> {}", p.name, p.count)
            };
            c.busy_until = ctx.now + s.lro_delay;
            c.failed = ctx.lro_failed;
            d.check_lost(
                &ctx.writer,
                &pk,
                &id,
                &old_etag,
                ctx.seq,
                ctx.if_match.as_deref(),
            );
            200
        }
    };
    let Some(c) = d.clusters.get_mut(&key) else {
        return not_found(CLUSTER_TYPE, cluster, rg);
    };
    let Some(p) = c.pools.get_mut(&pool_lower) else {
        return pool_not_found();
    };
    p.etag = new_etag();
    let etag = p.etag.clone();
    let p = p.clone();
    let body = c.pool_json(&p, ctx.now);
    d.record_version(&pk, &etag, &ctx.writer, change);
    d.mark_seen(&ctx.writer, &pk, &etag);
    let mut reply = Reply::json(status, body).header("ETag", etag);
    add_lro_headers(d, s, ctx, &mut reply, sub, PROVIDER, &location);
    reply
}

/// Deletes a cluster without a request (a fault or the control API).
pub(crate) fn delete_cluster_out_of_band(d: &mut Data, sub: &str, rg: &str, name: &str) {
    d.clusters.remove(&cluster_key(sub, rg, name));
}

/// Deletes an agent pool without a request.
pub(crate) fn delete_pool_out_of_band(
    d: &mut Data,
    sub: &str,
    rg: &str,
    cluster: &str,
    pool: &str,
) {
    if let Some(c) = d.clusters.get_mut(&cluster_key(sub, rg, cluster)) {
        c.pools.remove(&pool.to_ascii_lowercase());
    }
}
