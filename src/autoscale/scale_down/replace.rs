//! Consolidation (`consolidation.enabled`): the command decided when nothing else is being
//! removed, re-validated `validationDelay` later, then acted on through the same taint, drain
//! and guarded delete as an unneeded node. A replace launches first: its cheaper group is asked
//! for one more node, and only once that node is Ready and the command still holds on it are
//! the nodes it replaces tainted; its new node is kept from scale-down meanwhile.

use super::{node_ref, PassView, Removal, ScaleDownLoop};
use crate::config::NodeGroupSpec;
use crate::kube::nodes::has_our_taint_record;
use crate::node_groups::{is_ready, schedulable, GroupIndex, Unhealthy};
use crate::notify::ControllerEvent;
use crate::pods::consolidate::{
    self, Action, Command, ConsolidationInput, ReplaceOption, Unconsolidatable,
};
use crate::pods::index::PodIndex;
use crate::pods::record::NodeRecord;
use crate::pods::unneeded::DownInput;
use crate::resource::Victim;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// A replace under way: its new node asked for, not Ready yet. Only this replica's memory: a
/// replica that stops leading drops it (see [`ScaleDownLoop::run`]'s module notes in
/// `docs/pod-driven.md`): nothing is tainted before the new node is Ready, so nothing is left
/// tainted, and a new leader does not grow the group again for it.
#[derive(Debug)]
pub(super) struct Replacing {
    pub(super) command: Command,
    /// The cheaper group that grows.
    pub(super) group: NodeGroupSpec,
    /// The capacity asked for.
    pub(super) target: i64,
    /// The group's nodes when it was launched: a Ready node not among them is the new one.
    pub(super) before: HashSet<String>,
    pub(super) since: Instant,
}

/// The new nodes of a replace and the nodes they replace.
#[derive(Debug)]
pub(super) struct Protected {
    pub(super) new: HashSet<String>,
    pub(super) old: Vec<String>,
    /// Whether the old nodes' removals have started (then protection ends with them).
    pub(super) acted: bool,
}

/// A fingerprint of the pods bound to `node` (their uids, in any order).
fn pods_fingerprint(pods: &PodIndex, node: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut uids: Vec<&str> = pods
        .bound(node)
        .map(|p| {
            p.pods()
                .iter()
                .map(|p| p.uid.as_deref().unwrap_or(p.name.as_str()))
                .collect()
        })
        .unwrap_or_default();
    uids.sort_unstable();
    let mut h = rustc_hash::FxHasher::default();
    uids.hash(&mut h);
    h.finish()
}

impl ScaleDownLoop {
    /// Consolidation's part of a pass (`consolidation.enabled`): keeps since when each node's
    /// pods have been as they are (`consolidateAfter`); when the cluster is `idle` (nothing being
    /// removed, nothing chosen this pass) decides a command, and once its re-validation is due
    /// (`consolidation.validationDelay` later) checks it against this pass's view and returns its
    /// removals. A command that no longer holds is dropped with an `Unconsolidatable` Event on
    /// its nodes.
    pub(super) fn consolidation(&mut self, v: &PassView, idle: bool, now: Instant) -> Vec<Removal> {
        let s = self.shared.clone();
        let cfg = &s.settings.consolidation;
        if !cfg.enabled {
            return Vec::new();
        }
        let unsettled = self.unsettled(v, now);
        // Every pass is seen, so a rise is noticed however long consolidation waits. Off (the
        // default), the pods are not summed.
        let window = cfg.stabilization_window;
        let demand_rising = !window.is_zero()
            && self.requests_seen.observe(
                now,
                crate::pods::stabilization::Demand::of(v.pods.all()),
                window,
            );
        if !idle && self.replacing.is_none() {
            if let Some((c, _)) = self.command.take() {
                debug!(
                    nodes = c.nodes.len(),
                    "consolidation dropped: another removal started meanwhile"
                );
            }
            return Vec::new();
        }
        let prices = self.group_prices(v);
        // `emptyFirst`: the hinted nodes ripe for moves, by how long they have been hinted.
        let empty_first = cfg.empty_first;
        let ripe: Option<HashSet<String>> = (!empty_first.is_zero()).then(|| {
            self.drain_first
                .iter()
                .filter(|(_, since)| now.duration_since(**since) >= empty_first)
                .map(|(n, _)| n.clone())
                .collect()
        });
        let none = HashSet::new();
        let previously = HashSet::new();
        // The budgets active now, by the injected clock (schedules are UTC windows).
        let active = cfg.active_at(s.groups.now());
        let input = ConsolidationInput {
            down: DownInput {
                now: v.wall,
                groups: v.down,
                nodes: v.nodes,
                pods: v.pods,
                pdbs: v.pdbs,
                threshold: s.settings.scale_down.utilization_threshold,
                busy: v.busy,
                unready: v.unready,
                previously: &previously,
                non_empty_candidates: s.settings.scale_down.non_empty_candidates_count,
                volumes: v.volumes,
                namespaces: v.namespaces,
                keep_jobs: s.settings.consolidation.keeps_jobs(),
            },
            prices: &prices,
            chosen: &none,
            unsettled: &unsettled,
            settings: &active,
            max_nodes: u32::try_from(v.left).unwrap_or(u32::MAX),
            demand_rising,
            ripe: ripe.as_ref(),
        };
        if let Some(r) = self.replacing.take() {
            return self.follow_replace(v, &input, r, now);
        }
        if !idle {
            return Vec::new();
        }
        match self.command.take() {
            Some((command, due)) if now < due => {
                self.command = Some((command, due));
                Vec::new()
            }
            Some((command, _)) => self.revalidated(v, &input, &prices, command, now),
            None => self.search(v, &input, &prices, now),
        }
    }

