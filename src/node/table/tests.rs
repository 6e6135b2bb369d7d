//! The transitions of [`super::FilterTable`], the refused ones among them.

use super::*;
use crate::FilterKind;

/// A replica's handle: its number (two handles of one number are one replica).
#[derive(Debug, Clone, PartialEq)]
struct R(u32);

impl Handle for R {
    fn same(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

/// A parked replica's state.
#[derive(Debug, PartialEq)]
struct Kept(u32);

type Table = FilterTable<R, Kept>;

fn filter(generation: u64) -> Filter {
    Filter::new(CatalogEntry {
        name: "f".into(),
        spec: FilterSpec::new(FilterKind::GBloom, 1_000, 0.01),
        generation,
        created_ms: 7,
        replaces: None,
        expires_ms: None,
    })
}

/// A table where `name` is live as replica `r` of `generation`.
fn live(name: &str, r: u32, generation: u64) -> Table {
    let mut t = Table::default();
    t.begin_start(name, R(r), true).unwrap();
    t.started(name, &R(r), filter(generation)).unwrap();
    t
}

/// `name` of `t` parked (looked at until due, then parked as `Kept(k)`).
fn park(t: &mut Table, name: &str, k: u32) {
    let (generation, handle) = match t.get(name) {
        Some(State::Live { filter, handle }) => (filter.generation, handle.clone()),
        other => panic!("not live: {other:?}"),
    };
    for _ in 0..3 {
        t.idle(3, |_, _| true);
    }
    assert!(t.park(name, generation, &handle, || Some(Kept(k))));
    assert_eq!(t.kind(name), Kind::Parked);
}

fn refused(r: Result<impl std::fmt::Debug, Refused>, state: Kind) {
    match r {
        Err(e) => assert_eq!(e.state, state, "{e}"),
        Ok(v) => panic!("not refused: {v:?}"),
    }
}

#[test]
fn a_start_is_routed_to_before_it_is_hosted_then_hosted() {
    let mut t = Table::default();
    t.begin_start("f", R(1), true).unwrap();
    assert_eq!(t.find("f"), Found::Starting(&R(1), true));
    assert!(t.hosted("f").is_none() && t.hosted_len() == 0);
    assert_eq!(t.routed_handles(), vec![R(1)]);
    t.started("f", &R(1), filter(3)).unwrap();
    assert_eq!(t.find("f"), Found::Live(&R(1)));
    assert_eq!(t.hosted("f").unwrap().generation, 3);
    assert_eq!(t.hosted_len(), 1);
    assert_eq!(t.routed_handles(), vec![R(1)]);
}

#[test]
fn a_start_of_a_name_that_has_a_replica_is_refused() {
    let mut t = live("f", 1, 1);
    refused(t.begin_start("f", R(2), true), Kind::Live);
    assert_eq!(t.find("f"), Found::Live(&R(1)));
    t.begin_start("g", R(3), false).unwrap();
    refused(t.begin_start("g", R(4), false), Kind::Starting);
    park(&mut t, "f", 1);
    refused(t.begin_start("f", R(5), true), Kind::Parked);
    let mut t = live("h", 1, 1);
    t.stop_all(|_, _| true);
    refused(t.begin_start("h", R(2), true), Kind::Stopping);
}

#[test]
fn only_the_replica_that_starts_is_hosted() {
    let mut t = Table::default();
    refused(t.started("f", &R(1), filter(1)), Kind::Absent);
    t.begin_start("f", R(1), true).unwrap();
    refused(t.started("f", &R(2), filter(1)), Kind::Starting);
    t.started("f", &R(1), filter(1)).unwrap();
    refused(t.started("f", &R(1), filter(1)), Kind::Live);
    assert_eq!(t.hosted_len(), 1);
}

#[test]
fn a_failed_start_leaves_the_name_as_before_it() {
    let mut t = Table::default();
    t.begin_start("f", R(1), true).unwrap();
    t.start_failed("f").unwrap();
    assert_eq!(t.kind("f"), Kind::Absent);
    refused(t.start_failed("f"), Kind::Absent);
    // Behind a dropped replica that still refuses: that one refuses again.
    let mut t = live("f", 1, 1);
    t.drop_filter("f", None, |_| true).unwrap();
    t.begin_start("f", R(2), true).unwrap();
    assert_eq!(t.find("f"), Found::Starting(&R(2), true));
    t.start_failed("f").unwrap();
    assert_eq!(t.find("f"), Found::Dropping(&R(1)));
    let mut t = live("f", 1, 1);
    refused(t.start_failed("f"), Kind::Live);
    assert_eq!(t.kind("f"), Kind::Live);
}

#[test]
fn a_drop_of_a_live_filter_lingers_if_it_refuses_and_leaves_if_not() {
    let mut t = live("f", 1, 4);
    let dropped = t.drop_filter("f", None, |f| f.generation == 4).unwrap();
    assert_eq!(
        dropped,
        Dropped {
            generation: 4,
            running: Some(R(1)),
            was_parked: false,
            lingers: true
        }
    );
    assert_eq!(t.find("f"), Found::Dropping(&R(1)));
    assert_eq!(t.hosted_len(), 0);
    assert!(t.hosted("f").is_none());
    assert!(t.routed_handles().is_empty());
    // Another replica's linger is not this one's.
    assert!(!t.linger_over("f", &R(2)));
    assert!(t.linger_over("f", &R(1)));
    assert_eq!(t.kind("f"), Kind::Absent);

    let mut t = live("f", 1, 4);
    let dropped = t.drop_filter("f", Some(4), |_| false).unwrap();
    assert!(!dropped.lingers && dropped.running == Some(R(1)));
    assert_eq!(t.kind("f"), Kind::Absent);
}

#[test]
fn a_drop_of_a_parked_filter_has_nothing_to_stop() {
    let mut t = live("f", 1, 2);
    park(&mut t, "f", 9);
    let dropped = t.drop_filter("f", None, |_| true).unwrap();
    assert_eq!(
        dropped,
        Dropped {
            generation: 2,
            running: None,
            was_parked: true,
            lingers: false
        }
    );
    assert_eq!(t.kind("f"), Kind::Absent);
    assert_eq!(t.hosted_len(), 0);
}

#[test]
fn drops_refused_newer_generation_starting_dropping_stopping_absent() {
    let mut t = live("f", 1, 5);
    refused(t.drop_filter("f", Some(4), |_| true), Kind::Live);
    assert_eq!(t.kind("f"), Kind::Live);
    assert_eq!(t.hosted_len(), 1);
    t.begin_start("s", R(2), true).unwrap();
    refused(t.drop_filter("s", None, |_| true), Kind::Starting);
    t.drop_filter("f", None, |_| true).unwrap();
    refused(t.drop_filter("f", None, |_| true), Kind::Dropping);
    refused(t.drop_filter("nothing", None, |_| true), Kind::Absent);
    let mut t = live("f", 1, 1);
    t.stop_all(|_, _| false);
    refused(t.drop_filter("f", None, |_| true), Kind::Stopping);
}

#[test]
fn a_new_incarnation_goes_first_and_its_start_forgets_the_linger_of_the_old() {
    let mut t = live("f", 1, 1);
    t.drop_filter("f", None, |_| true).unwrap();
    t.begin_start("f", R(2), true).unwrap();
    // The old replica's linger ends while the new one starts.
    assert!(t.linger_over("f", &R(1)));
    assert_eq!(t.find("f"), Found::Starting(&R(2), true));
    t.start_failed("f").unwrap();
    assert_eq!(t.kind("f"), Kind::Absent);
    // The old one's linger over after the new one is hosted: nothing to do.
    let mut t = live("f", 1, 1);
    t.drop_filter("f", None, |_| true).unwrap();
    t.begin_start("f", R(2), true).unwrap();
    t.started("f", &R(2), filter(2)).unwrap();
    assert!(!t.linger_over("f", &R(1)));
    assert_eq!(t.find("f"), Found::Live(&R(2)));
}

#[test]
fn stopping_the_node_stops_the_live_lets_parked_go_and_keeps_the_rest() {
    let mut t = live("live", 1, 1);
    t.begin_start("other", R(2), true).unwrap();
    t.started("other", &R(2), filter(1)).unwrap();
    t.begin_start("parked", R(3), true).unwrap();
    t.started("parked", &R(3), filter(1)).unwrap();
    park(&mut t, "parked", 3);
    t.begin_start("starting", R(4), true).unwrap();
    t.begin_start("dropped", R(5), true).unwrap();
    t.started("dropped", &R(5), filter(1)).unwrap();
    t.drop_filter("dropped", None, |_| true).unwrap();
    let mut stopped = t.stop_all(|name, _| name == "live");
    stopped.running.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        stopped,
        Stopped {
            running: vec![("live".into(), R(1)), ("other".into(), R(2))],
            parked: 1,
        }
    );
    assert_eq!(t.hosted_len(), 0);
    assert_eq!(t.find("live"), Found::Stopping(&R(1), true));
    assert_eq!(t.find("other"), Found::Stopping(&R(2), false));
    assert_eq!(t.kind("parked"), Kind::Absent);
    assert_eq!(t.find("starting"), Found::Starting(&R(4), true));
    assert_eq!(t.find("dropped"), Found::Dropping(&R(5)));
    // Stopped routing: only the starting one is left.
    t.routing_stopped();
    assert_eq!(t.kind("live"), Kind::Absent);
    assert_eq!(t.kind("other"), Kind::Absent);
    assert_eq!(t.kind("dropped"), Kind::Absent);
    assert_eq!(t.kind("starting"), Kind::Starting);
}

#[test]
fn a_parked_filter_resumes_or_stays_parked_if_it_cannot() {
    let mut t = live("f", 1, 3);
    park(&mut t, "f", 7);
    assert_eq!(t.find("f"), Found::Parked);
    assert_eq!(t.use_hosted("f", false), Some(None));
    assert_eq!(t.hosted_len(), 1);
    // Not allowed now (the node has no id to resume it under): left parked.
    assert!(matches!(t.begin_resume("f", false), Resume::Kept));
    assert_eq!(t.kind("f"), Kind::Parked);
    let Resume::Take {
        parked,
        generation: 3,
        ..
    } = t.begin_resume("f", true)
    else {
        panic!("not taken")
    };
    assert_eq!(*parked, Kept(7));
    assert_eq!(t.kind("f"), Kind::Resuming);
    assert_eq!(t.find("f"), Found::Parked);
    // A second resume meanwhile (only possible under the same lock) takes nothing.
    assert!(matches!(t.begin_resume("f", true), Resume::Kept));
    // It could not resume: parked again, with its state.
    t.resumed("f", Err(parked)).unwrap();
    let Resume::Take { parked, .. } = t.begin_resume("f", true) else {
        panic!("not parked again")
    };
    assert_eq!(*parked, Kept(7));
    t.resumed("f", Ok(R(2))).unwrap();
    assert_eq!(t.find("f"), Found::Live(&R(2)));
    assert_eq!(t.hosted_len(), 1);
    assert!(matches!(t.begin_resume("f", true), Resume::Live(R(2))));
}

#[test]
fn resumes_refused_while_starting_dropping_stopping_or_not_resuming() {
    let mut t = live("f", 1, 1);
    refused(t.resumed("f", Ok(R(2))), Kind::Live);
    t.drop_filter("f", None, |_| true).unwrap();
    assert!(matches!(t.begin_resume("f", true), Resume::NotHosted));
    refused(t.resumed("f", Ok(R(2))), Kind::Dropping);
    assert_eq!(t.find("f"), Found::Dropping(&R(1)));
    t.begin_start("s", R(3), true).unwrap();
    assert!(matches!(t.begin_resume("s", true), Resume::NotHosted));
    let mut t = live("f", 1, 1);
    t.stop_all(|_, _| true);
    assert!(matches!(t.begin_resume("f", true), Resume::NotHosted));
    assert!(matches!(t.begin_resume("absent", true), Resume::NotHosted));
    refused(t.resumed("absent", Ok(R(1))), Kind::Absent);
}

#[test]
fn only_a_replica_untouched_for_its_looks_is_asked_to_park() {
    let t = live("f", 1, 1);
    // Touched when it started.
    assert!(t.idle(2, |_, _| true).is_empty());
    assert!(t.idle(2, |_, _| true).is_empty());
    assert_eq!(t.idle(2, |_, _| true), vec![("f".into(), 1, R(1))]);
    // Asked once per `looks` looks, not at every one.
    assert!(t.idle(2, |_, _| true).is_empty());
    assert_eq!(t.idle(2, |_, _| true).len(), 1);
    // A use starts the count again; a lookup that does not use it does not.
    assert_eq!(t.use_hosted("f", false), Some(Some(&R(1))));
    assert!(t.idle(2, |_, _| true).is_empty());
    assert_eq!(t.iter_hosted().filter_map(|(.., h)| h).count(), 1);
    assert!(t.idle(2, |_, _| true).is_empty());
    assert_eq!(t.idle(2, |_, _| true).len(), 1);
    // Never one the caller does not allow, or a pinned one.
    assert!((0..4).all(|_| t.idle(2, |_, _| false).is_empty()));
    t.hosted("f").unwrap().pin();
    assert!((0..4).all(|_| t.idle(2, |_, _| true).is_empty()));
}

#[test]
fn a_park_is_refused_if_used_pinned_replaced_or_not_live() {
    let mut t = live("f", 1, 1);
    let mut closed = false;
    // Touched since it was asked (it started a moment ago).
    assert!(!t.park("f", 1, &R(1), || {
        closed = true;
        Some(Kept(1))
    }));
    assert!(!closed, "its state is taken only if it parks");
    t.idle(1, |_, _| true);
    assert!(
        !t.park("f", 2, &R(1), || Some(Kept(1))),
        "another generation"
    );
    assert!(!t.park("f", 1, &R(2), || Some(Kept(1))), "another replica");
    t.hosted("f").unwrap().pin();
    assert!(!t.park("f", 1, &R(1), || Some(Kept(1))), "pinned");
    let mut t = live("f", 1, 1);
    t.idle(1, |_, _| true);
    // The replica itself may still refuse (a message came in): it stays live.
    assert!(!t.park("f", 1, &R(1), || None));
    assert_eq!(t.kind("f"), Kind::Live);
    assert!(t.park("f", 1, &R(1), || Some(Kept(1))));
    assert!(!t.park("f", 1, &R(1), || Some(Kept(2))), "parked already");
    t.begin_start("s", R(2), true).unwrap();
    assert!(!t.park("s", 0, &R(2), || Some(Kept(1))), "starting");
    assert!(!t.park("absent", 0, &R(2), || Some(Kept(1))));
}

#[test]
fn an_expiry_changes_only_the_generation_hosted() {
    let mut t = live("f", 1, 3);
    assert!(!t.set_expiry("f", 2, Some(10)));
    assert!(t.set_expiry("f", 3, Some(10)));
    assert!(!t.set_expiry("f", 3, Some(10)), "unchanged");
    assert_eq!(t.hosted("f").unwrap().expires_ms, Some(10));
    park(&mut t, "f", 1);
    assert!(t.set_expiry("f", 3, None));
    assert_eq!(t.hosted("f").unwrap().entry("f").expires_ms, None);
    t.begin_start("s", R(2), true).unwrap();
    assert!(!t.set_expiry("s", 0, Some(1)));
}

#[test]
fn hosted_filters_are_listed_with_their_running_replica() {
    let mut t = live("a", 1, 1);
    t.begin_start("b", R(2), true).unwrap();
    t.started("b", &R(2), filter(1)).unwrap();
    park(&mut t, "b", 2);
    t.begin_start("c", R(3), true).unwrap();
    let mut listed: Vec<_> = t
        .iter_hosted()
        .map(|(n, f, h)| (n.clone(), f.generation, h.cloned()))
        .collect();
    listed.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        listed,
        vec![("a".into(), 1, Some(R(1))), ("b".into(), 1, None)]
    );
    assert_eq!(t.hosted_len(), 2);
}

