//! The embedded store's admin audit list: the newest entries in memory, and, for a durable
//! store, the same entries in `audit.jsonl` in the data dir (one entry a line, appended and
//! synced before the change is answered).
//!
//! Why a file beside the journal rather than a keyspace in it: admin changes are rare (a
//! few a minute at most), an append and an fsync of one line is all they need, and the
//! journal's torn-tail check ([`super::watermark`]) is about queue state; keeping the
//! audit out of it leaves that reasoning untouched.
//!
//! Bounded: memory holds at most `keep` entries; the file grows to at most twice that many
//! lines and is then rewritten with the newest `keep` (a temporary file renamed over it, so
//! a crash leaves the old file or the new one, never half of one). A last line torn by a
//! crash or a full disk (no final newline, perhaps cut inside a character) was never
//! acknowledged as written and is dropped on open; an append that fails is cut back off.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The entries, newest last, and the file they are kept in (none in memory).
pub struct AuditFile {
    path: Option<PathBuf>,
    entries: VecDeque<String>,
    /// Lines the file holds, to know when to rewrite it.
    lines: usize,
}

/// Entries read back on open when the caller has not said yet how many it keeps.
const OPEN_KEEP: usize = 100_000;

impl AuditFile {
    /// A list in memory only.
    pub fn memory() -> Self {
        AuditFile {
            path: None,
            entries: VecDeque::new(),
            lines: 0,
        }
    }

