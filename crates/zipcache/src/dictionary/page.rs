//! LZ4 dictionaries for tiny-object pages (issue 21, item 2).
//!
//! A DRAM leaf page is one LZ4 block of records of 128 bytes or less; it starts from an
//! empty window, so the first occurrence of every field name, every common word and
//! every key prefix is a literal. A dictionary is a prefix of recent records that LZ4
//! may match against as if it came before the page. The GET path keeps early
//! termination: `LZ4_decompress_safe_partial_usingDict` rebuilds the page only through
//! the key's sub-page, with the dictionary as the history the matches reach into.
//!
//! A [`PageDictionary`] is the raw prefix (at most 64 KiB: LZ4's window) and the prepared
//! compression state liblz4 builds from it once (`LZ4_loadDictSlow`: a hash table of
//! every position), which every compression then references without a copy
//! (`LZ4_attach_dictionary`). It is named by a 32-bit version that every page compressed
//! with it carries, and charged to the DRAM budget while it lives: while the engine holds
//! it as its current one, or any leaf whose page was compressed with it.
//!
//! LZ4 has no checksum: a page decoded with another dictionary than its own would give
//! wrong bytes. So a page names its dictionary's version, and a reader refuses a page
//! whose version is not the one of the dictionary its leaf holds (a miss, never data).
//! The version hashes the dictionary's bytes and its generation, so two dictionaries
//! of one run share one only by a 32-bit collision.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use crate::memory::{Memory, alloc_size};

/// The most history an LZ4 match reaches back: dictionary bytes beyond it are useless.
pub const MAX_PAGE_DICTIONARY: usize = 64 << 10;

/// Bytes of an `LZ4_stream_t` (`LZ4_STREAM_MINSIZE` of liblz4 1.10 at its default
/// `LZ4_MEMORY_USAGE` of 14), in 8-byte words for its alignment.
const STREAM_WORDS: usize = ((1 << 14) + 32) / 8;

/// An `LZ4_stream_t`, owned by Rust and initialised by `LZ4_initStream`.
#[repr(C, align(8))]
struct Stream([u64; STREAM_WORDS]);

