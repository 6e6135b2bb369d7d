//! Multiset synchronisation with counting cuckoo filters (Li, Luo and Guo, section 4): after
//! two hosts exchange their [`CountingCuckoo`]s, each identifies the elements it must send
//! (`d_E`, in its multiset only) and the ones it must replicate locally (`d_M`, more
//! occurrences at the other host), by querying (Algorithm 4) or by decoding (Algorithm 5).
//!
//! Both are exact up to fingerprint collisions: an element of `A` only whose slot key (bucket
//! pair and fingerprint) is also the key of an element of `B` is taken for a member of `B`
//! (paper Eq. 5-7: probability about `2cα / 2^l` per element, `c` slots per bucket at load
//! `α` with `l`-bit fingerprints), and elements sharing a key share a counter.
//!
//! ```
//! use crpf::CountingCuckoo;
//! use crpf::core::cuckoo::multiset_sync::{decoding_based, query_based};
//!
//! let mut a = CountingCuckoo::with_capacity(100, 0.001, 1)?;
//! let mut b = CountingCuckoo::with_capacity(100, 0.001, 2)?;
//! let ma: Vec<(&[u8], u64)> = vec![(b"x", 2), (b"y", 1), (b"z", 4)];
//! let mb: Vec<(&[u8], u64)> = vec![(b"x", 2), (b"y", 3), (b"w", 1)];
//! for &(e, m) in &ma { a.add_count(e, m)?; }
//! for &(e, m) in &mb { b.add_count(e, m)?; }
//! // Host A: send z (only at A), make two more y (B has 3).
//! let d = query_based(ma.iter().copied(), &b);
//! assert_eq!(d.only_here, vec![(&b"z"[..], 4)]);
//! assert_eq!(d.more_there, vec![(&b"y"[..], 2)]);
//! assert_eq!(decoding_based(&a, ma.iter().copied(), &b)?, d);
//! // Host B: send w.
//! let d = query_based(mb.iter().copied(), &a);
//! assert_eq!((d.only_here, d.more_there), (vec![(&b"w"[..], 1)], vec![]));
//! # Ok::<(), crpf::FilterError>(())
//! ```

use std::collections::HashMap;

use super::counting::CountingCuckoo;
use crate::core::error::FilterError;

/// The differing elements a host identified, with multiplicities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultisetDiff<T> {
    /// `d_E` of this host: elements the other multiset lacks, with their local multiplicity
    /// (to send).
    pub only_here: Vec<(T, u64)>,
    /// `d_M` of the other host: elements with more occurrences there, with how many more (to
    /// replicate locally).
    pub more_there: Vec<(T, u64)>,
}

impl<T> Default for MultisetDiff<T> {
    fn default() -> Self {
        Self {
            only_here: Vec::new(),
            more_there: Vec::new(),
        }
    }
}

impl<T> MultisetDiff<T> {
    fn classify(&mut self, item: T, local: u64, remote: u64) {
        if remote == 0 {
            self.only_here.push((item, local));
        } else if remote > local {
            self.more_there.push((item, remote - local));
        }
    }
}

/// Algorithm 4 (query-based identification) at host A: every element of the local root set
/// `A*`, given with its multiplicity `m_A(x)`, is queried in the other host's filter; a count
/// of 0 puts it in `d_E` of A, a count above `m_A(x)` in `d_M` of B. Elements with a
/// multiplicity of 0 are skipped (not in the root set). Cost: one query per local element.
pub fn query_based<T: AsRef<[u8]>>(
    local: impl IntoIterator<Item = (T, u64)>,
    remote: &CountingCuckoo,
) -> MultisetDiff<T> {
    let mut d = MultisetDiff::default();
    for (item, m) in local {
        if m > 0 {
            let r = remote.count(item.as_ref());
            d.classify(item, m, r);
        }
    }
    d
}

/// What the elimination step of Algorithm 5 leaves in a slot of the local filter.
#[derive(Debug, Clone, Copy)]
enum Label {
    /// Flag 0: the fingerprint is in neither candidate bucket of the other filter.
    OnlyHere,
    /// Flag 1: the other filter counts more, this many.
    MoreThere(u64),
}

