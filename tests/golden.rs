//! Golden vectors of the state, delta and snapshot encodings of every kind a node runs: a
//! change to any of them breaks replicas and data directories of earlier releases, so it must
//! show up here (and in CHANGELOG.md). The envelope layout and the hashing have their own
//! golden vectors (`src/wire/mod.rs`, `src/core/hash.rs`).
//!
//! Each vector is the length and the xxh3-64 of the bytes: states are kilobytes, and the
//! digest pins every byte as well as a hex dump would.

use crpf::replica::durable::{DataDir, Identity, SNAPSHOT_FILE, Snapshot};
use crpf::replica::{AnyFilter, FilterSpec};
use crpf::wire::FilterKind;
use uuid::Uuid;
use xxhash_rust::xxh3::xxh3_64;

/// A small filter of `kind` (replica 3, the default seed) after adding `apple`, `pear` and
/// `plum` and, for the kinds that remove, removing `pear`; with the delta of those updates.
fn sample(kind: FilterKind) -> (AnyFilter, Vec<u8>) {
    let mut f = AnyFilter::new(&FilterSpec::new(kind, 64, 0.01), 3).unwrap();
    f.track_deltas(true);
    for item in [&b"apple"[..], b"pear", b"plum"] {
        f.add(item).unwrap();
    }
    if kind.removable() {
        assert!(f.remove(b"pear").unwrap().is_some());
    }
    let delta = f.take_delta().expect("a delta");
    (f, delta)
}

/// Length and xxh3-64 of some bytes.
type Pin = (usize, u64);

fn pin(bytes: &[u8]) -> Pin {
    (bytes.len(), xxh3_64(bytes))
}

/// (kind, state, delta): lengths and xxh3-64s. The Bloom kinds' deltas changed once without a
/// format change: their bits come in the order they were set, no longer sorted (the same
/// lengths; every release merges either order). The cuckoo kinds' states changed once
/// without a format change: an entry goes to its home bucket where Algorithm 1 chose one of
/// two buckets with room at random (the same lengths; every release decodes either placement,
/// `src/core/cuckoo/table.rs`). The Bloom and observed-remove kinds' deltas changed format
/// once: bit-packed (`src/core/compact.rs`); the earlier form still merges
/// ([`deltas_of_the_release_before_still_merge`]).
const GOLDEN: &[(FilterKind, Pin, Pin)] = &[
    (
        FilterKind::GBloom,
        (102, 17193096801069144951),
        (33, 11314892399778685344),
    ),
    (
        FilterKind::GCuckoo,
        (119, 15622743791328869368),
        (17, 9302376672807058780),
    ),
    (
        FilterKind::OrCuckoo,
        (141, 2136459113311781792),
        (17, 1209798495884373001),
    ),
    (
        FilterKind::ScGBloom,
        (154, 9939363148891137876),
        (42, 9164577533775967058),
    ),
    (
        FilterKind::ScGCuckoo,
        (168, 17565004833955234310),
        (22, 1109567346122685805),
    ),
    (
        FilterKind::ScOrCuckoo,
        (168, 14056288343637900344),
        (17, 9285596291984130080),
    ),
    (
        FilterKind::WriterScGBloom,
        (248, 8271937577086941821),
        (66, 4099137371973173289),
    ),
    (
        FilterKind::WriterScGCuckoo,
        (246, 4745869622102895956),
        (28, 16790825436979122729),
    ),
    (
        FilterKind::WriterScOrCuckoo,
        (246, 2012979632895897359),
        (24, 4995199673030325724),
    ),
    (
        FilterKind::ExpiringBloom,
        (74, 15448608530499876913),
        (38, 15413829207243906950),
    ),
    (
        FilterKind::CountingCuckoo,
        (138, 12790225268108971820),
        (32, 16872202562395666680),
    ),
];

