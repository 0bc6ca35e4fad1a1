//! The writer's state and one commit: group commit and lease expiry.
//!
//! Whoever leads (`commit.rs`: a caller, or the writer thread) hands a batch of every operation
//! queued to [`Writer::step`], which applies them one after another in a single redb
//! transaction, commits once with an fsync, and only then answers each caller and publishes the
//! changes to watchers. Concurrent writers therefore share one fsync, and nobody hears "done"
//! for a write that is not on disk.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, Table, WriteTransaction};
use tokio::sync::oneshot;

use super::codec::{decode_meta, encode_event, encode_record};
use super::{Shared, KV, LEASES, LEASE_KEYS, LOG, META};

mod recovery;

use crate::{CasOutcome, Event, EventKind, LeaseId, Revision, StoreError};
use recovery::classified;
pub(super) use recovery::echo;

/// History kept for watchers that resume from an older revision.
pub(super) const LOG_RETAIN: u64 = 10_000;
/// The longest lease the store grants (a longer one is cut to it) and reads back: ten years, far
/// past any session, and short enough that adding it to the clock never overflows.
pub(super) const MAX_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Upper bound of operations in one transaction, so a flood cannot starve repliers forever.
pub(super) const MAX_BATCH: usize = 1024;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A request to the writer thread.
pub(super) enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
        reply: Reply<Revision>,
    },
    Delete {
        key: String,
        reply: Reply<Option<Revision>>,
    },
    Cas {
        key: String,
        expected: Option<Revision>,
        value: Option<Vec<u8>>,
        lease: Option<LeaseId>,
        reply: Reply<CasOutcome>,
    },
    Grant {
        ttl: Duration,
        reply: Reply<LeaseId>,
    },
    KeepAlive {
        lease: LeaseId,
        reply: Reply<()>,
    },
    Revoke {
        lease: LeaseId,
        reply: Reply<()>,
    },
}

/// A deferred answer, sent once the batch's fate (commit or not) is known.
type Answer = Box<dyn FnOnce(Option<&StoreError>) + Send>;

fn answer<T: Send + 'static>(reply: Reply<T>, result: Result<T, StoreError>) -> Answer {
    Box::new(move |commit_error| {
        let _ = reply.send(match commit_error {
            Some(e) => Err(e.clone()),
            None => result,
        });
    })
}

struct LeaseState {
    ttl: Duration,
    deadline: Instant,
}

/// State only the writer thread touches.
pub(super) struct Writer {
    shared: Arc<Shared>,
    revision: Revision,
    compacted: Revision,
    next_lease: LeaseId,
    leases: HashMap<LeaseId, LeaseState>,
    /// After a failed commit the engine refuses everything until the file is opened again:
    /// when to try that next, and the pause after that.
    reopen: Option<(Instant, Duration)>,
}

/// Tables of one write transaction.
struct Tables<'t> {
    kv: Table<'t, &'static str, &'static [u8]>,
    log: Table<'t, u64, &'static [u8]>,
    leases: Table<'t, u64, u64>,
    lease_keys: Table<'t, (u64, &'static str), ()>,
}

fn engine(op: &'static str) -> impl Fn(redb::Error) -> StoreError {
    move |e| StoreError::Engine {
        op,
        reason: e.to_string(),
    }
}

/// What the writer keeps in memory, as read from the file.
pub(super) struct State {
    revision: Revision,
    compacted: Revision,
    next_lease: LeaseId,
    leases: HashMap<LeaseId, LeaseState>,
}

