//! The filters under evaluation and their thesis configurations (thesis 6.1), as a small
//! factory: a [`Variant`] is a filter kind and a design, and [`Variant::visit`] hands a
//! constructor for it to generic experiment code.

use std::fmt;

use serde::Serialize;

use crate::{
    BloomParams, CuckooParams, DeltaState, FilterError, GBloom, GCuckoo, Lattice, Membership,
    OrCuckoo, ReplicaId, ScGBloom, ScGCuckoo, ScOrCuckoo, ScalableParams, WriterScGBloom,
    WriterScGCuckoo, WriterScOrCuckoo,
};

/// Theoretical FPR of every thesis configuration: GBF 5, GCF 4 and ORCF 4 (`2c / 2^l =
/// 8 / 256`), and the compounded bound of the scalable ones.
pub const THESIS_FPR: f64 = 0.03125;
/// Slots per bucket of GCF 4 / ORCF 4.
pub const THESIS_BUCKET_SIZE: u8 = 4;
/// Fingerprint length of GCF 4 / ORCF 4.
pub const THESIS_FINGERPRINT_BITS: u8 = 8;
/// Kick quota of every cuckoo filter (thesis 6.1, after Fan et al.).
pub const THESIS_MAX_KICKS: u32 = 500;

/// The six filter types of the thesis (one figure each in Figure 6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum Kind {
    /// GBF 5: grow-only Bloom filter with 5 hash functions.
    Gbf,
    /// GCF 4: grow-only cuckoo filter, 4-slot buckets, 8-bit fingerprints.
    Gcf,
    /// ORCF 4: observed-remove cuckoo filter, 4-slot buckets, 8-bit fingerprints.
    Orcf,
    /// ScGBF 5: scalable GBF with the compounded FPR of GBF 5.
    ScGbf,
    /// ScGCF 4: scalable GCF with the compounded FPR of GCF 4.
    ScGcf,
    /// ScORCF 4: scalable ORCF with the compounded FPR of ORCF 4.
    ScOrcf,
}

impl Kind {
    /// All kinds, in the order of Figure 6.1 (a to f).
    pub const ALL: [Kind; 6] = [
        Kind::Gbf,
        Kind::Gcf,
        Kind::Orcf,
        Kind::ScGbf,
        Kind::ScGcf,
        Kind::ScOrcf,
    ];

    /// The thesis's name of the configuration.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Gbf => "GBF 5",
            Kind::Gcf => "GCF 4",
            Kind::Orcf => "ORCF 4",
            Kind::ScGbf => "ScGBF 5",
            Kind::ScGcf => "ScGCF 4",
            Kind::ScOrcf => "ScORCF 4",
        }
    }

    /// Short lower-case name, used in file names and CSV cells.
    pub fn slug(self) -> &'static str {
        match self {
            Kind::Gbf => "gbf",
            Kind::Gcf => "gcf",
            Kind::Orcf => "orcf",
            Kind::ScGbf => "scgbf",
            Kind::ScGcf => "scgcf",
            Kind::ScOrcf => "scorcf",
        }
    }

    /// The panel letter of Figure 6.1.
    pub fn figure_panel(self) -> char {
        match self {
            Kind::Gbf => 'a',
            Kind::Gcf => 'b',
            Kind::Orcf => 'c',
            Kind::ScGbf => 'd',
            Kind::ScGcf => 'e',
            Kind::ScOrcf => 'f',
        }
    }

    /// Whether the kind is a scalable series (and so has a per-writer design too).
    pub fn is_scalable(self) -> bool {
        matches!(self, Kind::ScGbf | Kind::ScGcf | Kind::ScOrcf)
    }

    /// Whether the kind is a cuckoo filter (its FPR estimator is Eq. 3.7).
    pub fn is_cuckoo(self) -> bool {
        matches!(self, Kind::Gcf | Kind::Orcf | Kind::ScGcf | Kind::ScOrcf)
    }

    /// The designs evaluated for this kind.
    pub fn designs(self) -> &'static [Design] {
        if self.is_scalable() {
            &[Design::Thesis, Design::PerWriter]
        } else {
            &[Design::Thesis]
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.slug())
    }
}

/// How a scalable filter shares its series between replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Design {
    /// The thesis's design (Specs. 2-8): one series that every replica adds to.
    Thesis,
    /// One series per writer with a per-writer FPR budget ([`crate::Partitioned`]).
    PerWriter,
}