    /// The list kept in `path`, read back if it exists.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let mut entries = VecDeque::new();
        let mut lines = 0;
        match std::fs::read(path) {
            Ok(bytes) => {
                // Read as bytes: a tail torn inside a multi-byte character (a disk that
                // filled mid-append cuts at a page, not at a character) is not UTF-8, and
                // refusing the file would refuse every start after it.
                let complete = match bytes.iter().rposition(|&b| b == b'\n') {
                    Some(i) => &bytes[..i],
                    None => &[][..],
                };
                // Cut a torn tail off, or the next append would glue onto it.
                let kept = if complete.is_empty() {
                    0
                } else {
                    complete.len() + 1
                };
                if kept < bytes.len() {
                    OpenOptions::new()
                        .write(true)
                        .open(path)?
                        .set_len(kept as u64)?;
                }
                // A damaged line (not UTF-8) is left out, not mended: a replaced byte would
                // show an entry with another event id or actor than recorded. The lines
                // after it are still the record.
                let mut damaged = 0;
                for line in complete.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                    lines += 1;
                    match std::str::from_utf8(line) {
                        Ok(line) => entries.push_back(line.to_string()),
                        Err(_) => damaged += 1,
                    }
                    if entries.len() > OPEN_KEEP {
                        entries.pop_front();
                    }
                }
                if damaged > 0 {
                    tracing::warn!(
                        file = %path.display(),
                        damaged,
                        "lines of the audit list that are not UTF-8 are left out"
                    );
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(AuditFile {
            path: Some(path.to_path_buf()),
            entries,
            lines,
        })
    }

    /// Appends `entry` (newlines are replaced: one entry is one line) and keeps the newest
    /// `keep`. On disk before it answers.
    pub fn append(&mut self, entry: &str, keep: usize) -> std::io::Result<()> {
        self.append_with(entry, keep, |f, line| {
            f.write_all(line)?;
            f.sync_data()
        })
    }

    /// [`Self::append`], with the line's write and sync done by `write` (a test's failing
    /// disk).
    fn append_with(
        &mut self,
        entry: &str,
        keep: usize,
        write: impl FnOnce(&mut File, &[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let entry = entry.replace(['\n', '\r'], " ");
        if let Some(path) = &self.path {
            if self.lines + 1 > keep.max(1) * 2 {
                let mut newest: Vec<&str> = self
                    .entries
                    .iter()
                    .skip((self.entries.len() + 1).saturating_sub(keep))
                    .map(String::as_str)
                    .collect();
                newest.push(&entry);
                rewrite(path, &newest)?;
                self.lines = newest.len();
            } else {
                let mut f = OpenOptions::new().create(true).append(true).open(path)?;
                let before = f.metadata()?.len();
                if let Err(e) = write(&mut f, format!("{entry}\n").as_bytes()) {
                    // A write cut short (a full disk) leaves part of the line: the next
                    // append would glue onto it and neither entry could be read back.
                    // The error is answered either way; this only tries to undo.
                    if f.set_len(before).is_ok() {
                        let _ = f.sync_data();
                    }
                    return Err(e);
                }
                self.lines += 1;
            }
        }
        self.entries.push_back(entry);
        while self.entries.len() > keep {
            self.entries.pop_front();
        }
        Ok(())
    }

    /// The newest `limit` entries, newest first.
    pub fn newest(&self, limit: usize) -> Vec<String> {
        self.entries.iter().rev().take(limit).cloned().collect()
    }
}

/// Replaces the file at `path` with `lines`, atomically (write, sync, rename, sync dir).
fn rewrite(path: &Path, lines: &[&str]) -> std::io::Result<()> {
    let tmp = path.with_extension("jsonl.tmp");
    {
        let mut f = File::create(&tmp)?;
        let mut text = String::new();
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_and_reads_them_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut a = AuditFile::open(&path).unwrap();
        for i in 0..25 {
            a.append(&format!("e{i}"), 5).unwrap();
        }
        assert_eq!(a.newest(3), ["e24", "e23", "e22"]);
        assert_eq!(a.newest(100).len(), 5);
        // The file is bounded too: never more than twice what is kept.
        let on_disk = std::fs::read_to_string(&path).unwrap().lines().count();
        assert!((5..=10).contains(&on_disk), "{on_disk} lines");
        let b = AuditFile::open(&path).unwrap();
        assert_eq!(b.newest(2), ["e24", "e23"]);
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_newlines_cannot_split_an_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut a = AuditFile::open(&path).unwrap();
        a.append("one\ntwo", 10).unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"half").unwrap();
        let mut b = AuditFile::open(&path).unwrap();
        assert_eq!(b.newest(10), ["one two"]);
        b.append("three", 10).unwrap();
        let c = AuditFile::open(&path).unwrap();
        assert_eq!(c.newest(10), ["three", "one two"]);
    }

    #[test]
    fn a_tail_torn_inside_a_character_does_not_stop_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut a = AuditFile::open(&path).unwrap();
        a.append("{\"event_id\":\"k\"}", 10).unwrap();
        // A disk that filled mid-append: the line cut two bytes into a three-byte
        // character (콘 is EC BD 98).
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"event_id\":\"\xec\xbd").unwrap();
        let mut b = AuditFile::open(&path).unwrap();
        assert_eq!(b.newest(10), ["{\"event_id\":\"k\"}"]);
        b.append("next", 10).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"{\"event_id\":\"k\"}\nnext\n"
        );
        // A damaged complete line does not stop it either, nor hide the lines after it;
        // it is left out rather than shown mended.
        std::fs::write(&path, b"a\n\xff\xfe\nb\n").unwrap();
        let c = AuditFile::open(&path).unwrap();
        assert_eq!(c.newest(10), ["b", "a"]);
    }

    #[test]
    fn an_append_cut_short_leaves_nothing_for_the_next_to_glue_onto() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut a = AuditFile::open(&path).unwrap();
        a.append("one", 10).unwrap();
        let failed = a.append_with("two-that-fails", 10, |f, line| {
            f.write_all(&line[..5])?;
            Err(std::io::Error::other("no space left on device"))
        });
        assert!(failed.is_err());
        a.append("three", 10).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"one\nthree\n");
        let b = AuditFile::open(&path).unwrap();
        assert_eq!(b.newest(10), ["three", "one"]);
    }
}
