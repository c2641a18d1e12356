//! Writing the zeros of the active journal ahead of its appends, so that a group commit's
//! `fdatasync` overwrites blocks the file system has already allocated.
//!
//! fjall preallocates each journal with `set_len`, which on ext4 (and most file systems)
//! leaves a sparse file: every append then lands in a hole, the block is allocated when it
//! is written back, and the `fdatasync` that makes the append durable must commit the file
//! system's journal for that allocation. In ext4's default `data=ordered` mode that commit
//! also writes out the data of every other file with blocks allocated in the same
//! transaction: the store's own flushes and compactions, and any other process on the
//! disk. That is where a join's sync wait of a few hundred µs turns into 100–300 ms (see
//! docs/PERFORMANCE.md, "Tail latency at scale"). A sync that only overwrites allocated,
//! written blocks needs no such commit: it writes its own pages and flushes the device.
//!
//! So after each sync (in `relaxed`, when the sync is captured, just before it: see
//! [`super::journal_sync`]), the journal writer (holding the group commit's flag, so
//! nothing is appended meanwhile) writes zeros over the next stretch of the preallocated
//! region, well ahead of the appends, and starts their write-back at once (in `relaxed`,
//! once the flag is given back: [`Writeback`]); by the time appends reach them, the blocks
//! are allocated and that allocation long committed.
//!
//! **Content never changes.** A stretch is written only if it reads all zeros (it is the
//! preallocated tail, which reads as zeros whether sparse or not), and it is written with
//! the zeros it holds. So even if the watermark's idea of where the appends end were wrong,
//! no byte would change value; recovery and [`super::watermark`] read the same file.

use std::fs::File;
use std::io;
use std::path::Path;

/// Bytes written per step (one step at most per sync).
const STEP: u64 = 1024 * 1024;
/// How far ahead of the appends the zeros are kept: at the 1–4 MB/s a busy journal grows,
/// seconds, long enough for their write-back and the file system's own periodic commit.
const AHEAD: u64 = 8 * 1024 * 1024;

/// The zeroed stretch of one journal file.
pub(super) struct ZeroAhead {
    /// The journal's id, its file (opened for writing), and where the zeros written so far end.
    active: Option<(u64, File, u64)>,
}

impl ZeroAhead {
    pub(super) fn new() -> ZeroAhead {
        ZeroAhead { active: None }
    }

    /// After a sync: the active journal `id` at `path` holds batches up to `end`. Writes one
    /// step of zeros if the zeros end less than [`AHEAD`] past `end`, and answers its
    /// write-back, to be started by the caller ([`Writeback::start`]). Must be called by the
    /// only writer of the journal, with nothing appended meanwhile.
    pub(super) fn advance(
        &mut self,
        id: u64,
        path: &Path,
        end: u64,
    ) -> io::Result<Option<Writeback>> {
        if self.active.as_ref().map(|a| a.0) != Some(id) {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)?;
            // Its reads of the tail must not cache more of it, in large folios, than the
            // step they read (see `no_readahead`).
            super::journal_files::no_readahead(&file);
            self.active = Some((id, file, 0));
        }
        let (_, file, zeroed) = self.active.as_mut().expect("set above");
        // Once per sync: no `stat` (`journal_files::len_quietly`); reads and writes here
        // are at explicit offsets.
        let len = super::journal_files::len_quietly(file)?;
        // Page-aligned, so a step never shares a page with the appends.
        let from = (*zeroed).max(end.div_ceil(4096) * 4096);
        if from >= len || from >= end + AHEAD {
            return Ok(None);
        }
        let n = STEP.min(len - from);
        let mut buf = vec![0u8; n as usize];
        read_exact_at(file, &mut buf, from)?;
        if buf.iter().any(|&b| b != 0) {
            // Not the preallocated tail (appends we did not expect): leave this file alone.
            *zeroed = len;
            return Ok(None);
        }
        write_all_at(file, &buf, from)?;
        *zeroed = from + n;
        Ok(Some(Writeback {
            file: file.try_clone()?,
            at: from,
            n,
        }))
    }
}

/// The write-back of a step just written, to start once the group commit's flag is given
/// back: `sync_file_range` submits the step's 256 pages to the disk and waits whenever the
/// kernel throttles write-back (a busy disk), 20–90 ms at times on a busy machine (the
/// writes of every request waited that long when it ran holding the flag; docs/PERFORMANCE.md,
/// "What stalls joins at 10,000/s"). Starting it a moment later changes nothing else: the
/// zeros are in the file already.
pub(super) struct Writeback {
    file: File,
    at: u64,
    n: u64,
}

