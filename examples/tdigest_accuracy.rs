//! crpf's t-digest quantiles on a stream read from stdin (one value per line), alone and as
//! three replicas, each fed every third value and exchanging deltas every 1,000 of its values,
//! then merged: prints `alone` and `three` lines of the estimates at the quantiles given as
//! arguments. `scripts/tdigest-accuracy.py` feeds it the stream RedisBloom gets and compares.
//!
//!     cargo run --release --example tdigest_accuracy -- COMPRESSION Q...

use std::io::BufRead;

use crpf::{DeltaState, Lattice, TDigest, TdigestParams};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let compression: u32 = args[0].parse().expect("a compression");
    let qs: Vec<f64> = args[1..]
        .iter()
        .map(|a| a.parse().expect("a quantile"))
        .collect();
    let values: Vec<f64> = std::io::stdin()
        .lock()
        .lines()
        .map(|l| l.unwrap().trim().parse().expect("a number"))
        .collect();
    let p = TdigestParams::new(compression).unwrap();
    let mut alone = TDigest::new(p, 1);
    alone.add_values(&values).unwrap();
    let mut reps: Vec<TDigest> = (1..=3).map(|r| TDigest::new(p, r)).collect();
    for r in &mut reps {
        r.track_deltas(true);
    }
    let mut fed = [0usize; 3];
    for (i, &v) in values.iter().enumerate() {
        let r = i % 3;
        reps[r].add_values(&[v]).unwrap();
        fed[r] += 1;
        if fed[r] % 1000 == 0 {
            let d = reps[r].take_delta().expect("adds leave a delta");
            for (t, rep) in reps.iter_mut().enumerate() {
                if t != r {
                    rep.merge_delta(&d).unwrap();
                }
            }
        }
    }
    let mut three = reps[0].clone();
    for r in &reps[1..] {
        three.merge(r).unwrap();
    }
    for (name, t) in [("alone", &alone), ("three", &three)] {
        let got = t.view().quantiles(&qs);
        let line: Vec<String> = got.iter().map(|v| format!("{v:.17e}")).collect();
        println!("{name} {} {}", t.centroids(), line.join(" "));
    }
}
