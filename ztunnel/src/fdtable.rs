//! The process's file descriptor table, grown once before any thread starts.
//!
//! The kernel doubles a process's descriptor table when a new descriptor number passes
//! its size (256, 512, 1024, ...). Once the table is shared by several threads, each
//! growth waits for an RCU grace period (`expand_fdtable`), and that wait lands inside
//! whichever `socket` or `accept` crossed the line: measured at 5–12 ms in a pod's ZDS
//! add. A single-threaded process grows it without the wait, so ztunnel does it first.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Descriptors the table is sized for: two per proxied connection plus about ten per
/// enrolled pod. The table costs 8 bytes a slot of kernel memory (128 KiB here).
pub const RESERVED: u64 = 16 * 1024;

/// Grows the table to hold `wanted` descriptors, capped by the soft `RLIMIT_NOFILE`.
/// Returns the size reserved. Call it before any thread is spawned.
pub fn reserve(wanted: u64) -> io::Result<u64> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
    let slots = wanted.min(soft);
    let Ok(highest) = libc::c_int::try_from(slots.saturating_sub(1)) else {
        return Ok(0);
    };
    let null = File::open("/dev/null")?;
    // The lowest free descriptor at or above `highest`: the kernel grows the table to
    // hold it, and keeps that size once it is closed.
    // SAFETY: fcntl on a valid fd; F_DUPFD_CLOEXEC takes an int and returns a new fd.
    let fd = unsafe { libc::fcntl(null.as_raw_fd(), libc::F_DUPFD_CLOEXEC, highest) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by fcntl and is owned by nothing else.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_size() -> u64 {
        // `FDSize` in /proc/self/status is the table's current size.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("FDSize:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn reserve_grows_the_table_and_leaves_no_descriptor_open() {
        let reserved = reserve(4096).unwrap();
        assert!(
            reserved > 256,
            "soft RLIMIT_NOFILE too low to test: {reserved}"
        );
        assert!(
            table_size() >= reserved,
            "FDSize {} < {reserved}",
            table_size()
        );
        let highest = libc::c_int::try_from(reserved - 1).unwrap();
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let open = unsafe { libc::fcntl(highest, libc::F_GETFD) } >= 0;
        assert!(!open, "the descriptor used to grow the table is still open");
    }
}
