//! Filters travel between crpf's `go_bloom` kind and Go's `bits-and-blooms/bloom` (3.3.1, from
//! Debian's packages): `tests/go/bloomtool.go`, built here with the real library, writes
//! filters crpf must read exactly, and reads the filters crpf writes.
//!
//! Go comes from `CRPF_GO` (a `go` command set up as `scripts/install-go.sh` sets up
//! `.tools/go/bin/go`: GOPATH mode with the packaged library), else `.tools/go/bin/go`, which
//! `scripts/test.sh` installs. Without either the tests say so and pass without checking
//! anything.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crpf::{GoBloom, GoBloomParams, Lattice, Membership};

/// The built `bloomtool`, or `None` (said once) where there is no Go.
fn bloomtool() -> Option<&'static Path> {
    static TOOL: OnceLock<Option<PathBuf>> = OnceLock::new();
    TOOL.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let go = match std::env::var_os("CRPF_GO") {
            Some(go) => PathBuf::from(go),
            None => root.join(".tools/go/bin/go"),
        };
        if !go.exists() {
            eprintln!(
                "SKIPPED: no Go at {go:?}: run scripts/install-go.sh (or scripts/test.sh), or \
                 set CRPF_GO, to check crpf against Go's bits-and-blooms/bloom"
            );
            return None;
        }
        let out = root.join("target/tmp/go-interop");
        std::fs::create_dir_all(&out).unwrap();
        let bin = out.join("bloomtool");
        let built = Command::new(&go)
            .arg("build")
            .arg("-o")
            .arg(&bin)
            .arg(root.join("tests/go/bloomtool.go"))
            .output()
            .expect("go runs");
        assert!(
            built.status.success(),
            "building tests/go/bloomtool.go with {go:?} failed: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        Some(bin)
    })
    .as_deref()
}

/// Runs `bloomtool` with `args`: its standard output.
pub fn go(args: &[&str]) -> String {
    let out = Command::new(bloomtool().expect("checked by the caller"))
        .args(args)
        .output()
        .expect("bloomtool runs");
    assert!(
        out.status.success(),
        "bloomtool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A fresh scratch directory under target/tmp.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/tmp/go-interop")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn item(prefix: &str, i: u64) -> Vec<u8> {
    format!("{prefix}{i}").into_bytes()
}

/// Go's `Test` of `prefix<i>` for `i` in `from..to`, from a filter file.
fn go_test(file: &Path, prefix: &str, from: u64, to: u64) -> Vec<bool> {
    let out = go(&[
        "test",
        file.to_str().unwrap(),
        prefix,
        &from.to_string(),
        &to.to_string(),
    ]);
    let bits: Vec<bool> = out.trim_end().bytes().map(|b| b == b'1').collect();
    assert_eq!(bits.len() as u64, to - from);
    bits
}

/// Go's filter (10,000 items at 1%) in both of its forms loads in crpf with the same `m`, `k`
/// and bits: every Go item is contained, and crpf answers as Go's `Test` on 100,000 others
/// (about 1% of them false positives, the same ones). Then crpf adds its own items and
/// writes the filter back in both forms: Go reads it, and `Test` is true for every item of
/// either side and agrees with crpf on the others.
#[test]
fn filters_round_trip_between_go_and_crpf_in_both_forms() {
    if bloomtool().is_none() {
        return;
    }
    let dir = scratch("round-trip");
    let go_file = dir.join("go.bin");
    go(&[
        "make",
        "10000",
        "0.01",
        "go-",
        "0",
        "10000",
        go_file.to_str().unwrap(),
    ]);
    let bytes = std::fs::read(&go_file).unwrap();
    assert_eq!(bytes.len(), 12_008, "NewWithEstimates(10000, 0.01)");
    let from_bytes = GoBloom::from_go_bytes(&bytes).unwrap();
    let json = std::fs::read(dir.join("go.bin.json")).unwrap();
    let from_json = GoBloom::from_go_json(&json).unwrap();
    assert_eq!(from_bytes, from_json);
    assert_eq!(
        *from_bytes.params(),
        GoBloomParams::estimate(10_000, 0.01).unwrap()
    );
    assert!((0..10_000).all(|i| from_bytes.contains(&item("go-", i))));
    let go_says = go_test(&go_file, "other-", 0, 100_000);
    let crpf_says: Vec<bool> = (0..100_000)
        .map(|i| from_bytes.contains(&item("other-", i)))
        .collect();
    assert_eq!(crpf_says, go_says);
    let false_positives = go_says.iter().filter(|&&b| b).count();
    assert!((500..1_500).contains(&false_positives), "{false_positives}");

    let mut f = from_bytes;
    for i in 0..5_000 {
        f.add(&item("crpf-", i)).unwrap();
    }
    let back = dir.join("crpf.bin");
    std::fs::write(&back, f.to_go_bytes()).unwrap();
    let back_json = dir.join("crpf.json");
    std::fs::write(&back_json, f.to_go_json()).unwrap();
    for file in [&back, &back_json] {
        assert!(go_test(file, "crpf-", 0, 5_000).iter().all(|&b| b));
        assert!(go_test(file, "go-", 0, 10_000).iter().all(|&b| b));
        let go_says = go_test(file, "other-", 0, 20_000);
        let crpf_says: Vec<bool> = (0..20_000)
            .map(|i| f.contains(&item("other-", i)))
            .collect();
        assert_eq!(crpf_says, go_says, "{file:?}");
    }
    // And a merge of two Go filters is their union, as Go's Merge makes it.
    let other = dir.join("other.bin");
    go(&[
        "make",
        "10000",
        "0.01",
        "more-",
        "0",
        "3000",
        other.to_str().unwrap(),
    ]);
    let mut union = GoBloom::from_go_bytes(&std::fs::read(&go_file).unwrap()).unwrap();
    let more = GoBloom::from_go_bytes(&std::fs::read(&other).unwrap()).unwrap();
    union.merge_import(&more).unwrap();
    assert!(more.le(&union));
    assert!((0..3_000).all(|i| union.contains(&item("more-", i))));
}
