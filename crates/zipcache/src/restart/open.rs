//! The steps of an open over a device, in the order their durability needs
//! (`docs/FORMAT.md`, "Restart"): read what the last run saved, begin this run (the saved
//! indexes retired, then a new epoch on the device before any other write), then keep
//! the tiers the saved indexes describe or trim the device and start them empty.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use zipcache_device::BlockDevice;

use crate::Config;
use crate::Result;
use crate::large_objects::LargeObjects;
use crate::memory::Memory;
use crate::restart::epoch;
use crate::restart::files::{JournalFiles, Persist};
use crate::restart::journal::DescriptorLog;
use crate::restart::shadow::{Identity, SLOTS, Shadow, UNLOGGED, boot_id};
use crate::ssd::dictionary::{BlockDictionaries, DictionaryFiles, block_training};
use crate::ssd::{Opening, SsdSettings, SsdTier};

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
    /// Which keys' flash versions are hidden; DRAM writes mark it.
    pub(crate) shadow: Arc<Shadow>,
    /// How the flash tier was kept.
    pub(crate) recovery: Recovery,
}

/// How an open kept the flash tier, for `stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    pub kind: RecoveryKind,
    /// This run keeps a crash journal (on, and tmpfs took it): a crash restarts warm.
    pub journal: bool,
    /// Objects the recovered BT_SSD descriptors count, and BT_LO's.
    pub objects: u64,
    /// Fingerprints of keys whose flash versions stay hidden (possibly stale).
    pub shadowed: u64,
    /// Time from the start of the open to the tiers' being ready.
    pub micros: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecoveryKind {
    /// The last run closed cleanly: its saved indexes.
    Clean,
    /// The last run died: its crash journal.
    Crash,
    /// Nothing could be trusted (a first start, a power cut, a reboot, a journal that
    /// filled up): trimmed and empty.
    #[default]
    Cold,
}

impl RecoveryKind {
    pub fn name(self) -> &'static str {
        match self {
            RecoveryKind::Clean => "clean",
            RecoveryKind::Crash => "crash",
            RecoveryKind::Cold => "cold",
        }
    }
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

/// What the last run left that still describes the device: BT_SSD from its clean
/// close's indexes or from its crash journal, with the fingerprints it kept shadowed,
/// and BT_LO (clean closes only).
struct Saved {
    on_device: Option<u64>,
    ssd: Option<(SsdTier, Vec<u64>, RecoveryKind)>,
    large: Option<LargeObjects>,
}

/// Opens the SSD tier and the large-object log on `device`: warm where the last run
/// closed cleanly or left a crash journal of this boot, cold (trimmed) otherwise.
pub(crate) fn open_tiers(
    config: &Config,
    device: Arc<dyn BlockDevice>,
    persist: Option<&Persist>,
    memory: &Arc<Memory>,
) -> Result<Tiers> {
    let started = Instant::now();
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
    let opening = || Opening {
        device: device.clone(),
        settings,
        memory: memory.clone(),
        clock: config.clock.clone(),
        dictionaries: dictionaries.clone(),
    };
    let journal = persist.and_then(|p| p.journal.as_ref());
    // may do I/O: the superblock, the index files and the crash journal are read
    let saved = read_saved(persist, journal, &device, layout, opening);
    // may do I/O: the indexes removed, the new epoch written and flushed
    let epoch = begin_run(device.as_ref(), persist, saved.on_device)?;
    let (mut ssd, carried, kind) = match saved.ssd {
        Some(kept) => kept,
        None => {
            // Nothing the device holds can be trusted (a crash may have left values that
            // were deleted or overwritten in DRAM): start cold, and trim so the old
            // blocks free their space.
            // may do I/O: the super-leaf slots trimmed
            device.trim(0, layout.small_blocks)?;
            let cold = SsdTier::with_dictionaries(
                device.clone(),
                settings,
                memory.clone(),
                config.clock.clone(),
                dictionaries.clone(),
            );
            (cold, Vec::new(), RecoveryKind::Cold)
        }
    };
    // may do I/O: dictionaries no block names lose their files
    dictionaries.settle_after_open();
    let mut large = match saved.large {
        Some(large) => large,
        None => {
            // Without its index the region's extents cannot be told live from dead:
            // forget them. Safe, because every large PUT also left a DRAM tombstone
            // that shadowed the key until it reached BT_SSD.
            // may do I/O: the large-object log trimmed
            device.trim(layout.small_blocks, layout.large_blocks)?;
            LargeObjects::new(
                device.clone(),
                layout.small_blocks,
                layout.large_blocks,
                memory.clone(),
            )
        }
    };
    // Without the boot's id no journal could ever be trusted: none is kept.
    let journal = journal.filter(|_| boot_id().is_some());
    // may do I/O: this run's journal written to tmpfs before any write is taken; where
    // tmpfs refuses it (full, missing), the run goes on without one: a crash is cold
    let (shadow, journal) = match start_journal(config, journal, &device, epoch, &carried) {
        Ok(shadow) => (shadow, journal),
        Err(_) => (
            Arc::new(Shadow::in_memory(carried_buckets(&carried), &carried)),
            None,
        ),
    };
    memory.change_index(shadow.bytes() as i64);
    // may do I/O: both logs' checkpoints written to tmpfs
    let started_logs = ssd
        .start_journal(shadow.clone(), journal.map(|j| j.log.as_path()), epoch)
        .and_then(|()| match journal {
            Some(files) => large.start_journal(&files.lo_log, epoch, shadow.clone()),
            None => Ok(()),
        });
    let logged = match started_logs {
        Ok(()) => journal.is_some(),
        Err(_) => {
            shadow.set_flag(UNLOGGED, true);
            false
        }
    };
    let recovery = Recovery {
        kind,
        journal: logged,
        objects: ssd.counters.objects.load(Ordering::Relaxed).max(0) as u64 + large.len(),
        shadowed: carried.len() as u64,
        micros: started.elapsed().as_micros() as u64,
    };
    Ok(Tiers {
        ssd,
        large,
        epoch,
        shadow,
        recovery,
    })
}