#[test]
fn state_and_delta_encodings_are_stable() {
    let mut found = Vec::new();
    for &kind in FilterKind::ALL {
        let (f, delta) = sample(kind);
        let state = f.encode_state();
        // What is pinned also decodes to what was encoded.
        let back = AnyFilter::decode_state(kind, &state).unwrap();
        assert!(back.equivalent(&f), "{kind}");
        let mut from_delta = AnyFilter::new(&FilterSpec::new(kind, 64, 0.01), 4).unwrap();
        from_delta.merge_delta_bytes(&delta).unwrap();
        assert!(
            from_delta.equivalent(&f),
            "{kind}: the delta carries every update"
        );
        found.push((kind, pin(&state), pin(&delta)));
    }
    for (kind, state, delta) in &found {
        eprintln!("    (FilterKind::{kind:?}, {state:?}, {delta:?}),");
    }
    assert_eq!(
        found, GOLDEN,
        "an encoding changed (the found vectors are printed above)"
    );
}

/// The deltas of [`sample`] as the release before the compact delta encodings wrote them
/// (CBOR arrays of Bloom bit indexes; observed-remove maps with their context): peers not yet
/// upgraded send them, and write-ahead logs hold them.
const EARLIER_DELTAS: &[(FilterKind, &str)] = &[
    (
        FilterKind::GBloom,
        "a10095190207183619021119017719016419018018271901c91901010519020d021901b218811901a519010918a918ac1901181834187d",
    ),
    (
        FilterKind::OrCuckoo,
        "a30082830e1818a200030101830b1901d2a2000301030181830c19025ea2000301020281820381820103",
    ),
    (
        FilterKind::ScGBloom,
        "a100818200a1009818190255183e1902601901af19019a1901ba182d183819020d1901270519025c021901f3189418ef1901e419013018c218c6190142183c188f1902ae",
    ),
    (
        FilterKind::ScOrCuckoo,
        "a3008284000e182fa20003010184000b1903a4a200030103018184000c1904bca2000301020281820381820103",
    ),
    (
        FilterKind::WriterScOrCuckoo,
        "a100818203a30082840007196482a200030101840009190bc8a20003010301818400001958b3a2000301020281820381820103",
    ),
    (
        FilterKind::ExpiringBloom,
        "a2000001818200a100981c185e0918601844184118460708183f0e1853182e00185f184f17182618341836184c1830181e181f183316186c18401864",
    ),
];

#[test]
fn deltas_of_the_release_before_still_merge() {
    for &(kind, hex) in EARLIER_DELTAS {
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let (f, delta) = sample(kind);
        assert_ne!(bytes, delta, "{kind}: the encoding did not change");
        let mut from_earlier = AnyFilter::new(&FilterSpec::new(kind, 64, 0.01), 4).unwrap();
        from_earlier.merge_delta_bytes(&bytes).unwrap();
        assert!(from_earlier.equivalent(&f), "{kind}");
    }
}

#[test]
fn snapshot_files_are_stable() {
    let (f, _) = sample(FilterKind::OrCuckoo);
    let dir = tempfile::tempdir().unwrap();
    let data = DataDir::open(dir.path().join("golden")).unwrap();
    let snap = Snapshot {
        identity: Identity {
            uuid: Uuid::from_u128(0x00112233_4455_6677_8899_aabbccddeeff),
            replica: 3,
        },
        filter: "users".into(),
        kind: FilterKind::OrCuckoo,
        params_digest: f.params_digest(),
        reserved: 4096,
        state: f.encode_state(),
        wal_covered: Some(7),
    };
    data.save_snapshot(&snap).unwrap();
    let bytes = std::fs::read(data.path().join(SNAPSHOT_FILE)).unwrap();
    assert_eq!(data.load_snapshot().unwrap().as_ref(), Some(&snap));
    eprintln!("snapshot: {:?}", pin(&bytes));
    assert_eq!(
        pin(&bytes),
        GOLDEN_SNAPSHOT,
        "the snapshot file format changed"
    );
}

/// Length and xxh3-64 of the snapshot file of [`snapshot_files_are_stable`].
const GOLDEN_SNAPSHOT: Pin = (217, 15157655736070611420);