    /// `consolidateAfter`: since when each node's pods have been unchanged; the nodes whose pods
    /// changed within it.
    fn unsettled(&mut self, v: &PassView, now: Instant) -> HashSet<String> {
        let after = self.shared.settings.consolidation.consolidate_after;
        let present: HashSet<&str> = v.nodes.iter().map(|n| n.name.as_str()).collect();
        self.pod_events.retain(|n, _| present.contains(n.as_str()));
        let mut unsettled = HashSet::new();
        for n in v.nodes {
            let fp = pods_fingerprint(v.pods, &n.name);
            let e = self.pod_events.entry(n.name.clone()).or_insert((fp, now));
            if e.0 != fp {
                *e = (fp, now);
            }
            if now.duration_since(e.1) < after {
                unsettled.insert(n.name.clone());
            }
        }
        unsettled
    }

    /// Each group's price, decided in one place (override, list price, sentinel), and set on
    /// `node_group_price_per_hour`.
    fn group_prices(&self, v: &PassView) -> Vec<f64> {
        let s = &self.shared;
        v.groups
            .iter()
            .map(|g| {
                let cached = s.groups.scale_sets().get(&g.name);
                let (location, size, spot) =
                    cached
                        .as_ref()
                        .map_or((String::new(), String::new(), false), |c| {
                            let shape = crate::autoscale::scale_up::shape_of(g, &c.scale_set);
                            (
                                shape.location.to_string(),
                                shape.vm_size.to_string(),
                                shape.profile.spot,
                            )
                        });
                let price = self
                    .prices
                    .group_price(&g.name, &location, &size, spot)
                    .per_hour;
                s.metrics
                    .node_group_price_per_hour
                    .with_label_values(&[&g.name])
                    .set(price);
                price
            })
            .collect()
    }

    /// A command whose re-validation is due, checked against this pass's view: a delete that
    /// holds returns its removals, a replace that holds is launched; one that does not hold is
    /// dropped with an `Unconsolidatable` Event on its nodes.
    fn revalidated(
        &mut self,
        v: &PassView,
        input: &ConsolidationInput,
        prices: &[f64],
        command: Command,
        now: Instant,
    ) -> Vec<Removal> {
        let checked = match command.action {
            Action::Delete => consolidate::revalidate(&command, input),
            Action::Replace { group, .. } => {
                let options = self.replace_options(v, prices, now);
                match options.iter().find(|o| o.group == group) {
                    Some(opt) => consolidate::revalidate_launch(&command, input, opt),
                    None => Err((
                        command.nodes.first().map(|n| n.node.clone()).unwrap_or_default(),
                        Unconsolidatable::Group(format!(
                            "node group {} may no longer grow for the replacement (at its max, refused, backed off, or no template)",
                            v.groups.get(group).map_or("?", |g| g.name.as_str())
                        )),
                    )),
                }
            }
        };
        match checked {
            Ok(()) => match command.action {
                Action::Delete => self.act(v, command),
                Action::Replace { .. } => {
                    self.launch(v, command, now);
                    Vec::new()
                }
            },
            Err((node, why)) => {
                info!(%node, reason = why.label(), why = %why, "consolidation did not hold on re-validation: nothing removed");
                self.abandoned(
                    v,
                    &command,
                    &node,
                    "consolidation_invalid",
                    &format!("abandoned on re-validation: {why}"),
                );
                Vec::new()
            }
        }
    }

