//! Decompression early termination (paper §2.1, §3.2), and a page body in chunks.
//!
//! LZ4 rebuilds a block front to back, so a GET that knows its object lives in sub-page
//! `i` stops once the bytes through sub-page `i` are rebuilt (liblz4's
//! `LZ4_decompress_safe_partial` stops at the exact byte; lz4_flex cannot;
//! `LZ4_decompress_safe_partial_usingDict` does the same for a page compressed with a
//! dictionary, `dictionary/page.rs`). The paper compresses a page as one block, so a GET
//! decodes half a page on average. Here a body is compressed as `page_chunks` blocks,
//! each of a run of whole sub-pages and independent of the others (the page dictionary,
//! where the page names one, is each block's history): a GET decodes only its
//! sub-page's chunk, through its sub-page: of a 16-sub-page page, about a quarter on
//! average in two chunks (the default), a sixth in four, instead of a half. Each block
//! starts without the records of the chunks before it, which costs some ratio: the
//! setting trades it (docs/history/RESULTS-HISTORY.md, "A page in chunks").
//!
//! ```text
//! compressed body := chunk_end[0] .. chunk_end[k-2]  (u16 LE each; u32 LE when a block of
//!                                                     the whole body could pass 65,535 bytes)
//!                    block 0 | block 1 | ... | block k-1
//! ```
//! `chunk_end[c]` is where block `c` ends, counted from block 0's start; the last ends with
//! the body. Block `c` is the LZ4 of chunk `c`'s bytes (a chunk of no bytes: no block). One
//! chunk is one block and no table: the paper's page.

use std::cell::RefCell;
use std::ops::Range;

use crate::dictionary::page::PageDictionary;
use crate::format::page::end_width;

/// Most chunks a body is compressed in.
pub const MAX_CHUNKS: usize = 16;

/// Where each chunk of a body ends, uncompressed: the last at the body's end.
#[derive(Clone, Copy, Debug)]
pub struct Chunks {
    ends: [usize; MAX_CHUNKS],
    count: usize,
}

impl Chunks {
    /// Chunks ending at `ends`; `None` if there are none, more than [`MAX_CHUNKS`], or
    /// one ends before the one before it.
    pub fn new(ends: impl IntoIterator<Item = usize>) -> Option<Chunks> {
        let mut chunks = Chunks {
            ends: [0; MAX_CHUNKS],
            count: 0,
        };
        let mut last = 0;
        for end in ends {
            if end < last {
                return None;
            }
            *chunks.ends.get_mut(chunks.count)? = end;
            chunks.count += 1;
            last = end;
        }
        (chunks.count > 0).then_some(chunks)
    }

    /// One chunk: the whole body of `len` bytes.
    pub fn whole(len: usize) -> Chunks {
        Chunks::new([len]).expect("one chunk")
    }

    fn span(&self, c: usize) -> Range<usize> {
        let start = if c == 0 { 0 } else { self.ends[c - 1] };
        start..self.ends[c]
    }

    fn body_len(&self) -> usize {
        self.ends[self.count - 1]
    }

    /// Bytes of one entry of the table in front of the blocks: wide enough for every
    /// block at LZ4's worst case (the body's, and a block's fixed overhead for each).
    fn width(&self) -> usize {
        end_width(lzzzz::lz4::max_compressed_size(self.body_len()) + 16 * self.count)
    }
}

/// Compresses a whole logical page into one LZ4 block.
pub fn compress_page(page: &[u8]) -> Box<[u8]> {
    let mut out = Vec::new();
    compress_block(page, None, &mut out);
    out.into_boxed_slice()
}

/// Appends `src` as one LZ4 block (with `dictionary` as its history, if any) to `out`;
/// false if liblz4 failed.
fn compress_block(src: &[u8], dictionary: Option<&PageDictionary>, out: &mut Vec<u8>) -> bool {
    match dictionary {
        Some(dictionary) => dictionary.compress_into(src, out).is_some(),
        // Appends, into room for LZ4's worst case: cannot fail.
        None => lzzzz::lz4::compress_to_vec(src, out, lzzzz::lz4::ACC_LEVEL_DEFAULT).is_ok(),
    }
}

/// Appends `body` compressed in `chunks` (each block with `dictionary` as its history,
/// if any) to `out`, behind what `out` holds; false, `out` as it was, if liblz4 failed
/// or the chunks are not `body`'s.
pub fn compress_chunks(
    body: &[u8],
    chunks: &Chunks,
    dictionary: Option<&PageDictionary>,
    out: &mut Vec<u8>,
) -> bool {
    let table = out.len();
    let done = chunks.body_len() == body.len() && {
        let width = chunks.width();
        out.resize(table + width * (chunks.count - 1), 0);
        let blocks = out.len();
        (0..chunks.count).all(|c| {
            let Some(span) = body.get(chunks.span(c)) else {
                return false;
            };
            if !span.is_empty() && !compress_block(span, dictionary, out) {
                return false;
            }
            let end = (out.len() - blocks) as u64;
            if c + 1 < chunks.count {
                out[table + c * width..][..width].copy_from_slice(&end.to_le_bytes()[..width]);
            }
            end < 1 << (8 * width)
        })
    };
    if !done {
        out.truncate(table);
    }
    done
}