#[test]
fn a_quiet_lookup_leaves_a_live_replica_unused_and_shows_a_parked_ones_state() {
    let mut t = live("f", 1, 4);
    t.idle(1, |_, _| true);
    assert_eq!(t.find_quietly("f"), Quiet::Found(Found::Live(&R(1))));
    // Not noted as used: still due at the next look.
    assert_eq!(t.idle(1, |_, _| true).len(), 1);
    park(&mut t, "f", 3);
    assert_eq!(t.find_quietly("f"), Quiet::Parked(&Kept(3), 4));
    assert_eq!(
        t.iter_parked().collect::<Vec<_>>(),
        vec![(&"f".to_string(), 4, &Kept(3))]
    );
    assert_eq!(t.find_quietly("absent"), Quiet::Found(Found::Absent));
    t.begin_start("s", R(2), false).unwrap();
    assert_eq!(
        t.find_quietly("s"),
        Quiet::Found(Found::Starting(&R(2), false))
    );
}

#[test]
fn a_restored_filter_is_hosted_parked_and_resumes_as_any_parked_one() {
    let mut t = Table::default();
    t.host_parked("f", filter(4), Box::new(Kept(9))).unwrap();
    assert_eq!(t.kind("f"), Kind::Parked);
    assert_eq!(t.hosted_len(), 1);
    assert_eq!(t.hosted("f").map(|f| f.generation), Some(4));
    assert_eq!(t.iter_parked().count(), 1);
    // A name in the table in any state is refused, and left as it was.
    refused(
        t.host_parked("f", filter(5), Box::new(Kept(1))),
        Kind::Parked,
    );
    let mut starting = Table::default();
    starting.begin_start("g", R(1), true).unwrap();
    refused(
        starting.host_parked("g", filter(1), Box::new(Kept(1))),
        Kind::Starting,
    );
    assert_eq!(starting.hosted_len(), 0);
    let Resume::Take {
        parked,
        generation: 4,
        ..
    } = t.begin_resume("f", true)
    else {
        panic!("not taken")
    };
    assert_eq!(*parked, Kept(9));
    t.resumed("f", Ok(R(3))).unwrap();
    assert_eq!(t.find("f"), Found::Live(&R(3)));
    assert_eq!(t.hosted_len(), 1);
}
