//! Tests of the emulated SSD: accounting, controllers, sidecar and rebuild.

use std::fs;
use std::thread;

use super::sidecar::SIDECAR_HEADER_LEN;
use super::sizer::BlockSizer;
use super::*;
use crate::test_util::{block_with_eta, complete, random_bytes};
use crate::{FaultOp, FaultyDevice, MemDevice};

const BLOCKS: u64 = 1024;

fn emulator(options: EmulatorOptions) -> CompressingDevice<MemDevice> {
    CompressingDevice::new(MemDevice::new(BLOCKS), options).expect("emulator")
}

fn zero_block_size() -> u64 {
    u64::from(BlockSizer::new().size(&[0; BLOCK_SIZE]))
}

fn file_emulator(dir: &Path) -> CompressingDevice<FileDevice> {
    CompressingDevice::open_file(
        dir.join("ssd"),
        BLOCKS * BLOCK_BYTES,
        &FileOptions::default(),
        EmulatorOptions::default(),
    )
    .expect("open emulator")
}

/// A mix the SSD tier produces: under-filled sub-pages, full ones, empty ones.
fn write_mixed_blocks(device: &impl BlockDevice) {
    for lba in 0..48u64 {
        let block = match lba % 4 {
            0 => vec![0; BLOCK_SIZE],
            1 => random_bytes(lba, BLOCK_SIZE),
            _ => block_with_eta(lba, 0.25 * (lba % 4) as f64),
        };
        device.write(lba * 3, &block).expect("write");
    }
    device.trim(9, 6).expect("trim");
}

fn sizes(device: &CompressingDevice<impl BlockDevice>) -> Vec<u16> {
    (0..BLOCKS)
        .map(|lba| device.physical_size(lba).unwrap_or(u16::MAX))
        .collect()
}

#[test]
fn block_sizes_follow_compressibility() {
    let device = emulator(EmulatorOptions::default());
    device.write(0, &[0; BLOCK_SIZE]).expect("zeros");
    device
        .write(1, &random_bytes(1, BLOCK_SIZE))
        .expect("random");
    device.write(2, &block_with_eta(2, 0.5)).expect("eta 0.5");
    device.drain().expect("drain");

    let zero = u64::from(device.physical_size(0).expect("tracked"));
    let random = u64::from(device.physical_size(1).expect("tracked"));
    let half = u64::from(device.physical_size(2).expect("tracked"));
    assert!((1..32).contains(&zero), "all-zero block costs {zero} B");
    assert_eq!(random, BLOCK_BYTES, "random blocks are stored raw");
    assert!((2048..2200).contains(&half), "η = 0.5 block costs {half} B");

    let stats = device.stats();
    assert_eq!(stats.host_bytes_written, 3 * BLOCK_BYTES);
    assert_eq!(stats.nand_bytes_written, zero + random + half);
    assert_eq!(stats.physical_used, zero + random + half);
    assert_eq!(stats.logical_capacity, BLOCKS * BLOCK_BYTES);
    assert_eq!(stats.physical_capacity, BLOCKS * BLOCK_BYTES / 4);
    assert_eq!(
        device.physical_free(),
        Some(stats.physical_capacity - stats.physical_used)
    );
    assert!(stats.wr_nand().is_some_and(|wr| wr > 1.9));
}

#[test]
fn overwrites_replace_and_trims_free_physical_space() {
    let device = emulator(EmulatorOptions::default());
    device
        .write(5, &random_bytes(5, 2 * BLOCK_SIZE))
        .expect("write");
    device.write(6, &[0; BLOCK_SIZE]).expect("overwrite");
    device.drain().expect("drain");
    let stats = device.stats();
    assert_eq!(stats.physical_used, BLOCK_BYTES + zero_block_size());
    assert_eq!(
        stats.nand_bytes_written,
        2 * BLOCK_BYTES + zero_block_size()
    );
    assert_eq!(stats.host_bytes_written, 3 * BLOCK_BYTES);

    device.trim(0, 10).expect("trim");
    device.drain().expect("drain");
    let after = device.stats();
    assert_eq!(after.physical_used, 0);
    assert_eq!(
        after.nand_bytes_written, stats.nand_bytes_written,
        "trims write nothing"
    );
    assert_eq!(after.trims, 1);
    assert_eq!(device.physical_size(5), Some(0));
    let mut block = vec![1u8; BLOCK_SIZE];
    device.read(5, &mut block).expect("read");
    assert!(block.iter().all(|&b| b == 0));
}