/// Decodes `want`, a range of a body compressed in `chunks` (with `dictionary`, or none),
/// into the same range of `out`: each chunk it touches from that chunk's start, the chunks
/// it does not touch not at all (so the rest of `out` is left as it was). False if the
/// compressed bytes are damaged: a table out of order or past the end, or a block that
/// does not decode to its chunk.
pub fn decode_span(
    compressed: &[u8],
    chunks: &Chunks,
    want: Range<usize>,
    dictionary: Option<&PageDictionary>,
    out: &mut [u8],
) -> bool {
    if want.end > chunks.body_len() || out.len() < want.end {
        return false;
    }
    if want.is_empty() {
        return true;
    }
    let width = chunks.width();
    let Some((table, blocks)) = compressed.split_at_checked(width * (chunks.count - 1)) else {
        return false;
    };
    let block_end = |c: usize| match c + 1 == chunks.count {
        true => blocks.len(),
        false => {
            let mut end = [0u8; 4];
            end[..width].copy_from_slice(&table[c * width..][..width]);
            u32::from_le_bytes(end) as usize
        }
    };
    let mut block_start = 0;
    for c in 0..chunks.count {
        let end = block_end(c);
        let span = chunks.span(c);
        let Some(block) = blocks.get(block_start..end) else {
            return false;
        };
        block_start = end;
        if span.is_empty() != block.is_empty() {
            return false;
        }
        if span.end <= want.start || span.start >= want.end {
            continue;
        }
        let through = want.end.min(span.end) - span.start;
        if !decompress_prefix(
            block,
            span.len(),
            through,
            dictionary,
            &mut out[span.start..],
        ) {
            return false;
        }
    }
    true
}

/// Decompresses the first `prefix` bytes of one block of `page_size` bytes, compressed
/// with `dictionary` (or none), into `out`. Returns false if the compressed bytes are
/// corrupt.
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

