//! `crpf eval`: the experiments of the thesis's chapter 6, reproduced.
//!
//! - [`fpr`]: Figure 6.1, empirical FPR of two replicas against the merge interval and the
//!   split of the workload, for the six filter types (and, for the scalable ones, the
//!   per-writer redesign [`crate::Partitioned`] beside the thesis design).
//! - [`size`]: Tables 6.1 and 6.2, serialized and gzip-compressed sizes against the set
//!   CRDTs of the `crdts` crate.
//! - [`ccf`]: the counting cuckoo filter against a counting Bloom filter ([`cbf`]), after the
//!   CCF paper's section 6 (`crpf eval ccf`).
//!
//! Filter types enter the harness through [`variant::Variant::visit`], one arm per type. Both
//! experiments are also commands of the `crpf` binary (`crpf eval fpr`, `crpf eval size`,
//! see [`cli`]); `EVALUATION.md` has the results next to the thesis's.
//!
//! ```no_run
//! use crpf::eval::fpr::{self, FprOptions};
//!
//! let report = fpr::run(&FprOptions::quick("eval-out".into()))?;
//! assert!(report.checks.iter().all(|c| c.pass));
//! # Ok::<(), crpf::eval::EvalError>(())
//! ```

// Counting cuckoo filter vs counting Bloom filter (issue 11).
pub mod cbf;
pub mod ccf;
pub mod cli;
mod error;
pub mod fpr;
mod par;
pub mod plot;
pub mod size;
pub mod variant;
pub mod workload;

pub use cli::{EvalArgs, run};
pub use error::EvalError;
