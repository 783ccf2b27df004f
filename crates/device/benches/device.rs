//! Device-layer latencies: 4 KiB O_DIRECT random reads and writes on a file, and what the
//! emulated compressing SSD adds to a write on the caller's thread.
//!
//! `cargo bench -p zipcache-device --bench device`. The file lives in `$ZIPCACHE_BENCH_DIR`
//! (default: the system temp dir); put it on the filesystem you want to measure.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use zipcache_device::{
    AlignedBuf, BLOCK_BYTES, BLOCK_SIZE, BlockDevice, CompressingDevice, EmulatorOptions,
    FileDevice, MemDevice,
};

/// 256 MiB: large enough that random LBAs rarely repeat within a sample.
const FILE_BLOCKS: u64 = 65_536;
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
fn prefilled_file(dir: &tempfile::TempDir) -> FileDevice {
    let device = FileDevice::open(dir.path().join("ssd"), FILE_BLOCKS * BLOCK_BYTES).expect("open");
    let chunk_blocks = 256;
    let mut chunk = AlignedBuf::zeroed(chunk_blocks);
    let mut lbas = Lbas(0x5eed);
    for byte in chunk.iter_mut() {
        *byte = lbas.next(256) as u8;
    }
    for lba in (0..FILE_BLOCKS).step_by(chunk_blocks) {
        device.write(lba, &chunk).expect("prefill");
    }
    device.flush().expect("flush");
    device
}

fn file_io(c: &mut Criterion) {
    let dir = bench_dir();
    let device = prefilled_file(&dir);
    let mut group = c.benchmark_group("file_o_direct_4k");
    let mut buf = AlignedBuf::zeroed(1);
    let mut lbas = Lbas(1);
    group.bench_function("random_read", |b| {
        b.iter(|| device.read(lbas.next(FILE_BLOCKS), &mut buf).expect("read"));
    });
    let block = half_compressible_block(2);
    group.bench_function("random_write", |b| {
        b.iter(|| device.write(lbas.next(FILE_BLOCKS), &block).expect("write"));
    });
    let mut unaligned = vec![0u8; BLOCK_SIZE + 1];
    group.bench_function("random_read_unaligned_buffer", |b| {
        b.iter(|| {
            let lba = lbas.next(FILE_BLOCKS);
            device.read(lba, &mut unaligned[1..]).expect("read");
        });
    });
    group.finish();
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
    let file = prefilled_file(&dir);
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