/// Reads the writer's state from `db`. Run on a copy by [`super::verify::prove`] before the
/// file itself is opened for writing, so that nothing here can refuse a file already written
/// to. Leases get a full TTL from now: their holders had no way to keep them alive while the
/// store was down.
pub(super) fn read_state(db: &Database) -> Result<State, StoreError> {
    let err = engine("load");
    let txn = db.begin_read().map_err(|e| err(e.into()))?;
    let meta = txn.open_table(META).map_err(|e| err(e.into()))?;
    let read = |name: &str| -> Result<u64, StoreError> {
        Ok(meta
            .get(name)
            .map_err(|e| err(e.into()))?
            .map(|v| v.value())
            .unwrap_or(0))
    };
    let (revision, compacted) = (read("revision")?, read("compacted")?);
    if compacted > revision {
        return Err(StoreError::Corrupt {
            key: "meta/compacted".into(),
            reason: format!("the log says it was compacted up to revision {compacted}, past the store's revision {revision}"),
        });
    }
    let next_lease = read("next_lease")?.max(1);
    let table = txn.open_table(LEASES).map_err(|e| err(e.into()))?;
    let now = Instant::now();
    let mut leases = HashMap::new();
    for row in table.iter().map_err(|e| err(e.into()))? {
        let (id, ttl_ms) = row.map_err(|e| err(e.into()))?;
        let ttl = Duration::from_millis(ttl_ms.value());
        let deadline = now
            .checked_add(ttl)
            .filter(|_| ttl <= MAX_TTL)
            .ok_or_else(|| StoreError::Corrupt {
                key: format!("lease/{:x}", id.value()),
                reason: format!(
                    "its time to live of {} ms is beyond any warden grants",
                    ttl_ms.value()
                ),
            })?;
        leases.insert(id.value(), LeaseState { ttl, deadline });
    }
    Ok(State {
        revision,
        compacted,
        next_lease,
        leases,
    })
}

// === impl Writer ===

impl Writer {
    /// Loads counters and leases from disk ([`read_state`]).
    pub(super) fn load(shared: Arc<Shared>) -> Result<Self, StoreError> {
        let mut w = Self {
            shared,
            revision: 0,
            compacted: 0,
            next_lease: 1,
            leases: HashMap::new(),
            reopen: None,
        };
        w.reload()?;
        Ok(w)
    }

    fn reload(&mut self) -> Result<(), StoreError> {
        let state = read_state(&*self.shared.db()?)?;
        self.revision = state.revision;
        self.compacted = state.compacted;
        self.next_lease = state.next_lease;
        self.leases = state.leases;
        self.shared.revision.store(self.revision, Ordering::SeqCst);
        self.shared
            .compacted
            .store(self.compacted, Ordering::SeqCst);
        self.shared.watchers.published(self.revision);
        Ok(())
    }

