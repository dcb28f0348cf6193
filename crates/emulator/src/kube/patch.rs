//! PATCH bodies: JSON merge patch (RFC 7386) and the strategic merge patch subset clients use
//! on these types (maps merge, `null` deletes, lists replace except the few with a merge key,
//! `$patch: delete|replace` in maps and list items, other `$` directives ignored).

use serde_json::{Map, Value};

/// Lists merged by a key under strategic merge patch (Kubernetes' `patchMergeKey`).
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "volumeMounts"
        | "imagePullSecrets" => "name",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "topologySpreadConstraints" => "topologyKey",
        "addresses" => "type",
        _ => return None,
    })
}

/// RFC 7386: objects merge, `null` deletes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Strategic merge patch for the fields listed in the module doc.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = p.clone();
        replaced.remove("$patch");
        *target = Value::Object(replaced);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if k.starts_with('$') {
            // $setElementOrder, $retainKeys, $deleteFromPrimitiveList: order and pruning hints.
            continue;
        }
        if v.is_null() || v.get("$patch").and_then(Value::as_str) == Some("delete") {
            t.remove(k);
            continue;
        }
        match (merge_key(k), v) {
            (Some(key), Value::Array(items)) => {
                let existing = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                if !existing.is_array() {
                    *existing = Value::Array(Vec::new());
                }
                merge_list(existing, items, key);
            }
            (_, Value::Object(_)) => {
                strategic_merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

fn merge_list(existing: &mut Value, items: &[Value], key: &str) {
    let Value::Array(list) = existing else { return };
    for item in items {
        let id = item.get(key).cloned();
        let pos = id
            .as_ref()
            .and_then(|id| list.iter().position(|e| e.get(key) == Some(id)));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                list.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge_patch(&mut list[i], item),
            (None, false) => {
                let mut fresh = Value::Null;
                strategic_merge_patch(&mut fresh, item);
                list.push(fresh);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_merges_maps_and_deletes_nulls() {
        let mut t = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": [1, 2]}});
        merge_patch(
            &mut t,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"x": [3]}}),
        );
        assert_eq!(
            t,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": [3]}})
        );
    }

    #[test]
    fn strategic_patch_replaces_taints_and_merges_conditions_by_type() {
        let mut t = json!({
            "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X", "status": "True"}]}
        });
        strategic_merge_patch(
            &mut t,
            &json!({
                "$setElementOrder/conditions": [{"type": "Ready"}],
                "spec": {"unschedulable": true, "taints": [{"key": "b", "effect": "NoExecute"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "$patch": "delete"}]}
            }),
        );
        assert_eq!(
            t,
            json!({
                "spec": {"unschedulable": true, "taints": [{"key": "b", "effect": "NoExecute"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}
            })
        );
    }
}
