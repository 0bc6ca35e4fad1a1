//! The scheduler's decision, as a pure function of what it sees: the next [`Placement`] from the
//! current one, the desired counts, the nodes (alive, drained, loaded) and the ready instances.
//!
//! The rules (seed 003 §3.3.2, with make-before-break):
//! - A dead node's counts go at once; the missing instances are placed on live nodes.
//! - A missing instance goes to the eligible node (alive, not drained, with room: load below
//!   `full`) with fewest of that label; load decides only between nodes with equally few (one
//!   not above the mean by more than `start_margin` first, then lowest load, then fewest
//!   instances, then lowest name). Spread for availability wins over balance by load: a label's
//!   instances stay at most one apart over the nodes with room, so losing one node never takes
//!   all of a label that more nodes could hold.
//! - A surplus instance leaves the node with most of that label (a drained one first).
//! - Instances *move* (the new node counts it at once, the old one only gives it up once the new
//!   one is ready) off drained nodes, off a node loaded above the mean by more than
//!   `shed_margin` (only what keeps the spread, unless the node is out of room), and from a
//!   node with two more of a label than another with room, loaded or not (after a node came
//!   back). Shedding and spreading move one instance at a time with a pause between, so that
//!   load figures catch up and nothing oscillates; drains move everything at once.
//! - A label crash-looping on a node is never moved for load or spread: it would only crash
//!   elsewhere.

use std::collections::{BTreeMap, BTreeSet};

use warden_core::{Move, MoveReason, Placement};

/// One agent node as the scheduler sees it.
#[derive(Debug, Clone)]
pub(crate) struct NodeView {
    pub id: String,
    /// Its record is there and its node port answers.
    pub alive: bool,
    pub draining: bool,
    /// Load score in [0, 1] (see `HostLoad::score`).
    pub score: f64,
}

/// The scheduler's thresholds.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// A node loaded above the mean by more than this gets no new instances.
    pub start_margin: f64,
    /// A node loaded above the mean by more than this sheds instances.
    pub shed_margin: f64,
    /// A move whose new instance is not ready by then is called off.
    pub move_timeout_ms: u64,
    /// Pause after a shedding or spreading move before the next.
    pub move_pause_ms: u64,
    /// A node loaded this much or more has no room: it gets no new instance while another
    /// node has room, counts for no label's spread, and sheds whatever keeps the spread.
    pub full: f64,
}

/// (app, label).
pub(crate) type LabelKey = (String, String);

/// What the scheduler sees in one round.
pub(crate) struct World {
    /// Desired count per (app, label) of every app that has one.
    pub desired: BTreeMap<LabelKey, u32>,
    /// Agent nodes with a record.
    pub nodes: Vec<NodeView>,
    /// Ready kept instances per (node, app, label).
    pub ready: BTreeMap<(String, String, String), u32>,
    /// (node, app, label) whose kept instances crash in a loop.
    pub crash_looping: BTreeSet<(String, String, String)>,
    pub now_ms: u64,
    pub rules: Rules,
}

impl World {
    fn alive(&self, id: &str) -> bool {
        self.nodes.iter().any(|n| n.id == id && n.alive)
    }

    /// Mean load of live nodes.
    fn mean(&self) -> f64 {
        let live: Vec<f64> = self
            .nodes
            .iter()
            .filter(|n| n.alive)
            .map(|n| n.score)
            .collect();
        if live.is_empty() {
            0.0
        } else {
            live.iter().sum::<f64>() / live.len() as f64
        }
    }

    fn ready(&self, node: &str, app: &str, label: &str) -> u32 {
        self.ready
            .get(&(node.to_owned(), app.to_owned(), label.to_owned()))
            .copied()
            .unwrap_or(0)
    }
}

