//! What only the running controller knows, as its status ConfigMap says it: holds and backoffs,
//! offerings Azure refused lately, the last write and conflict, and since when each node has been
//! unneeded. `explain` reads the ConfigMap (live, or from a snapshot's files) and feeds these into
//! the same pure decisions the loops make, as the loops feed their own memory.

use crate::kube::status::StatusDocument;
use crate::node_groups::{Health, Unhealthy};
use crate::notify::GroupStatus;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use std::time::Duration;

/// A status this old says little of the present: the controller may have stopped.
pub const STALE_AFTER: Duration = Duration::from_secs(300);

/// The running controller's status, as read.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerStatus {
    /// `namespace/name` of the ConfigMap.
    pub source: String,
    /// The leader that wrote it.
    pub leader: String,
    /// When it was written.
    pub written: Timestamp,
    /// Every node group as the leader saw it.
    pub groups: Vec<GroupStatus>,
}

/// `s` as a time, if it is RFC 3339.
fn time(s: &str) -> Option<Timestamp> {
    s.parse().ok()
}

/// How long from `now` until `until` (`None`: passed, or not a time).
fn left(until: Option<&String>, now: Timestamp) -> Option<Duration> {
    let until = time(until?)?;
    (until > now).then(|| Duration::try_from(until.duration_since(now)).unwrap_or_default())
}

impl ControllerStatus {
    /// The status a ConfigMap holds, or what is wrong with it.
    pub fn from_config_map(cm: &ConfigMap) -> Result<Self, String> {
        let doc = StatusDocument::from_config_map(cm)?;
        let source = format!(
            "{}/{}",
            cm.metadata.namespace.as_deref().unwrap_or("?"),
            cm.metadata.name.as_deref().unwrap_or("?")
        );
        let written = time(&doc.time)
            .ok_or_else(|| format!("ConfigMap {source}: time {:?} is not RFC 3339", doc.time))?;
        Ok(ControllerStatus {
            source,
            leader: doc.leader,
            written,
            groups: doc.node_groups,
        })
    }

    /// How long ago it was written.
    pub fn age(&self, now: Timestamp) -> Duration {
        Duration::try_from(now.duration_since(self.written)).unwrap_or_default()
    }

    /// The group's status, if the controller knows the group.
    pub fn group(&self, name: &str) -> Option<&GroupStatus> {
        self.groups
            .iter()
            .find(|g| g.name.eq_ignore_ascii_case(name))
    }

    /// Why the running controller keeps `group` out of scale-up at `now`, in the order the
    /// scale-up loop asks (after the write refusal `explain` sees itself): an offering Azure
    /// refused, writes backed off after errors, nodes that did not register within
    /// `maxNodeProvisionTime` (`limit`). Marks that ran out by `now` are over.
    pub fn unhealthy(&self, group: &str, now: Timestamp, limit: Duration) -> Option<Unhealthy> {
        Health::from_status(self.group(group)?, now, limit).out_of_scale_up()
    }

    /// What holds `group` now, in words, each with until when (empty: nothing).
    pub fn holds(&self, group: &str, now: Timestamp) -> Vec<String> {
        let Some(g) = self.group(group) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Some(held) = &g.held {
            out.push(format!("writes held: {held}"));
        }
        if let Some(u) = &g.unavailable {
            if left(Some(&u.until), now).is_some() {
                out.push(format!(
                    "offering unavailable ({}) until {}: {}",
                    u.reason, u.until, u.message
                ));
            }
        }
        if let Some(until) = g
            .backoff_until
            .as_ref()
            .filter(|u| left(Some(u), now).is_some())
        {
            out.push(format!("writes backed off after errors until {until}"));
        }
        if let Some(until) = g
            .provision_backoff_until
            .as_ref()
            .filter(|u| left(Some(u), now).is_some())
        {
            out.push(format!(
                "scale-up passes it over until {until}: nodes it asked for did not register within maxNodeProvisionTime"
            ));
        }
        if let Some(n) = g
            .not_helped
            .as_ref()
            .filter(|n| left(Some(&n.until), now).is_some())
        {
            out.push(format!(
                "scale-up passes it over for {} until {}: a scale-up for them did not help ({})",
                n.workloads.join(", "),
                n.until,
                n.why
            ));
        }
        if let Some(why) = &g.scale_down_halted {
            out.push(format!("scale-down halted: {why}"));
        }
        out
    }

    /// When the leader last saw `group` grow, if its status says.
    pub fn last_scale_up(&self, group: &str) -> Option<Timestamp> {
        time(self.group(group)?.last_scale_up.as_ref()?)
    }

    /// Since when the leader has found `node` unneeded, if its status lists it.
    pub fn unneeded_since(&self, node: &str) -> Option<Timestamp> {
        self.groups
            .iter()
            .flat_map(|g| &g.unneeded)
            .find(|u| u.node == node)
            .and_then(|u| time(&u.since))
    }