    /// The search for a command (`consolidation.timeout` of work at most); one found waits
    /// `validationDelay` for its re-validation (a dry run says what it would do instead).
    fn search(
        &mut self,
        v: &PassView,
        input: &ConsolidationInput,
        prices: &[f64],
        now: Instant,
    ) -> Vec<Removal> {
        let s = self.shared.clone();
        let cfg = &s.settings.consolidation;
        // The search's time limit is work time, not the cluster's: a real clock.
        let deadline = std::time::Instant::now() + cfg.timeout;
        let started = std::time::Instant::now();
        let options = if self.demand.is_some() {
            self.replace_options(v, prices, now)
        } else {
            Vec::new()
        };
        let found = consolidate::decide(input, &options, &mut || {
            std::time::Instant::now() >= deadline
        });
        if found.timed_out {
            warn!(searched = found.searched, "the consolidation search ran out of consolidation.timeout: the last valid answer stands");
        }
        debug!(
            searched = found.searched,
            trials = found.trials,
            ms = started.elapsed().as_millis() as u64,
            "consolidation decided"
        );
        self.tell(&found.unconsolidatable);
        let first = &found.drain_order[..found
            .drain_order
            .len()
            .min(cfg.deletion_cost_hints as usize)];
        self.drain_first.retain(|n, _| first.contains(n));
        for n in first {
            self.drain_first.entry(n.clone()).or_insert(now);
        }
        if !self.dry_run {
            let order: Vec<&str> = found.drain_order.iter().map(String::as_str).collect();
            self.hints = crate::pods::deletion_cost::plan(
                &order,
                input.down.pods,
                cfg.deletion_cost_hints as usize,
                crate::pods::deletion_cost::MAX_HINT_WRITES,
            );
        }
        let Some(command) = found.command else {
            return Vec::new();
        };
        let names: Vec<&str> = command.nodes.iter().map(|n| n.node.as_str()).collect();
        if self.dry_run {
            let key = format!("consolidation:{}", names.join(","));
            if self.would.insert(key) {
                match command.action {
                    Action::Delete => {
                        info!(nodes = ?names, savings_per_hour = command.savings_per_hour, "dry run: would consolidate (taint, drain, delete)")
                    }
                    Action::Replace { group, .. } => {
                        info!(nodes = ?names, replacement = %v.groups.get(group).map_or("?", |g| g.name.as_str()), savings_per_hour = command.savings_per_hour, "dry run: would replace (grow the cheaper group, then taint, drain, delete)")
                    }
                }
            }
            return Vec::new();
        }
        info!(nodes = ?names, savings_per_hour = command.savings_per_hour, delay_s = cfg.validation_delay.as_secs(), "consolidation decided: re-validating before acting");
        self.command = Some((command, now + cfg.validation_delay));
        Vec::new()
    }

    /// `Unconsolidatable` Events for nodes whose reason is new (each told once while it stays).
    pub(super) fn tell(&mut self, why: &BTreeMap<String, Unconsolidatable>) {
        let s = self.shared.clone();
        self.told.retain(|n, _| why.contains_key(n));
        for (node, w) in why {
            let text = w.to_string();
            if self.told.get(node) == Some(&text) {
                continue;
            }
            s.events.record(ControllerEvent::Unconsolidatable {
                object: node_ref(node, s.node(node).as_deref()),
                why: text.clone(),
                kind: w.label(),
            });
            self.told.insert(node.clone(), text);
        }
    }