/// The next placement.
pub(crate) fn plan(current: &Placement, w: &World) -> Placement {
    let mut p = current.clone();
    forget_the_dead(&mut p, w);
    forget_undesired(&mut p, w);
    finish_moves(&mut p, w);
    for ((app, label), &want) in &w.desired {
        converge(&mut p, w, app, label, want);
    }
    start_drain_moves(&mut p, w);
    if !p.moves.iter().any(|m| m.why != MoveReason::Drain)
        && w.now_ms.saturating_sub(p.last_move_ms) >= w.rules.move_pause_ms
    {
        if let Some(m) = shed_move(&p, w).or_else(|| spread_move(&p, w)) {
            begin(&mut p, m);
        }
    }
    p
}

/// Drops the counts of nodes that are dead or gone, and the moves that involve them: a move to a
/// dead node is off (the old instance stays), a move from one is done (the new one stays).
fn forget_the_dead(p: &mut Placement, w: &World) {
    p.nodes.retain(|node, _| w.alive(node));
    p.moves.retain(|m| w.alive(&m.from) && w.alive(&m.to));
}

/// Drops counts and moves of labels no longer desired.
fn forget_undesired(p: &mut Placement, w: &World) {
    for apps in p.nodes.values_mut() {
        apps.retain(|app, labels| {
            labels
                .retain(|label, n| *n > 0 && w.desired.contains_key(&(app.clone(), label.clone())));
            !labels.is_empty()
        });
    }
    p.nodes.retain(|_, apps| !apps.is_empty());
    p.moves
        .retain(|m| w.desired.contains_key(&(m.app.clone(), m.label.clone())));
}

/// Completes moves whose new instance is ready (the old node gives its one up) and calls off
/// those that took too long (the new node's count goes back down).
fn finish_moves(p: &mut Placement, w: &World) {
    let moves = std::mem::take(&mut p.moves);
    for m in moves {
        let target = p.count(&m.to, &m.app, &m.label);
        if w.ready(&m.to, &m.app, &m.label) >= target {
            let n = p.count(&m.from, &m.app, &m.label);
            p.set(&m.from, &m.app, &m.label, n.saturating_sub(1));
            if m.why != MoveReason::Drain {
                p.last_move_ms = w.now_ms;
            }
        } else if w.now_ms.saturating_sub(m.since_ms) >= w.rules.move_timeout_ms {
            tracing::warn!(app = %m.app, label = %m.label, from = %m.from, to = %m.to, "a moved instance did not become ready in time; it stays where it was");
            p.set(&m.to, &m.app, &m.label, target.saturating_sub(1));
            p.last_move_ms = w.now_ms;
            p.last_timeout_ms = w.now_ms;
        } else {
            p.moves.push(m);
        }
    }
}

/// Brings (app, label) to `want` instances, not counting the extra ones of moves in flight.
/// Each round of the loop adds or removes one instance; counts are bounded by the API
/// (`AppSpec::validate`), so the loop is too.
fn converge(p: &mut Placement, w: &World, app: &str, label: &str, want: u32) {
    let want = u64::from(want);
    loop {
        let moving = p
            .moves
            .iter()
            .filter(|m| m.app == app && m.label == label)
            .count() as u64;
        let placed: u64 = w
            .nodes
            .iter()
            .filter(|n| n.alive)
            .map(|n| u64::from(p.count(&n.id, app, label)))
            .sum::<u64>()
            .saturating_sub(moving);
        if placed < want {
            let Some(to) = best_target(p, w, app, label, None, Purpose::Place) else {
                return;
            };
            let n = p.count(&to, app, label);
            p.set(&to, app, label, n + 1);
        } else if placed > want {
            // Call a move off first: its new instance is the surplus.
            if let Some(i) = p
                .moves
                .iter()
                .position(|m| m.app == app && m.label == label)
            {
                let m = p.moves.remove(i);
                let n = p.count(&m.to, app, label);
                p.set(&m.to, app, label, n.saturating_sub(1));
                continue;
            }
            let Some(from) = w
                .nodes
                .iter()
                .filter(|n| n.alive && p.count(&n.id, app, label) > 0)
                .max_by(|a, b| {
                    (a.draining, p.count(&a.id, app, label), &a.id).cmp(&(
                        b.draining,
                        p.count(&b.id, app, label),
                        &b.id,
                    ))
                })
                .map(|n| n.id.clone())
            else {
                return;
            };
            let n = p.count(&from, app, label);
            p.set(&from, app, label, n.saturating_sub(1));
        } else {
            return;
        }
    }
}

