#!/usr/bin/env python3
"""Markdown tables from criterion's estimates after `cargo bench --bench filters`.

Usage: python3 benches/summarize.py [target/criterion]
Time per iteration is criterion's typical estimate (the slope when it has one, else the mean),
as in its console output.
"""
import json
import os
import sys

# Entries in the replica merged in by the cuckoo merge benchmarks (2^19).
MERGED = 1 << 19

root = sys.argv[1] if len(sys.argv) > 1 else "target/criterion"


def load(group, func):
    d = os.path.join(root, group, func, "new")
    est = json.load(open(os.path.join(d, "estimates.json")))
    meta = json.load(open(os.path.join(d, "benchmark.json")))
    e = est.get("slope") or est["mean"]
    tp = (meta.get("throughput") or {}).get("Elements")
    return e["point_estimate"], e["confidence_interval"], tp


def funcs(group):
    g = os.path.join(root, group)
    return sorted(f for f in os.listdir(g) if os.path.isdir(os.path.join(g, f, "new")))


def table(group, reference):
    names = funcs(group)
    ref = load(group, reference)[0]
    print(f"\n### {group}\n")
    print(f"| implementation | time / iteration | ns / element | Melem/s | speed vs {reference} |")
    print("|---|--:|--:|--:|--:|")
    for f in names:
        t, ci, n = load(group, f)
        if group == "merge" and "Cuckoo" in f:
            n = MERGED  # entries merged in; the ratio to an OR loop means nothing here
        per = f"{t / n:.2f}" if n else "-"
        rate = f"{n / t * 1e3:.1f}" if n else "-"
        tt = f"{t / 1e6:.2f} ms" if t >= 1e6 else f"{t / 1e3:.1f} µs"
        vs = "-" if group == "merge" and "Cuckoo" in f else f"{ref / t:.2f}x"
        print(f"| {f} | {tt} | {per} | {rate} | {vs} |")


def ratio(group, ours, theirs):
    return load(group, theirs)[0] / load(group, ours)[0]


for group, ref in [
    ("bloom_add", "fastbloom_default"),
    ("bloom_contains_hit", "fastbloom_default"),
    ("bloom_contains_miss", "fastbloom_default"),
    ("cuckoo_add", "cuckoofilter"),
    ("cuckoo_contains_hit", "cuckoofilter"),
    ("cuckoo_contains_miss", "cuckoofilter"),
    ("merge", "or_loop_vec_u64"),
]:
    if os.path.isdir(os.path.join(root, group)):
        table(group, ref)

print("\n### Targets\n")
print("| target | measured | goal | result |")
print("|---|--:|--:|---|")
checks = [
    ("GBloom add vs fastbloom (default hasher)", "bloom_add", "GBloom", "fastbloom_default", 1.0),
    ("GBloom contains, hits, vs fastbloom", "bloom_contains_hit", "GBloom", "fastbloom_default", 1.0),
    ("GBloom contains, misses, vs fastbloom", "bloom_contains_miss", "GBloom", "fastbloom_default", 1.0),
    ("GCuckoo contains, hits, vs cuckoofilter", "cuckoo_contains_hit", "GCuckoo", "cuckoofilter", 2.0),
    ("GCuckoo contains, misses, vs cuckoofilter", "cuckoo_contains_miss", "GCuckoo", "cuckoofilter", 2.0),
    ("GBloom merge vs plain OR loop", "merge", "GBloom", "or_loop_vec_u64", 0.9),
]
for name, g, ours, theirs, goal in checks:
    try:
        r = ratio(g, ours, theirs)
    except FileNotFoundError:
        continue
    print(f"| {name} | {r:.2f}x | >= {goal}x | {'met' if r >= goal else 'NOT met'} |")
