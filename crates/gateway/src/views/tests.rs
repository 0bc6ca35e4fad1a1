//! The views' own rules: what enters and leaves routing, and a tainted instance's return.

use warden_core::model::{InstanceState, Lifetime};
use warden_core::InstanceRecord;

use super::*;

fn record(label: &str) -> InstanceRecord {
    InstanceRecord {
        id: "i1".into(),
        app: "demo".into(),
        label: label.into(),
        node: "n".into(),
        addr: "127.0.0.1:1".parse().unwrap(),
        pid: 1,
        state: InstanceState::Ready,
        started_at_ms: 0,
        lifetime: Lifetime::Shared,
        user: None,
        kept: false,
        generation: String::new(),
        release: None,
    }
}

fn routed(s: &Shared, label: &str) -> bool {
    s.pick("demo", label, "", false, &[], None).is_some()
}

#[test]
fn only_entering_and_leaving_routing_reach_the_hook() {
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let c = calls.clone();
    let s = Shared::with_hook(Some(Box::new(move |id: &str, routed: bool| {
        c.lock().unwrap().push((id.to_owned(), routed))
    })));
    let with = |state: InstanceState| {
        let mut r = record("SECRET");
        r.state = state;
        serde_json::to_vec(&r).unwrap()
    };
    let key = "instances/demo/i1";
    s.apply(Kind::Instances, key, Some(&with(InstanceState::Ready)));
    // The start's own "starting" record, late behind its "ready": nothing changes.
    s.apply(Kind::Instances, key, Some(&with(InstanceState::Starting)));
    s.apply(Kind::Instances, key, Some(&with(InstanceState::Draining)));
    s.apply(Kind::Instances, key, None);
    let seen: Vec<bool> = calls.lock().unwrap().iter().map(|(_, r)| *r).collect();
    assert_eq!(seen, [true, false, false]);
}

#[test]
fn a_late_starting_or_spare_record_leaves_a_routed_instance_routed() {
    let s = Shared::new();
    let with = |state: InstanceState| {
        let mut r = record("SECRET");
        r.state = state;
        serde_json::to_vec(&r).unwrap()
    };
    let key = "instances/demo/i1";
    // Handed to its request by the agent before the store's record says ready.
    s.add_instance(record("SECRET"));
    s.apply(Kind::Instances, key, Some(&with(InstanceState::Starting)));
    assert!(routed(&s, "SECRET"), "a late starting record");
    s.apply(Kind::Instances, key, Some(&with(InstanceState::Spare)));
    assert!(routed(&s, "SECRET"), "a late spare record");
    s.apply(Kind::Instances, key, Some(&with(InstanceState::Draining)));
    assert!(!routed(&s, "SECRET"), "draining leaves routing");
    // Not routed yet: a starting record does not route it.
    s.apply(Kind::Instances, key, Some(&with(InstanceState::Starting)));
    assert!(!routed(&s, "SECRET"));
}

#[test]
fn a_tainted_instance_comes_back_only_under_its_new_label() {
    let s = Shared::new();
    let bytes = |label: &str| serde_json::to_vec(&record(label)).unwrap();
    s.apply(Kind::Instances, "instances/demo/i1", Some(&bytes("SECRET")));
    assert!(routed(&s, "SECRET"));
    s.withdraw_tainted("i1", Some("TOP SECRET".into()));
    assert!(!routed(&s, "SECRET"));
    // The start's own event, late: the old label must not bring it back.
    s.apply(Kind::Instances, "instances/demo/i1", Some(&bytes("SECRET")));
    s.add_instance(record("SECRET"));
    assert!(!routed(&s, "SECRET"));
    assert!(!routed(&s, "TOP SECRET"));
    // The relabelled record.
    s.apply(
        Kind::Instances,
        "instances/demo/i1",
        Some(&bytes("TOP SECRET")),
    );
    assert!(routed(&s, "TOP SECRET") && !routed(&s, "SECRET"));
    // Gone: nothing is kept of it.
    s.apply(Kind::Instances, "instances/demo/i1", None);
    assert!(s.read().tainted.is_empty());
    // One being stopped never comes back.
    s.apply(Kind::Instances, "instances/demo/i1", Some(&bytes("SECRET")));
    s.withdraw_tainted("i1", None);
    s.apply(Kind::Instances, "instances/demo/i1", Some(&bytes("SECRET")));
    assert!(!routed(&s, "SECRET"));
}
