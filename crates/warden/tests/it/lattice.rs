//! Routing by clearance in a product lattice (levels × category sets, seed 002 §2.1), through
//! the real binary: exact labels, spelling-independent, and taint raising a label to the join.

use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::http::basic;
use warden_test_support::{request, wait_until, Launch, Warden};

use crate::BIN;
const PASSWORD: &str = "correct horse battery";

fn serve(w: &Warden, user: &str, path: &str) -> Value {
    let r = request(
        "GET",
        &format!("{}/apps/labs/{path}", w.gateway),
        &[("authorization", &basic(user, PASSWORD))],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn label_of(w: &Warden, id: &str) -> Option<String> {
    w.instances()
        .iter()
        .find(|i| i["id"] == id)
        .map(|i| i["label"].as_str().unwrap().to_owned())
}

#[test]
fn product_labels_route_exactly_and_taint_joins_levels_and_categories() {
    let w = Launch::new(BIN).no_demo().start();
    let lattice = json!({ "levels": ["LOW", "HIGH"], "categories": ["RED", "BLUE"] });
    assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
    // ben's clearance is spelled out of lattice order and cy's without categories: both are
    // stored in canonical form.
    for (name, clearance) in [
        ("ann", "LOW:{RED}"),
        ("ben", "LOW:{BLUE,RED}"),
        ("cy", "HIGH"),
    ] {
        let r = w.api(
            "POST",
            "/v1/users",
            Some(json!({ "name": name, "password": PASSWORD, "clearance": clearance })),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    w.create_demo_app(BIN, "labs", json!({}));

    let ann = serve(&w, "ann", "");
    let ben = serve(&w, "ben", "");
    let cy = serve(&w, "cy", "");
    assert_eq!(ann["label"], "LOW:{RED}");
    assert_eq!(ben["label"], "LOW:{RED,BLUE}");
    assert_eq!(cy["label"], "HIGH:{}");
    let ids = [&ann, &ben, &cy].map(|a| a["instance"].as_str().unwrap().to_owned());
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "{ids:?}"
    );

    // ann's instance reads BLUE data: it joins to LOW:{RED,BLUE}, ben's label, and ann never
    // reaches it again.
    let tainted = serve(&w, "ann", "?taint=LOW:%7BBLUE%7D");
    assert_eq!(tainted["instance"], ids[0].as_str());
    wait_until("the join to be recorded", Duration::from_secs(30), || {
        (label_of(&w, &ids[0]).as_deref() == Some("LOW:{RED,BLUE}")).then_some(())
    });
    let again = serve(&w, "ann", "");
    assert_ne!(again["instance"], ids[0].as_str());
    assert_eq!(again["label"], "LOW:{RED}");
    // ben is now served by his own instance and the joined one, never by ann's new one.
    for _ in 0..4 {
        let b = serve(&w, "ben", "")["instance"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(b == ids[1] || b == ids[0], "{b}");
    }

    // A higher level joins with the categories kept: LOW:{RED} and HIGH:{} make HIGH:{RED},
    // a label no user here holds, so nobody reaches that instance any more.
    let fresh = again["instance"].as_str().unwrap().to_owned();
    serve(&w, "ann", "?taint=HIGH");
    wait_until("the join to be recorded", Duration::from_secs(30), || {
        (label_of(&w, &fresh).as_deref() == Some("HIGH:{RED}")).then_some(())
    });
    for user in ["ann", "cy"] {
        assert_ne!(serve(&w, user, "")["instance"], fresh.as_str());
    }
}
