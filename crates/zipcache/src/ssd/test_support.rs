//! What the SSD tier's unit tests share: a small tier on a memory device, and objects to
//! evict into it.

use std::sync::Arc;

use zipcache_device::BlockDevice;

use super::{SsdSettings, SsdTier};
use crate::config::SystemClock;
use crate::eviction::{EvictedObject, EvictionSink};
use crate::memory::Memory;
use crate::record::Meta;

/// Super-leaves of four sub-pages filled to half a block, in `slots` slots.
pub(super) fn settings(slots: u64) -> SsdSettings {
    SsdSettings {
        subpages: 4,
        fill_threshold: 0.5,
        blocks: 4 * slots,
        presence_filters: true,
        host_compression: false,
        dictionaries: None,
        loaded_dictionaries: false,
    }
}

pub(super) fn tier_on(device: Arc<dyn BlockDevice>, settings: SsdSettings) -> SsdTier {
    SsdTier::new(
        device,
        settings,
        Arc::new(Memory::default()),
        Arc::new(SystemClock),
    )
}

pub(super) fn key(i: u32) -> Vec<u8> {
    format!("{i:08}").into_bytes()
}

/// Evicts objects `keys` (100-byte values) into `ssd` as one DRAM leaf's batch.
pub(super) fn absorb(ssd: &SsdTier, keys: impl IntoIterator<Item = u32>) {
    let mut batch: Vec<EvictedObject> = keys
        .into_iter()
        .map(|i| EvictedObject {
            key: key(i),
            value: Some(vec![i as u8; 100]),
            meta: Meta::default(),
        })
        .collect();
    batch.sort_by(|a, b| a.key.cmp(&b.key));
    batch.dedup_by(|a, b| a.key == b.key);
    assert!(ssd.absorb(&[], None, batch));
}
