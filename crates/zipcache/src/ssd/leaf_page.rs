//! The hash-partitioned leaf page (paper Fig. 5 and Fig. 6): a page of `n` equal
//! sub-pages; an object goes to sub-page `hash(key) mod n`; each sub-page is a run of
//! records ended by a zero byte or by its end; unused bytes are zeros.
//!
//! BT_DRAM pages (4 KiB, 16 × 256 B, sub-page by `f`) and BT_SSD super-leaves
//! (m × 4 KiB, sub-page by `g`) share this layout with different geometry and hash.

use crate::record::{Record, records};

#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub subpages: usize,
    pub subpage_size: usize,
    /// Bytes of each sub-page records may fill (under-filling, paper §3.3); the DRAM tier
    /// fills sub-pages to the brim.
    pub fill_limit: usize,
    pub hash: fn(&[u8], usize) -> usize,
}

impl Geometry {
    pub fn page_size(&self) -> usize {
        self.subpages * self.subpage_size
    }

    pub fn subpage_of(&self, key: &[u8]) -> usize {
        (self.hash)(key, self.subpages)
    }

    /// Whether records of these `(key, encoded length)` fit without a sub-page overflowing.
    pub fn fits<'k>(&self, records: impl IntoIterator<Item = (&'k [u8], usize)>) -> bool {
        let placed: Vec<(usize, usize)> = records
            .into_iter()
            .map(|(key, len)| (self.subpage_of(key), len))
            .collect();
        self.fitting_prefix(&placed) == placed.len()
    }

    /// How many of these records, `(sub-page, encoded length)` from the first, fit
    /// before a sub-page would overflow. Callers that test many runs of the same records
    /// place them once (a hash each) and ask this.
    pub fn fitting_prefix(&self, placed: &[(usize, usize)]) -> usize {
        let mut fill = vec![0usize; self.subpages];
        placed
            .iter()
            .take_while(|&&(s, len)| {
                fill[s] += len;
                fill[s] <= self.fill_limit
            })
            .count()
    }

    /// Lays `records` out into a zero-padded page; `None` if a sub-page overflows.
    pub fn build<'a>(&self, records: impl IntoIterator<Item = &'a Record<'a>>) -> Option<Vec<u8>> {
        let mut subpages: Vec<Vec<u8>> = vec![Vec::new(); self.subpages];
        for r in records {
            let buf = &mut subpages[self.subpage_of(r.key)];
            r.encode(buf);
            if buf.len() > self.fill_limit {
                return None;
            }
        }
        let mut page = vec![0u8; self.page_size()];
        for (i, sub) in subpages.iter().enumerate() {
            page[i * self.subpage_size..][..sub.len()].copy_from_slice(sub);
        }
        Some(page)
    }

    /// Bytes of the page, from its start, that hold `key`'s sub-page.
    pub fn prefix_for(&self, key: &[u8]) -> usize {
        (self.subpage_of(key) + 1) * self.subpage_size
    }

    /// The record of `key` in a page (or a prefix of one that covers its sub-page).
    pub fn find<'p>(&self, page: &'p [u8], key: &[u8]) -> Option<Record<'p>> {
        let s = self.subpage_of(key);
        let sub = page.get(s * self.subpage_size..(s + 1) * self.subpage_size)?;
        records(sub).find(|r| r.key == key)
    }

    /// Every record of a page, sub-page by sub-page.
    pub fn all<'p>(&self, page: &'p [u8]) -> impl Iterator<Item = Record<'p>> {
        page.chunks(self.subpage_size)
            .take(self.subpages)
            .flat_map(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Meta, Payload};
    use crate::subpage_hash::dram_subpage;

    fn geometry() -> Geometry {
        Geometry {
            subpages: 16,
            subpage_size: 256,
            fill_limit: 256,
            hash: dram_subpage,
        }
    }

    #[test]
    fn built_pages_find_every_record_in_its_subpage() {
        let g = geometry();
        let keys: Vec<String> = (0..20).map(|i| format!("{i:016}")).collect();
        let recs: Vec<Record> = keys
            .iter()
            .map(|k| Record {
                key: k.as_bytes(),
                payload: Payload::Inline(b"value"),
                meta: Meta::default(),
            })
            .collect();
        let page = g.build(&recs).unwrap();
        assert_eq!(page.len(), 4096);
        for r in &recs {
            assert_eq!(g.find(&page, r.key), Some(*r));
            assert_eq!(g.find(&page[..g.prefix_for(r.key)], r.key), Some(*r));
        }
        assert_eq!(g.all(&page).count(), 20);
        assert!(g.find(&page, b"absent").is_none());
    }

    #[test]
    fn overflow_is_detected() {
        let g = Geometry {
            fill_limit: 100,
            ..geometry()
        };
        let v = [1u8; 90];
        let keys: Vec<[u8; 1]> = (0..40u8).map(|i| [i]).collect();
        let recs: Vec<Record> = keys
            .iter()
            .map(|k| Record {
                key: k,
                payload: Payload::Inline(&v),
                meta: Meta::default(),
            })
            .collect();
        assert!(!g.fits(recs.iter().map(|r| (r.key, r.encoded_len()))));
        assert!(g.fits(recs[..1].iter().map(|r| (r.key, r.encoded_len()))));
        assert!(g.build(&recs).is_none());
    }

    #[test]
    fn the_fitting_prefix_is_the_longest_run_that_builds() {
        let g = Geometry {
            fill_limit: 120,
            ..geometry()
        };
        let keys: Vec<String> = (0..200).map(|i| format!("key-{i}")).collect();
        let values: Vec<Vec<u8>> = (0..200).map(|i| vec![7; 5 + i * 7 % 40]).collect();
        let recs: Vec<Record> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| Record {
                key: k.as_bytes(),
                payload: Payload::Inline(v),
                meta: Meta::default(),
            })
            .collect();
        let placed: Vec<(usize, usize)> = recs
            .iter()
            .map(|r| (g.subpage_of(r.key), r.encoded_len()))
            .collect();
        for start in [0, 3, 50, 199] {
            let n = g.fitting_prefix(&placed[start..]);
            assert!(g.build(&recs[start..start + n]).is_some(), "{start}: {n}");
            if start + n < recs.len() {
                assert!(g.build(&recs[start..=start + n]).is_none(), "{start}: {n}");
            }
        }
        assert!(
            g.fitting_prefix(&placed) < placed.len(),
            "the limit is reached"
        );
    }
}