impl Writeback {
    /// Starts writing the step back (Linux; elsewhere the OS's own write-back does it).
    pub(super) fn start(self) {
        start_writeback(&self.file, self.at, self.n);
    }

    /// Where the step starts and how long it is.
    #[cfg(test)]
    pub(super) fn range(&self) -> (u64, u64) {
        (self.at, self.n)
    }
}

/// After a sync of the journal: writes the next zeros ahead of the active journal's
/// appends. `zero_ahead` becomes `None` if that fails: it only speeds syncs up, so the
/// store goes on without it. The caller holds the group commit's flag, and starts the
/// answered write-back once it no longer does.
pub(super) fn after_sync(
    zero_ahead: &mut Option<ZeroAhead>,
    marker: &super::watermark::Marker,
) -> Option<Writeback> {
    let (Some(z), Some((id, end))) = (zero_ahead.as_mut(), marker.active_end()) else {
        return None;
    };
    match z.advance(id, &marker.journal_path(id), end) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "writing zeros ahead of the journal failed; syncs go on without them");
            *zero_ahead = None;
            None
        }
    }
}

#[cfg(unix)]
fn read_exact_at(f: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, at)
}

#[cfg(unix)]
fn write_all_at(f: &File, buf: &[u8], at: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(f, buf, at)
}

#[cfg(not(unix))]
fn read_exact_at(f: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = f;
    f.seek(SeekFrom::Start(at))?;
    f.read_exact(buf)
}

#[cfg(not(unix))]
fn write_all_at(f: &File, buf: &[u8], at: u64) -> io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = f;
    f.seek(SeekFrom::Start(at))?;
    f.write_all(buf)
}

