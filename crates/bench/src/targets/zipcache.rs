//! The ZipCache engine, in-process.

use std::sync::Arc;

use zipcache::{Config, SsdConfig, ZipCache};

use super::{Budget, Client, Engine, EngineClient, Snapshot, Target};
use crate::procfs;

/// File of the SSD tier inside the data directory.
const SSD_FILE: &str = "zipcache-ssd.img";

pub struct ZipTarget {
    cache: Arc<ZipCache>,
    dram_only: bool,
    batch: usize,
    /// Whether this process's RSS is this target's (see `procfs::claim_own_rss`).
    own_rss: bool,
}

/// The engine `Config` for a budget: `--dram`, `--ssd-size`, `--data-dir`, then `--set`s.
pub fn config(budget: &Budget) -> Result<Config, String> {
    let mut config = Config {
        dram_capacity: budget.dram,
        ..Config::default()
    };
    if let Some(size) = budget.ssd {
        config.ssd = Some(SsdConfig {
            path: budget.data_dir.join(SSD_FILE),
            size,
            direct_io: true,
            device_compression: Default::default(),
            // Same logical size as every peer's disk; the emulated device only counts.
            logical_to_physical: 1.0,
        });
    }
    for (name, value) in &budget.settings {
        config
            .set(name, value)
            .map_err(|e| format!("--set {name}={value}: {e}"))?;
    }
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

impl ZipTarget {
    pub fn open(budget: &Budget) -> Result<ZipTarget, String> {
        let config = config(budget)?;
        let dram_only = config.ssd.is_none();
        let cache = ZipCache::open(config).map_err(|e| format!("zipcache: {e}"))?;
        Ok(ZipTarget {
            cache: Arc::new(cache),
            dram_only,
            batch: budget.batch(),
            own_rss: procfs::claim_own_rss(),
        })
    }
}

impl Engine for ZipCache {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        ZipCache::get(self, key).map_err(|e| e.to_string())
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), String> {
        ZipCache::put(self, key, value, None).map_err(|e| e.to_string())
    }

    fn delete(&self, key: &[u8]) -> Result<bool, String> {
        ZipCache::delete(self, key).map_err(|e| e.to_string())
    }

    fn scan(&self, from: &[u8], limit: usize) -> Result<Option<usize>, String> {
        ZipCache::scan(self, from.., limit)
            .map(|items| Some(items.len()))
            .map_err(|e| e.to_string())
    }
}

impl Target for ZipTarget {
    fn name(&self) -> &str {
        "zipcache"
    }

    fn client(&self) -> Result<Box<dyn Client>, String> {
        Ok(Box::new(EngineClient {
            engine: self.cache.clone(),
            batch: self.batch,
        }))
    }

    fn snapshot(&self) -> Result<Snapshot, String> {
        // Merged buffers and a drained device make the counts and V_NAND exact.
        self.cache
            .settle()
            .map_err(|e| format!("zipcache settle: {e}"))?;
        let s = self.cache.stats();
        let ssd = !self.dram_only;
        Ok(Snapshot {
            dram_hits: Some(s.dram_hits),
            ssd_hits: Some(s.ssd_hits + s.large_hits),
            dram_bytes_used: Some(s.dram_used),
            objects_resident: Some(s.objects_resident),
            compression_ratio_dram: Some(s.compression_ratio_dram),
            wa_host: s.wa_host,
            wr_nand: s.wr_nand,
            wa: s.wa,
            zeta: s.zeta,
            ssd_objects: ssd.then_some(s.ssd_objects),
            ssd_index_bytes: ssd.then_some(s.ssd_index_bytes),
            ssd_reads_per_ssd_get: s.ssd_reads_per_ssd_get,
            rss_bytes: procfs::own_rss(self.own_rss),
            server_cpu_seconds: None,
            host_bytes_written: ssd.then_some(s.v_host),
        })
    }

    fn dram_only(&self) -> bool {
        self.dram_only
    }

    fn close(self: Box<Self>) -> Result<(), String> {
        let cache = Arc::try_unwrap(self.cache)
            .map_err(|_| "zipcache: a client outlived the run".to_string())?;
        cache.close().map_err(|e| format!("zipcache close: {e}"))
    }
}
