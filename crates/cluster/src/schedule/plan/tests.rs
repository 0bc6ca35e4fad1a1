use super::*;

const RULES: Rules = Rules {
    start_margin: 0.1,
    shed_margin: 0.2,
    move_timeout_ms: 30_000,
    move_pause_ms: 5_000,
    full: 0.85,
};

fn node(id: &str, score: f64) -> NodeView {
    NodeView {
        id: id.into(),
        alive: true,
        draining: false,
        score,
    }
}

fn world(nodes: Vec<NodeView>, desired: &[(&str, u32)]) -> World {
    World {
        desired: desired
            .iter()
            .map(|(l, n)| (("demo".to_owned(), (*l).to_owned()), *n))
            .collect(),
        nodes,
        ready: BTreeMap::new(),
        crash_looping: BTreeSet::new(),
        now_ms: 1_000_000,
        rules: RULES,
    }
}

fn counts(p: &Placement, label: &str, nodes: &[&str]) -> Vec<u32> {
    nodes.iter().map(|n| p.count(n, "demo", label)).collect()
}

/// `rounds` rounds of the scheduler, a pause apart, every instance it assigns becoming ready.
fn settle(mut p: Placement, w: &mut World, rounds: usize) -> Placement {
    for _ in 0..rounds {
        all_ready(&p, w);
        w.now_ms += RULES.move_pause_ms;
        p = plan(&p, w);
    }
    p
}

/// Marks every assigned instance ready, as the agents would.
fn all_ready(p: &Placement, w: &mut World) {
    w.ready.clear();
    for (node, apps) in &p.nodes {
        for (app, labels) in apps {
            for (label, n) in labels {
                w.ready
                    .insert((node.clone(), app.clone(), label.clone()), *n);
            }
        }
    }
}

#[test]
fn a_labels_instances_spread_over_nodes_and_sum_to_the_desired_count() {
    let w = world(
        vec![
            node("a", 0.1),
            node("b", 0.1),
            node("c", 0.1),
            node("d", 0.1),
        ],
        &[("PUBLIC", 4), ("SECRET", 6)],
    );
    let p = plan(&Placement::default(), &w);
    assert_eq!(
        counts(&p, "PUBLIC", &["a", "b", "c", "d"]),
        vec![1, 1, 1, 1]
    );
    let secret = counts(&p, "SECRET", &["a", "b", "c", "d"]);
    assert_eq!(secret.iter().sum::<u32>(), 6);
    assert!(secret.iter().all(|n| (1..=2).contains(n)), "{secret:?}");
    // Planning again changes nothing: no churn in steady state.
    assert_eq!(plan(&p, &w), p);
}

#[test]
fn a_dead_nodes_instances_are_placed_elsewhere_at_once() {
    let mut w = world(
        vec![node("a", 0.1), node("b", 0.1), node("c", 0.1)],
        &[("PUBLIC", 3)],
    );
    let p = plan(&Placement::default(), &w);
    w.nodes[1].alive = false;
    let p = plan(&p, &w);
    assert_eq!(
        counts(&p, "PUBLIC", &["a", "b", "c"]).iter().sum::<u32>(),
        3
    );
    assert_eq!(p.count("b", "demo", "PUBLIC"), 0);
    assert!(p.moves.is_empty());
}

#[test]
fn a_loaded_node_gets_no_new_instance() {
    let w = world(
        vec![node("a", 0.9), node("b", 0.1), node("c", 0.1)],
        &[("PUBLIC", 2)],
    );
    let p = plan(&Placement::default(), &w);
    assert_eq!(counts(&p, "PUBLIC", &["a", "b", "c"]), vec![0, 1, 1]);
}