    /// A command dropped: an `Unconsolidatable` Event on each of its nodes (`node` is the one
    /// that failed) and the metric under `label`.
    pub(super) fn abandoned(
        &mut self,
        v: &PassView,
        command: &Command,
        node: &str,
        label: &str,
        why: &str,
    ) {
        let s = self.shared.clone();
        let group = command
            .nodes
            .iter()
            .find(|n| n.node == node)
            .or(command.nodes.first())
            .and_then(|n| v.groups.get(n.group))
            .map_or("", |g| g.name.as_str());
        s.metrics
            .failed_scale_downs_total
            .with_label_values(&[group, label])
            .inc();
        let what = match command.action {
            Action::Delete => "consolidation",
            Action::Replace { .. } => "replace",
        };
        for n in &command.nodes {
            let text = if n.node == node || node.is_empty() {
                format!("{what} {why}")
            } else {
                format!("{what} {why} (node {node})")
            };
            s.events.record(ControllerEvent::Unconsolidatable {
                object: node_ref(&n.node, s.node(&n.node).as_deref()),
                why: text.clone(),
                kind: "abandoned",
            });
            self.told.insert(n.node.clone(), text);
        }
    }

    /// The groups a replacement may come from now, each with a new node as scale-up's planner
    /// imagines it ([`crate::pods::scale_up::group_templates`]: a Ready node of the group, else
    /// its learned node, else its shape; DaemonSets taken off): below their max, with a known
    /// size and template, not refused (a co-writer's pool, an offering Azure refused lately)
    /// and not backed off.
    pub(super) fn replace_options(
        &self,
        v: &PassView,
        prices: &[f64],
        now: Instant,
    ) -> Vec<ReplaceOption> {
        use crate::pods::scale_up::{group_templates, GroupInput};
        let s = &self.shared;
        let cached: Vec<_> = v
            .groups
            .iter()
            .map(|g| s.groups.scale_sets().get(&g.name))
            .collect();
        let index = GroupIndex::of_backings(v.down.iter().map(|g| &g.backing));
        let mut live: Vec<Option<&NodeRecord>> = vec![None; v.groups.len()];
        for n in v.nodes {
            if let Some(i) = index.group_of(n) {
                if live[i].is_none() && is_ready(n) && schedulable(n) && !has_our_taint_record(n) {
                    live[i] = Some(n);
                }
            }
        }
        let inputs: Vec<GroupInput> = v
            .groups
            .iter()
            .zip(v.down)
            .zip(&cached)
            .map(|((g, d), c)| GroupInput {
                name: g.name.clone(),
                backing: d.backing.clone(),
                min: g.min_size,
                max: g.max_size,
                capacity: d.size,
                shape: c
                    .as_ref()
                    .map(|c| crate::autoscale::scale_up::shape_of(g, &c.scale_set)),
                unhealthy: None,
                failed: Vec::new(),
                stopped: Vec::new(),
                quota: Vec::new(),
                vcpus: None,
                passed_over: Default::default(),
                learned: s.groups.learned_template(&g.name),
            })
            .collect();
        let daemonsets: Vec<_> = s.cluster.daemonsets.snapshot().values().cloned().collect();
        let templates = group_templates(&inputs, &live, &daemonsets, v.volumes);
        let mut out = Vec::new();
        for (i, (g, t)) in v.groups.iter().zip(templates).enumerate() {
            let Ok(template) = t else { continue };
            let grows = v.down[i].size.is_some_and(|n| n < i64::from(g.max_size));
            let held = v.down[i].refused.is_some()
                || s.groups.health(&g.name).out_of_scale_up().is_some()
                || self.replace_backoff.until(&g.name, now).is_some();
            if grows && !held {
                out.push(ReplaceOption {
                    group: i,
                    template,
                    price: prices.get(i).copied().unwrap_or(f64::INFINITY),
                });
            }
        }
        out
    }

