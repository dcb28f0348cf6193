//! How a scale set's VMs register as Nodes beyond what its tags say: the labels and taints its
//! kubelets are started with (`--node-labels`, `--register-with-taints`), which Azure does not
//! show (they live in the VM's custom data, not in its tags). The cluster simulation gives every
//! Node it creates for the scale set from then on these labels (over the ones the
//! `k8s.io_cluster-autoscaler_node-template_*` tags and the agent pool give it; a label set to
//! `null` is left off) and these taints (beside the tags' and the pool's; one with the same key
//! and effect replaced). Nodes already registered keep theirs, as a kubelet's flags reach only
//! the Nodes it registers. A fault for the controller's template learning: the scale set's tags
//! predict one node, another registers.
//!
//! From outside: `POST /_emulator/scale-sets/{sub}/{rg}/{name}/node-registration` (and `GET`),
//! or `emulator --node-label NAME:KEY=VALUE` / `--node-taint NAME:KEY=VALUE:EFFECT` at start.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::state::{vmss_key, EmulatorState};
use super::EmulatorError;

/// The labels and taints a scale set's new Nodes register with beyond its tags.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRegistration {
    /// Labels set on each new Node, over the tags' (`None`, JSON `null`: the label is left off,
    /// as a kubelet not started with it).
    #[serde(default)]
    pub labels: BTreeMap<String, Option<String>>,
    /// Taints, `key=value:Effect` or `key:Effect` (effect `NoSchedule`, `PreferNoSchedule` or
    /// `NoExecute`), as `--register-with-taints` takes them.
    #[serde(default)]
    pub taints: Vec<String>,
}

impl NodeRegistration {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.taints.is_empty()
    }

    /// Checks every label key and taint as the API server and the kubelet would refuse them;
    /// the error names the one at fault.
    pub fn validate(&self) -> Result<(), String> {
        for (key, value) in &self.labels {
            label_key_ok(key).map_err(|why| format!("label {key:?}: {why}"))?;
            if let Some(v) = value {
                label_value_ok(v).map_err(|why| format!("label {key:?} value {v:?}: {why}"))?;
            }
        }
        for t in &self.taints {
            parse_taint(t).map_err(|why| format!("taint {t:?}: {why}"))?;
        }
        Ok(())
    }
}

/// A taint as `--register-with-taints` takes it: `key=value:Effect` or `key:Effect`; returns
/// `(key, value, effect)`.
pub fn parse_taint(text: &str) -> Result<(String, String, String), String> {
    let (kv, effect) = text
        .rsplit_once(':')
        .ok_or("expected key=value:Effect or key:Effect")?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!(
            "effect {effect:?} must be NoSchedule, PreferNoSchedule or NoExecute"
        ));
    }
    let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
    label_key_ok(key)?;
    if !value.is_empty() {
        label_value_ok(value)?;
    }
    Ok((key.to_string(), value.to_string(), effect.to_string()))
}

fn name_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name of at most 63 characters.
fn label_key_ok(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
            });
        if !ok {
            return Err(format!("prefix {p:?} is not a DNS subdomain"));
        }
    }
    if !name_ok(name) {
        return Err(
            "a key's name must be 1 to 63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit".into(),
        );
    }
    Ok(())
}

fn label_value_ok(value: &str) -> Result<(), String> {
    if value.is_empty() || name_ok(value) {
        Ok(())
    } else {
        Err("a value must be at most 63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit".into())
    }
}

impl EmulatorState {
    /// Sets how scale set `name`'s new Nodes register ([`NodeRegistration`]), replacing what was
    /// set before (an empty one lifts it). The scale set must exist; the setting survives its
    /// writes and is forgotten by [`EmulatorState::reset`].
    pub fn set_node_registration(
        &self,
        sub: &str,
        rg: &str,
        name: &str,
        registration: NodeRegistration,
    ) -> Result<(), EmulatorError> {
        registration
            .validate()
            .map_err(EmulatorError::InvalidRegistration)?;
        let key = vmss_key(sub, rg, name);
        let mut d = self.lock();
        if !d.scale_sets.contains_key(&key) {
            return Err(EmulatorError::NotFound {
                resource: format!("{sub}/{rg}/{name}"),
            });
        }
        if registration.is_empty() {
            d.node_registrations.remove(&key);
        } else {
            d.node_registrations.insert(key, registration);
        }
        Ok(())
    }

    /// How scale set `name`'s new Nodes register beyond its tags (empty when nothing is set).
    pub fn node_registration(&self, sub: &str, rg: &str, name: &str) -> NodeRegistration {
        self.lock()
            .node_registrations
            .get(&vmss_key(sub, rg, name))
            .cloned()
            .unwrap_or_default()
    }

    /// [`EmulatorState::set_node_registration`] without the scale set having to exist yet (the
    /// start-up flags, applied before the scale sets are seeded).
    pub(crate) fn preset_node_registration(
        &self,
        sub: &str,
        rg: &str,
        name: &str,
        registration: NodeRegistration,
    ) {
        self.lock()
            .node_registrations
            .insert(vmss_key(sub, rg, name), registration);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_parse_as_the_kubelet_takes_them_and_a_bad_one_is_named() {
        assert_eq!(
            parse_taint("sku=gpu:NoExecute"),
            Ok(("sku".into(), "gpu".into(), "NoExecute".into()))
        );
        assert_eq!(
            parse_taint("dedicated:NoSchedule"),
            Ok(("dedicated".into(), String::new(), "NoSchedule".into()))
        );
        assert!(parse_taint("sku=gpu:Sometimes")
            .unwrap_err()
            .contains("Sometimes"));
        assert!(parse_taint("sku=gpu").is_err());
        let r = NodeRegistration {
            labels: BTreeMap::from([("Bad Key".to_string(), Some("x".to_string()))]),
            taints: vec![],
        };
        assert!(r.validate().unwrap_err().contains("Bad Key"));
        let r = NodeRegistration {
            labels: BTreeMap::from([
                ("topology.kubernetes.io/zone".to_string(), None),
                ("tier".to_string(), Some("silver".to_string())),
            ]),
            taints: vec!["dedicated=batch:NoSchedule".into()],
        };
        assert_eq!(r.validate(), Ok(()));
    }
}
