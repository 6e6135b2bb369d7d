//! Size, accuracy and fill report (no timing): `cargo bench --bench report` prints markdown
//! tables of serialized bytes per element, load, overflow, false negatives and measured vs
//! estimated false positive rates of every crpf filter, and compares filling GCuckoo and the
//! `cuckoofilter` crate to capacity.

mod common;

use std::hash::DefaultHasher;

use crpf::{GBloom, GCuckoo, Lattice, Membership, OrCuckoo, ScGBloom, ScGCuckoo, ScOrCuckoo};
use serde::Serialize;

use common::{CUCKOO_FPR, FRESH_SEED, KEY_SEED, MAIN_FPR, N, keys, thesis_cuckoo};

struct Row {
    ty: &'static str,
    state: &'static str,
    failed: usize,
    cardinality: f64,
    load: f64,
    extra: String,
    bytes: usize,
    false_neg: usize,
    measured_fpr: f64,
    estimated_fpr: f64,
}

fn row<F: Membership + Serialize>(
    ty: &'static str,
    state: &'static str,
    f: &F,
    keys: &[[u8; 16]],
    ok: &[bool],
    fresh: &[[u8; 16]],
    extra: String,
) -> Row {
    let false_neg = keys
        .iter()
        .zip(ok)
        .filter(|(k, ok)| **ok && !f.contains(&k[..]))
        .count();
    let fp = fresh.iter().filter(|k| f.contains(&k[..])).count();
    Row {
        ty,
        state,
        failed: ok.iter().filter(|ok| !**ok).count(),
        cardinality: f.cardinality(),
        load: f.load_factor(),
        extra,
        bytes: serde_cbor::to_vec(f).expect("serializes").len(),
        false_neg,
        measured_fpr: fp as f64 / fresh.len() as f64,
        estimated_fpr: f.estimated_fpr(),
    }
}

/// All 2^20 keys added to one replica, and a 50-50 split over replicas 1 and 2 merged into 1.
fn measure<F: Membership + Lattice + Serialize>(
    ty: &'static str,
    make: impl Fn(u16) -> F,
    extra: impl Fn(&F) -> String,
    keys: &[[u8; 16]],
    fresh: &[[u8; 16]],
    rows: &mut Vec<Row>,
) {
    let mut f = make(1);
    let ok: Vec<bool> = keys.iter().map(|k| f.add(k).is_ok()).collect();
    rows.push(row(ty, "all local", &f, keys, &ok, fresh, extra(&f)));
    drop(f);

    let half = keys.len() / 2;
    let mut a = make(1);
    let mut b = make(2);
    let mut ok: Vec<bool> = keys[..half].iter().map(|k| a.add(k).is_ok()).collect();
    ok.extend(keys[half..].iter().map(|k| b.add(k).is_ok()));
    a.merge(&b).expect("compatible replicas");
    rows.push(row(ty, "50-50 merged", &a, keys, &ok, fresh, extra(&a)));
}

fn print_rows(rows: &[Row], n: usize) {
    println!(
        "| type | state | failed adds | cardinality | load factor | details | CBOR bytes | bytes/element | false negatives | measured FPR | estimated FPR |"
    );
    println!("|---|---|--:|--:|--:|---|--:|--:|--:|--:|--:|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.0} | {:.4} | {} | {} | {:.4} | {} | {:.5} | {:.5} |",
            r.ty,
            r.state,
            r.failed,
            r.cardinality,
            r.load,
            r.extra,
            r.bytes,
            r.bytes as f64 / n as f64,
            r.false_neg,
            r.measured_fpr,
            r.estimated_fpr
        );
    }
}

fn all_types(
    gbloom: impl Fn() -> GBloom,
    gcuckoo: impl Fn() -> GCuckoo,
    orcuckoo: impl Fn(u16) -> OrCuckoo,
    sc_fpr: f64,
    keys: &[[u8; 16]],
    fresh: &[[u8; 16]],
) -> Vec<Row> {
    let n = keys.len() as u64;
    let mut rows = Vec::new();
    measure(
        "GBloom",
        |_| gbloom(),
        |f| format!("m={} k={}", f.params().bits, f.params().hashes),
        keys,
        fresh,
        &mut rows,
    );
    measure(
        "GCuckoo",
        |_| gcuckoo(),
        |f| {
            let p = f.params();
            format!(
                "{}x{} slots, {}-bit fp, overflow={}",
                p.buckets,
                p.bucket_size,
                p.fingerprint_bits,
                f.overflow_len()
            )
        },
        keys,
        fresh,
        &mut rows,
    );
    measure(
        "OrCuckoo",
        orcuckoo,
        |f| {
            let p = f.params();
            format!(
                "{}x{} slots, {}-bit fp, overflow={}",
                p.buckets,
                p.bucket_size,
                p.fingerprint_bits,
                f.overflow_len()
            )
        },
        keys,
        fresh,
        &mut rows,
    );
    measure(
        "ScGBloom",
        |_| ScGBloom::with_capacity(n, sc_fpr).unwrap(),
        |f| {
            let k: Vec<String> = f
                .subs()
                .iter()
                .map(|s| s.params().hashes.to_string())
                .collect();
            format!("subs={} k=[{}]", f.sub_filters(), k.join(","))
        },
        keys,
        fresh,
        &mut rows,
    );
    measure(
        "ScGCuckoo",
        |_| ScGCuckoo::with_capacity(n, sc_fpr).unwrap(),
        |f| {
            let over: usize = f.subs().iter().map(|s| s.overflow_len()).sum();
            let fp: Vec<String> = f
                .subs()
                .iter()
                .map(|s| s.params().fingerprint_bits.to_string())
                .collect();
            format!(
                "subs={} fp bits=[{}], overflow={over}",
                f.sub_filters(),
                fp.join(",")
            )
        },
        keys,
        fresh,
        &mut rows,
    );
    measure(
        "ScOrCuckoo",
        |r| ScOrCuckoo::with_capacity(n, sc_fpr, r).unwrap(),
        |f| format!("subs={}", f.sub_filters()),
        keys,
        fresh,
        &mut rows,
    );
    rows
}

