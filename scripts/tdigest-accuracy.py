#!/usr/bin/env python3
"""t-digest quantile error: crpf's (one replica, and three replicas merged) against
RedisBloom's (one key, and TDIGEST.MERGE of three keys), the same compression, the same
seeded stream, in one run.

    PYTHONPATH=.tools/py scripts/tdigest-accuracy.py REDIS_PORT [COMPRESSION N DIST SEED]

DIST is `lognormal` (latencies: mu 3, sigma 1; the default) or `uniform`. crpf's side runs
`target/release/examples/tdigest_accuracy` (cargo build --release --example
tdigest_accuracy): one digest fed every value, and three replicas each fed every third value,
exchanging deltas every 1,000 of their values, then merged. RedisBloom's: TDIGEST.ADD
batches of 500 into one key, and into three keys (every third value) merged with
TDIGEST.MERGE. Error at p50, p99, p99.9: |estimate - exact| / exact, and the rank error
|rank(estimate)/N - q|.
"""
import bisect
import random
import subprocess
import sys

import redis

redis_port = int(sys.argv[1])
compression = int(sys.argv[2]) if len(sys.argv) > 2 else 100
n = int(sys.argv[3]) if len(sys.argv) > 3 else 1_000_000
dist = sys.argv[4] if len(sys.argv) > 4 else "lognormal"
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 50
qs = [0.5, 0.99, 0.999]
rng = random.Random(seed)
if dist == "lognormal":
    values = [rng.lognormvariate(3.0, 1.0) for _ in range(n)]
else:
    values = [rng.random() for _ in range(n)]
text = "".join(f"{v!r}\n" for v in values)
exact_sorted = sorted(values)


def exact(q):
    return exact_sorted[min(n - 1, int(q * n))]


def errors(estimates):
    out = []
    for q, e in zip(qs, estimates):
        rank = bisect.bisect_right(exact_sorted, e) / n
        out.append((abs(e - exact(q)) / abs(exact(q)), abs(rank - q)))
    return out


crpf = subprocess.run(
    ["target/release/examples/tdigest_accuracy", str(compression)] + [str(q) for q in qs],
    input=text, capture_output=True, text=True, check=True,
).stdout.split("\n")
results = {}
for line in crpf:
    if line:
        name, centroids, *est = line.split()
        results[f"crpf {name}"] = (int(centroids), [float(e) for e in est])

r = redis.Redis(port=redis_port)
for key in ["acc", "acc0", "acc1", "acc2", "acc3"]:
    r.delete(key)


def feed(key, vals):
    r.execute_command("TDIGEST.CREATE", key, "COMPRESSION", compression)
    pipe = r.pipeline(transaction=False)
    for i in range(0, len(vals), 500):
        pipe.execute_command("TDIGEST.ADD", key, *vals[i:i + 500])
        if (i // 500) % 50 == 49:
            pipe.execute()
    pipe.execute()


feed("acc", values)
for k in range(3):
    feed(f"acc{k}", values[k::3])
r.execute_command("TDIGEST.MERGE", "acc3", 3, "acc0", "acc1", "acc2", "COMPRESSION", compression)
for name, key in [("redisbloom alone", "acc"), ("redisbloom three", "acc3")]:
    est = [float(v) for v in r.execute_command("TDIGEST.QUANTILE", key, *qs)]
    info = r.execute_command("TDIGEST.INFO", key)
    if not isinstance(info, dict):
        info = dict(zip(info[::2], info[1::2]))
    info = {(k.decode() if isinstance(k, bytes) else k): v for k, v in info.items()}
    results[name] = (int(info["Merged nodes"]) + int(info["Unmerged nodes"]), est)

print(f"{n} values ({dist}, seed {seed}), compression {compression}")
print(f"{'digest':<18} {'centroids':>9} " + " ".join(f"{'p' + str(q * 100).rstrip('0').rstrip('.'):>20}" for q in qs))
for name, (centroids, est) in results.items():
    cells = [f"{v:.2e} (rank {rk:.1e})" for v, rk in errors(est)]
    print(f"{name:<18} {centroids:>9} " + " ".join(f"{c:>20}" for c in cells))
