//! Three replicas of each filter kind update concurrently, exchange states in a ring until they
//! converge, and report estimated against measured false positive rates.
//!
//! `cargo run --release --example quickstart`

use crpf::{
    GBloom, GCuckoo, Lattice, Membership, OrCuckoo, Removable, ScGBloom, ScGCuckoo, ScOrCuckoo,
};

const PER_REPLICA: usize = 50_000;

fn key(replica: usize, i: usize) -> Vec<u8> {
    format!("replica-{replica}-item-{i}").into_bytes()
}

/// Adds (and with `remove`, removes every tenth) on three replicas, then gossips in a ring.
fn converge<F: Lattice + Membership + Clone>(
    name: &str,
    mut replicas: Vec<F>,
    remove: Option<fn(&mut F, &[u8]) -> bool>,
) -> Result<(), crpf::FilterError> {
    for (r, f) in replicas.iter_mut().enumerate() {
        for i in 0..PER_REPLICA {
            f.add(&key(r, i))?;
        }
        if let Some(remove) = remove {
            for i in (0..PER_REPLICA).step_by(10) {
                remove(f, &key(r, i));
            }
        }
    }
    let mut rounds = 0;
    while !(replicas[0].equivalent(&replicas[1]) && replicas[1].equivalent(&replicas[2])) {
        for i in 0..3 {
            let next = replicas[(i + 1) % 3].clone();
            replicas[i].merge(&next)?;
        }
        rounds += 1;
    }
    let f = &replicas[0];
    let probes: Vec<Vec<u8>> = (0..200_000)
        .map(|i| format!("absent-{i}").into_bytes())
        .collect();
    let measured = probes.iter().filter(|p| f.contains(p)).count() as f64 / probes.len() as f64;
    let false_negatives = (0..3)
        .flat_map(|r| (0..PER_REPLICA).map(move |i| (r, i)))
        .filter(|&(r, i)| (remove.is_none() || i % 10 != 0) && !f.contains(&key(r, i)))
        .count();
    println!(
        "{name:<11} converged in {rounds} rounds: cardinality {:>8.0}  load {:>5.1}%  FPR estimated {:.4}% measured {:.4}%  false negatives {false_negatives}",
        f.cardinality(),
        100.0 * f.load_factor(),
        100.0 * f.estimated_fpr(),
        100.0 * measured,
    );
    Ok(())
}

fn main() -> Result<(), crpf::FilterError> {
    let n = 3 * PER_REPLICA as u64;
    converge("GBloom", vec![GBloom::with_capacity(n, 0.01)?; 3], None)?;
    converge("GCuckoo", vec![GCuckoo::with_capacity(n, 0.01)?; 3], None)?;
    let or: Vec<OrCuckoo> = (1..=3)
        .map(|r| OrCuckoo::with_capacity(n, 0.01, r))
        .collect::<Result<_, _>>()?;
    converge(
        "OrCuckoo",
        or,
        Some(|f: &mut OrCuckoo, k: &[u8]| f.remove(k)),
    )?;
    converge(
        "ScGBloom",
        vec![ScGBloom::with_capacity(n / 8, 0.01)?; 3],
        None,
    )?;
    converge(
        "ScGCuckoo",
        vec![ScGCuckoo::with_capacity(n / 8, 0.01)?; 3],
        None,
    )?;
    let sor: Vec<ScOrCuckoo> = (1..=3)
        .map(|r| ScOrCuckoo::with_capacity(n / 8, 0.01, r))
        .collect::<Result<_, _>>()?;
    converge(
        "ScOrCuckoo",
        sor,
        Some(|f: &mut ScOrCuckoo, k: &[u8]| f.remove(k)),
    )?;
    Ok(())
}