// liblz4 1.10, bundled and linked by the `lzzzz` crate (one copy of the C library in the
// binary); `lzzzz` does not expose the no-copy dictionary attachment, so these are
// declared here as liblz4's `lz4.h` declares them.
unsafe extern "C" {
    fn LZ4_initStream(buffer: *mut c_void, size: usize) -> *mut c_void;
    fn LZ4_loadDictSlow(stream: *mut c_void, dictionary: *const c_char, size: c_int) -> c_int;
    fn LZ4_resetStream_fast(stream: *mut c_void);
    fn LZ4_attach_dictionary(working: *mut c_void, dictionary: *const c_void);
    fn LZ4_compress_fast_continue(
        stream: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
    fn LZ4_compressBound(input_size: c_int) -> c_int;
}

impl Stream {
    /// A zeroed, initialised stream; `None` if liblz4 refuses it (it checks size and
    /// alignment).
    fn new() -> Option<Box<Stream>> {
        let mut stream = Box::new(Stream([0; STREAM_WORDS]));
        // SAFETY: the buffer is `size_of::<Stream>()` bytes, 8-aligned, owned by the box
        // and not otherwise borrowed; liblz4 only writes within it and returns null if
        // size or alignment does not suit (checked).
        let init = unsafe { LZ4_initStream(stream.as_mut_ptr(), size_of::<Stream>()) };
        (!init.is_null()).then_some(stream)
    }

    fn as_mut_ptr(&mut self) -> *mut c_void {
        self.0.as_mut_ptr().cast()
    }

    fn as_ptr(&self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// An LZ4 dictionary for pages, loaded into its compression state.
pub struct PageDictionary {
    version: u32,
    /// The raw prefix; boxed, so its address (which `stream` keeps) never moves.
    bytes: Box<[u8]>,
    /// Loaded from `bytes` once, then only read (every compression attaches it).
    stream: Box<Stream>,
    charge: i64,
    memory: Arc<Memory>,
}

impl std::fmt::Debug for PageDictionary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageDictionary")
            .field("version", &self.version)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

thread_local! {
    /// This thread's working stream: reset and given a dictionary for each page.
    static WORKING: RefCell<Option<Box<Stream>>> = const { RefCell::new(None) };
}

impl PageDictionary {
    /// The dictionary of `raw` (its last 64 KiB), generation `generation` of the run,
    /// charged to `memory`. `None` if `raw` is empty or liblz4 cannot take it.
    pub fn prepare(
        generation: u64,
        raw: &[u8],
        memory: Arc<Memory>,
    ) -> Option<Arc<PageDictionary>> {
        let raw = &raw[raw.len().saturating_sub(MAX_PAGE_DICTIONARY)..];
        if raw.is_empty() {
            return None;
        }
        let bytes: Box<[u8]> = raw.into();
        let mut stream = Stream::new()?;
        // SAFETY: `stream` is an initialised `LZ4_stream_t`; `bytes` is a live buffer of
        // `bytes.len()` (≤ 64 KiB, fits a c_int) bytes. liblz4 keeps a pointer to
        // `bytes` in the stream: the box's heap buffer never moves or changes and lives
        // exactly as long as the stream, both owned by this dictionary.
        let loaded = unsafe {
            LZ4_loadDictSlow(
                stream.as_mut_ptr(),
                bytes.as_ptr().cast(),
                bytes.len() as c_int,
            )
        };
        if loaded <= 0 {
            return None;
        }
        let version = (xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, generation) as u32).max(1);
        let charge = (alloc_size(bytes.len())
            + alloc_size(size_of::<Stream>())
            + alloc_size(size_of::<PageDictionary>())) as i64;
        memory.change_dictionaries(charge);
        Some(Arc::new(PageDictionary {
            version,
            bytes,
            stream,
            charge,
            memory,
        }))
    }

    /// The name pages compressed with it carry (never 0, which names none).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// What it is charged while it lives.
    #[cfg(test)]
    pub fn charge(&self) -> i64 {
        self.charge
    }

    /// The raw prefix, the history a page's matches reach into.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Appends `src` compressed into one LZ4 block with this dictionary to `out`;
    /// `None` if liblz4 fails (it cannot, into a buffer of its bound) or `src` is too
    /// large for it.
    pub fn compress_into(&self, src: &[u8], out: &mut Vec<u8>) -> Option<usize> {
        let len = c_int::try_from(src.len()).ok()?;
        // SAFETY: a pure function of its argument.
        let bound = unsafe { LZ4_compressBound(len) };
        let bound = usize::try_from(bound).ok().filter(|&b| b > 0)?;
        WORKING.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = Some(Stream::new()?);
            }
            let working = cell.as_mut()?;
            out.reserve(bound);
            let start = out.len();
            // SAFETY: `working` is this thread's initialised stream, borrowed mutably
            // here alone; `self.stream` was loaded by `LZ4_loadDictSlow` and is only
            // read, by any number of threads at once (liblz4 takes it `const`), and it
            // and the bytes it points into outlive the call (`&self`). The destination
            // is the vector's spare capacity, `bound` bytes past `start` (reserved just
            // above), and liblz4 writes at most `bound` bytes into it; the source is
            // `len` bytes of `src`. The working stream is reset first, and detached
            // after, so it never keeps a pointer to the dictionary or the source past
            // this block.
            let written = unsafe {
                LZ4_resetStream_fast(working.as_mut_ptr());
                LZ4_attach_dictionary(working.as_mut_ptr(), self.stream.as_ptr());
                let n = LZ4_compress_fast_continue(
                    working.as_mut_ptr(),
                    src.as_ptr().cast(),
                    out.as_mut_ptr().add(start).cast(),
                    len,
                    bound as c_int,
                    1,
                );
                LZ4_attach_dictionary(working.as_mut_ptr(), std::ptr::null());
                LZ4_resetStream_fast(working.as_mut_ptr());
                n
            };
            let written = usize::try_from(written)
                .ok()
                .filter(|&n| n > 0 && n <= bound)?;
            // SAFETY: liblz4 initialised the `written` bytes after `start` (checked
            // against the capacity reserved above).
            unsafe { out.set_len(start + written) };
            Some(written)
        })
    }

    /// Decompresses the first `prefix` bytes of a page body of `page_size` bytes,
    /// compressed with this dictionary, into `out`; false if the block is damaged (it
    /// does not decode to exactly that many bytes within its bounds).
    pub fn decompress_prefix(
        &self,
        compressed: &[u8],
        page_size: usize,
        prefix: usize,
        out: &mut [u8],
    ) -> bool {
        let prefix = prefix.min(page_size);
        let Some(out) = out.get_mut(..prefix) else {
            return false;
        };
        matches!(
            lzzzz::lz4::decompress_partial_with_dict(compressed, out, page_size, &self.bytes),
            Ok(n) if n == prefix
        )
    }
}

impl Drop for PageDictionary {
    fn drop(&mut self) {
        self.memory.change_dictionaries(-self.charge);
    }
}