#[test]
fn a_drained_node_keeps_its_instances_until_their_replacements_are_ready() {
    let mut w = world(vec![node("a", 0.1), node("b", 0.1)], &[("PUBLIC", 2)]);
    let p = plan(&Placement::default(), &w);
    all_ready(&p, &mut w);
    w.nodes[0].draining = true;
    let p = plan(&p, &w);
    // Make before break: b starts the replacement while a keeps its one.
    assert_eq!(counts(&p, "PUBLIC", &["a", "b"]), vec![1, 2]);
    assert_eq!(p.moves.len(), 1);
    assert_eq!(
        plan(&p, &w),
        p,
        "nothing changes until the replacement is ready"
    );
    all_ready(&p, &mut w);
    let p = plan(&p, &w);
    assert_eq!(counts(&p, "PUBLIC", &["a", "b"]), vec![0, 2]);
    assert!(p.moves.is_empty());
}

#[test]
fn a_move_that_never_becomes_ready_is_called_off() {
    let mut w = world(vec![node("a", 0.1), node("b", 0.1)], &[("PUBLIC", 2)]);
    let p = plan(&Placement::default(), &w);
    all_ready(&p, &mut w);
    w.nodes[0].draining = true;
    let p = plan(&p, &w);
    w.now_ms += RULES.move_timeout_ms;
    let p = plan(&p, &w);
    // Called off; the drain tries again only after a pause.
    assert!(p.moves.is_empty());
    assert_eq!(counts(&p, "PUBLIC", &["a", "b"]), vec![1, 1]);
    w.now_ms += RULES.move_pause_ms;
    let p = plan(&p, &w);
    assert_eq!(p.moves.len(), 1);
    assert_eq!(p.moves[0].since_ms, w.now_ms);
    assert_eq!(counts(&p, "PUBLIC", &["a", "b"]), vec![1, 2]);
}

#[test]
fn a_node_loaded_from_outside_never_gets_back_what_it_shed() {
    // b is loaded by something warden does not run. With room left (70%), it keeps its share:
    // shedding it would put every instance of the label on a.
    let mut w = world(vec![node("a", 0.2), node("b", 0.7)], &[("PUBLIC", 2)]);
    w.nodes[1].score = 0.2;
    let p = plan(&Placement::default(), &w);
    assert_eq!(counts(&p, "PUBLIC", &["a", "b"]), vec![1, 1]);
    all_ready(&p, &mut w);
    w.nodes[1].score = 0.7;
    let p = settle(plan(&p, &w), &mut w, 20);
    assert_eq!(counts(&p, "PUBLIC", &["a", "b"]), vec![1, 1]);
    // Out of room (90%), it sheds; spreading must not move the instance back while it is.
    w.nodes[1].score = 0.9;
    let p = settle(p, &mut w, 20);
    assert_eq!(counts(&p, "PUBLIC", &["a", "b"]), vec![2, 0]);
    assert!(p.moves.is_empty(), "{:?}", p.moves);
}

#[test]
fn nothing_moves_to_a_node_where_the_label_crash_loops() {
    let mut w = world(
        vec![node("a", 0.1), node("b", 0.1), node("c", 0.1)],
        &[("PUBLIC", 3)],
    );
    let p = plan(&Placement::default(), &w);
    all_ready(&p, &mut w);
    w.nodes[0].draining = true;
    w.crash_looping
        .insert(("b".into(), "demo".into(), "PUBLIC".into()));
    let p = plan(&p, &w);
    assert_eq!(p.moves.len(), 1);
    assert_eq!(p.moves[0].to, "c");
}

#[test]
fn large_counts_are_placed_without_overflow() {
    let w = world(vec![node("a", 0.1), node("b", 0.1)], &[("PUBLIC", 10_000)]);
    let p = plan(&Placement::default(), &w);
    assert_eq!(counts(&p, "PUBLIC", &["a", "b"]), vec![5_000, 5_000]);
}

