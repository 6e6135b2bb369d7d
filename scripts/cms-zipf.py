#!/usr/bin/env python3
"""The overestimate of a count-min sketch on a Zipf stream: crpf's (one replica) against
RedisBloom's at the same width and depth, fed the same stream in one run.

    PYTHONPATH=.tools/py scripts/cms-zipf.py CRPF_PORT REDIS_PORT [WIDTH DEPTH ITEMS EXPONENT N]

Creates the key `zipf` on both servers (CMS.INITBYDIM), feeds N increments of items drawn
from a Zipf distribution over ITEMS items (seeded, so every run feeds the same stream) in
CMS.INCRBY batches, then queries every item on both and compares each estimate with the true
count. Prints the overestimate's mean, 99th percentile and maximum, as a share of N too (the
sketch's bound is 2N/width with probability 1 - 2^-depth), and how many estimates differ
between the two servers.
"""
import random
import sys

import redis

crpf_port, redis_port = int(sys.argv[1]), int(sys.argv[2])
width, depth, items, exponent, n = (
    [int(a) for a in sys.argv[3:5]] + [int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])]
    if len(sys.argv) > 3
    else [2000, 5, 100_000, 1.1, 1_000_000]
)
rng = random.Random(50)
weights = [1.0 / (k ** exponent) for k in range(1, items + 1)]
stream = rng.choices(range(items), weights=weights, k=n)
truth = [0] * items
for k in stream:
    truth[k] += 1

results = {}
for name, port in [("crpf", crpf_port), ("redisbloom", redis_port)]:
    r = redis.Redis(port=port)
    r.delete("zipf")
    r.execute_command("CMS.INITBYDIM", "zipf", width, depth)
    batch = 500
    pipe = r.pipeline(transaction=False)
    for i in range(0, n, batch):
        args = []
        for k in stream[i:i + batch]:
            args += [f"item:{k}", 1]
        pipe.execute_command("CMS.INCRBY", "zipf", *args)
        if (i // batch) % 50 == 49:
            pipe.execute()
    pipe.execute()
    estimates = []
    for i in range(0, items, 1000):
        estimates += r.execute_command("CMS.QUERY", "zipf", *[f"item:{k}" for k in range(i, min(items, i + 1000))])
    info = r.execute_command("CMS.INFO", "zipf")
    results[name] = (estimates, info)

print(f"stream: {n} increments, {items} items, Zipf exponent {exponent}; sketch {width} x {depth}")
print(f"{'server':<12} {'mean over':>10} {'p99 over':>10} {'max over':>10} {'max/N':>8} {'under':>6}")
for name, (est, info) in results.items():
    over = sorted(e - t for e, t in zip(est, truth))
    under = sum(1 for o in over if o < 0)
    mean = sum(over) / len(over)
    p99 = over[int(0.99 * (len(over) - 1))]
    print(f"{name:<12} {mean:>10.2f} {p99:>10} {over[-1]:>10} {over[-1] / n:>8.5f} {under:>6}")
differ = sum(1 for a, b in zip(results["crpf"][0], results["redisbloom"][0]) if a != b)
print(f"estimates that differ between the two: {differ} of {items}; bound 2N/width = {2 * n / width:.0f}")
