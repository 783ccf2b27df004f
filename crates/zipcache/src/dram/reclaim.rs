//! Reclaiming expired objects ahead of time (memcached's LRU crawler): expired objects
//! are otherwise dropped only when their leaf next merges, and count as resident until
//! then.

use super::DramTier;
use super::leaf::RETIRED;
use super::merge::Shed;

/// What a reclaim pass did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Objects examined (expired or not).
    pub checked: u64,
    /// Expired objects dropped.
    pub reclaimed: u64,
}

impl DramTier {
    /// Visits every leaf, merging those holding an expired object (the merge drops it).
    /// After each leaf, `keep_going` sees the totals so far; false ends the pass.
    pub fn reclaim_expired(
        &self,
        now_ms: u64,
        mut keep_going: impl FnMut(&Reclaimed) -> bool,
    ) -> Reclaimed {
        let mut done = Reclaimed::default();
        let view = self.view();
        for id in self.leaves() {
            let Some(leaf) = view.get(id.0) else { continue };
            {
                let mut st = leaf.state.write();
                if !leaf.has(RETIRED) {
                    let (objects, expired) = self.census(leaf, &st, now_ms);
                    if expired > 0 {
                        self.merge_locked(leaf, &mut st, now_ms, Shed::Nothing);
                    }
                    done.checked += objects;
                    done.reclaimed += expired;
                }
            }
            if !keep_going(&done) {
                break;
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{key, settings, tier_with};
    use super::*;
    use crate::record::Meta;

    /// A tier holding 300 objects written at `now`, every third expiring a second later;
    /// `write_buffer` bytes a leaf buffers before merging.
    fn filled(write_buffer: usize, now: u64) -> DramTier {
        let (dram, _) = tier_with(settings(write_buffer));
        for i in 0..300u32 {
            let meta = Meta {
                expires_at_ms: (i % 3 == 0).then_some(now + 1_000),
                ..Meta::default()
            };
            dram.put_with(&key(i), Some(b"value"), meta, None, now, |_| ());
        }
        dram
    }

    #[test]
    fn expired_objects_are_dropped_and_counted_once() {
        let now = 1_000_000;
        for write_buffer in [0, 4096] {
            let dram = filled(write_buffer, now);
            assert_eq!(dram.tally(now).objects, 300);
            let later = now + 1_000;
            let done = dram.reclaim_expired(later, |_| true);
            assert_eq!(
                done,
                Reclaimed {
                    checked: 300,
                    reclaimed: 100
                },
                "write buffer {write_buffer}"
            );
            assert_eq!(dram.tally(later).objects, 200);
            let again = dram.reclaim_expired(later, |_| true);
            assert_eq!(
                again,
                Reclaimed {
                    checked: 200,
                    reclaimed: 0
                }
            );
        }
    }

    #[test]
    fn nothing_is_reclaimed_before_it_expires() {
        let now = 1_000_000;
        let dram = filled(0, now);
        let done = dram.reclaim_expired(now + 999, |_| true);
        assert_eq!(done.reclaimed, 0);
        assert_eq!(dram.tally(now).objects, 300);
    }

    #[test]
    fn keep_going_ends_the_pass() {
        let dram = filled(0, 0);
        assert!(dram.leaf_count() > 1);
        let mut calls = 0;
        let done = dram.reclaim_expired(0, |_| {
            calls += 1;
            false
        });
        assert_eq!(calls, 1);
        assert!(done.checked > 0 && done.checked < 300, "{done:?}");
    }
}
