//! The steps of an open over a device, in the order their durability needs
//! (`docs/FORMAT.md`, "Restart"): read what the last run saved, begin this run (the saved
//! indexes retired, then a new epoch on the device before any other write), then keep
//! the tiers the saved indexes describe or trim the device and start them empty.

use std::sync::Arc;

use zipcache_device::BlockDevice;

use crate::Config;
use crate::Result;
use crate::large_objects::LargeObjects;
use crate::memory::Memory;
use crate::restart::epoch;
use crate::restart::files::Persist;
use crate::ssd::dictionary::{BlockDictionaries, DictionaryFiles, block_training};
use crate::ssd::{SsdSettings, SsdTier};

/// The device's block: one SSD sub-page.
const BLOCK: usize = zipcache_device::BLOCK_SIZE;
/// Share of the SSD device given to the large-object log (BT_LO).
const LARGE_REGION: f64 = 0.125;

/// The flash tiers as an open leaves them.
pub(crate) struct Tiers {
    pub(crate) ssd: SsdTier,
    pub(crate) large: LargeObjects,
    /// This run's epoch, on the device now.
    pub(crate) epoch: u64,
    /// The SSD tier is the one the last clean close saved.
    pub(crate) warm: bool,
}

/// How the device is split: the last block is the superblock; of the rest, BT_SSD's
/// super-leaves come first, then the large-object log.
#[derive(Clone, Copy)]
struct Layout {
    small_blocks: u64,
    large_blocks: u64,
}

impl Layout {
    fn of(device: &dyn BlockDevice) -> Layout {
        let total = epoch::lba(device);
        let large_blocks = (total as f64 * LARGE_REGION) as u64;
        Layout {
            small_blocks: total - large_blocks,
            large_blocks,
        }
    }
}

/// What the last run saved that still describes the device: both indexes, loaded, if
/// their epoch is the device's.
struct Saved {
    on_device: Option<u64>,
    ssd: Option<SsdTier>,
    large: Option<LargeObjects>,
}

/// Opens the SSD tier and the large-object log on `device`: warm where the last run
/// closed cleanly, cold (trimmed) otherwise.
pub(crate) fn open_tiers(
    config: &Config,
    device: Arc<dyn BlockDevice>,
    persist: Option<&Persist>,
    memory: &Arc<Memory>,
) -> Result<Tiers> {
    let layout = Layout::of(device.as_ref());
    let settings = ssd_settings(config, device.as_ref(), layout);
    // may do I/O: the block dictionaries' files are read
    let dictionaries = Arc::new(BlockDictionaries::open(
        settings.dictionaries,
        persist.map(|p| DictionaryFiles {
            dir: p.dir.clone(),
            prefix: p.dictionaries.clone(),
        }),
        memory.clone(),
    ));
    let settings = SsdSettings {
        loaded_dictionaries: dictionaries.any_live(),
        ..settings
    };
    // may do I/O: the superblock and the index files are read
    let saved = read_saved(
        config,
        &device,
        persist,
        settings,
        layout,
        memory,
        &dictionaries,
    );
    // may do I/O: the indexes removed, the new epoch written and flushed
    let epoch = begin_run(device.as_ref(), persist, saved.on_device)?;
    let warm = saved.ssd.is_some();
    let ssd = match saved.ssd {
        Some(ssd) => ssd,
        None => {
            // Nothing the device holds can be trusted (a crash may have left values that
            // were deleted or overwritten in DRAM): start cold, and trim so the old
            // blocks free their space.
            // may do I/O: the super-leaf slots trimmed
            device.trim(0, layout.small_blocks)?;
            let clock = config.clock.clone();
            SsdTier::with_dictionaries(
                device.clone(),
                settings,
                memory.clone(),
                clock,
                dictionaries.clone(),
            )
        }
    };
    // may do I/O: dictionaries no block names lose their files
    dictionaries.settle_after_open();
    let large = match saved.large {
        Some(large) => large,
        None => {
            // Without its index the region's extents cannot be told live from dead:
            // forget them. Safe, because every large PUT also left a DRAM tombstone that
            // the clean close wrote to BT_SSD.
            // may do I/O: the large-object log trimmed
            device.trim(layout.small_blocks, layout.large_blocks)?;
            LargeObjects::new(
                device,
                layout.small_blocks,
                layout.large_blocks,
                memory.clone(),
            )
        }
    };
    Ok(Tiers {
        ssd,
        large,
        epoch,
        warm,
    })
}

fn ssd_settings(config: &Config, device: &dyn BlockDevice, layout: Layout) -> SsdSettings {
    let host_compression = device.compression().by_host();
    SsdSettings {
        subpages: config.superleaf_size / BLOCK,
        fill_threshold: config.fill_threshold,
        blocks: layout.small_blocks,
        presence_filters: config.ssd_presence_filters,
        host_compression,
        dictionaries: config
            .training_settings()
            .filter(|_| host_compression && config.ssd_dictionaries)
            .map(block_training),
        loaded_dictionaries: false,
    }
}

/// The superblock's epoch, and the indexes the last clean close saved if they name it:
/// only an index saved by the run that last wrote to the device describes what the
/// device holds. BT_LO's is used only beside BT_SSD's.
fn read_saved(
    config: &Config,
    device: &Arc<dyn BlockDevice>,
    persist: Option<&Persist>,
    settings: SsdSettings,
    layout: Layout,
    memory: &Arc<Memory>,
    dictionaries: &Arc<BlockDictionaries>,
) -> Saved {
    let on_device = epoch::read(device.as_ref());
    let Some((persist, epoch)) = persist.zip(on_device) else {
        return Saved {
            on_device,
            ssd: None,
            large: None,
        };
    };
    let ssd = SsdTier::load(
        persist.file(&persist.ssd_index, epoch),
        device.clone(),
        settings,
        memory.clone(),
        config.clock.clone(),
        dictionaries.clone(),
    );
    let large = ssd.as_ref().and_then(|_| {
        LargeObjects::load(
            persist.file(&persist.lo_index, epoch),
            device.clone(),
            layout.small_blocks,
            layout.large_blocks,
            memory.clone(),
        )
    });
    Saved {
        on_device,
        ssd,
        large,
    }
}

/// Begins this run: from here on the saved indexes are stale, so if this process dies
/// before a clean close the next open must start cold. Their removal is made durable
/// before the first device write of this run; the new epoch, written and flushed before
/// any other device write, would refuse them anyway.
fn begin_run(
    device: &dyn BlockDevice,
    persist: Option<&Persist>,
    on_device: Option<u64>,
) -> Result<u64> {
    if let Some(p) = persist {
        p.dir.remove(&p.ssd_index)?;
        p.dir.remove(&p.lo_index)?;
        p.dir.sync_dir()?;
    }
    let epoch = epoch::next(on_device);
    epoch::write(device, epoch)?;
    Ok(epoch)
}
