//! Device-layer figures: 4 KiB O_DIRECT random reads and writes on a 1 GiB file one at a
//! time, in batches of 32 and 64 (io_uring, and the fallback without it), and as
//! asynchronous reads with 32 in flight; and what the emulated compressing SSD adds to a
//! write on the caller's thread. Throughputs are requests per second (IOPS).
//!
//! `cargo bench -p zipcache-device --bench device`. The file lives in `$ZIPCACHE_BENCH_DIR`
//! (default: the system temp dir); put it on the filesystem you want to measure.

use std::hint::black_box;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use zipcache_device::{
    AlignedBuf, BLOCK_BYTES, BLOCK_SIZE, BatchRead, BatchWrite, BlockDevice, CompressingDevice,
    EmulatorOptions, FileDevice, FileOptions, MemDevice, ReadFuture, install_thread_ring,
    reap_thread_ring,
};

/// 256 MiB for the emulator's write path: large enough that random LBAs rarely repeat
/// within a sample.
const FILE_BLOCKS: u64 = 65_536;
/// 1 GiB for the IOPS figures, as fio's `--size=1G`: the page cache is bypassed anyway, and
/// a span this large keeps the device from serving reads out of its own cache.
const IOPS_FILE_BLOCKS: u64 = 262_144;
/// Asynchronous reads kept in flight, as fio's `--iodepth=32`.
const ASYNC_IN_FLIGHT: usize = 32;
/// Writes timed between two drains of the emulator: well under its default queue, so the
/// timed writes never meet back-pressure and only the caller's own cost is measured.
const WRITES_PER_DRAIN: u64 = 512;

struct Lbas(u64);

impl Lbas {
    fn next(&mut self, blocks: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % blocks
    }
}

/// Half random, half zeros: the paper's default compressibility η = 0.5.
fn half_compressible_block(seed: u64) -> AlignedBuf {
    let mut block = AlignedBuf::zeroed(1);
    let mut lbas = Lbas(seed | 1);
    for byte in &mut block[..BLOCK_SIZE / 2] {
        *byte = lbas.next(256) as u8;
    }
    block
}

