//! The restart protocol: what one run leaves on the device and beside it, and how the
//! next open decides what of the flash tier it may serve (`docs/FORMAT.md`, "Restart").
//!
//! Modules by job: [`open`] the steps of an open — the saved state read, the new run
//! begun, the tiers kept or trimmed; [`close`] what a clean close saves; [`epoch`] the
//! run epoch in the device's superblock; [`files`] where the files beside the SSD file
//! live; [`sealed_file`] an index file's seal and its atomic, durable replacement;
//! [`dir`] the few file-system steps durability is made of (a test cuts the power
//! between any two).

pub(crate) mod close;
pub(crate) mod dir;
pub(crate) mod epoch;
pub(crate) mod files;
pub(crate) mod journal;
pub(crate) mod open;
pub(crate) mod sealed_file;
pub(crate) mod shadow;
