//! Telling a torn journal tail from a damaged journal, on open.
//!
//! fjall cuts a journal back to its last intact batch wherever the damage is, so on its own
//! a flipped byte near the start of a journal silently drops every change after it. We
//! read the journal files before fjall does and decide:
//!
//! - **Torn tail** (the last batch was being written when the process or machine died):
//!   nothing after the cut was ever known durable. fjall drops it; we start normally.
//! - **Damage**: the cut falls inside what is known durable, or intact batches follow the
//!   cut (a torn write leaves at most one unfinished batch, never intact ones after it; that
//!   batch's own end entry may be whole, its last page written and an earlier one not), or
//!   the batch at the cut reads whole but fails its checksum or item count (fjall refuses
//!   to open that rather than cut it), or a sealed journal does not read to its end, or a
//!   journal known durable is missing. We refuse to start, naming the file and the byte
//!   offset, unless asked to repair: then we cut the journals at the damage ourselves and
//!   log how much acknowledged data went.
//!
//! "Known durable" is the **watermark**: a small sidecar that the journal writer rewrites
//! after each sync, listing each journal file with its length and the batches, records and
//! place joins it holds up to that length. It is written without its own fsync (a process
//! crash keeps it in the page cache; a machine crash may leave it older than the journal,
//! which only makes the check more lenient, never wrong in the strict direction) and
//! carries a checksum, so a torn one is recognised.
//!
//! It has two slots, two files ([`MARK_FILE`], [`MARK_FILE_B`]) rewritten in turn, and the
//! check reads the one that covers more of the journal. Writing one slot never touches the
//! other, so a write torn by a machine crash (or one slot damaged by hand or by the disk)
//! leaves the previous watermark whole, one sync older: the check stays strict. Only with
//! both slots unreadable (or absent: a data dir from before it existed) is a truncation
//! impossible to tell from a torn tail; intact batches after the cut still are.
//!
//! The journal format read here is fjall 3's: per batch a start entry (tag 1, item count,
//! seqno), the items (tag 2, or tag 4 for a cleared keyspace), and an end entry (tag 3,
//! xxh3 of the items' bytes, magic `FJL\x03`).

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::journal_files::{exists_quietly, quiet_name, QuietName};

/// The watermark's first slot, inside the store's directory (the only one before the
/// second existed, so an older version's watermark is read as a first slot).
pub const MARK_FILE: &str = "durable.mark";
/// The watermark's second slot.
pub const MARK_FILE_B: &str = "durable.mark.b";
const SLOTS: [&str; 2] = [MARK_FILE, MARK_FILE_B];

const TAG_START: u8 = 1;
const TAG_ITEM: u8 = 2;
const TAG_END: u8 = 3;
const TAG_CLEAR: u8 = 4;
const MAGIC: &[u8; 4] = b"FJL\x03";
/// fjall's own keyspace of keyspace names; its writes are not ours to count.
const META_KEYSPACE: u64 = 0;

/// What some batches of a journal hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub batches: u64,
    /// Key writes (inserts and removals) of ours.
    pub records: u64,
    /// Of those, the join records of places (one per place that joined).
    pub joins: u64,
}

impl Tally {
    fn add(&mut self, o: Tally) {
        self.batches += o.batches;
        self.records += o.records;
        self.joins += o.joins;
    }

    fn minus(self, o: Tally) -> Tally {
        Tally {
            batches: self.batches.saturating_sub(o.batches),
            records: self.records.saturating_sub(o.records),
            joins: self.joins.saturating_sub(o.joins),
        }
    }
}

/// One journal file known durable up to `len` bytes, holding `tally` there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMark {
    pub len: u64,
    pub tally: Tally,
}

/// Journal id (`N` of `N.jnl`) → what of it is known durable.
pub type Marks = BTreeMap<u64, FileMark>;

fn journal_id(p: &Path) -> Option<u64> {
    if p.extension()? != "jnl" {
        return None;
    }
    p.file_stem()?.to_str()?.parse().ok()
}

/// The journal files of a store directory, by id.
pub fn journals(dir: &Path) -> BTreeMap<u64, PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    rd.flatten()
        .map(|e| e.path())
        .filter_map(|p| journal_id(&p).map(|id| (id, p)))
        .collect()
}

