//! Unit tests of `faults` (moved unchanged from its inline `mod tests`).
//! Owns: the module's unit tests and their fixtures.
//! Must not: hold code the module itself uses.

use super::*;

fn parse(text: &str) -> FaultsConfig {
    #[derive(Deserialize)]
    struct Doc {
        faults: FaultsConfig,
    }
    toml::from_str::<Doc>(text).unwrap().faults
}

const FULL: &str = r#"
    [faults]
    [[faults.events]]
    round = 10
    loss = { fraction = 0.1, silos = [2] }
    [[faults.events]]
    round = 15
    join = 7
    [[faults.events]]
    round = 20
    partition = [[0, 1, 2, 3], [4, 5, 6, 7]]
    [[faults.events]]
    round = 30
    crash = { silo = 5, restart_after_rounds = 3 }
    [[faults.events]]
    round = 40
    delay = { silo = 2, ms = 3000 }
    [[faults.events]]
    round = 50
    heal = true
    [[faults.events]]
    round = 60
    leave = 6
"#;

#[test]
fn a_full_schedule_parses_and_replays() {
    let s = parse(FULL).schedule(8).unwrap();
    assert_eq!(s.events.len(), 7);
    s.rounds_only().unwrap();
    let t = s.timeline(70);
    assert!(!t.at(14).is_up(7) && t.at(15).is_up(7));
    assert_eq!(t.at(14).presence[7], Presence::Absent);
    assert!(t.at(19).connected(0, 4));
    assert!(!t.at(20).connected(0, 4) && t.at(20).connected(0, 3));
    assert!(t.at(29).is_up(5) && !t.at(30).is_up(5) && !t.at(32).is_up(5));
    assert!(t.at(33).is_up(5));
    assert_eq!(t.fired(33), &[Fault::Restart(5)]);
    assert_eq!(t.at(40).delay_ms[2], 3000);
    assert!(t.at(50).connected(0, 4));
    assert_eq!(t.at(60).presence[6], Presence::Left);
    assert_eq!(t.at(12).loss_between(2, 0), 0.1);
    assert_eq!(t.at(12).loss_between(1, 0), 0.0);
    assert_eq!(t.at(500).presence[6], Presence::Left);
}

fn err(text: &str, k: usize) -> String {
    parse(text).schedule(k).unwrap_err()
}

#[test]
fn invalid_schedules_name_the_event_and_the_problem() {
    let e = err("[[faults.events]]\nround = 2\ncrash = { silo = 9 }", 8);
    assert!(e.contains("events[1]") && e.contains("silo 9"), "{e}");
    let e = err(
        "[[faults.events]]\nround = 2\npartition = [[0, 1, 2], [2, 3]]",
        4,
    );
    assert!(e.contains("overlap") && e.contains("silo 2"), "{e}");
    let e = err("[[faults.events]]\nround = 2\npartition = [[0, 1], [2]]", 4);
    assert!(e.contains("silo 3 is in no group"), "{e}");
    let e = err("[[faults.events]]\nround = 2\nheal = true", 4);
    assert!(
        e.contains("events[1]") && e.contains("heal without a partition"),
        "{e}"
    );
    let e = err("[[faults.events]]\nround = 2\nleave = 1\njoin = 2", 4);
    assert!(e.contains("one event per action"), "{e}");
    let e = err("[[faults.events]]\nheal = true", 4);
    assert!(e.contains("trigger"), "{e}");
    let e = err("[[faults.events]]\nround = 0\nheal = true", 4);
    assert!(e.contains("at least 1"), "{e}");
    let e = err(
        "[[faults.events]]\nround = 5\nleave = 1\n[[faults.events]]\nround = 3\nleave = 2",
        4,
    );
    assert!(e.contains("events[2]") && e.contains("order"), "{e}");
    let e = err(
        "[[faults.events]]\nround = 5\nleave = 1\n[[faults.events]]\nround = 6\ncrash = { silo = 1 }",
        4,
    );
    assert!(e.contains("events[2]") && e.contains("left"), "{e}");
    let e = err(
        "[[faults.events]]\nround = 5\ncrash = { silo = 1, restart_after_rounds = 2 }\n[[faults.events]]\nround = 6\ncrash = { silo = 1 }",
        4,
    );
    assert!(e.contains("events[2]") && e.contains("crashed"), "{e}");
    let e = err(
        "[[faults.events]]\nround = 5\njoin = 1\n[[faults.events]]\nround = 6\njoin = 1",
        4,
    );
    assert!(
        e.contains("events[2]") && e.contains("already started"),
        "{e}"
    );
    let e = err("[[faults.events]]\nround = 5\nloss = { fraction = 1.0 }", 4);
    assert!(e.contains("[0, 1)"), "{e}");
    let e = err("[faults]\nmodel_deadline_s = 0", 4);
    assert!(e.contains("model_deadline_s"), "{e}");
    // A restart lands before a later crash of the same silo: valid.
    parse(
        "[[faults.events]]\nround = 5\ncrash = { silo = 1, restart_after_rounds = 2 }\n[[faults.events]]\nround = 8\ncrash = { silo = 1 }",
    )
    .schedule(4)
    .unwrap();
}

