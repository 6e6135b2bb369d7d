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