/// Reads intact batches of the journal at `path` from byte `from` (a batch boundary) on.
/// Answers where the last intact batch ends and what the batches read hold.
pub fn scan_from(path: &Path, from: u64) -> std::io::Result<FileMark> {
    let f = std::fs::File::open(path)?;
    super::journal_files::no_readahead(&f);
    let size = f.metadata()?.len();
    Ok(scan_file(&f, from, size, &mut Vec::new(), 64 * 1024))
}

/// [`scan_from`] on a journal that is kept open, reading through `buf` (kept between
/// calls, so a sync allocates nothing here).
fn scan_open(f: &std::fs::File, from: u64, buf: &mut Vec<u8>) -> std::io::Result<FileMark> {
    // Once per sync: no `stat` (`journal_files::len_quietly`). Reads are positioned, so
    // the offset that leaves at the end does not matter.
    let size = super::journal_files::len_quietly(f)?;
    let mark = scan_file(f, from, size, buf, ACTIVE_READ);
    // One batch far larger than usual (everything queued behind a slow sync) is no reason
    // to keep its buffer for the life of the process.
    if buf.len() > KEPT_READ_MAX {
        *buf = Vec::new();
    }
    Ok(mark)
}

/// The most the active journal's read buffer keeps between syncs.
const KEPT_READ_MAX: usize = 8 * ACTIVE_READ;

/// Reads the intact batches of `f` (`size` bytes) from `from` on, `chunk` bytes at a time
/// (more when a batch is longer) into `buf`, and parses them where they lie: no copy per
/// field, no allocation per batch. `buf` only grows (its bytes are overwritten, never
/// zeroed again: zeroing a read buffer per sync would cost more than the parse). A read
/// error ends the intact part, as the end of the file does.
fn scan_file(f: &std::fs::File, from: u64, size: u64, buf: &mut Vec<u8>, chunk: usize) -> FileMark {
    let mut mark = FileMark {
        len: from,
        tally: Tally::default(),
    };
    // `buf[lo..hi]` holds the file from `mark.len` on, up to `read_to`.
    let (mut lo, mut hi) = (0, 0);
    let mut read_to = from;
    loop {
        let left = size.saturating_sub(mark.len);
        #[cfg(test)]
        PARSED.with(|p| p.set(p.get() + (hi - lo)));
        match parse_batch(&buf[lo..hi], left) {
            Parsed::Batch(len, tally) => {
                mark.len += len as u64;
                mark.tally.add(tally);
                lo += len;
            }
            Parsed::End => break,
            Parsed::Short(need) => {
                if read_to >= size {
                    break;
                }
                buf.copy_within(lo..hi, 0);
                hi -= lo;
                lo = 0;
                // At least as much again as is buffered: a batch longer than `chunk` is
                // parsed again from its start after each read, so reads that double keep
                // the work linear in its length (a 1 MiB batch in 8 KiB reads would be
                // parsed 128 times over).
                let want = (need.saturating_sub(hi).max(chunk).max(hi) as u64).min(size - read_to);
                let end = hi + want as usize;
                if buf.len() < end {
                    buf.resize(end, 0);
                }
                let got = read_full_at(f, &mut buf[hi..end], read_to);
                hi += got;
                read_to += got as u64;
                if got == 0 {
                    break;
                }
            }
        }
    }
    mark
}