/// Why a node is sought for an instance: the rules differ in how much load they accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// A missing instance, or one moving off a drained node: it must run somewhere.
    Place,
    /// A move that only balances load: never to a node that is itself loaded.
    Shed,
    /// A move that restores the spread: to any node with room, loaded or not.
    Spread,
}

/// Whether a node has room for another instance at all: below [`Rules::full`].
fn has_room(w: &World, n: &NodeView) -> bool {
    n.score < w.rules.full
}

/// Where a new instance of (app, label) goes. The candidates are live, undrained nodes where
/// the label is not crash-looping and that have room ([`has_room`]); among them the one with
/// fewest of that label, so a label's instances spread over nodes (at most one apart: the
/// spread is a hard rule, as Kubernetes' topology spread with `maxSkew: 1` and
/// `DoNotSchedule`); load only decides between nodes with equally few: first one not above the
/// mean by more than the start margin, then the lowest load, then fewest kept instances, then
/// the lowest name. For [`Purpose::Place`], when no node has room, any candidate; for
/// [`Purpose::Shed`], only nodes not above the mean by the start margin (a move to a loaded
/// node would come straight back).
fn best_target(
    p: &Placement,
    w: &World,
    app: &str,
    label: &str,
    except: Option<&str>,
    purpose: Purpose,
) -> Option<String> {
    let mean = w.mean();
    let hot = |n: &NodeView| n.score > mean + w.rules.start_margin;
    let open: Vec<&NodeView> = w
        .nodes
        .iter()
        .filter(|n| n.alive && !n.draining && Some(n.id.as_str()) != except)
        .filter(|n| {
            !w.crash_looping
                .contains(&(n.id.clone(), app.to_owned(), label.to_owned()))
        })
        .collect();
    let roomy: Vec<&NodeView> = open
        .iter()
        .copied()
        .filter(|n| has_room(w, n) && (purpose != Purpose::Shed || !hot(n)))
        .collect();
    let pool = if roomy.is_empty() && purpose == Purpose::Place {
        open
    } else {
        roomy
    };
    let total = |id: &str| -> u64 {
        p.nodes
            .get(id)
            .map(|a| {
                a.values()
                    .flat_map(|l| l.values())
                    .map(|n| u64::from(*n))
                    .sum()
            })
            .unwrap_or(0)
    };
    pool.into_iter()
        .min_by(|a, b| {
            let key = |n: &NodeView| (p.count(&n.id, app, label), hot(n), n.score, total(&n.id));
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| a.id.cmp(&b.id))
        })
        .map(|n| n.id.clone())
}

/// How far apart a label's counts are (most minus fewest) over the nodes that could take one
/// of its instances (live, undrained, with room, not crash-looping it), with one instance
/// moved from `from` to `to` when given.
fn skew(p: &Placement, w: &World, app: &str, label: &str, moved: Option<(&str, &str)>) -> u32 {
    let counts: Vec<u32> = w
        .nodes
        .iter()
        .filter(|n| n.alive && !n.draining && has_room(w, n))
        .filter(|n| {
            !w.crash_looping
                .contains(&(n.id.clone(), app.to_owned(), label.to_owned()))
        })
        .map(|n| {
            let c = p.count(&n.id, app, label);
            match moved {
                Some((from, _)) if from == n.id => c.saturating_sub(1),
                Some((_, to)) if to == n.id => c + 1,
                _ => c,
            }
        })
        .collect();
    counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0)
}

fn begin(p: &mut Placement, m: Move) {
    let n = p.count(&m.to, &m.app, &m.label);
    p.set(&m.to, &m.app, &m.label, n + 1);
    p.moves.push(m);
}