fn bench_dir() -> tempfile::TempDir {
    let parent = std::env::var_os("ZIPCACHE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    tempfile::tempdir_in(parent).expect("bench dir")
}

/// Writes every block once so reads hit allocated extents: a hole reads as zeros without
/// touching the disk, which would flatter the read latency.
fn prefilled_file(dir: &tempfile::TempDir, blocks: u64) -> FileDevice {
    let device = FileDevice::open(dir.path().join("ssd"), blocks * BLOCK_BYTES).expect("open");
    let chunk_blocks = 256;
    let mut chunk = AlignedBuf::zeroed(chunk_blocks);
    let mut lbas = Lbas(0x5eed);
    for byte in chunk.iter_mut() {
        *byte = lbas.next(256) as u8;
    }
    for lba in (0..blocks).step_by(chunk_blocks) {
        device.write(lba, &chunk).expect("prefill");
    }
    device.flush().expect("flush");
    device
}

fn file_io(c: &mut Criterion) {
    let dir = bench_dir();
    let device = prefilled_file(&dir, IOPS_FILE_BLOCKS);
    let mut group = c.benchmark_group("file_o_direct_4k");
    group.throughput(Throughput::Elements(1));
    let mut buf = AlignedBuf::zeroed(1);
    let mut lbas = Lbas(1);
    group.bench_function("random_read", |b| {
        b.iter(|| {
            let lba = lbas.next(IOPS_FILE_BLOCKS);
            device.read(lba, &mut buf).expect("read")
        });
    });
    let block = half_compressible_block(2);
    group.bench_function("random_write", |b| {
        b.iter(|| {
            let lba = lbas.next(IOPS_FILE_BLOCKS);
            device.write(lba, &block).expect("write")
        });
    });
    let mut unaligned = vec![0u8; BLOCK_SIZE + 1];
    group.bench_function("random_read_unaligned_buffer", |b| {
        b.iter(|| {
            let lba = lbas.next(IOPS_FILE_BLOCKS);
            device.read(lba, &mut unaligned[1..]).expect("read");
        });
    });
    group.finish();

    let without_io_uring = FileDevice::open_with(
        dir.path().join("ssd"),
        IOPS_FILE_BLOCKS * BLOCK_BYTES,
        &FileOptions {
            io_uring: false,
            ..FileOptions::default()
        },
    )
    .expect("reopen");
    let mut group = c.benchmark_group("file_o_direct_4k_batch");
    for (name, device) in [("io_uring", &device), ("fallback", &without_io_uring)] {
        for size in [32, 64] {
            group.throughput(Throughput::Elements(size as u64));
            let mut bufs: Vec<AlignedBuf> = (0..size).map(|_| AlignedBuf::zeroed(1)).collect();
            let id = BenchmarkId::new(format!("random_read_{name}"), size);
            group.bench_function(id, |b| {
                b.iter(|| {
                    let mut reads: Vec<BatchRead<'_>> = bufs
                        .iter_mut()
                        .map(|buf| BatchRead {
                            lba: lbas.next(IOPS_FILE_BLOCKS),
                            buf,
                        })
                        .collect();
                    for result in device.read_batch(&mut reads) {
                        result.expect("read");
                    }
                });
            });
            let id = BenchmarkId::new(format!("random_write_{name}"), size);
            group.bench_function(id, |b| {
                b.iter(|| {
                    let writes: Vec<BatchWrite<'_>> = (0..size)
                        .map(|_| BatchWrite {
                            lba: lbas.next(IOPS_FILE_BLOCKS),
                            buf: &block,
                        })
                        .collect();
                    for result in device.write_batch(&writes) {
                        result.expect("write");
                    }
                });
            });
        }
    }
    group.finish();

    let mut group = c.benchmark_group("file_o_direct_4k_async");
    group.throughput(Throughput::Elements(1));
    let eventfd = install_thread_ring(ASYNC_IN_FLIGHT as u32).expect("thread ring");
    let id = BenchmarkId::new("random_read_in_flight", ASYNC_IN_FLIGHT);
    group.bench_function(id, |b| {
        b.iter_custom(|reads| async_reads(&device, eventfd, reads, &mut lbas));
    });
    group.finish();
}

/// Completes `total` random reads with [`ASYNC_IN_FLIGHT`] in flight, the way a server's
/// reaper task does: wait for the eventfd, reap, poll the futures, submit more.
fn async_reads(device: &FileDevice, eventfd: RawFd, total: u64, lbas: &mut Lbas) -> Duration {
    let start = Instant::now();
    let mut submitted = 0;
    let mut completed = 0;
    let mut reads: Vec<Option<ReadFuture>> = (0..ASYNC_IN_FLIGHT).map(|_| None).collect();
    let mut spare: Vec<AlignedBuf> = (0..ASYNC_IN_FLIGHT)
        .map(|_| AlignedBuf::zeroed(1))
        .collect();
    let mut context = Context::from_waker(Waker::noop());
    while completed < total {
        for slot in reads.iter_mut().filter(|slot| slot.is_none()) {
            if submitted == total {
                break;
            }
            let buf = spare.pop().unwrap_or_else(|| AlignedBuf::zeroed(1));
            *slot = Some(device.read_async(lbas.next(IOPS_FILE_BLOCKS), buf));
            submitted += 1;
        }
        zipcache_device::wait_thread_ring(eventfd, Duration::from_millis(100));
        reap_thread_ring();
        for slot in reads.iter_mut() {
            if let Some(read) = slot
                && let Poll::Ready((result, buf)) = Pin::new(read).poll(&mut context)
            {
                result.expect("read");
                spare.push(buf);
                *slot = None;
                completed += 1;
            }
        }
    }
    start.elapsed()
}

/// Times `WRITES_PER_DRAIN` writes at a time and lets the controller catch up untimed.
fn timed_writes(device: &impl BlockDevice, blocks: u64, iters: u64, block: &[u8]) -> Duration {
    let mut lbas = Lbas(3);
    let mut elapsed = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let batch = (iters - done).min(WRITES_PER_DRAIN);
        let start = Instant::now();
        for _ in 0..batch {
            device
                .write(lbas.next(blocks), black_box(block))
                .expect("write");
        }
        elapsed += start.elapsed();
        device.drain().expect("drain");
        done += batch;
    }
    elapsed
}

fn emulator_write_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("emulator_caller_write_4k");
    let block = half_compressible_block(4);
    let blocks = 1 << 20;
    let memory = MemDevice::new(blocks);
    let emulated = CompressingDevice::new(MemDevice::new(blocks), EmulatorOptions::default())
        .expect("emulator");
    group.bench_function("memory_device", |b| {
        b.iter_custom(|iters| timed_writes(&memory, blocks, iters, &block));
    });
    group.bench_function("memory_device_emulated", |b| {
        b.iter_custom(|iters| timed_writes(&emulated, blocks, iters, &block));
    });
    drop(emulated);

    let dir = bench_dir();
    let file = prefilled_file(&dir, FILE_BLOCKS);
    group.bench_function("file_o_direct", |b| {
        b.iter_custom(|iters| timed_writes(&file, FILE_BLOCKS, iters, &block));
    });
    let emulated_file =
        CompressingDevice::new(file, EmulatorOptions::default()).expect("file emulator");
    group.bench_function("file_o_direct_emulated", |b| {
        b.iter_custom(|iters| timed_writes(&emulated_file, FILE_BLOCKS, iters, &block));
    });
    group.finish();
}

fn config() -> Criterion {
    // Two shared cores: short runs, enough samples for a stable median.
    Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
}

criterion_group! {
    name = benches;
    config = config();
    targets = file_io, emulator_write_path
}
criterion_main!(benches);