    /// Commits one batch (and expires due leases, and probes a failing file); returns how long
    /// until a lease is due, at most a second.
    pub(super) fn step(&mut self, batch: Vec<Op>) -> Duration {
        // A panic in the engine (a damaged file can cause one, in the commit or in the probe
        // of a failing file) fails this batch (its callers' answers are dropped, and they read
        // the failure) and reopens the file. Nothing unwinds out of a step: a caller leading
        // the commit would leave the lead taken and every later write waiting.
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.recover();
            self.process(batch)
        }));
        if stepped.is_err() {
            let e = StoreError::Engine {
                op: "commit",
                reason: "the storage engine failed on the store file, which may be damaged; back it up with `warden store backup` while reads work and restore it".into(),
            };
            let recorded =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.failed(e.clone())));
            if recorded.is_err() {
                // Reloading the state panicked too: still say why, and try the file again.
                self.shared.set_failure(Some(e));
                self.schedule_reopen();
            }
        }
        let now = Instant::now();
        self.leases
            .values()
            .map(|l| l.deadline.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1))
    }

    fn process(&mut self, batch: Vec<Op>) {
        let now = Instant::now();
        let expired: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        // Keep-alives touch only memory; answer them without a transaction.
        let mut mutations = Vec::with_capacity(batch.len());
        for op in batch {
            match op {
                Op::KeepAlive { lease, reply } => {
                    let r = match self.leases.get_mut(&lease) {
                        Some(l) if !expired.contains(&lease) => {
                            l.deadline = now + l.ttl;
                            Ok(())
                        }
                        _ => Err(StoreError::LeaseNotFound(lease)),
                    };
                    let _ = reply.send(r);
                }
                other => mutations.push(other),
            }
        }
        if mutations.is_empty() && expired.is_empty() {
            return;
        }
        let before = self.revision;
        let mut events = Vec::new();
        let mut answers = Vec::with_capacity(mutations.len());
        let outcome = self.apply_batch(mutations, &expired, &mut events, &mut answers);
        match outcome {
            Ok(()) => {
                self.shared.commits.fetch_add(1, Ordering::Relaxed);
                self.shared.revision.store(self.revision, Ordering::SeqCst);
                self.shared
                    .compacted
                    .store(self.compacted, Ordering::SeqCst);
                self.shared
                    .watchers
                    .publish(&self.shared, &events, self.revision);
                for a in answers {
                    a(None);
                }
                if self.shared.failure().is_some() {
                    tracing::info!("store writes work again");
                    self.shared.set_failure(None);
                }
            }
            Err(e) => {
                let e = classified(e);
                warden_core::log_limited!(error, error = %e, revision = before, "store commit failed; rolling back the batch");
                // Recorded before any caller hears: one whose answer is dropped reads it.
                self.failed(e.clone());
                let e = self.shared.failure().unwrap_or(e);
                for a in answers {
                    a(Some(&e));
                }
            }
        }
    }

    fn apply_batch(
        &mut self,
        ops: Vec<Op>,
        expired: &[LeaseId],
        events: &mut Vec<Event>,
        answers: &mut Vec<Answer>,
    ) -> Result<(), StoreError> {
        let err = engine("commit");
        let db = self.shared.db()?;
        let mut txn: WriteTransaction = db.begin_write().map_err(|e| err(e.into()))?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| StoreError::Engine {
                op: "commit",
                reason: e.to_string(),
            })?;
        {
            let mut t = Tables {
                kv: txn.open_table(KV).map_err(|e| err(e.into()))?,
                log: txn.open_table(LOG).map_err(|e| err(e.into()))?,
                leases: txn.open_table(LEASES).map_err(|e| err(e.into()))?,
                lease_keys: txn.open_table(LEASE_KEYS).map_err(|e| err(e.into()))?,
            };
            for &lease in expired {
                tracing::debug!(lease = format_args!("{lease:x}"), "lease expired");
                self.revoke(&mut t, lease, events)?;
            }
            for op in ops {
                answers.push(self.apply(&mut t, op, events)?);
            }
            self.compact(&mut t)?;
            let mut meta = txn.open_table(META).map_err(|e| err(e.into()))?;
            for (name, value) in [
                ("revision", self.revision),
                ("compacted", self.compacted),
                ("next_lease", self.next_lease),
            ] {
                meta.insert(name, value).map_err(|e| err(e.into()))?;
            }
        }
        txn.commit().map_err(|e| err(e.into()))
    }

    /// Applies one operation. An `Err` here is an engine failure that dooms the whole batch;
    /// an operation's own refusal (missing lease, CAS conflict) is its answer.
    fn apply(
        &mut self,
        t: &mut Tables<'_>,
        op: Op,
        events: &mut Vec<Event>,
    ) -> Result<Answer, StoreError> {
        Ok(match op {
            Op::Put {
                key,
                value,
                lease,
                reply,
            } => {
                let r = self.put(t, &key, value, lease, events)?;
                answer(reply, r)
            }
            Op::Delete { key, reply } => {
                let r = self.delete(t, &key, events)?;
                answer(reply, Ok(r))
            }
            Op::Cas {
                key,
                expected,
                value,
                lease,
                reply,
            } => {
                let current = self.meta(t, &key)?.map(|m| m.mod_revision);
                let r =
                    if current != expected {
                        Ok(CasOutcome::Conflict { current })
                    } else {
                        match value {
                            Some(v) => self.put(t, &key, v, lease, events)?.map(CasOutcome::Done),
                            None => {
                                let rev = self.delete(t, &key, events)?;
                                Ok(rev.map_or(
                                    CasOutcome::Conflict { current: None },
                                    CasOutcome::Done,
                                ))
                            }
                        }
                    };
                answer(reply, r)
            }
            Op::Grant { ttl, reply } => {
                let id = self.next_lease;
                self.next_lease += 1;
                let ttl = ttl.clamp(Duration::from_millis(1), MAX_TTL);
                let ttl_ms = ttl.as_millis() as u64;
                t.leases
                    .insert(id, ttl_ms)
                    .map_err(|e| engine("grant")(e.into()))?;
                self.leases.insert(
                    id,
                    LeaseState {
                        ttl,
                        deadline: Instant::now() + ttl,
                    },
                );
                answer(reply, Ok(id))
            }
            Op::Revoke { lease, reply } => {
                let r = if self.leases.contains_key(&lease) {
                    self.revoke(t, lease, events)?;
                    Ok(())
                } else {
                    Err(StoreError::LeaseNotFound(lease))
                };
                answer(reply, r)
            }
            Op::KeepAlive { reply, .. } => answer(reply, Ok(())),
        })
    }

    fn meta(&self, t: &Tables<'_>, key: &str) -> Result<Option<super::codec::Meta>, StoreError> {
        match t.kv.get(key).map_err(|e| engine("read")(e.into()))? {
            Some(v) => Ok(Some(decode_meta(key, v.value())?)),
            None => Ok(None),
        }
    }

    /// Outer `Err`: engine failure. Inner `Err`: the put was refused.
    #[allow(clippy::type_complexity)]
    fn put(
        &mut self,
        t: &mut Tables<'_>,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
        events: &mut Vec<Event>,
    ) -> Result<Result<Revision, StoreError>, StoreError> {
        if let Some(l) = lease {
            if !self.leases.contains_key(&l) {
                return Ok(Err(StoreError::LeaseNotFound(l)));
            }
        }
        let err = engine("put");
        let old = self.meta(t, key)?;
        self.revision += 1;
        let rev = self.revision;
        let create = old.map_or(rev, |m| m.create_revision);
        if let Some(old_lease) = old.and_then(|m| m.lease) {
            if Some(old_lease) != lease {
                t.lease_keys
                    .remove((old_lease, key))
                    .map_err(|e| err(e.into()))?;
            }
        }
        if let Some(l) = lease {
            t.lease_keys
                .insert((l, key), ())
                .map_err(|e| err(e.into()))?;
        }
        let record = encode_record(key, create, rev, lease, &value);
        t.kv.insert(key, record.as_slice())
            .map_err(|e| err(e.into()))?;
        let kind = EventKind::Put(value);
        t.log
            .insert(rev, encode_event(rev, key, &kind).as_slice())
            .map_err(|e| err(e.into()))?;
        events.push(Event {
            revision: rev,
            key: key.to_owned(),
            kind,
        });
        Ok(Ok(rev))
    }

    fn delete(
        &mut self,
        t: &mut Tables<'_>,
        key: &str,
        events: &mut Vec<Event>,
    ) -> Result<Option<Revision>, StoreError> {
        let err = engine("delete");
        let Some(old) = self.meta(t, key)? else {
            return Ok(None);
        };
        self.revision += 1;
        let rev = self.revision;
        if let Some(l) = old.lease {
            t.lease_keys.remove((l, key)).map_err(|e| err(e.into()))?;
        }
        t.kv.remove(key).map_err(|e| err(e.into()))?;
        t.log
            .insert(rev, encode_event(rev, key, &EventKind::Delete).as_slice())
            .map_err(|e| err(e.into()))?;
        events.push(Event {
            revision: rev,
            key: key.to_owned(),
            kind: EventKind::Delete,
        });
        Ok(Some(rev))
    }

    fn revoke(
        &mut self,
        t: &mut Tables<'_>,
        lease: LeaseId,
        events: &mut Vec<Event>,
    ) -> Result<(), StoreError> {
        let err = engine("revoke");
        let keys: Vec<String> = t
            .lease_keys
            .range((lease, "")..(lease + 1, ""))
            .map_err(|e| err(e.into()))?
            .map(|row| row.map(|(k, _)| k.value().1.to_owned()))
            .collect::<Result<_, _>>()
            .map_err(|e| err(e.into()))?;
        for key in keys {
            self.delete(t, &key, events)?;
        }
        t.leases.remove(lease).map_err(|e| err(e.into()))?;
        self.leases.remove(&lease);
        Ok(())
    }

    fn compact(&mut self, t: &mut Tables<'_>) -> Result<(), StoreError> {
        if self.revision.saturating_sub(self.compacted) <= 2 * LOG_RETAIN {
            return Ok(());
        }
        let bound = self.revision - LOG_RETAIN;
        t.log
            .retain_in(..=bound, |_, _| false)
            .map_err(|e| engine("compact")(e.into()))?;
        self.compacted = bound;
        Ok(())
    }
}
