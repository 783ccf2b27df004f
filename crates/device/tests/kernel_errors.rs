//! An error the kernel returns for one request of a batch fails that request alone, through
//! io_uring and through the fallback alike. Its own test binary because it lowers
//! `RLIMIT_FSIZE`, which applies to the whole process.

use std::io;

use zipcache_device::{AlignedBuf, BLOCK_BYTES, BatchWrite, BlockDevice, FileDevice, FileOptions};

const LIMIT_BLOCKS: u64 = 32;

#[test]
fn a_write_the_kernel_refuses_fails_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let devices: Vec<FileDevice> = [true, false]
        .into_iter()
        .map(|io_uring| {
            let options = FileOptions {
                io_uring,
                ..FileOptions::default()
            };
            let path = dir.path().join(format!("ssd-{io_uring}"));
            FileDevice::open_with(path, 2 * LIMIT_BLOCKS * BLOCK_BYTES, &options).expect("open")
        })
        .collect();

    // SAFETY: SIG_IGN installs no handler, so no code of ours runs in signal context. A write
    // past the limit then fails with EFBIG instead of killing the process with SIGXFSZ.
    let previous = unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    assert_ne!(previous, libc::SIG_ERR);
    let limit = libc::rlimit {
        rlim_cur: LIMIT_BLOCKS * BLOCK_BYTES,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: passes a pointer to a live, initialised `rlimit` that the call only reads.
    assert_eq!(
        unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &raw const limit) },
        0
    );

    let block = AlignedBuf::copy_from(&[0x5A; 4096]);
    let writes = [0, LIMIT_BLOCKS + 3, 1].map(|lba| BatchWrite { lba, buf: &block });
    for device in &devices {
        let results = device.write_batch(&writes);
        let errors: Vec<Option<i32>> = results
            .iter()
            .map(|r| r.as_ref().err().map(|e| e.raw_os_error().unwrap_or(-1)))
            .collect();
        assert_eq!(
            errors,
            [None, Some(libc::EFBIG), None],
            "io_uring {}",
            device.uses_io_uring()
        );
        assert_eq!(device.stats().writes, 2);
        let mut back = AlignedBuf::zeroed(1);
        device.read(1, &mut back).expect("read");
        assert_eq!(&back[..], &block[..]);
    }
    let too_far = devices[0].write(LIMIT_BLOCKS, &block).err();
    assert_eq!(too_far.map(|e| e.kind()), Some(io::ErrorKind::FileTooLarge));
}
