//! Decompression early termination (paper §2.1, §3.2).
//!
//! A leaf page is compressed as one LZ4 stream. LZ4 rebuilds the page front to back, so
//! a GET that knows its object lives in sub-page `i` stops once sub-pages `0..=i` are
//! rebuilt: on average it decodes half a page, and a sub-page-0 object costs a sixteenth.
//! liblz4's `LZ4_decompress_safe_partial` stops at the exact byte (lz4_flex cannot), and
//! `LZ4_decompress_safe_partial_usingDict` does the same for a page compressed with a
//! dictionary (`dictionary/page.rs`).

use std::cell::RefCell;

use crate::dictionary::page::PageDictionary;

/// Compresses a whole logical page into one LZ4 block.
pub fn compress_page(page: &[u8]) -> Box<[u8]> {
    compress_behind(&[], page).into_boxed_slice()
}

/// `header` as it is, then `page` compressed into one LZ4 block, in a buffer of LZ4's
/// worst-case bound (the caller copies it to where it stays).
pub fn compress_behind(header: &[u8], page: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(header.len() + lzzzz::lz4::max_compressed_size(page.len()));
    out.extend_from_slice(header);
    // Compressing into a buffer of the worst-case bound cannot fail.
    let _ = lzzzz::lz4::compress_to_vec(page, &mut out, lzzzz::lz4::ACC_LEVEL_DEFAULT);
    out
}

/// Decompresses the first `prefix` bytes of a page of `page_size` bytes, compressed with
/// `dictionary` (or none), into `out`. Returns false if the compressed bytes are corrupt.
pub fn decompress_prefix(
    compressed: &[u8],
    page_size: usize,
    prefix: usize,
    dictionary: Option<&PageDictionary>,
    out: &mut [u8],
) -> bool {
    if let Some(dictionary) = dictionary {
        return dictionary.decompress_prefix(compressed, page_size, prefix, out);
    }
    let prefix = prefix.min(page_size);
    let Some(out) = out.get_mut(..prefix) else {
        return false;
    };
    matches!(
        lzzzz::lz4::decompress_partial(compressed, out, page_size),
        Ok(n) if n == prefix
    )
}

thread_local! {
    /// One page-sized scratch buffer per thread, so GETs never allocate to decompress.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` over the first `prefix` bytes of the decompressed page (compressed with
/// `dictionary`, or none), or over `None` if the page does not decompress.
pub fn with_prefix<R>(
    compressed: &[u8],
    page_size: usize,
    prefix: usize,
    dictionary: Option<&PageDictionary>,
    f: impl FnOnce(Option<&[u8]>) -> R,
) -> R {
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        if scratch.len() < page_size {
            scratch.resize(page_size, 0);
        }
        let prefix = prefix.min(page_size);
        if decompress_prefix(compressed, page_size, prefix, dictionary, &mut scratch) {
            f(Some(&scratch[..prefix]))
        } else {
            f(None)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prefix_matches_the_page() {
        let mut page = vec![0u8; 4096];
        for (i, b) in page.iter_mut().enumerate() {
            if i % 256 < 100 {
                *b = (i * 7 % 251) as u8;
            }
        }
        let c = compress_page(&page);
        for sub in 1..=16 {
            let prefix = sub * 256;
            with_prefix(&c, 4096, prefix, None, |p| {
                assert_eq!(p.unwrap(), &page[..prefix])
            });
        }
    }

    #[test]
    fn corrupt_pages_are_reported_not_trusted() {
        let page = vec![7u8; 4096];
        let c = compress_page(&page);
        let truncated = &c[..c.len() / 2];
        with_prefix(truncated, 4096, 4096, None, |p| assert!(p.is_none()));
    }
}
