//! Filters as data (issue 23) on the in-process bus: nodes that follow one filter catalog
//! create, drop and re-create filters at run time, refuse what their limits forbid, keep a
//! dropped incarnation's traffic out of a new one, and catch up with the catalog at start.
//! (Over a real nats-server and `crpf node` processes: tests/catalog_nats.rs.)
#![cfg(feature = "node")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use crpf::node::{HostError, Node, NodeConfig};
use crpf::transport::catalog::CatalogWatch;
use crpf::transport::{Bus, Catalog, CatalogEntry, CatalogError, InProcessBus, Message};
use crpf::{FilterKind, FilterSpec};
use futures::StreamExt;
use futures::future::BoxFuture;

/// A node config following the catalog with fast replica timers (and `extra` TOML).
fn config(extra: &str) -> NodeConfig {
    NodeConfig::from_toml_str(&format!(
        "[catalog]\n{extra}\n[catalog.defaults]\ndelta_interval_ms = 10\n\
         anti_entropy_interval_ms = 300\nmin_push_interval_ms = 100\ncatch_up_timeout_ms = 300\n\
         snapshot_interval_ms = 500\nmetrics_interval_ms = 200\n"
    ))
    .unwrap()
}

async fn node(bus: &InProcessBus, cfg: NodeConfig) -> Node {
    Node::start(cfg, Arc::new(bus.clone()), Some(Arc::new(bus.catalog())))
        .await
        .unwrap()
}

fn bloom(capacity: u64) -> FilterSpec {
    FilterSpec::new(FilterKind::GBloom, capacity, 0.01)
}

/// A request over the bus, its JSON reply (an error if none came within `timeout_ms`).
fn ask(
    bus: &InProcessBus,
    subject: String,
    payload: &'static [u8],
    timeout_ms: u64,
) -> impl std::future::Future<Output = Result<serde_json::Value, crpf::transport::TransportError>> + use<>
{
    let bus = bus.clone();
    async move {
        let reply = bus
            .request(subject, payload.into(), Duration::from_millis(timeout_ms))
            .await?;
        Ok(serde_json::from_slice(&reply).unwrap())
    }
}