#[test]
fn compression_runs_on_controller_threads_only() {
    let device = emulator(EmulatorOptions {
        controller_threads: 2,
        ..EmulatorOptions::default()
    });
    assert!(device.compression_threads().is_empty());
    for lba in 0..8 {
        device.write(lba, &block_with_eta(lba, 0.5)).expect("write");
    }
    device.drain().expect("drain");
    let threads = device.compression_threads();
    assert_eq!(threads.len(), 2, "each shard compresses its own LBAs");
    assert!(!threads.contains(&thread::current().id()));
}

/// Nice levels of this process's threads named `zipcache-csd-*`, from /proc.
fn controller_nice_levels() -> Vec<i32> {
    let mut levels = Vec::new();
    for task in fs::read_dir("/proc/self/task").expect("tasks").flatten() {
        let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let stat = fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesised name: state is field 3, nice is field 19.
        let after_name = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
        if comm.starts_with("zipcache-csd-")
            && let Some(nice) = after_name.split(' ').nth(16)
        {
            levels.push(nice.parse().expect("nice field"));
        }
    }
    levels
}

#[test]
fn controllers_run_at_the_configured_nice_level() {
    // 7 is used by no other test, so concurrent tests' controllers cannot be mistaken.
    let device = emulator(EmulatorOptions {
        controller_nice: 7,
        controller_threads: 2,
        ..EmulatorOptions::default()
    });
    device.drain().expect("controllers started");
    let at_seven = controller_nice_levels().iter().filter(|&&n| n == 7).count();
    assert_eq!(at_seven, 2);
    assert_eq!(
        thread::current()
            .name()
            .map(|n| n.starts_with("zipcache-csd")),
        Some(false)
    );
}

#[test]
fn concurrent_writers_give_exact_totals_after_drain() {
    let device = emulator(EmulatorOptions {
        controller_threads: 2,
        queue_blocks: 64,
        ..EmulatorOptions::default()
    });
    let writers = 4u64;
    let per_writer = 200u64;
    let block_for = |lba: u64| block_with_eta(lba, (lba % 5) as f64 / 4.0);
    thread::scope(|scope| {
        for writer in 0..writers {
            let device = &device;
            scope.spawn(move || {
                for i in 0..per_writer {
                    let lba = i * writers + writer;
                    device.write(lba, &block_for(lba)).expect("write");
                }
            });
        }
    });
    device.drain().expect("drain");
    assert_eq!(device.backlog(), 0);

    let mut sizer = BlockSizer::new();
    let expected: u64 = (0..writers * per_writer)
        .map(|lba| u64::from(sizer.size(&block_for(lba))))
        .sum();
    let stats = device.stats();
    assert_eq!(stats.writes, writers * per_writer);
    assert_eq!(stats.host_bytes_written, writers * per_writer * BLOCK_BYTES);
    assert_eq!(stats.nand_bytes_written, expected);
    assert_eq!(stats.physical_used, expected);
}

#[test]
fn a_full_queue_applies_back_pressure_without_losing_blocks() {
    let device = emulator(EmulatorOptions {
        queue_blocks: 1,
        ..EmulatorOptions::default()
    });
    device
        .write(0, &random_bytes(9, 64 * BLOCK_SIZE))
        .expect("write");
    device.drain().expect("drain");
    assert_eq!(device.stats().physical_used, 64 * BLOCK_BYTES);
}

#[test]
fn plain_modes_account_a_plain_ssd_without_compressing() {
    for mode in [DeviceCompression::None, DeviceCompression::Host] {
        let device = emulator(EmulatorOptions {
            mode,
            ..EmulatorOptions::default()
        });
        device.write(0, &[0; 3 * BLOCK_SIZE]).expect("write");
        device
            .write(1, &random_bytes(1, BLOCK_SIZE))
            .expect("overwrite");
        device.trim(2, 1).expect("trim");
        let stats = device.stats();
        assert_eq!(stats.physical_capacity, stats.logical_capacity, "{mode:?}");
        assert_eq!(
            stats.nand_bytes_written, stats.host_bytes_written,
            "{mode:?}"
        );
        assert_eq!(stats.physical_used, 2 * BLOCK_BYTES, "{mode:?}");
        assert!(device.compression_threads().is_empty(), "{mode:?}");
    }
}