    /// Launches a replace that held on re-validation: its group is asked for one more node
    /// (the reconciler writes it with `If-Match`, as a scale-up), and each node it replaces is
    /// told by a `Consolidating` Event. Nothing is tainted yet.
    pub(super) fn launch(&mut self, v: &PassView, command: Command, now: Instant) {
        let s = self.shared.clone();
        let Action::Replace { group, price } = command.action else {
            return;
        };
        let (Some(g), Some(demand)) = (v.groups.get(group).cloned(), self.demand.clone()) else {
            return;
        };
        let Some(size) = s.groups.target_size(&g.name) else {
            return;
        };
        let target = size + 1;
        let index = GroupIndex::of_backings(v.down.iter().map(|g| &g.backing));
        let before: HashSet<String> = v
            .nodes
            .iter()
            .filter(|n| index.group_of(n) == Some(group))
            .map(|n| n.name.clone())
            .collect();
        let count = command.nodes.len();
        info!(nodes = count, scale_set = %g.name, from = size, to = target, savings_per_hour = command.savings_per_hour, "replacing: the decision held on re-validation; the cheaper group grows first");
        for n in &command.nodes {
            let group_name = v.groups.get(n.group).map_or("?", |g| g.name.as_str());
            s.events.record(ControllerEvent::Consolidating {
                object: node_ref(&n.node, s.node(&n.node).as_deref()),
                note: format!(
                    "replacing {count} node(s) by one new node of {} (${price:.3}/h), saving ${:.3}/h: the new node comes first; once it is Ready and the decision still holds, this node ({group_name}, ${:.3}/h, {} pod(s)) is tainted, drained and deleted",
                    g.name,
                    command.savings_per_hour,
                    n.price,
                    n.pods.len(),
                ),
            });
            self.told.remove(&n.node);
        }
        demand.set_replacement(&g.name, Some(target));
        s.reconciler.wake();
        self.protected = Some(Protected {
            new: HashSet::new(),
            old: command.nodes.iter().map(|n| n.node.clone()).collect(),
            acted: false,
        });
        self.replacing = Some(Replacing {
            command,
            group: g,
            target,
            before,
            since: now,
        });
    }

    /// A replace waiting for its new node, looked at each pass: the group refused (a write
    /// refusal, an allocation Azure refused, a backoff) or no new node Ready within
    /// `maxNodeProvisionTime` abandons it; a new node Ready re-validates it on that node as it
    /// really is, then its nodes go through scale-down's taint, drain and guarded delete.
    pub(super) fn follow_replace(
        &mut self,
        v: &PassView,
        input: &ConsolidationInput,
        r: Replacing,
        now: Instant,
    ) -> Vec<Removal> {
        let s = self.shared.clone();
        let g = &r.group;
        let index = GroupIndex::of_backings(v.down.iter().map(|g| &g.backing));
        let at = v.groups.iter().position(|x| x.name == g.name);
        let new: Vec<&Arc<NodeRecord>> = v
            .nodes
            .iter()
            .filter(|n| at.is_some() && index.group_of(n) == at && !r.before.contains(&n.name))
            .collect();
        if let Some(p) = self.protected.as_mut() {
            p.new = new.iter().map(|n| n.name.clone()).collect();
        }
        let ready: Vec<&str> = new
            .iter()
            .filter(|n| is_ready(n) && schedulable(n))
            .map(|n| n.name.as_str())
            .collect();
        // Why the group's new node does not come, as its health says (a provisioning timeout
        // is this wait's own, below).
        let refused = match s.groups.health(&g.name).out_of_scale_up() {
            Some(Unhealthy::Refused(w)) => Some(w.to_string()),
            Some(Unhealthy::Unavailable { .. }) => s
                .groups
                .unavailable(&g.name)
                .map(|u| format!("Azure refused its allocation: {u}")),
            Some(Unhealthy::WriteBackoff) => {
                Some("its writes are backed off after an error".to_string())
            }
            _ => None,
        };
        let limit = s.settings.pod_demand.max_node_provision_time;
        let why = if !ready.is_empty() {
            None
        } else if let Some(w) = refused {
            Some(format!("its new node of {} does not come: {w}", g.name))
        } else if now.duration_since(r.since) >= limit {
            // No replace asks the group again until its backoff ends: a group whose nodes
            // never register would otherwise be grown, timed out and cleaned up in a loop.
            let until = self.replace_backoff.fail(&g.name, now);
            Some(format!(
                "its new node of {} was not Ready within maxNodeProvisionTime ({}); no replace asks it again for {}",
                g.name,
                humantime::format_duration(limit),
                humantime::format_duration(std::time::Duration::from_secs(
                    until.saturating_duration_since(now).as_secs()
                ))
            ))
        } else {
            debug!(scale_set = %g.name, target = r.target, "replace waiting for its new node");
            self.replacing = Some(r);
            return Vec::new();
        };
        if let Some(d) = &self.demand {
            d.set_replacement(&g.name, None);
        }
        if let Some(why) = why {
            warn!(scale_set = %g.name, why = %why, "replace abandoned before any node was tainted");
            self.abort(v, r, &why);
            return Vec::new();
        }
        match consolidate::revalidate(&r.command, input) {
            Ok(()) => {
                info!(scale_set = %g.name, new = ?ready, "replacement Ready and the decision holds on it: removing the nodes it replaces");
                if let Some(p) = self.protected.as_mut() {
                    p.acted = true;
                }
                self.act(v, r.command)
            }
            Err((node, why)) => {
                let why = format!(
                    "abandoned on re-validation with its new node {} Ready: {why}",
                    ready.join(",")
                );
                info!(%node, scale_set = %g.name, why = %why, "replace abandoned: nothing tainted; the new node stays for scale-down to judge");
                self.abandoned(v, &r.command, &node, "replace_aborted", &why);
                self.protected = None;
                Vec::new()
            }
        }
    }