/// Starts writing the step back now (Linux), so its blocks are allocated long before an
/// append's sync; elsewhere the OS's own write-back does it within seconds.
#[cfg(target_os = "linux")]
fn start_writeback(f: &File, at: u64, n: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on an open descriptor; it reads no memory of ours.
    unsafe {
        libc::sync_file_range(
            f.as_raw_fd(),
            at as libc::off64_t,
            n as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_f: &File, _at: u64, _n: u64) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn sparse(dir: &Path, len: u64) -> std::path::PathBuf {
        let p = dir.join("0.jnl");
        let f = File::create(&p).unwrap();
        f.set_len(len).unwrap();
        p
    }

    #[cfg(unix)]
    fn allocated(p: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).unwrap().blocks() * 512
    }

    #[cfg(unix)]
    #[test]
    fn zeros_ahead_of_the_appends_become_allocated_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let p = sparse(dir.path(), 64 * 1024 * 1024);
        assert!(allocated(&p) < STEP, "set_len leaves a sparse file");
        let mut z = ZeroAhead::new();
        for _ in 0..20 {
            if let Some(w) = z.advance(0, &p, 100).unwrap() {
                w.start();
            }
        }
        std::fs::File::open(&p).unwrap().sync_all().unwrap();
        let a = allocated(&p);
        assert!(a >= AHEAD, "the next {AHEAD} bytes are allocated ({a})");
        assert!(a <= AHEAD + 2 * STEP, "not much more ({a})");
    }

    /// Pages of `p`'s page cache in `[from, to)` that belong to a large (compound) folio, and
    /// the cached pages seen; `None` where page flags cannot be read (not root: the
    /// kernel hides page frame numbers).
    #[cfg(target_os = "linux")]
    fn large_folio_pages(p: &Path, from: u64, to: u64) -> Option<(u64, u64)> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        let f = File::open(p).unwrap();
        let len = (to - from) as usize;
        let pages = len / 4096;
        // SAFETY: a read-only shared mapping of an open file, unmapped below; only read
        // through volatile loads of bytes inside it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                from as libc::off_t,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let mut cached = vec![0u8; pages];
        // SAFETY: `cached` holds one byte per page of the mapping.
        assert_eq!(unsafe { libc::mincore(base, len, cached.as_mut_ptr()) }, 0);
        let pagemap = File::open("/proc/self/pagemap").ok()?;
        let flags = File::open("/proc/kpageflags").ok()?;
        let (mut large, mut seen) = (0, 0);
        for (i, c) in cached.iter().enumerate() {
            if c & 1 == 0 {
                continue; // not cached: reading it would cache it
            }
            let addr = base as usize + i * 4096;
            // SAFETY: inside the mapping; maps the page already cached.
            unsafe { std::ptr::read_volatile(addr as *const u8) };
            let mut e = [0u8; 8];
            pagemap
                .read_exact_at(&mut e, (addr / 4096 * 8) as u64)
                .ok()?;
            let e = u64::from_ne_bytes(e);
            let pfn = e & ((1 << 55) - 1);
            if e >> 63 == 0 || pfn == 0 {
                // SAFETY: the mapping made above.
                unsafe { libc::munmap(base, len) };
                return None; // not mapped after all, or frame numbers hidden
            }
            let mut k = [0u8; 8];
            flags.read_exact_at(&mut k, pfn * 8).ok()?;
            let k = u64::from_ne_bytes(k);
            // KPF_COMPOUND_HEAD (15), KPF_COMPOUND_TAIL (16).
            if k >> 15 & 1 == 1 || k >> 16 & 1 == 1 {
                large += 1;
            }
            seen += 1;
        }
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(base, len) };
        Some((large, seen))
    }

    /// The zeros ahead and the watermark's scan read the journal's preallocated tail; with
    /// the kernel's readahead those reads cached megabytes of it in large folios, and each
    /// small append into one cost 5–7 µs of buffer-head walking (see
    /// `journal_files::no_readahead`). They now leave the tail in single pages. Compared
    /// with a plain sequential read of a file like it, which on a kernel that caches in
    /// large folios (Linux ≥ 6.16 on ext4) does make large folios; where the control makes
    /// none (or page flags cannot be read), there is nothing to tell apart and it says so.
    #[cfg(target_os = "linux")]
    #[test]
    fn reads_of_the_journal_leave_its_tail_in_single_pages() {
        use std::io::Read;
        const MIB: u64 = 1024 * 1024;
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("control");
        File::create(&control).unwrap().set_len(32 * MIB).unwrap();
        let mut f = File::open(&control).unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        for _ in 0..(4 * MIB / buf.len() as u64) {
            f.read_exact(&mut buf).unwrap();
        }
        let Some((control_large, _)) = large_folio_pages(&control, 0, 16 * MIB) else {
            eprintln!("page flags are not readable here (not root): nothing to compare");
            return;
        };
        if control_large == 0 {
            eprintln!("a plain read caches this file system's pages singly: nothing to compare");
            return;
        }
        let p = sparse(dir.path(), 32 * MIB);
        let mut z = ZeroAhead::new();
        for _ in 0..12 {
            if let Some(w) = z.advance(0, &p, 100).unwrap() {
                w.start();
            }
        }
        let mark = crate::store::watermark::scan_from(&p, 0).unwrap();
        assert_eq!(mark.len, 0, "zeros hold no batch");
        let (large, seen) = large_folio_pages(&p, 0, 16 * MIB).unwrap();
        assert!(
            seen >= AHEAD / 4096,
            "the zeros ahead are cached ({seen} pages)"
        );
        assert_eq!(
            large, 0,
            "{large} of {seen} cached pages of the tail are in large folios \
             (a plain read of the control made {control_large})"
        );
    }

    #[test]
    fn never_changes_a_byte() {
        let dir = tempfile::tempdir().unwrap();
        let p = sparse(dir.path(), 4 * STEP);
        // Appends the watermark did not account for, past where it says they end.
        let data: Vec<u8> = (1..=255).cycle().take(5000).collect();
        write_all_at(
            &File::options().write(true).open(&p).unwrap(),
            &data,
            10_000,
        )
        .unwrap();
        let before = std::fs::read(&p).unwrap();
        let mut z = ZeroAhead::new();
        for _ in 0..8 {
            z.advance(0, &p, 100).unwrap();
        }
        assert!(std::fs::read(&p).unwrap() == before, "content unchanged");
        // A file that ends short of a whole step.
        let q = dir.path().join("1.jnl");
        File::create(&q).unwrap().set_len(STEP + 123).unwrap();
        for _ in 0..4 {
            z.advance(1, &q, 0).unwrap();
        }
        assert_eq!(std::fs::metadata(&q).unwrap().len(), STEP + 123);
        assert!(std::fs::read(&q).unwrap().iter().all(|&b| b == 0));
    }
}