#[test]
fn hardware_mode_passes_through_and_reports_physical_as_unknown() {
    let device = emulator(EmulatorOptions {
        mode: DeviceCompression::Hardware,
        ..EmulatorOptions::default()
    });
    let data = random_bytes(3, BLOCK_SIZE);
    device.write(7, &data).expect("write");
    let mut back = vec![0u8; BLOCK_SIZE];
    device.read(7, &mut back).expect("read");
    assert_eq!(back, data);
    let stats = device.stats();
    assert_eq!(
        (
            stats.physical_capacity,
            stats.physical_used,
            stats.nand_bytes_written
        ),
        (0, 0, 0)
    );
    assert_eq!(stats.host_bytes_written, BLOCK_BYTES);
    assert_eq!(device.physical_free(), None);
    assert_eq!(device.physical_size(7), None);
    assert_eq!(device.accounting_origin(), &AccountingOrigin::NotTracked);
}

#[test]
fn hardware_mode_discards_a_stale_sidecar() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sidecar = EmulatorOptions::sidecar_for(&dir.path().join("ssd"));
    let device = file_emulator(dir.path());
    write_mixed_blocks(&device);
    device.close().expect("close");
    assert!(sidecar.exists());
    let hardware = CompressingDevice::open_file(
        dir.path().join("ssd"),
        BLOCKS * BLOCK_BYTES,
        &FileOptions::default(),
        EmulatorOptions {
            mode: DeviceCompression::Hardware,
            ..EmulatorOptions::default()
        },
    )
    .expect("open in hardware mode");
    assert!(!sidecar.exists(), "its writes would go unaccounted");
    drop(hardware);
    assert!(!sidecar.exists());
}

#[test]
fn failed_writes_are_not_accounted() {
    let faulty = FaultyDevice::new(MemDevice::new(BLOCKS));
    faulty.fail_lba(FaultOp::Write, 3);
    let device = CompressingDevice::new(faulty, EmulatorOptions::default()).expect("open");
    assert!(device.write(3, &random_bytes(1, BLOCK_SIZE)).is_err());
    device
        .write(4, &random_bytes(2, BLOCK_SIZE))
        .expect("write");
    device.drain().expect("drain");
    assert_eq!(device.stats().nand_bytes_written, BLOCK_BYTES);
    assert_eq!(device.stats().host_bytes_written, BLOCK_BYTES);
}

#[test]
fn bad_options_are_rejected() {
    for options in [
        EmulatorOptions {
            logical_to_physical: 0.0,
            ..EmulatorOptions::default()
        },
        EmulatorOptions {
            logical_to_physical: f64::NAN,
            ..EmulatorOptions::default()
        },
        EmulatorOptions {
            controller_threads: 0,
            ..EmulatorOptions::default()
        },
        EmulatorOptions {
            queue_blocks: 0,
            ..EmulatorOptions::default()
        },
    ] {
        let err = CompressingDevice::new(MemDevice::new(4), options).err();
        assert_eq!(err.map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
    }
}

#[test]
fn sidecar_round_trip_keeps_physical_accounting() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sidecar = EmulatorOptions::sidecar_for(&dir.path().join("ssd"));
    let device = file_emulator(dir.path());
    assert_eq!(
        device.accounting_origin(),
        &AccountingOrigin::Rebuilt(RebuildReason::SidecarMissing)
    );
    write_mixed_blocks(&device);
    device.flush().expect("flush");
    assert!(sidecar.exists(), "flush persists the table");
    let before = device.stats();
    let sizes_before = sizes(&device);
    device.close().expect("close");

    let device = file_emulator(dir.path());
    assert_eq!(device.accounting_origin(), &AccountingOrigin::Loaded);
    assert_eq!(sizes(&device), sizes_before);
    let after = device.stats();
    assert_eq!(after.physical_used, before.physical_used);
    assert_eq!(after.host_bytes_written, 0, "counters restart at open");

    device
        .write(1000, &random_bytes(7, BLOCK_SIZE))
        .expect("write");
    assert!(!sidecar.exists(), "a write makes the persisted table stale");
    drop(device);
    assert!(sidecar.exists(), "drop persists again");
}

