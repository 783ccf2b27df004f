//! A clean close's last step: the indexes saved for the next open.

use crate::Result;
use crate::large_objects::LargeObjects;
use crate::restart::files::Persist;
use crate::restart::shadow::Shadow;
use crate::ssd::SsdTier;

/// Saves the BT_SSD and BT_LO indexes, each naming this run's `epoch`, BT_SSD's with the
/// keys whose flash versions `shadow` still hides (a crash's, carried over), and retires
/// the crash journal. Called only once every DRAM object and tombstone is on the device
/// and the device is flushed: then the indexes describe exactly what the device holds,
/// and the next open serves it.
pub(crate) fn save_indexes(
    persist: &Persist,
    epoch: u64,
    ssd: &SsdTier,
    large: &LargeObjects,
    shadow: &Shadow,
) -> Result<()> {
    // may do I/O: each index written, fsynced and renamed into place
    ssd.save(
        persist.file(&persist.ssd_index, epoch),
        &shadow.fingerprints(),
    )?;
    large.save(persist.file(&persist.lo_index, epoch))?;
    // The indexes describe the tiers now, through a power cut too.
    if let Some(journal) = &persist.journal {
        journal.remove();
    }
    Ok(())
}
