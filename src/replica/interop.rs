//! Filters in other libraries' formats, for the import and export that `CRPF.IMPORT`,
//! `CRPF.EXPORT`, the request API's `import` and `export` and `crpf inspect --export` share:
//! today Go's `bits-and-blooms/bloom` ([`GoFormat`]), which only `go_bloom` filters speak.

use crate::core::go_bloom::GoFormat;
use crate::replica::AnyFilter;
use crate::{FilterError, FilterKind, FilterSpec};

/// What `bytes` in `format` import as: the filter, and the spec a key created for it takes
/// (its `m` and `k`). Damaged input loads nothing.
pub fn decode(format: GoFormat, bytes: &[u8]) -> Result<(FilterSpec, AnyFilter), FilterError> {
    let f = format.decode(bytes)?;
    Ok((
        FilterSpec::go_bloom(*f.params()),
        AnyFilter::GoBloom(Box::new(f)),
    ))
}

/// Whether `imported` (from [`decode`]) merges into `into`: a `go_bloom` filter of the same
/// `m` and `k`; else why not, naming both.
pub fn check_fits(into: &AnyFilter, imported: &AnyFilter) -> Result<(), FilterError> {
    match (into, imported) {
        (AnyFilter::GoBloom(mine), AnyFilter::GoBloom(theirs)) => mine.check_import(theirs),
        (mine, _) => Err(FilterError::Incompatible(format!(
            "a {} filter cannot take a bits-and-blooms import: only {} filters can",
            mine.kind(),
            FilterKind::GoBloom
        ))),
    }
}

/// What merging `imported` (from [`decode`]) into `into` changes, as a delta of `into`'s
/// kind: the bits it newly sets (with `whole`, every bit it sets), and the delta's packed
/// size (its bit indexes as the wire carries them). Refused as [`check_fits`] refuses.
pub fn import_delta(
    into: &AnyFilter,
    imported: &AnyFilter,
    whole: bool,
) -> Result<(crate::core::delta::BloomDelta, usize), FilterError> {
    check_fits(into, imported)?;
    match (into, imported) {
        (AnyFilter::GoBloom(mine), AnyFilter::GoBloom(theirs)) => {
            let delta = mine.import_delta(theirs, whole)?;
            let bytes = crate::core::compact::encode_indexes(&delta.bits).len();
            Ok((delta, bytes))
        }
        _ => unreachable!("check_fits takes go_bloom into go_bloom only"),
    }
}

/// Applies an import's delta ([`import_delta`]) to `into` as a local update: its bits join
/// the pending delta. How many were clear.
pub fn apply_import_delta(
    into: &mut AnyFilter,
    delta: &crate::core::delta::BloomDelta,
) -> Result<u64, FilterError> {
    match into {
        AnyFilter::GoBloom(mine) => mine.apply_as_local(delta),
        other => Err(FilterError::Incompatible(format!(
            "a {} filter cannot take a bits-and-blooms import: only {} filters can",
            other.kind(),
            FilterKind::GoBloom
        ))),
    }
}

/// `f` in `format`, for the kinds that have one in it (`go_bloom`).
pub fn export(f: &AnyFilter, format: GoFormat) -> Result<Vec<u8>, FilterError> {
    match f {
        AnyFilter::GoBloom(g) => Ok(format.encode(g)),
        other => Err(FilterError::Incompatible(format!(
            "a {} filter has no {format} form: only {} filters do",
            other.kind(),
            FilterKind::GoBloom
        ))),
    }
}
