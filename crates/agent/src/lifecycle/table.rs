//! The instance table: the running instances and who serves each (app, label, owner).
//!
//! Both maps live behind one lock ([`super::Lifecycle`]'s `table`). Many paths read one map and
//! change the other (a start settles only if its instance still runs, a taint moves a running
//! instance to another label, an exit or a drain takes it out of serving); with a lock per map
//! they took the two in opposite orders and could deadlock, freezing every start, drain and
//! relabel of the node, and between two locks the maps could disagree. One lock has no order to
//! get wrong, and each of these changes is seen whole.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use warden_core::{Activity, InstanceRecord, InstanceState};

use super::{record_key, Running, ServeKey, Serving};

/// What the table's one lock guards.
#[derive(Default)]
pub(super) struct Table {
    /// Who serves each (app, label, owner): an instance being started, or a ready one.
    pub serving: HashMap<ServeKey, Serving>,
    /// The running instances, by id.
    pub running: HashMap<String, Running>,
}

// === impl Table ===

impl Table {
    /// Stops `key` being served by instance `id`, if it is (another may serve it already).
    pub fn unserve(&mut self, key: &ServeKey, id: &str) {
        if matches!(self.serving.get(key), Some(Serving::Ready(x)) if x.id == id) {
            self.serving.remove(key);
        }
    }

    /// Marks running instance `id` as draining and stops it being served: its record and its
    /// activity, or None if it does not run.
    pub fn mark_draining(&mut self, id: &str) -> Option<(InstanceRecord, Arc<Activity>)> {
        let r = self.running.get_mut(id)?;
        r.record.state = InstanceState::Draining;
        let marked = (r.record.clone(), r.activity.clone());
        if let Some(key) = record_key(&marked.0) {
            self.unserve(&key, id);
        }
        Some(marked)
    }

    /// Makes instance `id` the one its (app, label, owner) is served by, unless one already is
    /// or it cannot serve: gone, not ready (draining, a spare), or being stopped.
    ///
    /// The key is its current record's, never a caller's copy: a copy taken before a taint
    /// raised its label would serve the old, lower label again.
    pub fn serve_if_free(&mut self, id: &str) {
        let Some(r) = self.running.get(id) else {
            return;
        };
        if r.record.state != InstanceState::Ready || r.stopping.load(Ordering::Relaxed) {
            return;
        }
        if let Some(key) = record_key(&r.record) {
            let record = r.record.clone();
            self.serving
                .entry(key)
                .or_insert_with(|| Serving::Ready(record));
        }
    }
}
