//! `stats()`: one `Stats` assembled from the operation counters, the memory account and
//! the tiers' own counters.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Inner, ZipCache};
use crate::Stats;
use crate::restart::shadow::{INCOMPLETE, UNLOGGED};
use crate::stats::ratio;

impl ZipCache {
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }
}

impl Inner {
    fn stats(&self) -> Stats {
        let mem = self.memory.snapshot();
        let rss = crate::stats::rss_bytes(std::process::id());
        let c = &self.dram.counters;
        let gets = self.ops.gets.get();
        let dram_hits = self.ops.dram_hits.get();
        let ssd_hits = self.ops.ssd_hits.get();
        let large_hits = self.ops.large_hits.get();
        let hits = dram_hits + large_hits + ssd_hits;
        let tally = self.dram.tally(self.now());
        let dram_objects = tally.objects.max(0) as u64;
        let (dram_clean, raw) = (tally.clean, tally.raw_bytes);
        let holding = (mem.compressed_pages + mem.hot_pages + mem.mediums).max(0) as u64;
        let large_compress_ns = self
            .large
            .as_ref()
            .map_or(0, |lo| lo.counters.compress_ns.load(Ordering::Relaxed));
        let ssd = self.ssd.as_ref().map(|ssd| {
            let device = ssd.device().stats();
            let c = &ssd.counters;
            let ssd_gets = c.gets.load(Ordering::Relaxed);
            let v_obj = c.v_obj.load(Ordering::Relaxed);
            let merge_blocks = c.merge_blocks.load(Ordering::Relaxed);
            let split_blocks = c.split_blocks.load(Ordering::Relaxed);
            let (v_host, v_nand) = (device.host_bytes_written, device.nand_bytes_written);
            let index = ssd.index_bytes();
            let leaf_bytes = ssd.leaf_bytes();
            let objects = c.objects.load(Ordering::Relaxed).max(0) as u64;
            let flash_bytes = ssd
                .device()
                .compression()
                .plain()
                .then_some(device.physical_used);
            let rates = self
                .io_rates
                .observe(Instant::now(), device.reads, device.writes);
            Stats {
                ssd_io_in_flight: device.in_flight,
                ssd_device_reads: device.reads,
                ssd_device_writes: device.writes,
                ssd_device_reads_per_sec: rates.map(|r| r.reads),
                ssd_device_writes_per_sec: rates.map(|r| r.writes),
                flusher_backlog_bytes: (mem.total() - self.flusher_target()).max(0) as u64,
                flusher_waiting_writers: self.flusher_waiting.load(Ordering::Relaxed),
                v_obj,
                v_host,
                v_nand,
                wa_host: ratio(v_host, v_obj),
                wr_nand: device.wr_nand(),
                wa: ratio(v_nand, v_obj).filter(|_| v_nand > 0),
                zeta: ratio(index, leaf_bytes),
                ssd_objects: objects,
                ssd_index_bytes: index,
                ssd_leaf_bytes: leaf_bytes,
                ssd_superleaves: c.superleaves.load(Ordering::Relaxed).max(0) as u64,
                ssd_gets,
                ssd_reads: c.reads.load(Ordering::Relaxed),
                ssd_reads_per_ssd_get: ratio(c.get_reads.load(Ordering::Relaxed), ssd_gets),
                ssd_filtered_gets: c.filtered_gets.load(Ordering::Relaxed),
                ssd_evicted_superleaves: c.evicted_superleaves.load(Ordering::Relaxed),
                ssd_evicted_objects: c.evicted_objects.load(Ordering::Relaxed),
                ssd_merge_blocks_written: merge_blocks,
                ssd_split_blocks_written: split_blocks,
                ssd_split_evicted_bytes: c.split_v_obj.load(Ordering::Relaxed),
                ssd_evicted_bytes_per_written_block: ratio(v_obj, merge_blocks + split_blocks),
                ssd_physical_used: device.physical_used,
                ssd_logical_capacity: device.logical_capacity,
                ssd_physical_capacity: device.physical_capacity,
                ssd_flash_bytes: flash_bytes,
                ssd_objects_per_flash_gib: flash_bytes
                    .and_then(|bytes| ratio(objects << 30, bytes)),
                ssd_compress_seconds: (c.compress_ns.load(Ordering::Relaxed) + large_compress_ns)
                    as f64
                    / 1e9,
                checksum_failures: c.checksum_failures.load(Ordering::Relaxed),
                io_errors: c.io_errors.load(Ordering::Relaxed),
                ssd_hidden_versions: c.hidden.load(Ordering::Relaxed),
                ..Stats::default()
            }
        });
        let ssd = ssd.unwrap_or_default();
        let large_objects = self.large.as_ref().map_or(0, |lo| lo.len());
        let large_dropped = self
            .large
            .as_ref()
            .map_or(0, |lo| lo.counters.dropped.load(Ordering::Relaxed));
        let large_failures = self.large.as_ref().map_or(0, |lo| {
            lo.counters.checksum_failures.load(Ordering::Relaxed)
                + lo.counters.io_errors.load(Ordering::Relaxed)
        });
        Stats {
            // A clean DRAM object is a copy of one the SSD tier counts already.
            objects_resident: dram_objects.saturating_sub(dram_clean)
                + ssd.ssd_objects
                + large_objects,
            large_objects,
            large_dropped,
            large_hits,
            ssd_hits,
            ssd_promotions: self.ops.promotions.get(),
            ssd_promotions_skipped: self.ops.promotions_skipped.get(),
            ssd_hit_ratio: ratio(ssd_hits, gets).unwrap_or(0.0),
            checksum_failures: ssd.checksum_failures
                + c.corrupt_pages.load(Ordering::Relaxed)
                + large_failures,
            dram_capacity: self.capacity(),
            dram_used: mem.total().max(0) as u64,
            dram_compressed_page_bytes: mem.compressed_pages.max(0) as u64,
            dram_hot_page_bytes: mem.hot_pages.max(0) as u64,
            dram_write_buffer_bytes: mem.write_buffers.max(0) as u64,
            dram_medium_bytes: mem.mediums.max(0) as u64,
            dram_access_bytes: mem.access_tables.max(0) as u64,
            dram_dictionary_bytes: mem.dictionaries.max(0) as u64,
            dictionaries_trained: self.dram.training(|d| &d.blobs.counters.trained),
            dictionaries_swapped: self.dram.training(|d| &d.blobs.counters.swapped),
            page_dictionaries_trained: self.dram.training(|d| &d.pages.counters.trained),
            page_dictionaries_swapped: self.dram.training(|d| &d.pages.counters.swapped),
            dram_index_bytes: mem.index.max(0) as u64,
            rss_bytes: rss,
            dram_fragmentation_bytes: rss.map_or(0, |rss| {
                rss.saturating_sub(self.rss_at_open + mem.total().max(0) as u64)
            }),
            dram_defrag_moved_bytes: self
                .dram
                .counters
                .defrag_moved_bytes
                .load(Ordering::Relaxed),
            dram_withheld_bytes: self
                .governor
                .as_ref()
                .map_or(0, |g| g.reserve().max(0) as u64),
            dram_objects,
            dram_leaves: self.dram.leaf_count(),
            hot_leaves: c.hot_leaves.load(Ordering::Relaxed).max(0) as u64,
            hot_blob_leaves: c.hot_blob_leaves.load(Ordering::Relaxed).max(0) as u64,
            compression_ratio_dram: ratio(raw, holding).unwrap_or(0.0),
            gets,
            hits,
            dram_hits,
            misses: self.ops.misses.get(),
            puts: self.ops.puts.get(),
            refused_writes: self.ops.refused_writes.get(),
            deletes: self.ops.deletes.get(),
            scans: self.ops.scans.get(),
            expired: self.ops.expired.get(),
            hit_ratio: ratio(hits, gets).unwrap_or(0.0),
            dram_hit_ratio: ratio(dram_hits, gets).unwrap_or(0.0),
            merges: c.merges.load(Ordering::Relaxed),
            foreground_merges: c.foreground_merges.load(Ordering::Relaxed),
            leaf_splits: c.splits.load(Ordering::Relaxed),
            evicted_leaves: c.evicted_leaves.load(Ordering::Relaxed),
            evicted_objects: c.evicted_objects.load(Ordering::Relaxed),
            dropped_objects: c.dropped_objects.load(Ordering::Relaxed)
                + c.write_drops.load(Ordering::Relaxed)
                + ssd.ssd_evicted_objects
                + large_dropped,
            clean_dropped: c.clean_dropped.load(Ordering::Relaxed),
            retained_objects: c.retained_objects.load(Ordering::Relaxed),
            ssd_write_drops: c.write_drops.load(Ordering::Relaxed),
            ssd_async_reads: self.ops.async_ssd_reads.get(),
            ssd_reads_in_flight: self.ops.ssd_reads_in_flight.load(Ordering::Relaxed),
            dram_clean_objects: dram_clean,
            bypass_threshold: self.dram.bypass.threshold(),
            recovery_kind: match &self.ssd {
                Some(_) => self.recovery.kind.name(),
                None => "",
            },
            recovery_objects: self.recovery.objects,
            recovery_shadowed_keys: self.recovery.shadowed,
            recovery_ms: self.recovery.micros as f64 / 1e3,
            crash_journal_on: self.recovery.journal,
            crash_journal_bytes: self.shadow.as_ref().map_or(0, |s| s.bytes()),
            crash_journal_keys: self.shadow.as_ref().map_or(0, |s| s.len()),
            crash_journal_incomplete: self
                .shadow
                .as_ref()
                .is_some_and(|s| s.flags() & (INCOMPLETE | UNLOGGED) != 0),
            crash_journal_overflows: self.shadow.as_ref().map_or(0, |s| s.overflows()),
            crash_journal_heals: self.shadow.as_ref().map_or(0, |s| s.heals()),
            ..ssd
        }
    }
}