    /// Ends a replace whose new node does not come: any of its nodes carrying our taint (none
    /// should: they are tainted only once the new node is Ready) is untainted, each is told.
    pub(super) fn abort(&mut self, v: &PassView, r: Replacing, why: &str) {
        let s = self.shared.clone();
        {
            let mut f = s.flight.lock();
            for n in &r.command.nodes {
                let tainted = s.node(&n.node).is_some_and(|x| has_our_taint_record(&x));
                if tainted && !f.busy.contains(&n.node) {
                    f.untaint.insert(n.node.clone());
                }
            }
        }
        self.abandoned(
            v,
            &r.command,
            "",
            "replace_aborted",
            &format!("abandoned: {why}"),
        );
        self.protected = None;
    }

    /// Ends a replace's protection of its new node once the nodes it replaced are no longer
    /// being removed (removed, or their removal stopped).
    pub(super) fn protection(&mut self, busy: &HashSet<String>) {
        if self.replacing.is_some() {
            return;
        }
        let done = self
            .protected
            .as_ref()
            .is_some_and(|p| p.acted && p.old.iter().all(|n| !busy.contains(n)));
        let armed = self.protected.as_ref().is_some_and(|p| p.acted);
        if done {
            self.protected = None;
        } else if !armed && self.protected.is_some() {
            // Launched and then ended without acting: nothing to keep.
            self.protected = None;
        }
    }

    /// The removals of a command that held on re-validation, each announced by a
    /// `Consolidating` Event (taint, drain and guarded delete are scale-down's).
    pub(super) fn act(&mut self, v: &PassView, command: Command) -> Vec<Removal> {
        let s = self.shared.clone();
        let count = command.nodes.len();
        info!(
            nodes = count,
            savings_per_hour = command.savings_per_hour,
            "consolidating: the decision held on re-validation"
        );
        let mut out = Vec::with_capacity(count);
        for n in command.nodes {
            let Some(group) = v.groups.get(n.group).cloned() else {
                continue;
            };
            if let Some(hold) = s.reconciler.delete_hold(&group) {
                debug!(node = %n.node, scale_set = %group.name, %hold, "consolidation of a node not started: its delete would be held");
                continue;
            }
            s.events.record(ControllerEvent::Consolidating {
                object: node_ref(&n.node, s.node(&n.node).as_deref()),
                note: format!(
                    "consolidating {count} node(s), saving ${:.3}/h: this node ({}, ${:.3}/h, {} pod(s), disruption cost {:.2}) is tainted, drained and deleted; its pods move to the nodes that stay",
                    command.savings_per_hour,
                    group.name,
                    n.price,
                    n.pods.len(),
                    n.cost
                ),
            });
            self.told.remove(&n.node);
            out.push(Removal {
                node: n.node.clone(),
                victim: Victim {
                    instance_id: n.instance_id,
                    node_name: n.node,
                },
                resource_version: n.resource_version,
                pods: n.pods,
                unready: false,
                consolidation: true,
                group,
            });
        }
        out
    }
}
