//! The status writes a decision asked for, for every kind whose status this controller writes
//! (ProvisioningRequests, CapacityBuffers): each under the `resourceVersion` it was decided from
//! ([`StatusStore::replace_status`]); the answer replaces the object as kept; a 409 reads that
//! object afresh (it is decided again at the next look, never written blind); a 404 forgets it.

use crate::kube::provreq::ProvReqError;
use crate::kube::status_object::{StatusObject, StatusStore};
use crate::pods::provreq::Update;
use tracing::{info, warn};

/// Writes `updates` through `store`, keeping `objects` as the server answered. Returns whether
/// one met a conflict (decide again soon).
pub(crate) async fn write<T: StatusObject>(
    store: &dyn StatusStore<T>,
    objects: &mut Vec<T>,
    updates: Vec<Update>,
) -> bool {
    let kind = T::KIND;
    let mut conflict = false;
    for u in updates {
        let set: Vec<String> = u
            .set
            .iter()
            .map(|(k, s, r)| format!("{k}={}/{r}", if *s { "True" } else { "False" }))
            .collect();
        let replicas = u.object["status"]["replicas"].as_i64();
        match store.replace_status(&u.object).await {
            Ok(fresh) => {
                info!(kind, object = %u.key, replicas = ?replicas, conditions = %set.join(", "), "status written");
                keep(objects, &u.key, Some(fresh));
            }
            Err(ProvReqError::Conflict(_)) => {
                conflict = true;
                warn!(kind, object = %u.key, "changed since it was read (409): reading it afresh, deciding again");
                let (ns, name) = u.key.split_once('/').unwrap_or(("default", &u.key));
                match store.get(ns, name).await {
                    Ok(fresh) => keep(objects, &u.key, fresh),
                    Err(e) => warn!(kind, object = %u.key, error = %e, "could not read it afresh"),
                }
            }
            Err(ProvReqError::NotFound(_)) => keep(objects, &u.key, None),
            Err(e) => {
                warn!(kind, object = %u.key, error = %e, reason = e.metric_label(), "could not write the status: deciding again next loop");
            }
        }
    }
    conflict
}

/// Replaces (or adds, or with `None` drops) the object `key` in `objects`.
fn keep<T: StatusObject>(objects: &mut Vec<T>, key: &str, fresh: Option<T>) {
    match (objects.iter().position(|o| o.key() == key), fresh) {
        (Some(i), Some(f)) => objects[i] = f,
        (Some(i), None) => {
            objects.remove(i);
        }
        (None, Some(f)) => objects.push(f),
        (None, None) => {}
    }
}