impl Design {
    /// Short name, used in file names and CSV cells.
    pub fn slug(self) -> &'static str {
        match self {
            Design::Thesis => "thesis",
            Design::PerWriter => "per-writer",
        }
    }

    /// Human-readable name for figure titles.
    pub fn label(self) -> &'static str {
        match self {
            Design::Thesis => "thesis design (one shared series)",
            Design::PerWriter => "per-writer series (Partitioned)",
        }
    }

    /// Parses [`Design::slug`].
    pub fn from_slug(s: &str) -> Option<Self> {
        match s {
            "thesis" => Some(Design::Thesis),
            "per-writer" => Some(Design::PerWriter),
            _ => None,
        }
    }
}

/// A filter type under evaluation: a kind and a design.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Variant {
    /// The thesis configuration.
    pub kind: Kind,
    /// The design (only scalable kinds have more than one).
    pub design: Design,
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.kind.label(), self.design.slug())
    }
}

/// Every variant of the given kinds.
pub fn variants(kinds: &[Kind]) -> Vec<Variant> {
    kinds
        .iter()
        .flat_map(|&kind| {
            kind.designs()
                .iter()
                .map(move |&design| Variant { kind, design })
        })
        .collect()
}

/// The thesis configurations (6.1) scaled to a workload of `adds` elements: non-scalable
/// filters sized for the whole workload, scalable ones starting at a quarter of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Number of elements the workload adds.
    pub adds: u64,
    /// Capacity ratio of successive scalable sub-filters. The thesis uses 1 ("subsequent
    /// sub-filters use the same capacity without further expansion").
    pub growth: u32,
    /// FPR ratio of successive scalable sub-filters.
    pub tightening: f64,
}

impl Config {
    /// The thesis configuration for `adds` elements.
    pub fn thesis(adds: u64) -> Self {
        Self {
            adds,
            growth: 1,
            tightening: 0.5,
        }
    }

    /// GBF 5: `m` and `k` for `adds` elements at 3.125% (k = 5), with the given hash seed.
    pub fn bloom(&self, seed: u64) -> Result<BloomParams, FilterError> {
        Ok(BloomParams::with_capacity(self.adds.max(1), THESIS_FPR)?.with_seed(seed))
    }

    /// GCF 4 / ORCF 4: one slot per element (`adds / 4` buckets of 4), 8-bit fingerprints,
    /// 500 kicks.
    pub fn cuckoo(&self, seed: u64) -> Result<CuckooParams, FilterError> {
        CuckooParams {
            buckets: (self.adds / THESIS_BUCKET_SIZE as u64).max(1),
            bucket_size: THESIS_BUCKET_SIZE,
            fingerprint_bits: THESIS_FINGERPRINT_BITS,
            max_kicks: THESIS_MAX_KICKS,
            seed,
        }
        .validated()
    }

    /// Scalable series starting at a quarter of the workload with compounded bound 3.125%.
    pub fn scalable(&self, seed: u64) -> Result<ScalableParams, FilterError> {
        ScalableParams {
            initial_capacity: (self.adds / 4).max(1),
            fpr: THESIS_FPR,
            growth: self.growth,
            tightening: self.tightening,
            bucket_size: THESIS_BUCKET_SIZE,
            max_kicks: THESIS_MAX_KICKS,
            seed,
        }
        .validated()
    }

    /// The reference line of a kind's figure: Eq. 3.1 after `inserted` elements for GBF,
    /// `2c / 2^l` for GCF and ORCF, the configured compounded bound for scalable filters.
    pub fn theory(&self, kind: Kind, inserted: u64) -> Result<f64, FilterError> {
        Ok(match kind {
            Kind::Gbf => self.bloom(0)?.fpr_after(inserted as f64),
            Kind::Gcf | Kind::Orcf => {
                2.0 * THESIS_BUCKET_SIZE as f64 / 2f64.powi(THESIS_FINGERPRINT_BITS as i32)
            }
            Kind::ScGbf | Kind::ScGcf | Kind::ScOrcf => THESIS_FPR,
        })
    }
}

/// What the harness needs of a filter: the lattice, membership, delta-states, and a couple of
/// structural counters for the CSV.
pub trait EvalFilter: Lattice + Membership + DeltaState + Clone + Send {
    /// Entries stored beyond their bucket's slots (cuckoo filters), 0 otherwise.
    fn overflow(&self) -> usize {
        0
    }
    /// Number of sub-filters (1 for non-scalable filters).
    fn sub_filters(&self) -> usize {
        1
    }
}

impl EvalFilter for GBloom {}

impl EvalFilter for GCuckoo {
    fn overflow(&self) -> usize {
        self.overflow_len()
    }
}