#[test]
fn a_node_loaded_above_the_shedding_margin_moves_one_instance_at_a_time() {
    let mut w = world(
        vec![node("a", 0.1), node("b", 0.1), node("c", 0.1)],
        &[("PUBLIC", 6)],
    );
    let p = plan(&Placement::default(), &w);
    assert_eq!(counts(&p, "PUBLIC", &["a", "b", "c"]), vec![2, 2, 2]);
    all_ready(&p, &mut w);
    w.nodes[0].score = 0.9;
    let p = plan(&p, &w);
    assert_eq!(p.moves.len(), 1);
    assert_eq!(p.moves[0].from, "a");
    assert_eq!(p.moves[0].why, MoveReason::Shed);
    assert_eq!(
        counts(&p, "PUBLIC", &["a", "b", "c"]).iter().sum::<u32>(),
        7
    );
    all_ready(&p, &mut w);
    let p = plan(&p, &w);
    assert_eq!(p.count("a", "demo", "PUBLIC"), 1);
    assert!(p.moves.is_empty(), "the next move waits for the pause");
    w.now_ms += RULES.move_pause_ms;
    let p = plan(&p, &w);
    assert_eq!(p.moves.len(), 1);
}

#[test]
fn a_node_above_the_mean_by_less_than_the_margin_sheds_nothing() {
    let mut w = world(
        vec![node("a", 0.1), node("b", 0.1), node("c", 0.1)],
        &[("PUBLIC", 3)],
    );
    let p = plan(&Placement::default(), &w);
    all_ready(&p, &mut w);
    w.nodes[0].score = 0.35; // mean 0.18: a is 0.17 above it
    assert!(plan(&p, &w).moves.is_empty());
}

#[test]
fn a_node_that_comes_back_gets_its_share_one_move_at_a_time() {
    let mut w = world(
        vec![node("a", 0.1), node("b", 0.1), node("c", 0.1)],
        &[("PUBLIC", 6)],
    );
    w.nodes[2].alive = false;
    let p = plan(&Placement::default(), &w);
    assert_eq!(counts(&p, "PUBLIC", &["a", "b", "c"]), vec![3, 3, 0]);
    all_ready(&p, &mut w);
    w.nodes[2].alive = true;
    let p = plan(&p, &w);
    assert_eq!(p.moves.len(), 1);
    assert_eq!(p.moves[0].why, MoveReason::Spread);
    assert_eq!(p.moves[0].to, "c");
}

#[test]
fn a_crash_looping_label_is_not_moved_for_load() {
    let mut w = world(
        vec![node("a", 0.1), node("b", 0.1), node("c", 0.1)],
        &[("PUBLIC", 3)],
    );
    let p = plan(&Placement::default(), &w);
    all_ready(&p, &mut w);
    w.nodes[0].score = 0.9;
    w.crash_looping
        .insert(("a".into(), "demo".into(), "PUBLIC".into()));
    assert!(plan(&p, &w).moves.is_empty());
}

#[test]
fn lowering_the_count_calls_off_moves_first_and_never_leaves_more_than_desired() {
    let mut w = world(vec![node("a", 0.1), node("b", 0.1)], &[("PUBLIC", 4)]);
    let p = plan(&Placement::default(), &w);
    all_ready(&p, &mut w);
    w.nodes[0].draining = true;
    let p = plan(&p, &w);
    assert_eq!(p.moves.len(), 2);
    w.desired.insert(("demo".into(), "PUBLIC".into()), 1);
    let p = plan(&p, &w);
    let total: u32 = counts(&p, "PUBLIC", &["a", "b"]).iter().sum();
    assert_eq!(total as usize - p.moves.len(), 1);
    w.desired.clear();
    let p = plan(&p, &w);
    assert!(p.nodes.is_empty() && p.moves.is_empty());
}