/// Runs `f` over bytes `want` of a body compressed in `chunks` (with `dictionary`, or
/// none), decoded through early termination, or over `None` if they do not decode.
pub fn with_span<R>(
    compressed: &[u8],
    chunks: &Chunks,
    want: Range<usize>,
    dictionary: Option<&PageDictionary>,
    f: impl FnOnce(Option<&[u8]>) -> R,
) -> R {
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        let len = chunks.body_len();
        if scratch.len() < len {
            scratch.resize(len, 0);
        }
        match decode_span(compressed, chunks, want.clone(), dictionary, &mut scratch) {
            true => f(scratch.get(want)),
            false => f(None),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::dictionary::page::tests::text_records;
    use crate::memory::Memory;

    /// A body of text records (what a dictionary shrinks) with runs of random bytes.
    fn body(seed: u64, len: usize) -> Vec<u8> {
        let mut body = text_records(seed, len / 40 + 1);
        body.truncate(len);
        for (i, b) in body.iter_mut().enumerate() {
            if (i / 97) % 5 == 3 {
                *b = crate::dictionary::training::mix(seed ^ i as u64) as u8;
            }
        }
        body
    }

    fn dictionary() -> Arc<PageDictionary> {
        PageDictionary::prepare(1, &text_records(99, 600), Arc::new(Memory::default())).unwrap()
    }

    /// Chunk ends cut from `cuts` (positions as fractions of `len`), sorted: empty chunks
    /// included.
    fn chunks_of(len: usize, cuts: &[u16]) -> Chunks {
        let mut ends: Vec<usize> = cuts.iter().map(|&c| len * c as usize / 1000).collect();
        ends.sort_unstable();
        ends.push(len);
        Chunks::new(ends).unwrap()
    }

    /// Ends out of order are no chunks.
    #[test]
    fn chunks_end_in_order() {
        assert!(Chunks::new([10, 5]).is_none());
        assert!(Chunks::new([]).is_none());
        assert!(Chunks::new([1; MAX_CHUNKS + 1]).is_none());
        assert!(Chunks::new([0, 0, 7]).is_some());
    }

    proptest! {
        /// Any range of a body decodes to the body's bytes, through any chunking (empty
        /// chunks among them), with a dictionary or without; out of what it decodes —
        /// from the start of the first chunk it touches to its end — `out` is untouched.
        #[test]
        fn every_span_decodes_as_the_body(
            seed in any::<u64>(),
            len in 0usize..4500,
            cuts in proptest::collection::vec(0u16..=1000, 0..MAX_CHUNKS),
            from in 0usize..=1000,
            width in 0usize..=1000,
            with_dictionary in any::<bool>(),
        ) {
            let body = body(seed, len);
            let chunks = chunks_of(len, &cuts);
            let dictionary = with_dictionary.then(dictionary);
            let mut compressed = vec![7u8; 3];
            prop_assert!(compress_chunks(&body, &chunks, dictionary.as_deref(), &mut compressed));
            prop_assert_eq!(&compressed[..3], &[7u8; 3][..], "appended behind what was there");
            let compressed = &compressed[3..];
            let start = len * from / 1000;
            let want = start..(start + len * width / 1000).min(len);
            let mut out = vec![0xa5u8; len];
            prop_assert!(decode_span(compressed, &chunks, want.clone(), dictionary.as_deref(), &mut out));
            prop_assert_eq!(&out[want.clone()], &body[want.clone()]);
            let first = (0..chunks.count)
                .map(|c| chunks.span(c))
                .find(|s| s.end > want.start && !s.is_empty())
                .map_or(want.start, |s| s.start);
            let touched = if want.is_empty() { want.clone() } else { first..want.end };
            prop_assert!(out.iter().enumerate().all(|(i, &b)| touched.contains(&i) || b == 0xa5));
            with_span(compressed, &chunks, want.clone(), dictionary.as_deref(), |span| {
                assert_eq!(span, Some(&body[want.clone()]));
            });
        }
    }

    /// One chunk is the paper's page: one LZ4 block, no table.
    #[test]
    fn one_chunk_is_one_block() {
        let body = body(1, 4096);
        let mut chunked = Vec::new();
        assert!(compress_chunks(
            &body,
            &Chunks::whole(4096),
            None,
            &mut chunked
        ));
        assert_eq!(*chunked, *compress_page(&body));
    }

    /// A GET of a sub-page decodes its chunk only: a chunk before it that is damaged
    /// past decoding does not stop it, and the whole body does not decode.
    #[test]
    fn a_span_decodes_its_chunk_alone() {
        let body = body(2, 4096);
        let chunks = Chunks::new([1024, 2048, 3072, 4096]).unwrap();
        let mut compressed = Vec::new();
        assert!(compress_chunks(&body, &chunks, None, &mut compressed));
        let table = 2 * 3;
        let second = usize::from(u16::from_le_bytes([compressed[0], compressed[1]]));
        // Block 0 zeroed (a token of 0 literals, no match: not a block of 1,024 bytes).
        compressed[table..table + second].fill(0);
        let mut out = vec![0u8; 4096];
        assert!(decode_span(
            &compressed,
            &chunks,
            2100..2200,
            None,
            &mut out
        ));
        assert_eq!(out[2100..2200], body[2100..2200]);
        assert!(!decode_span(&compressed, &chunks, 0..4096, None, &mut out));
    }

    /// A table out of order or past the end, a block where a chunk is empty (or none where
    /// it is not), a body cut short, a range past the body: refused, never a panic.
    #[test]
    fn damaged_chunk_tables_are_refused() {
        let body = body(3, 4000);
        let chunks = Chunks::new([1000, 1000, 3000, 4000]).unwrap();
        let mut good = Vec::new();
        assert!(compress_chunks(&body, &chunks, None, &mut good));
        let end = |c: &[u8], i: usize| u16::from_le_bytes([c[2 * i], c[2 * i + 1]]);
        assert_eq!(end(&good, 0), end(&good, 1), "the empty chunk has no block");
        let mut out = vec![0u8; 4000];
        assert!(decode_span(&good, &chunks, 0..4000, None, &mut out));
        assert_eq!(out, body);
        let with_end = |i: usize, value: u16| {
            let mut c = good.clone();
            c[2 * i..2 * i + 2].copy_from_slice(&value.to_le_bytes());
            c
        };
        let damaged = [
            ("past the end", with_end(2, u16::MAX)),
            ("out of order", with_end(1, end(&good, 0) - 1)),
            (
                "a block for the empty chunk",
                with_end(1, end(&good, 0) + 1),
            ),
            ("cut short", good[..good.len() - 5].to_vec()),
            ("no table", good[..3].to_vec()),
        ];
        for (what, compressed) in damaged {
            let mut out = vec![0u8; 4000];
            assert!(
                !decode_span(&compressed, &chunks, 0..4000, None, &mut out),
                "{what}"
            );
        }
        assert!(
            !decode_span(&good, &chunks, 3990..4001, None, &mut out),
            "past the body"
        );
        let mut short = vec![0u8; 100];
        assert!(
            !decode_span(&good, &chunks, 0..200, None, &mut short),
            "out too short"
        );
        // The last chunk empty: bytes behind the blocks would be its block.
        let last_empty = Chunks::new([1000, 3000, 4000, 4000]).unwrap();
        let mut trailing = Vec::new();
        assert!(compress_chunks(&body, &last_empty, None, &mut trailing));
        assert!(decode_span(&trailing, &last_empty, 0..4000, None, &mut out));
        trailing.push(0);
        assert!(
            !decode_span(&trailing, &last_empty, 0..4000, None, &mut out),
            "bytes behind"
        );
        let mut wrong = Vec::new();
        assert!(
            !compress_chunks(&body[..3999], &chunks, None, &mut wrong),
            "chunks of another body"
        );
        assert!(wrong.is_empty());
    }
}
