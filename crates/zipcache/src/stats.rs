//! What `ZipCache::stats()` reports. Field names follow SPEC §4 and are part of the
//! interface: the server's `stats`/INFO and the bench's JSON print them as they are.

/// A snapshot of the engine's counters and gauges.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    // --- DRAM budget and its breakdown (bytes) ---
    pub dram_capacity: u64,
    /// Sum of everything below: the bytes charged to `dram_capacity`.
    pub dram_used: u64,
    /// Compressed leaf pages.
    pub dram_compressed_page_bytes: u64,
    /// Uncompressed leaf pages of the hot (bypassed) sub-tier.
    pub dram_hot_page_bytes: u64,
    /// Per-page write buffers.
    pub dram_write_buffer_bytes: u64,
    /// Medium objects' blobs: each compressed alone, or stored as is in a hot leaf while
    /// the budget has room to spare (`hot_blob_leaves`).
    pub dram_medium_bytes: u64,
    /// Per-object access state (setting `track_access`; 0 without it).
    pub dram_access_bytes: u64,
    /// Trained dictionaries of medium objects (prepared forms) and of pages (raw prefix
    /// and LZ4 state), and the samples they are trained on (setting `dictionaries`).
    pub dram_dictionary_bytes: u64,
    /// Dictionaries trained, and of those, made current (a held-out sample compressed
    /// noticeably better with them).
    pub dictionaries_trained: u64,
    pub dictionaries_swapped: u64,
    /// The same for the LZ4 dictionaries of tiny objects' pages.
    pub page_dictionaries_trained: u64,
    pub page_dictionaries_swapped: u64,
    /// Leaf descriptors and inner nodes of BT_DRAM and BT_LO, and BT_SSD inner nodes.
    pub dram_index_bytes: u64,
    /// The resident memory of the process the engine runs in (`VmRSS`), to hold beside
    /// `dram_capacity`; `None` where /proc cannot tell.
    pub rss_bytes: Option<u64>,
    /// Bytes of `dram_capacity` withheld from the cache because RSS was above the
    /// `rss_limit` setting (allocator overhead the engine's count cannot see).
    pub dram_withheld_bytes: u64,
    /// RSS beyond `dram_used` and the RSS the process had when the engine opened: what
    /// the allocator holds around the engine's blocks (size-class rounding, part-used
    /// pages) and whatever else the process allocated since (connection buffers).
    /// 0 where /proc cannot tell.
    pub dram_fragmentation_bytes: u64,
    /// Bytes of leaf pages and blobs moved out of sparsely used allocator pages, so that
    /// those pages could be returned to the OS (with an `rss_limit`: every second).
    pub dram_defrag_moved_bytes: u64,

    // --- objects ---
    /// Distinct keys resident in any tier (an object both in DRAM and on SSD counts once
    /// where the engine can tell; see `ssd_objects`).
    pub objects_resident: u64,
    pub dram_objects: u64,
    /// DRAM objects that are unchanged copies of SSD-tier objects (in merged pages; not
    /// counting write buffers).
    pub dram_clean_objects: u64,
    pub dram_leaves: u64,
    pub hot_leaves: u64,
    /// Hot leaves whose medium objects' blobs are stored as is (DRAM had room to spare).
    pub hot_blob_leaves: u64,
    pub ssd_objects: u64,
    pub large_objects: u64,
    /// Large objects forgotten: dropped from the head of the log, or too big for it.
    pub large_dropped: u64,
    /// Uncompressed bytes of DRAM-tier objects / DRAM bytes holding them.
    pub compression_ratio_dram: f64,

    // --- operations ---
    pub gets: u64,
    pub hits: u64,
    pub dram_hits: u64,
    pub large_hits: u64,
    pub ssd_hits: u64,
    /// SSD hits copied into DRAM (inclusive caching; see the `promotion` setting).
    pub ssd_promotions: u64,
    /// SSD hits left on the SSD, not copied into DRAM, because DRAM was far over its
    /// budget (a GET never waits for the flusher to make room).
    pub ssd_promotions_skipped: u64,
    pub misses: u64,
    pub puts: u64,
    /// Writes refused because the DRAM budget was full and `evictions` is off.
    pub refused_writes: u64,
    pub deletes: u64,
    pub scans: u64,
    pub expired: u64,
    pub hit_ratio: f64,
    pub dram_hit_ratio: f64,
    pub ssd_hit_ratio: f64,

    // --- background work ---
    pub merges: u64,
    pub foreground_merges: u64,
    pub leaf_splits: u64,
    /// DRAM leaves evicted to make room, and their objects (moved to the SSD tier, or
    /// dropped without one); a flush or a clean shutdown counts nothing.
    pub evicted_leaves: u64,
    pub evicted_objects: u64,
    /// Objects the cache forgot to make room (memcached's `evictions`): evicted from
    /// DRAM with no SSD tier or unwritten (`ssd_write_drops`), from the SSD tier with their super-leaf
    /// (`ssd_evicted_objects`), or from the large-object log (`large_dropped`). Objects
    /// moved from DRAM to the SSD are not dropped; a flush is not an eviction.
    pub dropped_objects: u64,
    /// Clean objects (unchanged copies of SSD-tier objects) dropped from DRAM before any
    /// dirty one was evicted: no write, and still an SSD hit.
    pub clean_dropped: u64,
    /// Objects kept in DRAM, because they were read often lately, when the rest of their
    /// leaf was dropped (DRAM-only) or when its clean copies were (`clean_dropped`):
    /// counted at each eviction.
    pub retained_objects: u64,
    /// Objects dropped from DRAM without being written to the SSD tier, because the
    /// flusher was behind when DRAM was full (a miss later, never a stale value).
    pub ssd_write_drops: u64,
    /// GET reads of the SSD (a block of the SSD tier or a BT_LO extent) that went in
    /// flight (`get_item_async`) instead of blocking.
    pub ssd_async_reads: u64,
    /// GETs whose SSD read went in flight and that have not had their answer yet (a GET
    /// dropped before it has is no longer counted; its read is in `ssd_io_in_flight`
    /// until it completes).
    pub ssd_reads_in_flight: u64,
    /// Device reads and writes submitted and not yet completed (GET reads, the flusher's
    /// batches, promotion and split reads).
    pub ssd_io_in_flight: u64,
    /// Device read and write calls that succeeded (all SSD-tier I/O, not only GETs').
    pub ssd_device_reads: u64,
    pub ssd_device_writes: u64,
    /// Their rates over the last window of at least a second between two `stats` calls.
    pub ssd_device_reads_per_sec: Option<f64>,
    pub ssd_device_writes_per_sec: Option<f64>,
    /// The flusher's queue: DRAM bytes above the level it evicts down to.
    pub flusher_backlog_bytes: u64,
    /// Writers waiting for the flusher to make room (at most `flush_wait_ms` each).
    pub flusher_waiting_writers: u64,
    pub bypass_threshold: f64,

    // --- SSD tier (SPEC §4); zero / None without an SSD ---
    #[serde(rename = "V_obj")]
    pub v_obj: u64,
    #[serde(rename = "V_host")]
    pub v_host: u64,
    #[serde(rename = "V_NAND")]
    pub v_nand: u64,
    pub wa_host: Option<f64>,
    pub wr_nand: Option<f64>,
    pub wa: Option<f64>,
    pub zeta: Option<f64>,
    pub ssd_index_bytes: u64,
    pub ssd_leaf_bytes: u64,
    pub ssd_superleaves: u64,
    pub ssd_gets: u64,
    pub ssd_reads: u64,
    pub ssd_reads_per_ssd_get: Option<f64>,
    /// SSD GETs that read nothing because their sub-page's presence filter ruled the key
    /// out (a miss without I/O).
    pub ssd_filtered_gets: u64,
    pub ssd_evicted_superleaves: u64,
    pub ssd_evicted_objects: u64,
    /// 4 KiB blocks the SSD tier wrote for evictions: merges (read-modify-write of the
    /// sub-pages an eviction's objects hash to) and splits (super-leaves rewritten whole).
    pub ssd_merge_blocks_written: u64,
    pub ssd_split_blocks_written: u64,
    /// The part of `V_obj` whose eviction split its super-leaf.
    pub ssd_split_evicted_bytes: u64,
    /// `V_obj` per block written (merges and splits): how much new data each block write
    /// carries. On a drive that stores blocks whole (`device_compression` host or none),
    /// `wa` = 4096 / this.
    pub ssd_evicted_bytes_per_written_block: Option<f64>,
    pub ssd_physical_used: u64,
    pub ssd_logical_capacity: u64,
    pub ssd_physical_capacity: u64,
    /// Flash bytes the SSD tier's data really takes: its written blocks on a drive that
    /// stores them whole (`device_compression` host or none); `None` where the host
    /// cannot tell (hardware) or the figure would be emulated (emulate).
    pub ssd_flash_bytes: Option<u64>,
    /// `ssd_objects` per GiB of `ssd_flash_bytes`.
    pub ssd_objects_per_flash_gib: Option<f64>,
    /// Seconds spent compressing for the SSD (`device_compression=host`): the flusher packing
    /// blocks, and large PUTs compressing their values.
    pub ssd_compress_seconds: f64,
    pub checksum_failures: u64,
    pub io_errors: u64,
    /// How this open kept the flash tier: `clean` (a clean close's indexes), `crash` (a
    /// crashed run's journal), `cold` (nothing trusted: trimmed and empty); empty without
    /// an SSD tier.
    pub recovery_kind: &'static str,
    /// Objects the open kept: BT_SSD's and BT_LO's.
    pub recovery_objects: u64,
    /// Keys whose flash versions the open kept hidden as possibly stale (a crash lost
    /// their newer state, or a clean close carried them over).
    pub recovery_shadowed_keys: u64,
    /// Milliseconds from the start of the open to the tiers' being ready.
    pub recovery_ms: f64,
    /// Flash versions found by GETs and scans but not served: hidden as possibly stale.
    pub ssd_hidden_versions: u64,
    /// This run keeps a crash journal in tmpfs (`crash_journal` set, and tmpfs had
    /// room for it): a crash restarts warm.
    pub crash_journal_on: bool,
    /// Bytes of the crash journal's shadow table (in `dram_index_bytes`).
    pub crash_journal_bytes: u64,
    /// Keys the shadow table holds now: their newest state is in DRAM only.
    pub crash_journal_keys: u64,
    /// The journal no longer names every such key (its table filled up, or tmpfs
    /// refused a write): a crash now restarts cold. A full table heals once DRAM has
    /// written enough down for every dirty key to fit again.
    pub crash_journal_incomplete: bool,
    /// Marks that found the shadow table full while it was whole or a heal watched
    /// (each left it incomplete until a heal; while it is incomplete, writes do not
    /// mark): many mean `crash_journal_bytes` is too small for the objects DRAM holds.
    pub crash_journal_overflows: u64,
    /// Times a full shadow table healed.
    pub crash_journal_heals: u64,
}

/// `num / den`, or `None` when nothing was counted.
pub(crate) fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// `VmRSS` of process `pid`, in bytes (Linux /proc); `None` where it cannot be read.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}