#[cfg(test)]
thread_local! {
    /// Bytes handed to [`parse_batch`] by this thread's scans (the work a scan does).
    static PARSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Fills `out` from `f` at `offset` as far as the file goes; the bytes read (fewer at
/// the end of the file or on an error).
fn read_full_at(f: &std::fs::File, out: &mut [u8], offset: u64) -> usize {
    let mut got = 0;
    while got < out.len() {
        match read_at(f, &mut out[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    got
}

#[cfg(unix)]
fn read_at(f: &std::fs::File, out: &mut [u8], offset: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(f, out, offset)
}

#[cfg(not(unix))]
fn read_at(f: &std::fs::File, out: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut f = f;
    f.seek(SeekFrom::Start(offset))?;
    f.read(out)
}

/// A file's mark after reading `new` (from [`scan_from`] at `old.len`).
fn add(old: FileMark, new: FileMark) -> FileMark {
    let mut tally = old.tally;
    tally.add(new.tally);
    FileMark {
        len: new.len,
        tally,
    }
}

/// What the bytes at a batch boundary hold.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// One intact batch: its length in bytes and what it holds.
    Batch(usize, Tally),
    /// The end of the intact part: the zeros of preallocation, a torn or damaged batch.
    End,
    /// Not decided before this many bytes are there (the end of the file, if they never
    /// are).
    Short(usize),
}

/// A start entry: tag, item count, seqno.
const HEAD_LEN: usize = 1 + 4 + 8;
/// An item's fixed part: tag, value type, compression, keyspace, key length, value
/// length, length on disk.
const ITEM_LEN: usize = 1 + 2 + 8 + 2 + 4 + 4;
/// A cleared keyspace's entry: tag, keyspace.
const CLEAR_LEN: usize = 1 + 8;
/// An end entry: tag, checksum, magic.
const TAIL_LEN: usize = 1 + 8 + 4;

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Parses the batch `b` starts with; `left` is how many bytes the file has from there.
fn parse_batch(b: &[u8], left: u64) -> Parsed {
    macro_rules! need {
        ($n:expr) => {
            if b.len() < $n {
                return Parsed::Short($n);
            }
        };
    }
    need!(1);
    if b[0] != TAG_START {
        return Parsed::End;
    }
    need!(HEAD_LEN);
    let count = le_u32(b, 1);
    let mut p = HEAD_LEN;
    let mut tally = Tally {
        batches: 1,
        ..Tally::default()
    };
    for _ in 0..count {
        need!(p + 1);
        match b[p] {
            TAG_ITEM => {
                need!(p + ITEM_LEN);
                let value_type = b[p + 1];
                let keyspace = le_u64(b, p + 3);
                let key_len = le_u16(b, p + 11) as usize;
                let disk_len = le_u32(b, p + 17) as u64;
                // A length past the file's end is damage: the end of the intact part, known
                // without reading the rest of the file to find out.
                if (p + ITEM_LEN + key_len) as u64 + disk_len > left {
                    return Parsed::End;
                }
                let key_at = p + ITEM_LEN;
                let end = key_at + key_len + disk_len as usize;
                need!(end);
                if keyspace != META_KEYSPACE {
                    tally.records += 1;
                    let key = &b[key_at..key_at + key_len];
                    // A place's join record: `event_id ‖ 0 ‖ seq ‖ 0` (see journal.rs),
                    // inserted (value type 0).
                    if value_type == 0
                        && key.len() >= 11
                        && key[key.len() - 10] == 0
                        && key[key.len() - 1] == 0
                    {
                        tally.joins += 1;
                    }
                }
                p = end;
            }
            TAG_CLEAR => {
                need!(p + CLEAR_LEN);
                p += CLEAR_LEN;
            }
            _ => return Parsed::End,
        }
    }
    need!(p + 1);
    if b[p] != TAG_END {
        return Parsed::End;
    }
    need!(p + TAIL_LEN);
    let checksum = le_u64(b, p + 1);
    if &b[p + 9..p + TAIL_LEN] != MAGIC || xxhash_rust::xxh3::xxh3_64(&b[HEAD_LEN..p]) != checksum {
        return Parsed::End;
    }
    Parsed::Batch(p + TAIL_LEN, tally)
}

/// Intact batches in `bytes` (a journal from a batch that does not read on), wherever they
/// start past the first byte. The unreadable batch itself is not counted, even when its
/// end entry is whole: a write torn by a machine crash can leave a batch's last page on
/// disk and an earlier one not, and that is still one unfinished batch, not an intact one
/// after it (counting end entries took it for one, and refused a torn tail as damage).
fn intact_batches_after(bytes: &[u8]) -> u64 {
    let (mut n, mut at) = (0, 1);
    while at < bytes.len() {
        if bytes[at] == TAG_START {
            if let Parsed::Batch(len, _) = parse_batch(&bytes[at..], (bytes.len() - at) as u64) {
                n += 1;
                at += len;
                continue;
            }
        }
        at += 1;
    }
    n
}

/// Whether fjall, reading the batch `b` starts with (one that does not read, up to the
/// file's written end), refuses to open the journal rather than cut it there. fjall cuts
/// where an entry does not decode (a bad tag, a bad magic, a start inside the batch, the
/// end of the file), but answers an error for a batch whose entries all decode and whose
/// item count or checksum does not match: a start then fails whatever the check said, so
/// that is damage, which a repair cuts. Where the decoding is unsure (a compressed value
/// fjall may fail to decompress) it answers `true`: calling a torn tail damage only asks
/// for a repair; calling a refused batch a torn tail leaves the store unable to start.
fn fjall_refuses(b: &[u8]) -> bool {
    if b.len() < HEAD_LEN || b[0] != TAG_START {
        return false;
    }
    let mut expected = le_u32(b, 1);
    let mut p = HEAD_LEN;
    loop {
        let Some(&tag) = b.get(p) else {
            return false;
        };
        let len = match tag {
            TAG_ITEM => {
                // The value types and compressions fjall decodes (lsm-tree's `ValueType`
                // and `CompressionType`).
                if b.len() < p + ITEM_LEN || !matches!(b[p + 1], 0 | 1 | 2 | 4) || b[p + 2] > 1 {
                    return false;
                }
                ITEM_LEN + le_u16(b, p + 11) as usize + le_u32(b, p + 17) as usize
            }
            TAG_CLEAR => CLEAR_LEN,
            // A whole end entry: its item count or checksum is wrong (else the batch read).
            TAG_END => return b.len() >= p + TAIL_LEN && &b[p + 9..p + TAIL_LEN] == MAGIC,
            _ => return false,
        };
        if b.len() < p + len {
            return false;
        }
        if expected == 0 {
            return true; // more items than the start entry counts
        }
        expected -= 1;
        p += len;
    }
}

/// What one slot of the watermark holds.
enum Slot {
    Missing,
    Torn,
    Read(Marks),
}

fn read_slot(path: &Path) -> Slot {
    let Ok(bytes) = std::fs::read(path) else {
        return Slot::Missing;
    };
    let body = || {
        let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        let body = bytes.get(4..4 + len)?;
        let sum = u64::from_le_bytes(bytes.get(4 + len..12 + len)?.try_into().ok()?);
        (xxhash_rust::xxh3::xxh3_64(body) == sum).then_some(body)
    };
    match body().and_then(|b| postcard::from_bytes(b).ok()) {
        Some(marks) => Slot::Read(marks),
        None => Slot::Torn,
    }
}

/// How far a watermark reaches: its newest journal and that journal's length. Journals
/// only grow and a newer one has a higher id, so of two watermarks written by one run the
/// later reaches further (equal reaches hold the same marks).
fn reach(m: &Marks) -> (u64, u64) {
    m.iter().next_back().map_or((0, 0), |(&id, f)| (id, f.len))
}

/// The readable slot that reaches furthest, with its index, and whether a slot is torn.
fn best_slot(dir: &Path) -> (Option<(usize, Marks)>, bool) {
    let mut best: Option<(usize, Marks)> = None;
    let mut torn = false;
    for (i, name) in SLOTS.iter().enumerate() {
        match read_slot(&dir.join(name)) {
            Slot::Missing => {}
            Slot::Torn => torn = true,
            Slot::Read(m) => {
                if best.as_ref().is_none_or(|(_, b)| reach(&m) > reach(b)) {
                    best = Some((i, m));
                }
            }
        }
    }
    (best, torn)
}

/// Reads the watermark of a store directory: its slot that reaches furthest; `None` when
/// neither slot is there and readable.
pub fn read_marks(dir: &Path) -> Option<Marks> {
    let (best, torn) = best_slot(dir);
    if torn {
        if best.is_some() {
            tracing::warn!(
                dir = %dir.display(),
                "one slot of the journal's durability watermark is torn; using the other"
            );
        } else {
            tracing::warn!(
                dir = %dir.display(),
                "the journal's durability watermark is torn; checking the journal without it"
            );
        }
    }
    best.map(|(_, m)| m)
}

/// Removes both slots of the watermark (after a repair cut the journal below what they
/// name) and makes the removal durable, so that a crash before the next watermark cannot
/// bring back one that names the bytes cut away.
fn forget_marks(dir: &Path) -> std::io::Result<()> {
    for name in SLOTS {
        match std::fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

/// The journal writer's view of the watermark: what it last wrote, kept up to date after
/// each sync by reading only the bytes written since.
///
/// A sync costs a look at the active journal only (fjall appends to one journal and
/// starts `N+1.jnl` when it rotates): its file stays open and its new batches are read
/// through a small buffer that is kept. The directory is listed again only when
/// `N+1.jnl` has appeared; marks of older journals fjall removed meanwhile are dropped
/// then (until then they name files older than every journal, which [`check`] ignores).
pub struct Marker {
    dir: PathBuf,
    marks: Marks,
    /// The two slots' files, opened at their first write.
    files: [Option<std::fs::File>; 2],
    /// The slot the next write goes to: never the one holding the newest whole watermark.
    next: usize,
    /// The journal being appended to.
    active: Option<Active>,
    /// The active journal's new bytes, read at each capture (kept: no allocation per sync).
    buf: Vec<u8>,
}

/// The journal being appended to: its id, a handle, and the names whose presence tells
/// that fjall sealed it (made once, not per sync).
struct Active {
    id: u64,
    file: std::fs::File,
    /// Its own path.
    name: QuietName,
    /// The path of the journal that follows it.
    successor: QuietName,
}

/// Read size for the active journal's new batches: a batch of a few joins is a few hundred
/// bytes, and the file past them is preallocated zeros that need not be read.
const ACTIVE_READ: usize = 8 * 1024;

impl Marker {
    /// Starts from the journals as they are now (just opened, so all intact).
    pub fn new(dir: &Path) -> std::io::Result<Marker> {
        // The first write goes to the slot that is not the best one now, so that a crash
        // tearing it leaves the best one as it was.
        let next = match best_slot(dir).0 {
            Some((0, _)) => 1,
            _ => 0,
        };
        let mut m = Marker {
            dir: dir.to_path_buf(),
            marks: Marks::new(),
            files: [None, None],
            next,
            active: None,
            buf: Vec::new(),
        };
        m.synced()?;
        Ok(m)
    }

    /// Call after the journal was synced: records what is now durable. Lengths only grow
    /// within a file.
    pub fn synced(&mut self) -> std::io::Result<()> {
        let marks = self.capture()?;
        self.record(&marks)
    }

    /// Reads what the journals hold now, without recording it: the marks a sync that
    /// starts after this call covers. Call with nothing appended meanwhile (the group
    /// commit's flag held), then sync, then [`Marker::record`] exactly these marks, so the
    /// watermark names synced bytes only even when appends go on during the sync.
    pub fn capture(&mut self) -> std::io::Result<Marks> {
        // fjall rotates and deletes sealed journals (oldest first) on its own threads. A
        // newer journal means the active one was sealed; the active one gone means it was
        // sealed and its successor may be gone too (two rotations and flushes between
        // captures). Either way, list again: a handle of a deleted journal would be synced
        // for ever while the one appended to never is.
        let rotated = match &self.active {
            // Neither `stat`s the journal: see `journal_files::len_quietly`.
            Some(a) => exists_quietly(&a.successor) || !exists_quietly(&a.name),
            None => true,
        };
        if rotated {
            self.relist()?;
        } else {
            let a = self.active.as_ref().expect("checked above");
            let old = self.marks.get(&a.id).copied().unwrap_or_default();
            let new = scan_open(&a.file, old.len, &mut self.buf)?;
            self.marks.insert(a.id, add(old, new));
        }
        Ok(self.marks.clone())
    }

    /// Writes `marks` (from [`Marker::capture`], now synced) as the watermark.
    pub fn record(&mut self, marks: &Marks) -> std::io::Result<()> {
        self.write(marks)
    }

    /// A second handle of the journal being appended to, as of the last capture: syncing
    /// it syncs the file, whoever holds it (a sync is per file, not per handle).
    pub fn active_file(&self) -> Option<std::io::Result<std::fs::File>> {
        Some(self.active.as_ref()?.file.try_clone())
    }

    /// The journal being appended to and where its intact batches end, as of the last
    /// [`Marker::capture`].
    pub fn active_end(&self) -> Option<(u64, u64)> {
        let id = self.active.as_ref()?.id;
        Some((id, self.marks.get(&id)?.len))
    }

    /// The path of journal `id`.
    pub fn journal_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.jnl"))
    }

    /// Lists the journals again: files fjall removed (flushed into tables) are dropped,
    /// new ones read, and the newest becomes the active one.
    fn relist(&mut self) -> std::io::Result<()> {
        self.read_listed(journals(&self.dir))
    }

    /// [`Marker::relist`] after the listing: reads the journals `files` names.
    fn read_listed(&mut self, files: BTreeMap<u64, PathBuf>) -> std::io::Result<()> {
        self.marks.retain(|id, _| files.contains_key(id));
        self.active = None;
        let newest = files.keys().next_back().copied();
        for (&id, path) in &files {
            let old = self.marks.get(&id).copied().unwrap_or_default();
            match scan_from(path, old.len) {
                Ok(new) => {
                    self.marks.insert(id, add(old, new));
                }
                // fjall deletes an older journal once its keyspaces are flushed, at any
                // moment: one listed a moment ago may be gone, as if it was not listed.
                // Not the newest: it is the one being appended to.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && Some(id) != newest => {
                    self.marks.remove(&id);
                }
                Err(e) => return Err(e),
            }
        }
        if let Some((&id, path)) = files.iter().next_back() {
            let f = std::fs::File::open(path)?;
            super::journal_files::no_readahead(&f);
            self.active = Some(Active {
                id,
                file: f,
                name: quiet_name(path),
                successor: quiet_name(&self.journal_path(id + 1)),
            });
        }
        Ok(())
    }

    /// Rewrites the next slot in place (length, body, checksum), without fsync: see the
    /// module's notes. The other slot keeps the previous watermark.
    fn write(&mut self, marks: &Marks) -> std::io::Result<()> {
        let slot = self.next;
        if self.files[slot].is_none() {
            self.files[slot] = Some(
                private_options()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(self.dir.join(SLOTS[slot]))?,
            );
        }
        let f = self.files[slot].as_mut().expect("opened above");
        let body = postcard::to_stdvec(marks).expect("serialising to memory");
        let mut out = Vec::with_capacity(body.len() + 12);
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&body).to_le_bytes());
        f.seek(SeekFrom::Start(0))?;
        f.write_all(&out)?;
        self.next = 1 - slot;
        Ok(())
    }
}

/// Options for creating a file only its owner can read.
pub fn private_options() -> std::fs::OpenOptions {
    #[allow(unused_mut)]
    let mut o = std::fs::OpenOptions::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    o
}

/// Damage found in a store's journals.
#[derive(Debug)]
pub struct Damage {
    pub file: PathBuf,
    /// Where the intact part of `file` ends: the damaged batch starts here.
    pub offset: u64,
    pub why: String,
    /// What was known durable after `offset` (this file and every later one); exact when
    /// the watermark knew the file.
    pub lost: Tally,
    /// Intact-looking batches found after the damage that the watermark did not cover yet
    /// (written, perhaps acknowledged, not yet recorded as durable): counted, not known.
    pub uncounted_batches: u64,
    /// Whether `lost` comes from the watermark (else it is a lower bound).
    pub exact: bool,
    later: Vec<PathBuf>,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the store's journal {} is damaged at byte offset {} ({}); ",
            self.file.display(),
            self.offset,
            self.why
        )?;
        let q = if self.exact { "" } else { "at least " };
        write!(
            f,
            "{q}{} acknowledged records ({q}{} place joins, in {q}{} batches) were written after it",
            self.lost.records, self.lost.joins, self.lost.batches
        )?;
        if self.uncounted_batches > 0 {
            write!(
                f,
                ", plus {} intact-looking batches not yet recorded as durable",
                self.uncounted_batches
            )?;
        }
        Ok(())
    }
}

