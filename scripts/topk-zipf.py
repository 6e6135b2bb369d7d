#!/usr/bin/env python3
"""Top-k precision on a Zipf stream: crpf's (one replica) against RedisBloom's, the same
k, width, depth and decay, fed the same stream in one run.

    PYTHONPATH=.tools/py scripts/topk-zipf.py CRPF_PORT REDIS_PORT [K WIDTH DEPTH ITEMS EXPONENT N]

Creates the key `zipf` on both servers (TOPK.RESERVE), feeds N adds of items drawn from a
Zipf distribution over ITEMS items (seeded: every run feeds the same stream) in TOPK.ADD
batches, then reads TOPK.LIST WITHCOUNT and compares it with the exact top k: precision =
listed items among the true top k, over k (ties at the k-th count count as hits), and the
listed counts' mean relative error against the truth.
"""
import random
import sys

import redis

crpf_port, redis_port = int(sys.argv[1]), int(sys.argv[2])
if len(sys.argv) > 3:
    k, width, depth, items = (int(a) for a in sys.argv[3:7])
    exponent, n = float(sys.argv[7]), int(sys.argv[8])
else:
    k, width, depth, items, exponent, n = 50, 2000, 5, 100_000, 1.1, 1_000_000
rng = random.Random(50)
weights = [1.0 / (r ** exponent) for r in range(1, items + 1)]
stream = rng.choices(range(items), weights=weights, k=n)
truth = [0] * items
for i in stream:
    truth[i] += 1
kth = sorted(truth, reverse=True)[k - 1]

print(f"stream: {n} adds, {items} items, Zipf exponent {exponent}; top-{k}, {width} x {depth}")
print(f"{'server':<12} {'precision':>10} {'count error':>12}")
for name, port in [("crpf", crpf_port), ("redisbloom", redis_port)]:
    r = redis.Redis(port=port)
    r.delete("zipf")
    r.execute_command("TOPK.RESERVE", "zipf", k, width, depth, 0.9)
    batch = 500
    pipe = r.pipeline(transaction=False)
    for i in range(0, n, batch):
        pipe.execute_command("TOPK.ADD", "zipf", *[f"item:{j}" for j in stream[i:i + batch]])
        if (i // batch) % 50 == 49:
            pipe.execute()
    pipe.execute()
    listed = r.execute_command("TOPK.LIST", "zipf", "WITHCOUNT")
    pairs = [(int(listed[i].split(b":")[1]), int(listed[i + 1])) for i in range(0, len(listed), 2)]
    hits = sum(1 for item, _ in pairs if truth[item] >= kth)
    error = sum(abs(c - truth[item]) / truth[item] for item, c in pairs) / max(1, len(pairs))
    print(f"{name:<12} {hits / k:>10.3f} {error:>12.4f}")