/// Polls `cond` every 5 ms; `false` after `timeout`.
async fn eventually(timeout: Duration, cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !cond() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

#[actix::test]
async fn a_filter_created_on_one_node_serves_on_the_other_and_a_drop_stops_both() {
    let bus = InProcessBus::new();
    let (a, b) = (node(&bus, config("")).await, node(&bus, config("")).await);
    let created = a.create_filter("tenant-1", bloom(1_000)).await.unwrap();
    assert!(created.new);
    // Idempotent with the same spec.
    let again = b.create_filter("tenant-1", bloom(1_000)).await.unwrap();
    assert!(!again.new);
    assert_eq!(again.entry.generation, created.entry.generation);
    assert!(eventually(Duration::from_secs(5), || b.filter("tenant-1").is_some()).await);
    a.filter("tenant-1")
        .unwrap()
        .add(b"alice".to_vec())
        .await
        .unwrap();
    let on_b = b.filter("tenant-1").unwrap();
    assert!(
        on_b.wait_until(Duration::from_secs(5), |f| f.contains(b"alice"))
            .await
    );
    assert_eq!(a.filters().len(), 1);
    assert_eq!(a.catalog_entries().await.unwrap().len(), 1);

    let dropped = b.drop_filter("tenant-1").await.unwrap().unwrap();
    assert_eq!(dropped.generation, created.entry.generation);
    assert!(b.filter("tenant-1").is_none());
    assert!(eventually(Duration::from_secs(5), || a.filter("tenant-1").is_none()).await);
    assert_eq!(b.drop_filter("tenant-1").await.unwrap(), None);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[actix::test]
async fn concurrent_creates_with_different_specs_have_one_winner_everywhere() {
    let bus = InProcessBus::new();
    let (a, b) = (node(&bus, config("")).await, node(&bus, config("")).await);
    for round in 0..10 {
        let name = format!("race-{round}");
        let (ra, rb) = futures::join!(
            a.create_filter(&name, bloom(1_000)),
            b.create_filter(&name, bloom(2_000))
        );
        let (winner, loser) = match (ra, rb) {
            (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w, l),
            other => panic!("round {round}: exactly one create must win: {other:?}"),
        };
        match &loser {
            HostError::Catalog(CatalogError::Exists { existing, .. }) => {
                assert_eq!(existing, &winner.entry.spec)
            }
            other => panic!("round {round}: the loser must be told the existing spec: {other}"),
        }
        assert!(
            loser.to_string().contains("exists with another spec"),
            "{loser}"
        );
        for n in [&a, &b] {
            assert!(eventually(Duration::from_secs(5), || n.filter(&name).is_some()).await);
            let spec = n
                .filters()
                .into_iter()
                .find(|f| f.name == name)
                .unwrap()
                .spec;
            assert_eq!(spec, winner.entry.spec);
        }
    }
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[actix::test]
async fn a_re_created_filter_takes_nothing_of_its_old_incarnation() {
    let bus = InProcessBus::new();
    let a = node(&bus, config("")).await;
    // Everything the first incarnation's replicas publish, to replay later.
    let mut recorded = bus.subscribe("crpf.reused.>".into(), None).await.unwrap();
    let old = a.create_filter("reused", bloom(1_000)).await.unwrap();
    let first = a.filter("reused").unwrap();
    for i in 0..200 {
        first.add(format!("old-{i}").into_bytes()).await.unwrap();
    }
    first.flush().await.unwrap();
    a.drop_filter("reused").await.unwrap();
    let mut frames: Vec<Message> = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(200), recorded.next()).await
    {
        frames.push(m);
    }
    assert!(!frames.is_empty(), "the old incarnation published nothing");

    let new = a.create_filter("reused", bloom(1_000)).await.unwrap();
    assert!(new.entry.generation > old.entry.generation);
    let second = a.filter("reused").unwrap();
    assert!(!second.contains(b"old-0"));
    // The old incarnation's deltas and states, replayed onto the new one's subjects.
    for m in &frames {
        bus.publish(m.subject.clone(), m.payload.clone())
            .await
            .unwrap();
    }
    let rejected = async {
        loop {
            let stats = second.stats().await.unwrap();
            if stats.rejects.get("generation").copied().unwrap_or(0) >= frames.len() as u64 {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let stats = tokio::time::timeout(Duration::from_secs(5), rejected)
        .await
        .expect("every replayed frame is refused as another generation's");
    assert_eq!(stats.figures.cardinality.round(), 0.0);
    assert!((0..200).all(|i| !second.contains(format!("old-{i}").as_bytes())));
    a.shutdown().await.unwrap();
}

#[actix::test]
async fn limits_are_refused_with_clear_errors_and_nothing_created() {
    let bus = InProcessBus::new();
    let cfg = config("max_filters = 2\nmax_filter_bytes = 100000");
    let mut cfg = cfg;
    cfg.filters = NodeConfig::from_toml_str(
        "[[filters]]\nname = \"fixed\"\nfilter = { kind = \"g_bloom\", capacity = 100, fpr = 0.01 }\n",
    )
    .unwrap()
    .filters;
    let a = node(&bus, cfg).await;
    fn refused<T: std::fmt::Debug>(r: Result<T, HostError>) -> HostError {
        r.unwrap_err()
    }
    for bad in ["", "a.b", "a b", "_hidden", &"x".repeat(65), "$catalog"] {
        let e = refused(a.create_filter(bad, bloom(100)).await);
        assert!(matches!(e, HostError::InvalidName(_)), "{bad:?}: {e}");
    }
    let e = refused(a.create_filter("fixed", bloom(100)).await);
    assert!(e.to_string().contains("configuration file"), "{e}");
    let e = refused(a.drop_filter("fixed").await);
    assert!(matches!(e, HostError::Configured(_)), "{e}");
    // 10M elements at 1% is 12 MB, over the 100 kB limit; a bad fpr is refused as such.
    let e = refused(a.create_filter("huge", bloom(10_000_000)).await);
    assert!(
        matches!(e, HostError::TooLarge { max: 100_000, .. })
            && e.to_string().contains("max_filter_bytes"),
        "{e}"
    );
    let e = refused(
        a.create_filter("bad-fpr", FilterSpec::new(FilterKind::GBloom, 100, 1.5))
            .await,
    );
    assert!(matches!(e, HostError::InvalidSpec(_)), "{e}");
    a.create_filter("one", bloom(100)).await.unwrap();
    a.create_filter("two", bloom(100)).await.unwrap();
    let e = refused(a.create_filter("three", bloom(100)).await);
    assert!(
        matches!(e, HostError::TooManyFilters { hosted: 2 })
            && e.to_string().contains("max_filters"),
        "{e}"
    );
    // An existing one is not refused by the count.
    a.create_filter("two", bloom(100)).await.unwrap();
    let names: Vec<String> = a.filters().into_iter().map(|f| f.name).collect();
    assert_eq!(names, ["fixed", "one", "two"]);
    assert_eq!(a.catalog_entries().await.unwrap().len(), 2);
    a.shutdown().await.unwrap();
}

#[actix::test]
async fn a_restarted_node_keeps_its_filters_and_catches_up_with_drops_and_creates() {
    let bus = InProcessBus::new();
    let data = tempfile::tempdir().unwrap();
    let with_data = || {
        let mut c = config("");
        c.node.data_dir = Some(data.path().to_path_buf());
        c
    };
    let a = node(&bus, with_data()).await;
    let kept = a.create_filter("kept", bloom(1_000)).await.unwrap();
    let gone = a.create_filter("gone", bloom(1_000)).await.unwrap();
    a.filter("kept")
        .unwrap()
        .add(b"durable".to_vec())
        .await
        .unwrap();
    let gone_dir = data.path().join(format!("gone.g{}", gone.entry.generation));
    assert!(gone_dir.is_dir());
    a.shutdown().await.unwrap();

    // Unchanged catalog: the filter comes back with its state, from its data directory.
    let a = node(&bus, with_data()).await;
    assert!(a.filter("kept").unwrap().contains(b"durable"));
    a.shutdown().await.unwrap();

    // Changed while the node was down (another node is up meanwhile).
    let other = node(&bus, config("")).await;
    other.drop_filter("gone").await.unwrap();
    other.create_filter("new", bloom(1_000)).await.unwrap();
    other.shutdown().await.unwrap();
    let a = node(&bus, with_data()).await;
    assert!(a.filter("gone").is_none());
    assert!(!gone_dir.exists(), "a dropped filter's data stays behind");
    assert!(a.filter("new").is_some());
    let still = a.filter("kept").unwrap();
    assert!(still.contains(b"durable"));
    assert_eq!(
        a.filters()
            .iter()
            .find(|f| f.name == "kept")
            .unwrap()
            .generation,
        kept.entry.generation
    );
    a.shutdown().await.unwrap();
}

#[actix::test]
async fn a_thousand_filters_come_and_go() {
    let bus = InProcessBus::new();
    // Default timers: a thousand replicas with the fast ones of the other tests keep this
    // test's one thread busy.
    let a = node(&bus, NodeConfig::from_toml_str("[catalog]\n").unwrap()).await;
    let started = Instant::now();
    for i in 0..1_000 {
        a.create_filter(&format!("t{i}"), bloom(100)).await.unwrap();
    }
    eprintln!(
        "1,000 filters created in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(a.len(), 1_000);
    a.filter("t999").unwrap().add(b"x".to_vec()).await.unwrap();
    for i in 0..1_000 {
        a.drop_filter(&format!("t{i}")).await.unwrap().unwrap();
    }
    assert!(a.is_empty());
    a.shutdown().await.unwrap();
}

#[actix::test]
async fn catalog_filters_issue_tags_under_one_node_id_and_never_twice_after_a_restart() {
    use crpf::transport::IdRegistry;
    let bus = InProcessBus::new();
    let data = tempfile::tempdir().unwrap();
    let with_data = || {
        let mut c = config("");
        c.node.data_dir = Some(data.path().to_path_buf());
        c
    };
    let or = FilterSpec::new(FilterKind::OrCuckoo, 1_000, 0.01);
    let a = node(&bus, with_data()).await;
    let kept = a.create_filter("kept", or.clone()).await.unwrap();
    let lost = a.create_filter("lost", or.clone()).await.unwrap();
    let counts = FilterSpec::new(FilterKind::CountingCuckoo, 1_000, 0.01);
    let counted = a.create_filter("counts", counts).await.unwrap();
    let (k, l) = (a.filter("kept").unwrap(), a.filter("lost").unwrap());
    // One id for both, claimed once, in the node namespace.
    assert_eq!(k.identity(), l.identity());
    let node_ids = bus
        .replica_claims(crpf::replica::SharedId::NAMESPACE.into())
        .await
        .unwrap();
    assert_eq!(node_ids.len(), 1);
    for (name, generation) in [
        ("kept", kept.entry.generation),
        ("lost", lost.entry.generation),
    ] {
        let own = bus.replica_claims(format!("{name}.g{generation}")).await;
        assert!(own.unwrap().is_empty(), "{name} claimed an id of its own");
    }
    // A kind whose ids serve one run only claims its own.
    let c = a.filter("counts").unwrap();
    assert_ne!(c.identity().uuid, k.identity().uuid);
    let own = bus
        .replica_claims(format!("counts.g{}", counted.entry.generation))
        .await
        .unwrap();
    assert_eq!(own.len(), 1);

    let node_id = k.identity().replica;
    let before = k.add(b"x".to_vec()).await.unwrap().unwrap();
    let lost_before = l.add(b"y".to_vec()).await.unwrap().unwrap();
    assert_eq!(before.replica, node_id);
    a.shutdown().await.unwrap();
    // One filter's data is lost: it starts empty under the same id.
    std::fs::remove_dir_all(data.path().join(format!("lost.g{}", lost.entry.generation))).unwrap();

    let a = node(&bus, with_data()).await;
    let (k, l) = (a.filter("kept").unwrap(), a.filter("lost").unwrap());
    assert_eq!(k.identity().replica, node_id, "the node took its id back");
    assert!(k.contains(b"x") && !l.contains(b"y"));
    // Every tag of the restarted node is above every tag issued before, in every filter:
    // the emptied one does not issue its old tags again.
    let after = k.add(b"z".to_vec()).await.unwrap().unwrap();
    let lost_after = l.add(b"y".to_vec()).await.unwrap().unwrap();
    assert_eq!(after.replica, node_id);
    assert!(after.counter > before.counter);
    assert!(lost_after.counter > lost_before.counter);
    assert!(k.remove(b"x".to_vec()).await.unwrap() && !k.contains(b"x"));
    let ids = bus
        .replica_claims(crpf::replica::SharedId::NAMESPACE.into())
        .await
        .unwrap();
    assert_eq!(ids.len(), 1, "a restart claimed a second node id");
    a.shutdown().await.unwrap();
}

/// A catalog filter's own API subjects (`crpf.<filter>.replica.<id>.api.<op>`) answer through
/// the node's subscriptions when it replicates under the node's id, through its own when it
/// keeps an id of its own; a dropped filter's refuse for a moment, then nothing answers. The
/// subject without an operation (`crpf.<filter>.api`) is the node's too.
#[actix::test]
async fn own_api_subjects_of_catalog_filters_answer_through_the_node_until_dropped() {
    let bus = InProcessBus::new();
    let a = node(&bus, config("")).await;
    a.create_filter("shared", bloom(1_000)).await.unwrap();
    let counts = FilterSpec::new(FilterKind::CountingCuckoo, 1_000, 0.01);
    a.create_filter("counts", counts).await.unwrap();
    let ask = |subject: String, payload: &'static [u8]| ask(&bus, subject, payload, 300);
    for name in ["shared", "counts"] {
        let h = a.filter(name).unwrap();
        h.add(b"x".to_vec()).await.unwrap();
        let id = h.identity().replica;
        let stats = ask(format!("crpf.{name}.replica.{id}.api.stats"), b"")
            .await
            .unwrap();
        assert_eq!(stats["filter"], name, "{stats}");
        assert_eq!(stats["replica"], id, "{stats}");
        let found = ask(format!("crpf.{name}.replica.{id}.api.contains"), b"x")
            .await
            .unwrap();
        assert_eq!(found["contains"], true, "{name}: {found}");
        // Without an operation: an error reply, on the filter's subject (routed by the node)
        // as on its own.
        for subject in [
            format!("crpf.{name}.api"),
            format!("crpf.{name}.replica.{id}.api"),
        ] {
            let bare = ask(subject, b"").await.unwrap();
            assert!(
                bare["error"].as_str().unwrap().contains("no operation"),
                "{bare}"
            );
        }
        // Another id of the same filter is nobody here.
        let other = ask(format!("crpf.{name}.replica.{}.api.stats", id + 1), b"").await;
        assert!(other.is_err(), "{other:?}");
    }
    // A filter the node does not host: its subscription hears it, and stays silent.
    let node_id = a.filter("shared").unwrap().identity().replica;
    let unknown = ask(format!("crpf.nobody.replica.{node_id}.api.stats"), b"").await;
    assert!(unknown.is_err(), "{unknown:?}");
    let unknown = ask("crpf.nobody.api".into(), b"").await;
    assert!(unknown.is_err(), "{unknown:?}");

    a.drop_filter("shared").await.unwrap().unwrap();
    // Refused as stopped while the drop is fresh, never answered as if it were there.
    let subject = format!("crpf.shared.replica.{node_id}.api.contains");
    if let Ok(late) = ask(subject.clone(), b"x").await {
        assert!(late["error"].as_str().unwrap().contains("stop"), "{late}");
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(ask(subject, b"x").await.is_err(), "answered after the drop");
    a.shutdown().await.unwrap();
}

/// A catalog whose watch holds its changes back while `paused`: a node told of creates
/// late, as one whose watcher lags behind a burst.
#[derive(Clone)]
struct LaggingCatalog {
    inner: Arc<dyn Catalog>,
    paused: Arc<std::sync::atomic::AtomicBool>,
}

impl Catalog for LaggingCatalog {
    fn create(
        &self,
        name: String,
        spec: FilterSpec,
    ) -> BoxFuture<'static, Result<crpf::transport::Created, CatalogError>> {
        self.inner.create(name, spec)
    }

    fn drop_filter(
        &self,
        name: String,
    ) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>> {
        self.inner.drop_filter(name)
    }

    fn get(&self, name: String) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>> {
        self.inner.get(name)
    }

    fn listing(&self) -> BoxFuture<'static, Result<crpf::transport::Listing, CatalogError>> {
        self.inner.listing()
    }

    fn reoffer(
        &self,
        entry: CatalogEntry,
    ) -> BoxFuture<'static, Result<crpf::transport::Reoffered, CatalogError>> {
        self.inner.reoffer(entry)
    }

    fn sealed_with(&self, keys: Option<crpf::wire::AuthKeys>) -> Arc<dyn Catalog> {
        Arc::new(LaggingCatalog {
            inner: self.inner.sealed_with(keys),
            paused: self.paused.clone(),
        })
    }

    fn watch(&self) -> BoxFuture<'static, Result<CatalogWatch, CatalogError>> {
        let (inner, paused) = (self.inner.clone(), self.paused.clone());
        Box::pin(async move {
            let changes = inner.watch().await?.then(move |change| {
                let paused = paused.clone();
                async move {
                    while paused.load(std::sync::atomic::Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    change
                }
            });
            Ok(changes.boxed())
        })
    }
}

/// A request on a catalog filter's own API subject of a node whose watcher has not told it
/// of the filter yet (created a moment ago on another node) is answered once the replica
/// serves: the node asks the catalog and holds it. It used to be left unanswered.
#[actix::test]
async fn an_own_api_request_ahead_of_the_watcher_is_held_until_the_replica_serves() {
    let bus = InProcessBus::new();
    let a = node(&bus, config("")).await;
    let paused = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let lagging = LaggingCatalog {
        inner: Arc::new(bus.catalog()),
        paused: paused.clone(),
    };
    let b = Node::start(config(""), Arc::new(bus.clone()), Some(Arc::new(lagging)))
        .await
        .unwrap();
    a.create_filter("warm", bloom(1_000)).await.unwrap();
    assert!(eventually(Duration::from_secs(10), || b.filter("warm").is_some()).await);
    let id = b.filter("warm").unwrap().identity().replica;

    paused.store(true, std::sync::atomic::Ordering::SeqCst);
    a.create_filter("fresh", bloom(1_000)).await.unwrap();
    let asked = tokio::spawn(ask(
        &bus,
        format!("crpf.fresh.replica.{id}.api.contains"),
        b"x",
        2_000,
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(b.filter("fresh").is_none(), "the watcher was not held back");
    paused.store(false, std::sync::atomic::Ordering::SeqCst);
    let answer = asked
        .await
        .unwrap()
        .expect("answered once the replica serves");
    assert_eq!(answer["contains"], false, "{answer}");
    // A name the catalog does not list stays unanswered there.
    let unknown = ask(
        &bus,
        format!("crpf.nobody.replica.{id}.api.contains"),
        b"x",
        300,
    )
    .await;
    assert!(unknown.is_err(), "{unknown:?}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A dropped filter's name is refused as unknown for a while after its drop, where a name
/// the node does not know is left unanswered (a responder outside the catalog may have it):
/// the node saw it dropped from the catalog. A request right after a drop, reaching a node
/// whose replica of the filter had not started, got nothing.
#[actix::test]
async fn a_dropped_name_is_refused_for_a_while_after_its_drop() {
    let bus = InProcessBus::new();
    // Grace: 8 anti-entropy intervals, 16 s here.
    let cfg = NodeConfig::from_toml_str(
        "[catalog]\n[catalog.defaults]\ndelta_interval_ms = 10\nanti_entropy_interval_ms = 2000\n",
    )
    .unwrap();
    let a = node(&bus, cfg).await;
    a.create_filter("gone", bloom(1_000)).await.unwrap();
    a.drop_filter("gone").await.unwrap().unwrap();
    // Past its replica's linger ("stopped"), still in the grace.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let refused = ask(&bus, "crpf.gone.api.contains".into(), b"x", 1_000)
        .await
        .expect("answered in the grace");
    let error = refused["error"].to_string();
    assert!(error.contains("no filter named `gone`"), "{error}");
    // A name never in the catalog is left unanswered.
    let never = ask(&bus, "crpf.never.api.contains".into(), b"x", 300).await;
    assert!(never.is_err(), "{never:?}");
    a.shutdown().await.unwrap();
}

/// The request API's operations of catalog filters come on one queue subscription of the
/// node (`api_queue = "node"`, the default) or on each replica's own (`"filter"`): both
/// answer, and neither answers a name the catalog does not list (issue 53: a responder
/// outside the catalog may serve it; the node's refusal came first).
#[actix::test]
async fn the_request_api_of_catalog_filters_answers_in_either_queue_mode() {
    for mode in ["node", "filter"] {
        let bus = InProcessBus::new();
        let a = node(&bus, config(&format!("api_queue = \"{mode}\""))).await;
        a.create_filter("t", bloom(1_000)).await.unwrap();
        let ask = |subject: &str, payload: &'static [u8]| ask(&bus, subject.into(), payload, 500);
        let added = ask("crpf.t.api.add", b"alice").await.unwrap();
        assert_eq!(added["added"], true, "{mode}: {added}");
        let found = ask("crpf.t.api.contains", b"alice").await.unwrap();
        assert_eq!(found["contains"], true, "{mode}: {found}");
        // Past what was the node's grace after its start (8 anti-entropy intervals), after
        // which it refused the name.
        tokio::time::sleep(Duration::from_millis(2_600)).await;
        let unknown = ask("crpf.nobody.api.add", b"x").await;
        assert!(unknown.is_err(), "{mode}: {unknown:?}");
        // Asked again at once, from what the catalog just said.
        let again = ask("crpf.nobody.api.add", b"x").await;
        assert!(again.is_err(), "{mode}: {again:?}");
        // Created now, it answers at once: the catalog's "no" is forgotten.
        a.create_filter("nobody", bloom(1_000)).await.unwrap();
        let added = ask("crpf.nobody.api.add", b"x").await.unwrap();
        assert_eq!(added["added"], true, "{mode}: {added}");
        a.shutdown().await.unwrap();
    }
}

/// A node's digests of its catalog filters go in batches (`<prefix>.$digests`, one message
/// for many filters), and those batches still repair: every delta of node `a` is lost, so
/// `b` learns `a`'s adds only by anti-entropy: `a`'s batched digests say up to which number
/// it published, `b` finds those numbers missing at the next one and asks for `a`'s state
/// (and `a` would push it anyway once `b`'s batched digests kept differing from its own).
#[actix::test]
async fn batched_digests_repair_what_lost_deltas_did_not_bring() {
    use crpf::transport::{FaultConfig, FaultyTransport};
    use crpf::wire::batch::decode_batch;
    let bus = InProcessBus::new();
    let mut batches = bus.subscribe("crpf.$digests".into(), None).await.unwrap();
    let lossy = FaultyTransport::new(
        Arc::new(bus.clone()),
        FaultConfig {
            drop_delta: 1.0,
            drop_state: 0.0,
            seed: 7,
        },
    );
    let a = Node::start(config(""), Arc::new(lossy), Some(Arc::new(bus.catalog())))
        .await
        .unwrap();
    let b = node(&bus, config("")).await;
    let names: Vec<_> = (0..20).map(|i| format!("t{i}")).collect();
    for name in &names {
        a.create_filter(name, bloom(1_000)).await.unwrap();
    }
    assert!(
        eventually(Duration::from_secs(10), || names
            .iter()
            .all(|n| b.filter(n).is_some()))
        .await
    );
    a.filter("t3")
        .unwrap()
        .add(b"alice".to_vec())
        .await
        .unwrap();
    let on_b = b.filter("t3").unwrap();
    assert!(
        on_b.wait_until(Duration::from_secs(20), |f| f.contains(b"alice"))
            .await,
        "anti-entropy never brought a's add"
    );
    // The loss was seen and counted (from what a's batched digests said it had sent).
    assert!(on_b.stats().await.unwrap().sequence_gaps > 0);
    // The digests of all 20 filters of both nodes went in batches of many.
    let mut seen = std::collections::HashMap::<String, usize>::new();
    let mut largest = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.len() < names.len() || seen.values().any(|&n| n < 2) {
        assert!(Instant::now() < deadline, "batches seen: {seen:?}");
        let msg = tokio::time::timeout(Duration::from_secs(5), batches.next())
            .await
            .expect("a digest batch")
            .unwrap();
        let items = decode_batch(&msg.payload).unwrap();
        largest = largest.max(items.len());
        for (name, _) in items {
            *seen.entry(name).or_default() += 1;
        }
    }
    assert!(largest >= 2, "batches of {largest} digest at most");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Whether `node` has parked the replica of `name`.
fn parked(node: &Node, name: &str) -> bool {
    node.filters().iter().any(|f| f.name == name && f.parked)
}

/// An idle filter alone on its node parks (its state kept, its actor gone); a query is
/// answered from the kept state without resuming it, the next update resumes it at once,
/// answered as if it had never parked, and it parks again once idle. Its
/// data directory holds everything through it: a restart finds every add, the filter
/// restored parked at once. A handle taken through `Node::filter` keeps its replica awake
/// from then on.
#[actix::test]
async fn an_idle_filter_parks_and_the_next_request_resumes_it_with_nothing_lost() {
    let bus = InProcessBus::new();
    let data = tempfile::tempdir().unwrap();
    let with_data = || {
        let mut c = config("park_after_ms = 200");
        c.node.data_dir = Some(data.path().to_path_buf());
        c
    };
    let a = node(&bus, with_data()).await;
    a.create_filter("idle", bloom(1_000)).await.unwrap();
    let ask = |op: &str, item: &'static [u8]| ask(&bus, format!("crpf.idle.api.{op}"), item, 2_000);
    ask("add", b"alice").await.unwrap();
    let wait = Duration::from_secs(10);
    assert!(
        eventually(wait, || parked(&a, "idle")).await,
        "never parked"
    );
    // Listed and counted as hosted meanwhile.
    assert_eq!(a.len(), 1);
    // A query is answered from the state it kept, and resumes nothing.
    let found = ask("contains", b"alice").await.unwrap();
    assert_eq!(found["contains"], true, "{found}");
    let found = ask("contains", b"bob").await.unwrap();
    assert_eq!(found["contains"], false, "{found}");
    assert!(parked(&a, "idle"), "a query resumed it");
    // An update resumes it, and it parks again.
    let added = ask("add", b"carol").await.unwrap();
    assert_eq!(added["added"], true, "{added}");
    assert!(!parked(&a, "idle"));
    assert!(eventually(wait, || parked(&a, "idle")).await);
    a.shutdown().await.unwrap();

    let a = node(&bus, with_data()).await;
    // Restored parked from its directory as the node started: no replica ran.
    assert!(parked(&a, "idle"), "not restored parked at the start");
    let handle = a.filter("idle").expect("resumed for the caller");
    assert!(handle.contains(b"alice") && handle.contains(b"carol"));
    handle.add(b"dave".to_vec()).await.unwrap();
    // Pinned: held by its caller, it stays awake.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(!parked(&a, "idle"), "a handed-out replica parked");
    a.shutdown().await.unwrap();
    let a = node(&bus, with_data()).await;
    assert!(a.filter("idle").unwrap().contains(b"dave"));
    a.shutdown().await.unwrap();
}

/// A parked replica wakes for the first message of a peer that appears (a node starting
/// later asks it for its state), which then catches up from it. Converged, both park (before,
/// a replica with a peer never did): their nodes announce their digests and answer each
/// other's. An add to one wakes the other, which takes it, and both park again.
#[actix::test]
async fn a_parked_filter_wakes_for_a_new_peer_and_replicas_with_peers_park_too() {
    let bus = InProcessBus::new();
    let a = node(&bus, config("park_after_ms = 200")).await;
    a.create_filter("shared", bloom(1_000)).await.unwrap();
    ask(&bus, "crpf.shared.api.add".into(), b"alice", 2_000)
        .await
        .unwrap();
    let wait = Duration::from_secs(10);
    assert!(
        eventually(wait, || parked(&a, "shared")).await,
        "never parked"
    );
    let b = node(&bus, config("park_after_ms = 200")).await;
    assert!(
        eventually(wait, || parked(&a, "shared") && parked(&b, "shared")).await,
        "replicas with a peer did not both park"
    );
    let on_b = b.filter("shared").expect("hosted");
    assert!(
        on_b.contains(b"alice"),
        "the new peer did not catch up from the parked replica"
    );
    on_b.add(b"bob".to_vec()).await.unwrap();
    let on_a = a.filter("shared").unwrap();
    assert!(
        on_a.wait_until(wait, |f| f.contains(b"bob")).await,
        "b's add never reached a's parked replica"
    );
    assert!(on_a.contains(b"alice"));
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// A parked filter dropped: nothing to stop, its data directory removed, its name refused.
#[actix::test]
async fn a_parked_filter_is_dropped_like_a_running_one() {
    let bus = InProcessBus::new();
    let data = tempfile::tempdir().unwrap();
    let mut cfg = config("park_after_ms = 200");
    cfg.node.data_dir = Some(data.path().to_path_buf());
    let a = node(&bus, cfg).await;
    let created = a.create_filter("gone", bloom(1_000)).await.unwrap();
    let dir = data
        .path()
        .join(format!("gone.g{}", created.entry.generation));
    assert!(dir.is_dir());
    assert!(eventually(Duration::from_secs(10), || parked(&a, "gone")).await);
    a.drop_filter("gone").await.unwrap().unwrap();
    assert!(a.filters().is_empty());
    assert!(!dir.exists(), "a dropped parked filter's data stays behind");
    let refused = ask(&bus, "crpf.gone.api.contains".into(), b"x", 2_000)
        .await
        .unwrap();
    assert!(refused.to_string().contains("no filter"), "{refused}");
    a.shutdown().await.unwrap();
}