/// Checks the journals of `dir` before fjall opens them. `Ok(None)`: intact, or only a torn
/// tail. `Ok(Some(d))`: damage, which [`repair`] can cut away.
pub fn check(dir: &Path) -> std::io::Result<Option<Damage>> {
    let files = journals(dir);
    let marks = read_marks(dir);
    if marks.is_none() && !files.is_empty() {
        tracing::warn!(
            dir = %dir.display(),
            "the store has no durability watermark (first start with it, or it was lost): \
             a truncated journal cannot be told from a torn tail this time"
        );
    }
    let marks = marks.unwrap_or_default();
    let last = files.keys().next_back().copied();
    // fjall removes only the oldest journals, once flushed into tables: a journal known
    // durable that is missing while an older one is still there (or when none is) is damage.
    let oldest = files.keys().next().copied();
    for (&id, m) in &marks {
        let gone = match oldest {
            Some(lo) => id >= lo && !files.contains_key(&id),
            None => m.len > 0,
        };
        if gone {
            let lost = marks.range(id..).fold(Tally::default(), |mut t, (_, m)| {
                t.add(m.tally);
                t
            });
            return Ok(Some(Damage {
                file: dir.join(format!("{id}.jnl")),
                offset: 0,
                why: format!(
                    "the file is missing; {} bytes of it were known durable",
                    m.len
                ),
                lost,
                uncounted_batches: 0,
                exact: true,
                later: files.range(id..).map(|(_, p)| p.clone()).collect(),
            }));
        }
    }
    for (&id, path) in &files {
        let scan = scan_from(path, 0)?;
        let written = super::journal::written_end(path)?;
        let (after, refused) = if written > scan.len {
            let mut f = std::fs::File::open(path)?;
            f.seek(SeekFrom::Start(scan.len))?;
            let mut b = vec![0u8; (written - scan.len) as usize];
            f.read_exact(&mut b)?;
            (intact_batches_after(&b), fjall_refuses(&b))
        } else {
            (0, false)
        };
        let mark = marks.get(&id);
        let why = if mark.is_some_and(|m| scan.len < m.len) {
            let m = mark.expect("checked");
            if written < m.len {
                format!(
                    "the file ends at byte {written} but {} bytes were known durable: it was truncated",
                    m.len
                )
            } else {
                format!(
                    "{} bytes were known durable, but the batch starting here does not read",
                    m.len
                )
            }
        } else if after > 0 {
            format!("{after} intact-looking batches follow the unreadable one: not a torn tail")
        } else if refused {
            "the batch starting here reads whole but its item count or checksum does not \
             match, which fjall refuses to open"
                .into()
        } else if Some(id) != last && scan.len < written {
            "a sealed journal does not read to its end".into()
        } else {
            if scan.len < written {
                tracing::warn!(
                    journal = %path.display(),
                    offset = scan.len,
                    discarded_bytes = written - scan.len,
                    "the journal ends in an unfinished batch (a crash mid-write); it is cut \
                     back to the last intact batch. {}",
                    if mark.is_some() {
                        "Nothing after it was known durable, so nothing acknowledged is lost"
                    } else {
                        "Without a watermark, whether it was acknowledged cannot be known"
                    }
                );
            }
            continue;
        };
        let mut lost = mark.map_or(Tally::default(), |m| m.tally.minus(scan.tally));
        let later: Vec<PathBuf> = files.range(id + 1..).map(|(_, p)| p.clone()).collect();
        for p in &later {
            lost.add(scan_from(p, 0)?.tally);
        }
        // The watermark's batches after the unreadable one (which it counts, when it covers
        // it, and which `after` does not).
        let covered = mark.map_or(0, |m| {
            m.tally.batches.saturating_sub(scan.tally.batches + 1)
        });
        return Ok(Some(Damage {
            file: path.clone(),
            offset: scan.len,
            why,
            lost,
            uncounted_batches: after.saturating_sub(covered),
            exact: mark.is_some(),
            later,
        }));
    }
    Ok(None)
}

/// Cuts the damaged journal at the damage and removes the journals after it, so that what
/// remains is an intact prefix of the history; `dir` is the store directory [`check`] read.
pub fn repair(dir: &Path, d: &Damage) -> std::io::Result<()> {
    if d.file.exists() {
        let f = std::fs::OpenOptions::new().write(true).open(&d.file)?;
        f.set_len(d.offset)?;
        f.sync_all()?;
    }
    for p in &d.later {
        std::fs::remove_file(p)?;
    }
    // The watermark names what was cut away: a start after this one would see damage.
    forget_marks(dir)
}

#[cfg(test)]
#[path = "watermark_tests.rs"]
mod tests;