/// A text record like a row of `airports` (about 60 bytes), drawn from `seed`: what a
/// page dictionary shrinks, for the tests and the benchmarks (`internals`).
pub fn text_record(seed: u64) -> Vec<u8> {
    const CITIES: [&str; 5] = ["Anchorage", "Boise", "Chicago", "Denver", "El Paso"];
    let n = crate::dictionary::training::mix(seed);
    format!(
        "K{:05},\"{} Municipal\",\"{}\",\"USA\",{}.{:04},-{}.{:04}\n",
        n % 99_999,
        CITIES[(n % 5) as usize],
        CITIES[(n / 7 % 5) as usize],
        30 + n % 30,
        n % 10_000,
        80 + n % 40,
        n / 13 % 10_000
    )
    .into_bytes()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `count` text records of one shape: what a dictionary of their kind shrinks.
    pub(crate) fn text_records(seed: u64, count: usize) -> Vec<u8> {
        (0..count as u64)
            .flat_map(|i| text_record(seed ^ i.wrapping_mul(0x9e37)))
            .collect()
    }

    fn dictionary(generation: u64, seed: u64) -> Arc<PageDictionary> {
        let raw = text_records(seed, 600);
        PageDictionary::prepare(generation, &raw, Arc::new(Memory::default())).unwrap()
    }

    #[test]
    fn a_page_round_trips_and_shrinks_with_its_dictionary() {
        let memory = Arc::new(Memory::default());
        let d = PageDictionary::prepare(1, &text_records(1, 600), memory.clone()).unwrap();
        assert!(memory.snapshot().dictionaries > 16 << 10, "charged");
        let page = text_records(2, 50);
        let mut with = Vec::new();
        d.compress_into(&page, &mut with).unwrap();
        let without = crate::dram::early_termination::compress_page(&page);
        assert!(
            with.len() < without.len() * 9 / 10,
            "{} with, {} without",
            with.len(),
            without.len()
        );
        let mut out = vec![0u8; page.len()];
        assert!(d.decompress_prefix(&with, page.len(), page.len(), &mut out));
        assert_eq!(out, page);
        drop(d);
        assert_eq!(memory.snapshot().dictionaries, 0, "uncharged");
    }

    /// Early termination with a dictionary: every prefix decodes to the page's own bytes,
    /// and decoding one costs no more of the page than asked.
    #[test]
    fn every_prefix_decodes_with_the_dictionary() {
        let d = dictionary(1, 1);
        let page = text_records(3, 60);
        let mut c = Vec::new();
        d.compress_into(&page, &mut c).unwrap();
        for prefix in [0, 1, 17, 256, page.len() / 2, page.len() - 1, page.len()] {
            let mut out = vec![0u8; page.len()];
            assert!(
                d.decompress_prefix(&c, page.len(), prefix, &mut out),
                "{prefix}"
            );
            assert_eq!(&out[..prefix], &page[..prefix]);
        }
    }

    /// A block decoded with another dictionary, none, or cut short is refused or differs;
    /// the version tells the dictionaries apart so that a reader never tries.
    #[test]
    fn versions_differ_and_damage_is_refused() {
        let (a, b, a_again) = (dictionary(1, 1), dictionary(2, 9), dictionary(3, 1));
        assert_ne!(a.version(), b.version());
        assert_ne!(
            a.version(),
            a_again.version(),
            "same bytes, other generation"
        );
        let page = text_records(4, 50);
        let mut c = Vec::new();
        a.compress_into(&page, &mut c).unwrap();
        let mut out = vec![0u8; page.len()];
        assert!(!a.decompress_prefix(&c[..c.len() / 2], page.len(), page.len(), &mut out));
        // Without its dictionary the block reaches before its start: refused.
        assert!(
            lzzzz::lz4::decompress_partial(&c, &mut out, page.len()).is_err(),
            "decodes without its dictionary"
        );
        // With another one it may decode, to other bytes: hence the version check.
        let decoded = b.decompress_prefix(&c, page.len(), page.len(), &mut out);
        assert!(!decoded || out != page);
    }

    #[test]
    fn only_the_last_64_kib_are_kept() {
        let raw = text_records(5, 3000);
        assert!(raw.len() > MAX_PAGE_DICTIONARY);
        let d = PageDictionary::prepare(1, &raw, Arc::new(Memory::default())).unwrap();
        assert_eq!(d.bytes(), &raw[raw.len() - MAX_PAGE_DICTIONARY..]);
        assert!(PageDictionary::prepare(1, &[], Arc::new(Memory::default())).is_none());
    }

    #[test]
    fn threads_share_one_dictionary() {
        let d = dictionary(1, 1);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let d = &d;
                s.spawn(move || {
                    for i in 0..200 {
                        let page = text_records(t * 1000 + i, 40);
                        let mut c = Vec::new();
                        d.compress_into(&page, &mut c).unwrap();
                        let mut out = vec![0u8; page.len()];
                        assert!(d.decompress_prefix(&c, page.len(), page.len(), &mut out));
                        assert_eq!(out, page);
                    }
                });
            }
        });
    }
}