/// Algorithm 5 (decoding-based identification) at host A. Elimination: every non-empty slot
/// of `local_filter` (A's own filter) is looked up in the two candidate buckets of `remote`;
/// slots that `remote` counts at least as often are emptied (common, or B's business), the
/// others are labelled, flag 1 where `remote` counts more and flag 0 where it has no such
/// fingerprint. Decoding: the local multiset is traversed and every element whose slot is
/// labelled is reported, flag 0 in `d_E` of A and flag 1 in `d_M` of B with the difference
/// to its local multiplicity.
///
/// The filters must have the same parameters ([`FilterError::Incompatible`] otherwise), so
/// that an element has the same slot key in both.
pub fn decoding_based<T: AsRef<[u8]>>(
    local_filter: &CountingCuckoo,
    local: impl IntoIterator<Item = (T, u64)>,
    remote: &CountingCuckoo,
) -> Result<MultisetDiff<T>, FilterError> {
    FilterError::require_same("cuckoo", local_filter.params(), remote.params())?;
    // Elimination and labelling (lines 1-12).
    let mut labels: HashMap<(u64, u16), Label> = HashMap::new();
    local_filter.for_each_slot(|bucket, fp, mine| {
        if mine == 0 {
            return; // an empty slot: its element was deleted
        }
        match remote.count_at(bucket as usize, fp) {
            0 => {
                labels.insert((bucket, fp), Label::OnlyHere);
            }
            theirs if theirs > mine => {
                labels.insert((bucket, fp), Label::MoreThere(theirs));
            }
            _ => {}
        }
    });
    // Decoding the labelled slots against the local multiset (lines 13-18).
    let mut d = MultisetDiff::default();
    if labels.is_empty() {
        return Ok(d);
    }
    for (item, m) in local {
        if m == 0 {
            continue;
        }
        let (b, fp) = local_filter.position(item.as_ref());
        match labels.get(&local_filter.key(b, fp)) {
            Some(Label::OnlyHere) => d.only_here.push((item, m)),
            Some(&Label::MoreThere(theirs)) if theirs > m => d.more_there.push((item, theirs - m)),
            _ => {}
        }
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{CuckooParams, Membership};

    type Multiset = BTreeMap<u32, u64>;
    /// `(d_E, d_M)` as sorted `(element, multiplicity)` lists.
    type Pair = (Vec<(u32, u64)>, Vec<(u32, u64)>);

    fn filter(m: &Multiset, params: CuckooParams, replica: u16) -> CountingCuckoo {
        let mut f = CountingCuckoo::new(params, replica).unwrap();
        for (x, &n) in m {
            f.add_count(&x.to_le_bytes(), n).unwrap();
        }
        f
    }

    fn items(m: &Multiset) -> impl Iterator<Item = ([u8; 4], u64)> + '_ {
        m.iter().map(|(x, &n)| (x.to_le_bytes(), n))
    }

    /// Two multisets with every kind of difference: elements only in A, only in B, more in
    /// A, more in B, and common ones.
    fn scenario(n: u32, seed: u64) -> (Multiset, Multiset) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (mut a, mut b) = (Multiset::new(), Multiset::new());
        for x in 0..n {
            let m = rng.u64(1..20);
            match x % 5 {
                0 => {
                    a.insert(x, m);
                }
                1 => {
                    b.insert(x, m);
                }
                2 => {
                    a.insert(x, m);
                    b.insert(x, m + rng.u64(1..5));
                }
                3 => {
                    a.insert(x, m + rng.u64(1..5));
                    b.insert(x, m);
                }
                _ => {
                    a.insert(x, m);
                    b.insert(x, m);
                }
            }
        }
        (a, b)
    }

    /// The exact answer: `d_E` of `a` and `d_M` of `b`, sorted.
    fn truth(a: &Multiset, b: &Multiset) -> Pair {
        let only = a
            .iter()
            .filter(|(x, _)| !b.contains_key(x))
            .map(|(x, &m)| (*x, m))
            .collect();
        let more = a
            .iter()
            .filter_map(|(x, &m)| b.get(x).filter(|&&mb| mb > m).map(|&mb| (*x, mb - m)))
            .collect();
        (only, more)
    }

    fn decode(d: MultisetDiff<[u8; 4]>) -> Pair {
        let conv = |v: Vec<([u8; 4], u64)>| {
            let mut v: Vec<_> = v
                .into_iter()
                .map(|(x, m)| (u32::from_le_bytes(x), m))
                .collect();
            v.sort_unstable();
            v
        };
        (conv(d.only_here), conv(d.more_there))
    }

    /// With 16-bit fingerprints at load ~0.5 the paper's bound (Eq. 7, `2cα/2^l`) puts the
    /// chance of a collision among 2000 elements at about 12%; this seed has none, so both
    /// methods must find exactly the differing elements, at both hosts.
    #[test]
    fn both_methods_identify_exactly_the_differing_elements() {
        let (a, b) = scenario(2000, 7);
        let p = CuckooParams::with_capacity(3800, 0.0002)
            .unwrap()
            .with_seed(11);
        assert_eq!(p.fingerprint_bits, 16);
        let (fa, fb) = (filter(&a, p, 1), filter(&b, p, 2));
        for (x, y, fx, fy) in [(&a, &b, &fa, &fb), (&b, &a, &fb, &fa)] {
            let want = truth(x, y);
            assert!(!want.0.is_empty() && !want.1.is_empty());
            assert_eq!(decode(query_based(items(x), fy)), want);
            assert_eq!(decode(decoding_based(fx, items(x), fy).unwrap()), want);
        }
    }

    /// Applying the identified differences (send `d_E`, replicate `d_M`) synchronises the two
    /// multisets: both become their union (the maximum multiplicity), and so do the filters.
    #[test]
    fn the_framework_synchronises_both_multisets() {
        let (mut a, mut b) = scenario(500, 3);
        let p = CuckooParams::with_capacity(1000, 0.0002).unwrap();
        let (fa, fb) = (filter(&a, p, 1), filter(&b, p, 2));
        let da = decode(query_based(items(&a), &fb));
        let db = decode(query_based(items(&b), &fa));
        for (x, m) in da.0 {
            b.insert(x, m);
        }
        for (x, more) in da.1 {
            *a.get_mut(&x).unwrap() += more;
        }
        for (x, m) in db.0 {
            a.insert(x, m);
        }
        for (x, more) in db.1 {
            *b.get_mut(&x).unwrap() += more;
        }
        assert_eq!(a, b);
        let (fa, fb) = (filter(&a, p, 1), filter(&b, p, 2));
        assert_eq!(fa.entries(), fb.entries());
    }

    /// With short fingerprints collisions happen; every misidentified element must then be
    /// explained by a key collision (the paper's only error source), and their number must be
    /// near the paper's estimate (Eq. 5-7 at the measured load).
    #[test]
    fn errors_come_only_from_fingerprint_collisions() {
        let (a, b) = scenario(4000, 9);
        let p = CuckooParams {
            fingerprint_bits: 8,
            ..CuckooParams::with_capacity(4400, 0.1).unwrap()
        };
        let fb = filter(&b, p, 2);
        let (want_only, want_more) = truth(&a, &b);
        let (got_only, got_more) = decode(query_based(items(&a), &fb));
        let key = |f: &CountingCuckoo, x: u32| {
            let (bk, fp) = f.position(&x.to_le_bytes());
            f.key(bk, fp)
        };
        let b_keys: std::collections::HashSet<_> = b.keys().map(|&x| key(&fb, x)).collect();
        let mut errors = 0;
        for &(x, m) in &want_only {
            if !got_only.contains(&(x, m)) {
                errors += 1;
                assert!(
                    b_keys.contains(&key(&fb, x)),
                    "{x} missed without collision"
                );
            }
        }
        for &(x, m) in &want_more {
            if !got_more.contains(&(x, m)) {
                errors += 1;
                let k = key(&fb, x);
                let collided = b.keys().filter(|&&y| key(&fb, y) == k).count() > 1;
                assert!(collided, "{x} miscounted without collision");
            }
        }
        // Nothing is reported that is not a difference (a collision only adds occurrences).
        assert!(got_only.iter().all(|e| want_only.contains(e)));
        // Eq. 5-7: per element about 2cα/(2^l - 1), α the load.
        let alpha = fb.cardinality() / fb.capacity() as f64;
        let expected = a.len() as f64 * p.fpr_at_load_unique(alpha);
        assert!(errors > 0, "8-bit fingerprints at this load must collide");
        assert!(
            (errors as f64) < 3.0 * expected + 5.0,
            "{errors} errors, paper's estimate {expected:.1}"
        );
    }

    #[test]
    fn decoding_needs_equal_parameters() {
        let a = CountingCuckoo::with_capacity(100, 0.01, 1).unwrap();
        let b = CountingCuckoo::with_capacity(200, 0.01, 2).unwrap();
        let none: [(&[u8], u64); 0] = [];
        assert!(matches!(
            decoding_based(&a, none, &b),
            Err(FilterError::Incompatible(_))
        ));
    }
}