/// This run's shadow table, holding `carried`: in the journal's file when crash
/// recovery is on, else in memory.
fn start_journal(
    config: &Config,
    journal: Option<&JournalFiles>,
    device: &Arc<dyn BlockDevice>,
    epoch: u64,
    carried: &[u64],
) -> Result<Arc<Shadow>> {
    let identity = journal.zip(boot_id()).map(|(files, boot_id)| {
        (
            files,
            Identity {
                boot_id,
                epoch,
                device_blocks: device.block_count(),
            },
        )
    });
    let shadow = match identity {
        Some((files, identity)) => {
            let buckets = config.shadow_buckets().max(carried_buckets(carried));
            Shadow::create(&files.shadow, identity, buckets, carried)?
        }
        // No crash recovery: DRAM marks nothing, and the table only hides what a clean
        // index carried over until it is written again.
        None => Shadow::in_memory(carried_buckets(carried), carried),
    };
    Ok(Arc::new(shadow))
}

/// Buckets with room for what was carried over twice (those must never be lost: they
/// would come back after a clean close); the journal's table is at least this large.
fn carried_buckets(carried: &[u64]) -> usize {
    2 * carried.len() / SLOTS + 1
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

/// The superblock's epoch, and what of the tiers the last run left that describes the
/// device: the indexes its clean close saved if they name that epoch (only an index
/// saved by the run that last wrote to the device describes what the device holds), else
/// its crash journal if this boot wrote it for that epoch and it names every shadowed key.
/// BT_LO's index is used only beside BT_SSD's clean one.
fn read_saved(
    persist: Option<&Persist>,
    journal: Option<&JournalFiles>,
    device: &Arc<dyn BlockDevice>,
    layout: Layout,
    opening: impl Fn() -> Opening,
) -> Saved {
    let on_device = epoch::read(device.as_ref());
    let Some((persist, epoch)) = persist.zip(on_device) else {
        return Saved {
            on_device,
            ssd: None,
            large: None,
        };
    };
    if let Some((ssd, shadowed)) = SsdTier::load(persist.file(&persist.ssd_index, epoch), opening())
    {
        let large = LargeObjects::load(
            persist.file(&persist.lo_index, epoch),
            device.clone(),
            layout.small_blocks,
            layout.large_blocks,
            opening().memory,
        );
        return Saved {
            on_device,
            ssd: Some((ssd, shadowed, RecoveryKind::Clean)),
            large,
        };
    }
    let ssd = journal.zip(boot_id()).and_then(|(files, boot_id)| {
        let identity = Identity {
            boot_id,
            epoch,
            device_blocks: device.block_count(),
        };
        let shadowed = Shadow::recover(&files.shadow, identity)?;
        let replay = DescriptorLog::replay(&files.log, epoch)?;
        let ssd = SsdTier::recover(&replay, epoch, opening())?;
        Some((ssd, shadowed, RecoveryKind::Crash))
    });
    // BT_LO's log only beside BT_SSD's: the table that vouches for one vouches for both.
    let large = journal.filter(|_| ssd.is_some()).and_then(|files| {
        let replay = DescriptorLog::replay(&files.lo_log, epoch)?;
        LargeObjects::recover(
            &replay,
            epoch,
            device.clone(),
            layout.small_blocks,
            layout.large_blocks,
            opening().memory,
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