    /// Whether the status lists unneeded nodes of `group` at all (a group's list is cut at
    /// [`crate::notify::UNNEEDED_LISTED`]: a node missing from a full list is not known).
    pub fn unneeded_list_full(&self, group: &str) -> bool {
        self.group(group)
            .is_some_and(|g| g.unneeded.len() >= crate::notify::UNNEEDED_LISTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::AllocationFailure;
    use crate::notify::{UnavailableStatus, UnneededNode};
    use std::collections::BTreeMap;

    fn cm(yaml: &str) -> ConfigMap {
        ConfigMap {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("vmss-capacity-controller-status".into()),
                namespace: Some("kube-system".into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                crate::kube::status::STATUS_KEY.to_string(),
                yaml.to_string(),
            )])),
            ..Default::default()
        }
    }

    fn status(now: Timestamp) -> ControllerStatus {
        let at = |secs: i64| (now + k8s_openapi::jiff::SignedDuration::from_secs(secs)).to_string();
        let doc = StatusDocument {
            leader: "controller-0".into(),
            time: at(-5),
            node_groups: vec![
                GroupStatus {
                    name: "spot".into(),
                    kind: "vmss".into(),
                    max_size: 10,
                    unavailable: Some(UnavailableStatus {
                        reason: "allocation_failed".into(),
                        until: at(170),
                        message: "no capacity".into(),
                    }),
                    backoff_until: Some(at(30)),
                    ..Default::default()
                },
                GroupStatus {
                    name: "web".into(),
                    kind: "vmss".into(),
                    max_size: 10,
                    unavailable: Some(UnavailableStatus {
                        reason: "quota".into(),
                        until: at(-1),
                        message: "over".into(),
                    }),
                    provision_backoff_until: Some(at(60)),
                    unneeded: vec![UnneededNode {
                        node: "web-0".into(),
                        since: at(-125),
                    }],
                    ..Default::default()
                },
            ],
        };
        let yaml = serde_yaml::to_string(&doc).unwrap();
        ControllerStatus::from_config_map(&cm(&yaml)).unwrap()
    }

    #[test]
    fn the_written_document_reads_back_whole() {
        let now = Timestamp::now();
        let s = status(now);
        assert_eq!(s.source, "kube-system/vmss-capacity-controller-status");
        assert_eq!(s.leader, "controller-0");
        assert_eq!(s.age(now).as_secs(), 5);
        assert_eq!(s.groups.len(), 2);
        assert_eq!(s.group("WEB").map(|g| g.unneeded.len()), Some(1));
    }

    #[test]
    fn a_refused_offering_comes_before_a_write_backoff_and_an_expired_mark_is_over() {
        let now = Timestamp::now();
        let s = status(now);
        let limit = Duration::from_secs(900);
        match s.unhealthy("spot", now, limit) {
            Some(Unhealthy::Unavailable { failure, left }) => {
                assert_eq!(failure, AllocationFailure::NoCapacity);
                assert!((169..=170).contains(&left.as_secs()), "{left:?}");
            }
            other => panic!("{other:?}"),
        }
        // web's quota mark ran out a second ago: its provisioning timeout is what holds it.
        match s.unhealthy("web", now, limit) {
            Some(Unhealthy::ProvisionTimeout { limit: l, left }) => {
                assert_eq!(l, limit);
                assert!((59..=60).contains(&left.as_secs()), "{left:?}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.unhealthy("other", now, limit), None);
        let later = now + k8s_openapi::jiff::SignedDuration::from_secs(200);
        assert_eq!(s.unhealthy("spot", later, limit), None, "every mark over");
        let holds = s.holds("spot", now);
        assert_eq!(holds.len(), 2, "{holds:?}");
        assert!(holds[0].starts_with("offering unavailable (allocation_failed) until "));
        assert!(holds[1].starts_with("writes backed off after errors until "));
    }

    #[test]
    fn since_when_a_node_is_unneeded_is_read_from_its_groups_list() {
        let now = Timestamp::now();
        let s = status(now);
        let since = s.unneeded_since("web-0").expect("listed");
        assert_eq!(now.duration_since(since).as_secs(), 125);
        assert_eq!(s.unneeded_since("web-1"), None);
    }

    #[test]
    fn a_config_map_without_the_key_or_with_another_document_is_named_in_the_error() {
        let mut empty = cm("");
        empty.data = None;
        let e = ControllerStatus::from_config_map(&empty).unwrap_err();
        assert!(
            e.contains("kube-system/vmss-capacity-controller-status") && e.contains("no key"),
            "{e}"
        );
        let e = ControllerStatus::from_config_map(&cm("autoscalerStatus: Running\n")).unwrap_err();
        assert!(e.contains("is not this controller's status"), "{e}");
    }
}