impl EvalFilter for OrCuckoo {
    fn overflow(&self) -> usize {
        self.overflow_len()
    }
}

impl EvalFilter for ScGBloom {
    fn sub_filters(&self) -> usize {
        ScGBloom::sub_filters(self)
    }
}

impl EvalFilter for ScGCuckoo {
    fn overflow(&self) -> usize {
        self.subs().iter().map(GCuckoo::overflow_len).sum()
    }
    fn sub_filters(&self) -> usize {
        ScGCuckoo::sub_filters(self)
    }
}

impl EvalFilter for ScOrCuckoo {
    fn sub_filters(&self) -> usize {
        ScOrCuckoo::sub_filters(self)
    }
}

impl EvalFilter for WriterScGBloom {
    fn sub_filters(&self) -> usize {
        self.parts().map(|(_, s)| s.sub_filters()).sum()
    }
}

impl EvalFilter for WriterScGCuckoo {
    fn overflow(&self) -> usize {
        self.parts().map(|(_, s)| EvalFilter::overflow(s)).sum()
    }
    fn sub_filters(&self) -> usize {
        self.parts().map(|(_, s)| s.sub_filters()).sum()
    }
}

impl EvalFilter for WriterScOrCuckoo {
    fn sub_filters(&self) -> usize {
        self.parts().map(|(_, s)| s.sub_filters()).sum()
    }
}

/// Generic code run on a variant's filter type (see [`Variant::visit`]).
pub trait VariantVisitor {
    /// What the visit returns.
    type Output;
    /// Called with a constructor of replica `r`'s initial state (`r` is the replica id of
    /// observed-remove filters and the writer id of per-writer ones).
    fn visit<F, M>(self, make: M) -> Self::Output
    where
        F: EvalFilter,
        M: Fn(ReplicaId) -> Result<F, FilterError> + Sync;
}

impl Variant {
    /// Calls the visitor with a constructor of this variant in configuration `config`, with
    /// hash seed `seed`. Adding a filter type to the evaluation is one arm here.
    pub fn visit<V: VariantVisitor>(
        &self,
        config: &Config,
        seed: u64,
        visitor: V,
    ) -> Result<V::Output, FilterError> {
        Ok(match (self.kind, self.design) {
            (Kind::Gbf, _) => {
                let p = config.bloom(seed)?;
                visitor.visit(move |_| GBloom::new(p))
            }
            (Kind::Gcf, _) => {
                let p = config.cuckoo(seed)?;
                visitor.visit(move |_| GCuckoo::new(p))
            }
            (Kind::Orcf, _) => {
                let p = config.cuckoo(seed)?;
                visitor.visit(move |r| OrCuckoo::new(p, r))
            }
            (Kind::ScGbf, Design::Thesis) => {
                let p = config.scalable(seed)?;
                visitor.visit(move |_| ScGBloom::new(p))
            }
            (Kind::ScGcf, Design::Thesis) => {
                let p = config.scalable(seed)?;
                visitor.visit(move |_| ScGCuckoo::new(p))
            }
            (Kind::ScOrcf, Design::Thesis) => {
                let p = config.scalable(seed)?;
                visitor.visit(move |r| ScOrCuckoo::new(p, r))
            }
            (Kind::ScGbf, Design::PerWriter) => {
                let p = config.scalable(seed)?;
                visitor.visit(move |w| WriterScGBloom::new(p, w))
            }
            (Kind::ScGcf, Design::PerWriter) => {
                let p = config.scalable(seed)?;
                visitor.visit(move |w| WriterScGCuckoo::new(p, w))
            }
            (Kind::ScOrcf, Design::PerWriter) => {
                let p = config.scalable(seed)?;
                visitor.visit(move |w| WriterScOrCuckoo::new(p, w))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thesis_configurations() {
        let c = Config::thesis(1 << 20);
        assert_eq!(c.bloom(1).unwrap().hashes, 5);
        let k = c.cuckoo(1).unwrap();
        assert_eq!(
            (k.buckets, k.bucket_size, k.fingerprint_bits),
            (1 << 18, 4, 8)
        );
        assert_eq!(c.scalable(1).unwrap().initial_capacity, 1 << 18);
        assert!((c.theory(Kind::Gbf, 1 << 20).unwrap() - THESIS_FPR).abs() < 1e-3);
        assert_eq!(c.theory(Kind::Gcf, 0).unwrap(), THESIS_FPR);
        assert_eq!(variants(&Kind::ALL).len(), 9);
    }
}