#[test]
fn unknown_fields_are_refused() {
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Doc {
        faults: FaultsConfig,
    }
    let e = toml::from_str::<Doc>("[[faults.events]]\nround = 2\npartiton = [[0], [1]]")
        .unwrap_err()
        .to_string();
    assert!(e.contains("partiton"), "{e}");
}

#[test]
fn timed_events_are_for_the_swarm_only() {
    let s = parse("[[faults.events]]\nat_s = 3.5\ncrash = { silo = 1, restart_after_s = 2 }")
        .schedule(4)
        .unwrap();
    let e = s.rounds_only().unwrap_err();
    assert!(e.contains("events[1]") && e.contains("round = N"), "{e}");
}

#[test]
fn wide_area_links_are_checked_and_name_what_is_wrong() {
    let links = |body: &str| parse(&format!("[faults]\n[faults.links]\n{body}"));
    let ok = links(
        "sites = [0, 0, 1, 2]\none_way_ms = [[20, 80, 150], [80, 20, 80], [150, 80, 20]]\n\
         jitter_ms = 5\nmbit_s = 50",
    );
    assert!(!ok.is_empty(), "links alone make a run under faults");
    let s = ok.schedule(4).unwrap();
    let l = s.links().unwrap();
    assert_eq!(l.link(0, 1).one_way, std::time::Duration::from_millis(20));
    assert_eq!(l.link(0, 3).one_way, std::time::Duration::from_millis(150));
    assert_eq!(l.link(3, 2).one_way, std::time::Duration::from_millis(80));
    assert_eq!(l.link(2, 3).bits_per_s, 50e6);
    let err = |body: &str, clients| links(body).schedule(clients).unwrap_err();
    assert!(err("sites = [0, 0]\none_way_ms = [[1]]", 3).contains("lists 2 silos"));
    assert!(err("sites = [0, 1]\none_way_ms = [[1]]", 2).contains("names site 1"));
    assert!(err("sites = [0, 1]\none_way_ms = [[1, 2], [3]]", 2).contains("square"));
    assert!(err("sites = [0]\none_way_ms = [[-1]]", 1).contains("one_way_ms"));
    assert!(err("sites = [0]\none_way_ms = [[1]]\njitter_ms = -2", 1).contains("jitter_ms"));
    assert!(err("sites = [0]\none_way_ms = [[1]]\nmbit_s = 0", 1).contains("mbit_s"));
    let unlimited = links("sites = [0]\none_way_ms = [[1]]")
        .schedule(1)
        .unwrap();
    assert!(
        unlimited
            .links()
            .unwrap()
            .link(0, 0)
            .bits_per_s
            .is_infinite()
    );
}
