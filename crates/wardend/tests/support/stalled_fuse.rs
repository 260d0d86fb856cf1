//! A FUSE filesystem that answers until told to stall, then answers nothing: the test
//! double of a hung NFS or FUSE mount. It speaks just enough of the protocol to be entered
//! (an empty root directory owned by the client); after [`StalledFuse::stall`] every request
//! waits, as on a dead server. Dropping it detaches the mount and closes the device, which
//! aborts the connection: every waiting request then fails and its thread goes on.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::harness::Result;

const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const INIT: u32 = 26;
const OPENDIR: u32 = 27;
const READDIR: u32 = 28;
const RELEASEDIR: u32 = 29;
const INTERRUPT: u32 = 36;
const BATCH_FORGET: u32 = 42;
const IN_HEADER: usize = 40;

/// A mounted FUSE double.
pub struct StalledFuse {
    mountpoint: PathBuf,
    stalled: Arc<AtomicBool>,
    waiting: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<File>>,
}

impl StalledFuse {
    /// Mount an empty directory owned by `uid`:`gid` on `mountpoint` (which must exist).
    pub fn mount(mountpoint: &Path, uid: u32, gid: u32) -> Result<Self> {
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")?;
        let options = format!(
            "fd={},rootmode=40000,user_id={uid},group_id={gid},allow_other",
            dev.as_raw_fd()
        );
        nix::mount::mount(
            Some("warden-stalled"),
            mountpoint,
            Some("fuse"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(options.as_str()),
        )?;
        let stalled = Arc::new(AtomicBool::new(false));
        let waiting = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let server = {
            let (stalled, waiting, stop) = (stalled.clone(), waiting.clone(), stop.clone());
            std::thread::spawn(move || serve(dev, uid, gid, &stalled, &waiting, &stop))
        };
        Ok(Self {
            mountpoint: mountpoint.to_path_buf(),
            stalled,
            waiting,
            stop,
            server: Some(server),
        })
    }

    /// From now on, answer nothing.
    pub fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }

    /// Requests that arrived since the stall and wait for an answer.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

impl Drop for StalledFuse {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
        self.stop.store(true, Ordering::SeqCst);
        // The server thread hands the device back; closing it aborts the connection.
        if let Some(dev) = self.server.take().and_then(|s| s.join().ok()) {
            drop(dev);
        }
    }
}

fn serve(
    mut dev: File,
    uid: u32,
    gid: u32,
    stalled: &AtomicBool,
    waiting: &AtomicUsize,
    stop: &AtomicBool,
) -> File {
    let mut buf = vec![0u8; 1 << 20];
    while !stop.load(Ordering::SeqCst) {
        let tick = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let mut fds = [rustix::event::PollFd::new(
            &dev,
            rustix::event::PollFlags::IN,
        )];
        match rustix::event::poll(&mut fds, Some(&tick)) {
            Ok(n) if n > 0 => {}
            _ => continue,
        }
        let Ok(n) = dev.read(&mut buf) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if n < IN_HEADER {
            continue;
        }
        let opcode = u32_at(&buf, 4);
        let unique = u64_at(&buf, 8);
        if matches!(opcode, FORGET | BATCH_FORGET | INTERRUPT) {
            continue;
        }
        if stalled.load(Ordering::SeqCst) {
            waiting.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        let (error, body): (i32, Vec<u8>) = match opcode {
            INIT => (0, init_out(u32_at(&buf, IN_HEADER + 8))),
            GETATTR => (0, attr_out(uid, gid)),
            LOOKUP => (-libc::ENOENT, Vec::new()),
            OPENDIR => (0, vec![0u8; 16]),
            READDIR | RELEASEDIR => (0, Vec::new()),
            // ACCESS among them: ENOSYS tells the kernel not to ask again.
            _ => (-libc::ENOSYS, Vec::new()),
        };
        let mut reply = Vec::with_capacity(16 + body.len());
        let len = u32::try_from(16 + body.len()).unwrap_or(16);
        reply.extend_from_slice(&len.to_ne_bytes());
        reply.extend_from_slice(&error.to_ne_bytes());
        reply.extend_from_slice(&unique.to_ne_bytes());
        reply.extend_from_slice(&body);
        let _ = dev.write_all(&reply);
    }
    dev
}

/// fuse_init_out for protocol 7.31.
fn init_out(max_readahead: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&7u32.to_ne_bytes());
    b.extend_from_slice(&31u32.to_ne_bytes());
    b.extend_from_slice(&max_readahead.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes()); // flags
    b.extend_from_slice(&16u16.to_ne_bytes()); // max_background
    b.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
    b.extend_from_slice(&65536u32.to_ne_bytes()); // max_write
    b.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    b.resize(64, 0);
    b
}

/// fuse_attr_out of the root: a directory owned by the client, never cached.
fn attr_out(uid: u32, gid: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(104);
    b.extend_from_slice(&0u64.to_ne_bytes()); // attr_valid
    b.extend_from_slice(&0u32.to_ne_bytes()); // attr_valid_nsec
    b.extend_from_slice(&0u32.to_ne_bytes()); // dummy
    b.extend_from_slice(&1u64.to_ne_bytes()); // ino
    b.extend_from_slice(&[0u8; 8 * 5]); // size, blocks, atime, mtime, ctime
    b.extend_from_slice(&[0u8; 4 * 3]); // *timensec
    b.extend_from_slice(&(libc::S_IFDIR | 0o755).to_ne_bytes());
    b.extend_from_slice(&2u32.to_ne_bytes()); // nlink
    b.extend_from_slice(&uid.to_ne_bytes());
    b.extend_from_slice(&gid.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes()); // rdev
    b.extend_from_slice(&4096u32.to_ne_bytes()); // blksize
    b.extend_from_slice(&0u32.to_ne_bytes()); // flags
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}