fn fill_comparison(keys: &[[u8; 16]], fresh: &[[u8; 16]]) {
    println!(
        "\n## Filling to capacity: 2^20 keys into 2^20 slots (2^18 buckets x 4, 8-bit fingerprints)\n"
    );
    println!(
        "| filter | failed inserts | false negatives (insert Ok, contains false) | failed keys not contained | keys not contained | entries | measured FPR |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|");

    let mut gc = GCuckoo::new(thesis_cuckoo()).unwrap();
    let ok: Vec<bool> = keys.iter().map(|k| gc.add(k).is_ok()).collect();
    print_fill(
        "crpf GCuckoo (thesis params)",
        &ok,
        |k| gc.contains(k),
        gc.cardinality() as usize,
        keys,
        fresh,
    );

    let mut cf = cuckoofilter::CuckooFilter::<DefaultHasher>::with_capacity(keys.len());
    let ok: Vec<bool> = keys.iter().map(|k| cf.add(&k[..]).is_ok()).collect();
    print_fill(
        "cuckoofilter 0.5 with_capacity(2^20)",
        &ok,
        |k| cf.contains(k),
        cf.len(),
        keys,
        fresh,
    );
}

fn print_fill(
    name: &str,
    ok: &[bool],
    contains: impl Fn(&[u8]) -> bool,
    entries: usize,
    keys: &[[u8; 16]],
    fresh: &[[u8; 16]],
) {
    let failed = ok.iter().filter(|ok| !**ok).count();
    let (mut fneg, mut failed_missing) = (0, 0);
    for (k, ok) in keys.iter().zip(ok) {
        if !contains(k) {
            if *ok {
                fneg += 1;
            } else {
                failed_missing += 1;
            }
        }
    }
    let fp = fresh.iter().filter(|k| contains(&k[..])).count();
    println!(
        "| {name} | {failed} | {fneg} | {failed_missing} | {} | {entries} | {:.5} |",
        fneg + failed_missing,
        fp as f64 / fresh.len() as f64
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let keys = keys(N, KEY_SEED);
    let fresh = common::keys(N, FRESH_SEED);
    let n = N as u64;
    println!(
        "# crpf report: {N} random 16-byte keys (seed {KEY_SEED:#x}), FPR measured on {N} fresh keys (seed {FRESH_SEED:#x})"
    );
    println!(
        "\nbytes/element = serde_cbor bytes / 2^20 keys offered. \"50-50 merged\": replica 1 adds the first 2^19 keys, replica 2 the rest, then replica 1 merges replica 2. False negatives count keys whose add returned Ok."
    );

    println!(
        "\n## Thesis configuration: GBloom(2^20, 3.125%) (k=5), GCuckoo/OrCuckoo 2^18x4 slots with 8-bit fingerprints, scalable types with_capacity(2^20, 3.125%)\n"
    );
    let rows = all_types(
        || GBloom::with_capacity(n, CUCKOO_FPR).unwrap(),
        || GCuckoo::new(thesis_cuckoo()).unwrap(),
        |r| OrCuckoo::new(thesis_cuckoo(), r).unwrap(),
        CUCKOO_FPR,
        &keys,
        &fresh,
    );
    print_rows(&rows, N);

    println!("\n## Default sizing: every type with_capacity(2^20, {MAIN_FPR})\n");
    let rows = all_types(
        || GBloom::with_capacity(n, MAIN_FPR).unwrap(),
        || GCuckoo::with_capacity(n, MAIN_FPR).unwrap(),
        |r| OrCuckoo::with_capacity(n, MAIN_FPR, r).unwrap(),
        MAIN_FPR,
        &keys,
        &fresh,
    );
    print_rows(&rows, N);

    fill_comparison(&keys, &fresh);
}