#[test]
fn corrupt_or_mismatched_sidecars_are_rebuilt_from_the_data() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sidecar = EmulatorOptions::sidecar_for(&dir.path().join("ssd"));
    let device = file_emulator(dir.path());
    write_mixed_blocks(&device);
    device.drain().expect("drain");
    let expected = device.stats().physical_used;
    let sizes_before = sizes(&device);
    device.close().expect("close");

    let mut bytes = fs::read(&sidecar).expect("sidecar");
    bytes[SIDECAR_HEADER_LEN + 10] ^= 0x40;
    fs::write(&sidecar, &bytes).expect("corrupt it");
    let device = file_emulator(dir.path());
    assert_eq!(
        device.accounting_origin(),
        &AccountingOrigin::Rebuilt(RebuildReason::SidecarInvalid("CRC32C mismatch".into()))
    );
    assert_eq!(
        sizes(&device),
        sizes_before,
        "rebuild recomputes the same sizes"
    );
    assert_eq!(device.stats().physical_used, expected);
    assert_eq!(device.stats().reads, 0, "rebuild reads are not host reads");
    device.close().expect("close");

    let other_mode = CompressingDevice::open_file(
        dir.path().join("ssd"),
        BLOCKS * BLOCK_BYTES,
        &FileOptions::default(),
        EmulatorOptions {
            mode: DeviceCompression::None,
            ..EmulatorOptions::default()
        },
    )
    .expect("open in None mode");
    assert!(matches!(
        other_mode.accounting_origin(),
        AccountingOrigin::Rebuilt(RebuildReason::SidecarInvalid(_))
    ));
    let live_blocks = sizes_before.iter().filter(|&&size| size > 0).count() as u64;
    assert_eq!(other_mode.stats().physical_used, live_blocks * BLOCK_BYTES);
}

#[test]
fn an_unclean_stop_after_more_writes_rebuilds_instead_of_trusting_the_sidecar() {
    let dir = tempfile::tempdir().expect("temp dir");
    let device = file_emulator(dir.path());
    write_mixed_blocks(&device);
    device.flush().expect("flush");
    device
        .write(500, &random_bytes(1, 4 * BLOCK_SIZE))
        .expect("write after flush");
    device.trim(0, 3).expect("trim after flush");
    device.drain().expect("drain");
    let expected = sizes(&device);
    // A crash: no close, no drop, nothing persisted after the flush.
    std::mem::forget(device);

    let device = file_emulator(dir.path());
    assert_eq!(
        device.accounting_origin(),
        &AccountingOrigin::Rebuilt(RebuildReason::SidecarMissing)
    );
    assert_eq!(sizes(&device), expected);
}

#[test]
fn without_a_sidecar_memory_devices_rebuild_from_their_blocks() {
    let memory = Arc::new(MemDevice::new(BLOCKS));
    let device =
        CompressingDevice::new(Arc::clone(&memory), EmulatorOptions::default()).expect("open");
    write_mixed_blocks(&device);
    device.drain().expect("drain");
    let expected = sizes(&device);
    drop(device);
    let device = CompressingDevice::new(memory, EmulatorOptions::default()).expect("reopen");
    assert_eq!(
        device.accounting_origin(),
        &AccountingOrigin::Rebuilt(RebuildReason::NoSidecar)
    );
    assert_eq!(sizes(&device), expected);
}

