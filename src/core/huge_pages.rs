//! Huge pages for the large arrays of a filter. A query or add touches a random cache line of
//! a table of tens of megabytes; on 4 KiB pages each touch also misses the TLB, and a page walk
//! (two-dimensional under a hypervisor) costs about what the cache miss does. On 2 MiB pages
//! the TLB covers the whole table: `cuckoo madd` into a 63 MB table went from about 2.0 to 2.7
//! M items/s (CHANGELOG.md, benchmark history). Only a hint: without transparent huge pages
//! in the kernel, or off Linux, nothing changes.

/// Arrays smaller than this stay as they are: a few huge pages gain little and every array
/// rounds its resident size up to whole huge pages once touched.
const MIN_BYTES: usize = 4 << 20;

/// Asks the kernel to back `data` with transparent huge pages (`MADV_HUGEPAGE`). Pages not yet
/// touched (a fresh zeroed allocation) become huge pages when first written; touched ones when
/// the kernel's `khugepaged` gets to them.
pub(crate) fn advise<T>(data: &[T]) {
    let bytes = std::mem::size_of_val(data);
    if bytes < MIN_BYTES {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `sysconf` only reads a constant. The range lies within `data`'s live
        // allocation, page-aligned inward. MADV_HUGEPAGE changes how the range is backed,
        // never what it holds, so no reference into it is affected. A failure (a kernel
        // without transparent huge pages) only means the hint is not taken.
        unsafe {
            let page = usize::try_from(libc::sysconf(libc::_SC_PAGESIZE))
                .ok()
                .filter(|&p| p > 0)
                .unwrap_or(4096);
            let start = (data.as_ptr() as usize).next_multiple_of(page);
            let end = (data.as_ptr() as usize + bytes) / page * page;
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

/// A zeroed vector, on huge pages where it is large (see [`advise`]). Zeroed by the allocator:
/// fresh pages from the kernel are not touched before they are first written.
pub(crate) fn zeroed_vec<T: bytemuck::Zeroable + Clone>(len: usize) -> Vec<T> {
    let v = bytemuck::zeroed_vec(len);
    advise(&v);
    v
}

/// [`zeroed_vec`] as a boxed slice.
pub(crate) fn zeroed_box<T: bytemuck::Zeroable>(len: usize) -> Box<[T]> {
    let b = bytemuck::zeroed_slice_box(len);
    advise(&b);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_zeroed_vector_is_zeroed_and_writable_end_to_end() {
        let mut v: Vec<u16> = zeroed_vec((MIN_BYTES / 2) * 3 + 7);
        assert!(v.iter().all(|&x| x == 0));
        let n = v.len();
        v[0] = 1;
        v[n - 1] = 2;
        assert_eq!((v[0], v[n / 2], v[n - 1]), (1, 0, 2));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_huge_array_is_marked_for_huge_pages_where_the_kernel_has_them() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !thp.contains("[madvise]") && !thp.contains("[always]") {
            return;
        }
        let b: Box<[std::sync::atomic::AtomicU64]> = zeroed_box(MIN_BYTES / 8 * 4);
        let start = b.as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        // The mapping holding the array's middle is flagged `hg` (VM_HUGEPAGE).
        let middle = start + MIN_BYTES * 2;
        let mut lines = smaps.lines();
        let mut flagged = None;
        while let Some(line) = lines.next() {
            let Some((range, _)) = line.split_once(' ') else {
                continue;
            };
            let Some((lo, hi)) = range.split_once('-') else {
                continue;
            };
            let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            else {
                continue;
            };
            if (lo..hi).contains(&middle) {
                flagged = lines
                    .by_ref()
                    .find(|l| l.starts_with("VmFlags:"))
                    .map(|l| l.split_whitespace().any(|f| f == "hg"));
                break;
            }
        }
        assert_eq!(flagged, Some(true), "array at {start:#x} not advised");
    }
}
