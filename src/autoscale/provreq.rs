//! ProvisioningRequests' I/O around [`crate::pods::provreq`]: the scale-up loop lists the
//! requests and PodTemplates every scan interval, decides them with the pending pods (bookings
//! first), and then writes the status updates the decision asked for, each under the
//! `resourceVersion` read. A 409 re-reads that request and decides it again at the next look;
//! nothing is ever written blind. At most [`crate::pods::provreq::MAX_UPDATES_PER_LOOP`]
//! updates per loop.

use crate::kube::provreq::{ProvReqError, ProvReqStore};
use crate::pods::provreq::{Booking, Request, Templates, Update};
use crate::pods::record::PodRecord;
use parking_lot::RwLock;
use std::sync::Arc;
use tokio::time::Instant;
use tracing::{info, warn};

/// What the bookings hold.
#[derive(Debug, Default)]
pub struct Held {
    /// Per request.
    pub bookings: Vec<Booking>,
    /// Their pods (virtual: scale-down places them on the nodes they fit).
    pub pods: Vec<Arc<PodRecord>>,
}

/// The bookings held, as the last decision left them (scale-down reads them).
#[derive(Debug, Default)]
pub struct Bookings(RwLock<Arc<Held>>);

impl Bookings {
    /// The bookings now.
    pub fn get(&self) -> Arc<Held> {
        self.0.read().clone()
    }

    fn set(&self, held: Held) {
        *self.0.write() = Arc::new(held);
    }
}

/// What the scale-up loop keeps of the requests between looks.
#[derive(Debug)]
pub struct ProvReqs {
    store: Arc<dyn ProvReqStore>,
    /// The requests as last read (a write's answer replaces its entry).
    pub(crate) requests: Vec<Request>,
    /// The PodTemplates as last read.
    pub(crate) templates: Templates,
    /// When to list them again.
    pub(crate) next_poll: Option<Instant>,
    /// The writes the last decision asked for.
    pub(crate) updates: Vec<Update>,
    /// The bookings of the last decision.
    pub bookings: Arc<Bookings>,
}

impl ProvReqs {
    /// Requests read and written through `store`.
    pub fn new(store: Arc<dyn ProvReqStore>) -> Self {
        Self {
            store,
            requests: Vec::new(),
            templates: Templates::new(),
            next_poll: None,
            updates: Vec::new(),
            bookings: Arc::default(),
        }
    }

    /// Lists requests and templates; on an error keeps what it had (logged).
    pub async fn refresh(&mut self) {
        match self.store.list().await {
            Ok((requests, templates)) => {
                self.requests = requests;
                self.templates = templates;
            }
            Err(e) => {
                warn!(error = %e, reason = e.metric_label(), "could not list ProvisioningRequests: deciding from the last list");
            }
        }
    }

    /// Whether a request of ours asks for a decision (not finished: waiting, or booked).
    pub fn due(&self) -> bool {
        self.requests
            .iter()
            .any(|r| r.class().is_some() && !r.finished())
    }

    /// Keeps the bookings the decision left.
    pub(crate) fn set_bookings(&self, bookings: Vec<Booking>, pods: Vec<Arc<PodRecord>>) {
        self.bookings.set(Held { bookings, pods });
    }

    /// Writes the updates the last decision asked for. Returns whether one met a conflict (the
    /// request is read afresh: decide again soon).
    pub async fn write(&mut self) -> bool {
        let mut conflict = false;
        for u in std::mem::take(&mut self.updates) {
            let set: Vec<String> = u
                .set
                .iter()
                .map(|(k, s, r)| format!("{k}={}/{r}", if *s { "True" } else { "False" }))
                .collect();
            match self.store.replace_status(&u.object).await {
                Ok(fresh) => {
                    info!(provisioning_request = %u.key, conditions = %set.join(", "), "ProvisioningRequest status written");
                    self.replace(&u.key, Some(fresh));
                }
                Err(ProvReqError::Conflict(_)) => {
                    conflict = true;
                    warn!(provisioning_request = %u.key, "ProvisioningRequest changed since it was read (409): reading it afresh, deciding again");
                    let (ns, name) = u.key.split_once('/').unwrap_or(("default", &u.key));
                    match self.store.get(ns, name).await {
                        Ok(fresh) => self.replace(&u.key, fresh),
                        Err(e) => {
                            warn!(provisioning_request = %u.key, error = %e, "could not read it afresh")
                        }
                    }
                }
                Err(ProvReqError::NotFound(_)) => self.replace(&u.key, None),
                Err(e) => {
                    warn!(provisioning_request = %u.key, error = %e, reason = e.metric_label(), "could not write the ProvisioningRequest's status: deciding again next loop");
                }
            }
        }
        conflict
    }

    fn replace(&mut self, key: &str, fresh: Option<Request>) {
        match (self.requests.iter().position(|r| r.key() == key), fresh) {
            (Some(i), Some(f)) => self.requests[i] = f,
            (Some(i), None) => {
                self.requests.remove(i);
            }
            (None, Some(f)) => self.requests.push(f),
            (None, None) => {}
        }
    }
}