#[test]
fn batches_account_and_count_like_single_requests() {
    for mode in [DeviceCompression::Emulate, DeviceCompression::None] {
        let options = EmulatorOptions {
            mode,
            controller_threads: 2,
            ..EmulatorOptions::default()
        };
        let (single, batched) = (emulator(options.clone()), emulator(options));
        let blocks: Vec<Vec<u8>> = (0..40)
            .map(|i| block_with_eta(i, (i % 5) as f64 / 4.0))
            .collect();
        let three_blocks = random_bytes(9, 3 * BLOCK_SIZE);
        let mut writes: Vec<BatchWrite<'_>> = (0..)
            .zip(&blocks)
            .map(|(i, buf)| BatchWrite { lba: i * 2, buf })
            .collect();
        writes.push(BatchWrite {
            lba: 200,
            buf: &three_blocks,
        });
        for write in &writes {
            single.write(write.lba, write.buf).expect("write");
        }
        writes.push(BatchWrite {
            lba: BLOCKS,
            buf: &blocks[0],
        });
        let failed: Vec<bool> = batched
            .write_batch(&writes)
            .iter()
            .map(Result::is_err)
            .collect();
        assert_eq!(failed.iter().filter(|&&f| f).count(), 1);
        assert!(
            failed[writes.len() - 1],
            "the request past the end fails alone"
        );
        single.drain().expect("drain");
        batched.drain().expect("drain");
        assert_eq!(sizes(&single), sizes(&batched), "{mode:?}");
        assert_eq!(single.stats(), batched.stats(), "{mode:?}");

        let mut back: Vec<Vec<u8>> = writes.iter().map(|w| vec![0; w.buf.len()]).collect();
        let mut reads: Vec<BatchRead<'_>> = writes
            .iter()
            .zip(back.iter_mut())
            .map(|(write, buf)| BatchRead {
                lba: write.lba,
                buf,
            })
            .collect();
        let results = batched.read_batch(&mut reads);
        assert_eq!(
            results.iter().filter(|r| r.is_ok()).count(),
            writes.len() - 1
        );
        for (write, read) in writes.iter().zip(&back).take(writes.len() - 1) {
            assert!(write.buf == &read[..], "lba {}", write.lba);
        }
        let (result, _) = complete(batched.read_async(200, AlignedBuf::zeroed(3)));
        result.expect("async read");
        assert_eq!(batched.stats().reads, writes.len() as u64);
    }
}

#[test]
fn a_batch_invalidates_the_sidecar_and_is_persisted_by_the_next_flush() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sidecar = EmulatorOptions::sidecar_for(&dir.path().join("ssd"));
    let device = file_emulator(dir.path());
    write_mixed_blocks(&device);
    device.flush().expect("flush");
    assert!(sidecar.exists());
    let data = random_bytes(3, 2 * BLOCK_SIZE);
    let writes = [
        BatchWrite {
            lba: 1000,
            buf: &data[..BLOCK_SIZE],
        },
        BatchWrite {
            lba: 1002,
            buf: &data[BLOCK_SIZE..],
        },
    ];
    assert!(device.write_batch(&writes).iter().all(Result::is_ok));
    assert!(!sidecar.exists(), "a batch makes the persisted table stale");
    device.drain().expect("drain");
    let expected = sizes(&device);
    assert_eq!(expected[1000], RAW_BLOCK);
    device.close().expect("close");
    let device = file_emulator(dir.path());
    assert_eq!(device.accounting_origin(), &AccountingOrigin::Loaded);
    assert_eq!(sizes(&device), expected);
}

#[test]
fn failed_requests_of_a_batch_are_not_accounted() {
    let faulty = FaultyDevice::new(MemDevice::new(BLOCKS));
    faulty.fail_lba(FaultOp::Write, 3);
    let device = CompressingDevice::new(faulty, EmulatorOptions::default()).expect("open");
    let data = random_bytes(1, 2 * BLOCK_SIZE);
    let writes = [
        BatchWrite {
            lba: 3,
            buf: &data[..BLOCK_SIZE],
        },
        BatchWrite {
            lba: 4,
            buf: &data[BLOCK_SIZE..],
        },
    ];
    let failed: Vec<bool> = device
        .write_batch(&writes)
        .iter()
        .map(Result::is_err)
        .collect();
    assert_eq!(failed, [true, false]);
    device.drain().expect("drain");
    assert_eq!(device.physical_size(3), Some(0));
    assert_eq!(device.stats().nand_bytes_written, BLOCK_BYTES);
    assert_eq!(device.stats().host_bytes_written, BLOCK_BYTES);
}