/// Moves every instance of a drained node that is not moving yet; after a move that timed out,
/// not before the pause (a replacement that cannot become ready would otherwise be tried
/// again and again).
fn start_drain_moves(p: &mut Placement, w: &World) {
    if w.now_ms.saturating_sub(p.last_timeout_ms) < w.rules.move_pause_ms {
        return;
    }
    for node in w.nodes.iter().filter(|n| n.alive && n.draining) {
        let held: Vec<(String, String, u32)> = p
            .nodes
            .get(&node.id)
            .map(|apps| {
                apps.iter()
                    .flat_map(|(a, ls)| {
                        ls.iter()
                            .map(move |(l, n)| (a.to_owned(), l.to_owned(), *n))
                    })
                    .collect::<Vec<(String, String, u32)>>()
            })
            .unwrap_or_default();
        for (app, label, n) in held {
            let moving = p
                .moves
                .iter()
                .filter(|m| m.from == node.id && m.app == app && m.label == label)
                .count() as u32;
            for _ in moving..n {
                let Some(to) = best_target(p, w, &app, &label, Some(&node.id), Purpose::Place)
                else {
                    break;
                };
                begin(
                    p,
                    Move {
                        app: app.clone(),
                        label: label.clone(),
                        from: node.id.clone(),
                        to,
                        why: MoveReason::Drain,
                        since_ms: w.now_ms,
                    },
                );
            }
        }
    }
}

/// One instance off the most loaded node, if it is above the mean by more than the shedding
/// margin, to the best node that is not; the label with most instances there first. A node
/// with room gives up an instance only where the move keeps the label's spread (at most one
/// apart, or no worse than it is): spread for availability wins over balance by load. A node
/// out of room sheds regardless.
fn shed_move(p: &Placement, w: &World) -> Option<Move> {
    let mean = w.mean();
    let hot = w
        .nodes
        .iter()
        .filter(|n| n.alive && !n.draining && n.score > mean + w.rules.shed_margin)
        .max_by(|a, b| {
            a.score
                .partial_cmp(&b.score)
                .unwrap_or(std::cmp::Ordering::Equal)
        })?;
    let apps = p.nodes.get(&hot.id)?;
    let mut held: Vec<(&String, &String, u32)> = apps
        .iter()
        .flat_map(|(a, ls)| ls.iter().map(move |(l, n)| (a, l, *n)))
        .filter(|(a, l, n)| {
            *n > 0
                && !w
                    .crash_looping
                    .contains(&(hot.id.clone(), (*a).clone(), (*l).clone()))
        })
        .collect();
    held.sort_by(|x, y| (y.2, y.0, y.1).cmp(&(x.2, x.0, x.1)));
    held.into_iter().find_map(|(app, label, _)| {
        let to = best_target(p, w, app, label, Some(&hot.id), Purpose::Shed)?;
        let spread_kept = !has_room(w, hot)
            || skew(p, w, app, label, Some((&hot.id, &to))) <= skew(p, w, app, label, None).max(1);
        spread_kept.then(|| Move {
            app: app.clone(),
            label: label.clone(),
            from: hot.id.clone(),
            to,
            why: MoveReason::Shed,
            since_ms: w.now_ms,
        })
    })
}

/// One instance from the node with most of a label to the one with fewest that has room,
/// loaded or not, when they differ by two or more.
fn spread_move(p: &Placement, w: &World) -> Option<Move> {
    let open: Vec<&NodeView> = w.nodes.iter().filter(|n| n.alive && !n.draining).collect();
    for (app, label) in w.desired.keys() {
        let most = open
            .iter()
            .max_by_key(|n| (p.count(&n.id, app, label), n.id.clone()))?;
        if w.crash_looping
            .contains(&(most.id.clone(), app.clone(), label.clone()))
        {
            continue;
        }
        let Some(to) = best_target(p, w, app, label, Some(&most.id), Purpose::Spread) else {
            continue;
        };
        if p.count(&most.id, app, label) >= p.count(&to, app, label) + 2 {
            return Some(Move {
                app: app.clone(),
                label: label.clone(),
                from: most.id.clone(),
                to,
                why: MoveReason::Spread,
                since_ms: w.now_ms,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests;