#[test]
fn one_labels_moves_never_count_for_another() {
    let mut w = world(
        vec![node("a", 0.1), node("b", 0.1)],
        &[("PUBLIC", 2), ("SECRET", 2)],
    );
    let p = plan(&Placement::default(), &w);
    all_ready(&p, &mut w);
    w.nodes[0].draining = true;
    let p = plan(&p, &w);
    // Each label moves its own instance off a, make before break, and no more.
    for label in ["PUBLIC", "SECRET"] {
        assert_eq!(counts(&p, label, &["a", "b"]), vec![1, 2], "{label}");
        assert_eq!(p.moves.iter().filter(|m| m.label == label).count(), 1);
    }
    assert_eq!(plan(&p, &w), p);
    // A label scaled while another's move is under way gets exactly its new count.
    w.desired.insert(("demo".into(), "PUBLIC".into()), 3);
    let p = plan(&p, &w);
    let public = counts(&p, "PUBLIC", &["a", "b"]);
    let moving = p.moves.iter().filter(|m| m.label == "PUBLIC").count() as u32;
    assert_eq!(
        public.iter().sum::<u32>() - moving,
        3,
        "{public:?} {:?}",
        p.moves
    );
    assert_eq!(counts(&p, "SECRET", &["a", "b"]), vec![1, 2]);
}

/// Every replica of a label on one node is lost with that node: a node that is merely busier
/// than the others still takes its share, and is not made to shed it.
#[test]
fn spread_wins_over_load_on_nodes_with_room() {
    // The finding: two agents, one at 77% against a mean of 61%, over the start margin.
    let mut w = world(vec![node("n2", 0.77), node("n3", 0.45)], &[("SECRET", 4)]);
    let p = plan(&Placement::default(), &w);
    assert_eq!(counts(&p, "SECRET", &["n2", "n3"]), vec![2, 2]);
    all_ready(&p, &mut w);
    w.now_ms += RULES.move_pause_ms;
    assert_eq!(plan(&p, &w), p, "no move that breaks the spread");

    // Three nodes of unequal load, several labels: each label at most one apart everywhere.
    let mut w = world(
        vec![node("a", 0.8), node("b", 0.3), node("c", 0.5)],
        &[("PUBLIC", 4), ("SECRET", 3), ("TOP", 5)],
    );
    let p = settle(plan(&Placement::default(), &w), &mut w, 5);
    for (label, want) in [("PUBLIC", 4), ("SECRET", 3), ("TOP", 5)] {
        let c = counts(&p, label, &["a", "b", "c"]);
        assert_eq!(c.iter().sum::<u32>(), want, "{label}: {c:?}");
        let (most, fewest) = (c.iter().max().unwrap(), c.iter().min().unwrap());
        assert!(most - fewest <= 1, "{label}: {c:?}");
        assert!(c.iter().all(|n| *n > 0), "{label}: {c:?}");
    }
    // Load decides between nodes with equally few: the coolest gets the odd one.
    assert_eq!(counts(&p, "PUBLIC", &["a", "b", "c"]), vec![1, 2, 1]);
}

/// A node out of room is the exception: it gets nothing while another node has room, and
/// sheds what it holds, even if that leaves a label unevenly spread.
#[test]
fn a_node_out_of_room_gets_nothing_and_sheds() {
    let mut w = world(
        vec![node("a", 0.1), node("b", 0.1), node("c", 0.1)],
        &[("PUBLIC", 3)],
    );
    let p = plan(&Placement::default(), &w);
    all_ready(&p, &mut w);
    w.nodes[0].score = 0.9;
    w.now_ms += RULES.move_pause_ms;
    let p = plan(&p, &w);
    assert_eq!(p.moves.len(), 1, "{p:?}");
    assert_eq!(p.moves[0].from, "a");
    let w2 = world(
        vec![node("a", 0.9), node("b", 0.1), node("c", 0.1)],
        &[("PUBLIC", 4)],
    );
    assert_eq!(
        counts(
            &plan(&Placement::default(), &w2),
            "PUBLIC",
            &["a", "b", "c"]
        ),
        vec![0, 2, 2]
    );
}
