//! The files of the embedded store's directory: private permissions, its `version` file,
//! and where a preallocated journal's written bytes end.

use std::path::Path;

/// Creates `dir` (and its parents) readable by its owner only, and makes it so if it was
/// not: the store holds user ids and metadata.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    // Said plainly: creating it would fail with "File exists", which reads as if the
    // directory were the trouble.
    if std::fs::metadata(dir).is_ok_and(|m| !m.is_dir()) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            format!("{} is a file, not a directory", dir.display()),
        ));
    }
    crate::tokens::create_owner_dirs(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // A shared directory (`/tmp`, `/var/tmp`: anyone may write in it, and the sticky
        // bit keeps each user's files their own) is never narrowed: that chmod, which root
        // may always make, broke it for every other user. Nor is it used, since the key and
        // the journal would sit among everyone's files. A directory every user may write in
        // without the sticky bit (a scratch volume made 0777) is this user's to narrow, as
        // before.
        let mode = std::fs::metadata(dir)?.permissions().mode();
        if mode & 0o1002 == 0o1002 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{} is a shared directory (mode {:o}: every user may write in it): use \
                     a directory of its own, such as one inside it",
                    dir.display(),
                    mode & 0o7777
                ),
            ));
        }
        narrow_dir(dir, |d| {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
        })?;
    }
    Ok(())
}

/// Narrows `dir` with `set` (its mode to 0700). A directory of another owner cannot be
/// narrowed (`EPERM`): a mounted volume (Kubernetes' `fsGroup`, a group-writable bind
/// mount) or one a root run made. It is used as it is, with a warning, since the files
/// made in it are still this user's only; but not if anyone at all may write in it,
/// where another user could replace the signing key or the journal.
#[cfg(unix)]
fn narrow_dir(dir: &Path, set: impl FnOnce(&Path) -> std::io::Result<()>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match set(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let mode = std::fs::metadata(dir)?.permissions().mode();
            if mode & 0o002 != 0 {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!(
                        "{} is writable by every user and not this user's to narrow to 0700 \
                         ({e}): give it to this user, or use a directory inside it",
                        dir.display()
                    ),
                ));
            }
            tracing::warn!(
                dir = %dir.display(),
                mode = format!("{:o}", mode & 0o7777),
                "the data directory is not this user's, so it is used as it is \
                 (the files made in it are still this user's only)"
            );
            Ok(())
        }
        r => r,
    }
}

/// Makes every directory under `dir` 0700 and every file 0600: fjall creates its files with
/// the process's umask (`server::run` narrows it, but an embedding program or an older data
/// dir may not have).
pub(super) fn restrict_tree(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let ty = entry.file_type()?;
            // An error names the file: "Operation not permitted" alone does not say which
            // of the store's files another user owns.
            let named = |e: std::io::Error| {
                std::io::Error::new(e.kind(), format!("{}: {e}", entry.path().display()))
            };
            if ty.is_dir() {
                std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o700))
                    .map_err(named)?;
                restrict_tree(&entry.path())?;
            } else if ty.is_file() {
                std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600))
                    .map_err(named)?;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// The length of a journal the writer keeps open, read without asking for its timestamps.
///
/// A `stat` of a file reads its change time, and since Linux 6.13 (multigrain timestamps)
/// a change time that was read must be followed by a finer one at the next write: the
/// journal's inode is then dirty after every append, and every `fdatasync` writes it
/// with a synchronous I/O of its own before the device flush. The journal writer used to
/// `stat` the active journal three times per sync (watermark and zeros ahead); measured with
/// `python3 bench/fsync_floor.py DIR 1 own 4 stat`, an `fstat` before each append raised
/// the sync's p50 from 0.12–0.13 to 0.19 ms (about 5,000 syncs/s instead of 6,800–7,700;
/// docs/PERFORMANCE.md, "A `stat` per sync"). `lseek` to the end answers the size
/// without reading any timestamp. It moves the handle's offset: callers read and write
/// at explicit offsets, or seek before reading.
pub(super) fn len_quietly(f: &std::fs::File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = f;
    f.seek(SeekFrom::End(0))
}

/// A path as [`exists_quietly`] takes it, made once by [`quiet_name`] rather than per call:
/// on Unix the C string `access` takes.
#[cfg(unix)]
pub(super) type QuietName = std::ffi::CString;
#[cfg(not(unix))]
pub(super) type QuietName = std::path::PathBuf;

/// `path` as [`exists_quietly`] takes it.
pub(super) fn quiet_name(path: &Path) -> QuietName {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        // Our directory and `N.jnl` names hold no NUL byte (a path with one could not have
        // been opened either).
        std::ffi::CString::new(path.as_os_str().as_bytes()).expect("a path without NUL")
    }
    #[cfg(not(unix))]
    path.to_path_buf()
}

/// Whether `name` names a file, without a `stat` of it (see [`len_quietly`]): `access`
/// looks the name up only.
pub(super) fn exists_quietly(name: &QuietName) -> bool {
    #[cfg(unix)]
    {
        // SAFETY: `name` is NUL-terminated and outlives the call; `access` only reads it.
        unsafe { libc::access(name.as_ptr(), libc::F_OK) == 0 }
    }
    #[cfg(not(unix))]
    name.exists()
}

/// Turns the kernel's readahead off for reads through `f`, a handle of a journal that is
/// (or may become) the one appended to.
///
/// Readahead reads past what is asked, up to the disk's `read_ahead_kb` (8 MiB on the
/// development VM's disk), so a scan of the journal's batches or a read of its
/// preallocated tail caches megabytes of that tail ahead of the appends, and since Linux
/// 6.16 ext4 caches it in large folios (up to 2 MiB). Every later append that lands in one
/// then walks all of the folio's buffer heads twice (`ext4_block_write_begin`,
/// `block_commit_write`): 5–7 µs of CPU per write instead of well under one, on every
/// request's write in `relaxed` at 10,000 joins/s (docs/PERFORMANCE.md, "Large folios
/// under the journal's appends"). Without readahead a read caches only the pages it asks
/// for, in single pages, and the appends then fill those. Reads of these handles are few
/// and sequential over data just written (in the page cache already), so nothing is lost.
pub(super) fn no_readahead(f: &std::fs::File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a plain syscall on an open descriptor; it reads no memory of ours. It
        // only advises: if it fails, reads work as before.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = f;
}

/// Where the written bytes of a journal end. Journals are preallocated with zeros, so this
/// is just past the last non-zero byte. Recovery cuts a journal back to its last intact
/// batch; if it cuts below this point, a damaged or half-written batch was discarded.
pub fn written_end(path: &Path) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    no_readahead(&f);
    let mut end = f.metadata()?.len();
    let mut buf = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let n = (end - start) as usize;
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf[..n])?;
        if let Some(i) = buf[..n].iter().rposition(|&b| b != 0) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// What fjall's `version` file starts with (then the format's number).
const VERSION_MAGIC: &[u8] = b"FJL";

/// fjall's `lock` file holds nothing: it is only locked while the store is open, and the
/// data dir's own lock keeps a second server out anyway. One deleted by hand is made again
/// (fjall refuses to open without it, and that refusal read as a missing file of the
/// store, with the advice to restore a backup).
fn restore_lock(dir: &Path) -> anyhow::Result<()> {
    let lock = dir.join("lock");
    if std::fs::symlink_metadata(&lock).is_ok() {
        return Ok(());
    }
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    match open.open(&lock) {
        Ok(_) => {
            tracing::warn!(path = %lock.display(), "the store's lock file was missing: made again (it holds nothing)");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(anyhow::anyhow!("making {} again: {e}", lock.display())),
    }
}

/// Checks the store's `version` file before fjall opens `dir`. fjall writes it first when
/// it creates a store, and reads it to tell a store from an empty directory:
/// - missing in a store with files, fjall tried to create a store over the old one and
///   failed with "File exists", naming nothing;
/// - empty or cut short (the very first start stopped by a full disk or a crash while
///   creating the store), fjall refused every later start with "InvalidVersion(None)",
///   even once the disk had room, with `--repair` too.
///
/// A store that holds only what fjall makes before it holds anything (the `version` file,
/// its `lock`, an empty `keyspaces` directory, journals of zeros: preallocated) is the
/// remains of a first start cut short: those entries are removed, one by one (but the
/// `lock`, which fjall takes as it finds it, and which another opener may hold), and the
/// store is created again, with a warning. Anything else there (a keyspace, a journal
/// byte, the watermark's slots, a file someone put there, a link) is data or a sign of
/// it: the start is refused with a message that names the file. A missing `lock` file is
/// made again ([`restore_lock`]).
pub(super) fn check_version(dir: &Path) -> anyhow::Result<()> {
    let version = dir.join("version");
    let problem = match std::fs::read(&version) {
        Ok(b) if b.len() > VERSION_MAGIC.len() && b.starts_with(VERSION_MAGIC) => {
            return restore_lock(dir)
        }
        Ok(b) => format!("its `version` file is damaged ({} bytes)", b.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            "its `version` file is missing".to_string()
        }
        Err(e) => return Err(anyhow::anyhow!("reading {}: {e}", version.display())),
    };
    let mut made_by_a_first_start = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let (path, kind) = (entry.path(), entry.file_type()?);
        let name = entry.file_name();
        let named = |e: std::io::Error| anyhow::anyhow!("reading {}: {e}", path.display());
        let fjalls = match &*name.to_string_lossy() {
            "lock" => {
                if kind.is_file() {
                    continue;
                }
                false
            }
            "version" => kind.is_file(),
            "keyspaces" => {
                kind.is_dir() && std::fs::read_dir(&path).map_err(named)?.next().is_none()
            }
            n => kind.is_file() && n.ends_with(".jnl") && all_zeros(&path).map_err(named)?,
        };
        if !fjalls {
            anyhow::bail!(
                "the store in {} holds data ({}), but {problem}: removed, lost or \
                 overwritten. Refusing to start: restore the data directory from a backup",
                dir.display(),
                path.display()
            );
        }
        made_by_a_first_start.push((path, kind.is_dir()));
    }
    if made_by_a_first_start.is_empty() {
        return Ok(()); // a new store
    }
    tracing::warn!(
        store = %dir.display(),
        "the store's first start was cut short ({problem}) before it held anything: \
         creating it again"
    );
    for (path, is_dir) in made_by_a_first_start {
        let removed = if is_dir {
            std::fs::remove_dir(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|e| anyhow::anyhow!("removing {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Whether the file holds zeros only (a preallocated journal no batch reached).
fn all_zeros(path: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match f.read(&mut buf)? {
            0 => return Ok(true),
            n if buf[..n].iter().any(|&b| b != 0) => return Ok(false),
            _ => {}
        }
    }
}

/// Why the store's files could not be opened or read, for the operator: fjall's own
/// message is its error's debug form (`FjallError: Storage(ChecksumMismatch { … })`),
/// which names neither the cause in words nor a way out, and `--repair` cannot help with
/// anything but a journal's tail. Only what is damage is called damage: an I/O error
/// (too many open files, no permission, a full disk) says what it is, since restoring a
/// backup over a healthy directory would lose what was acknowledged since.
pub(super) fn store_failure(dir: &Path, doing: &str, e: &fjall::Error) -> anyhow::Error {
    use fjall::Error as F;
    use fjall::LsmError as L;
    const DAMAGED: &str = "a file of the store's tables is damaged (its keyspaces under \
         keyspaces/). Refusing to start: restore the data directory from a backup \
         (--repair mends only a journal's torn or damaged tail, not the tables)";
    let io = |io: &std::io::Error| match io.kind() {
        std::io::ErrorKind::NotFound => {
            "a file of the store is missing. Refusing to start: restore the data directory \
             from a backup (--repair mends only a journal's tail)"
        }
        std::io::ErrorKind::PermissionDenied => {
            "a file of the store cannot be read or written by this user (its owner or \
             permissions changed?)"
        }
        _ => "",
    };
    let advice = match e {
        F::Locked => "another process holds it (two servers on one data directory?)",
        F::Io(e) | F::Storage(L::Io(e)) => io(e),
        F::Storage(_)
        | F::Unrecoverable
        | F::Decompress(_)
        | F::InvalidTag(_)
        | F::InvalidTrailer
        | F::JournalRecovery(_) => DAMAGED,
        // What `check_version` lets pass (the magic right, the format's number not one
        // this build reads): the `version` file, not the tables, is what to look at.
        F::InvalidVersion(_) => {
            "its `version` file names a format this build does not read (damaged, or written \
             by another version). Refusing to start: restore the data directory from a \
             backup, or run the version that wrote it"
        }
        _ => "",
    };
    if advice.is_empty() {
        anyhow::anyhow!("{doing} the store in {}: {e}", dir.display())
    } else {
        anyhow::anyhow!("{doing} the store in {}: {advice} ({e})", dir.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};

    /// A file where the directory should be is named as such (was "File exists").
    #[test]
    fn a_file_in_place_of_the_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data");
        std::fs::write(&file, b"x").unwrap();
        let e = create_private_dir(&file).unwrap_err().to_string();
        assert!(e.contains("is a file, not a directory"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"x");
    }

    /// A shared directory (anyone may write in it, `/tmp`'s 1777) is refused, and left as it
    /// was: narrowing it, as root may, broke it for every other user.
    #[cfg(unix)]
    #[test]
    fn a_shared_directory_is_refused_and_left_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = create_private_dir(dir.path()).unwrap_err();
        assert!(e.to_string().contains("shared directory"), "{e}");
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o1777);
        // A directory of its own inside it is made and narrowed as usual.
        let own = dir.path().join("waitroom");
        create_private_dir(&own).unwrap();
        let mode = std::fs::metadata(&own).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o700);
    }

    /// A directory this user may not narrow (another owner's: `set` answers `EPERM`, as
    /// `chmod` does then) is used as it is, unless every user may write in it.
    #[cfg(unix)]
    #[test]
    fn a_directory_of_another_owner_is_used_unless_anyone_may_write_in_it() {
        use std::os::unix::fs::PermissionsExt;
        let eperm = |_: &Path| Err(std::io::Error::from_raw_os_error(libc::EPERM));
        let dir = tempfile::tempdir().unwrap();
        let mode = |m| std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(m));
        mode(0o2775).unwrap(); // a Kubernetes volume with fsGroup
        assert!(narrow_dir(dir.path(), eperm).is_ok());
        mode(0o777).unwrap();
        let e = narrow_dir(dir.path(), eperm).unwrap_err();
        assert!(e.to_string().contains("writable by every user"), "{e}");
        assert!(
            e.to_string().contains(&dir.path().display().to_string()),
            "{e}"
        );
        // Other errors are errors, and a directory that can be narrowed is.
        let eio = |_: &Path| Err(std::io::Error::from_raw_os_error(libc::EIO));
        assert!(narrow_dir(dir.path(), eio).is_err());
        // This user's own scratch directory, made 0777 (no sticky bit), is narrowed.
        mode(0o777).unwrap();
        create_private_dir(dir.path()).unwrap();
        let m = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(m & 0o777, 0o700);
    }

    /// The quiet helpers answer what `metadata` and `exists` do, and the length's seek
    /// leaves nothing for a reader that seeks before reading (as the watermark's scan does).
    #[test]
    fn the_quiet_helpers_answer_as_a_stat_would() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.jnl");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&[1u8; 1234]).unwrap();
        f.set_len(8192).unwrap();
        let mut f = std::fs::File::open(&path).unwrap();
        assert_eq!(len_quietly(&f).unwrap(), 8192);
        assert_eq!(len_quietly(&f).unwrap(), f.metadata().unwrap().len());
        f.seek(SeekFrom::Start(1230)).unwrap();
        let mut b = [0u8; 6];
        f.read_exact(&mut b).unwrap();
        assert_eq!(b, [1, 1, 1, 1, 0, 0]);

        assert!(exists_quietly(&quiet_name(&path)));
        assert!(!exists_quietly(&quiet_name(&dir.path().join("8.jnl"))));
        assert!(
            exists_quietly(&quiet_name(dir.path())),
            "a directory exists too, as for `exists`"
        );
    }

    #[test]
    fn a_damaged_table_is_named_with_a_way_out() {
        let dir = Path::new("/data/store");
        let damaged = store_failure(dir, "opening", &fjall::Error::Unrecoverable).to_string();
        assert!(
            damaged.starts_with("opening the store in /data/store: "),
            "{damaged}"
        );
        assert!(damaged.contains("damaged"), "{damaged}");
        assert!(
            damaged.contains("restore the data directory from a backup"),
            "{damaged}"
        );
        assert!(damaged.contains("Unrecoverable"), "{damaged}");
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let gone = store_failure(dir, "reading", &fjall::Error::Io(missing)).to_string();
        assert!(gone.contains("a file of the store is missing"), "{gone}");
        // A `version` file fjall does not read names that file, not the tables.
        let version = store_failure(dir, "opening", &fjall::Error::InvalidVersion(None));
        let version = version.to_string();
        assert!(version.contains("`version` file"), "{version}");
        assert!(!version.contains("keyspaces"), "{version}");
        let locked = store_failure(dir, "opening", &fjall::Error::Locked).to_string();
        assert!(locked.contains("another process holds it"), "{locked}");
        // An I/O failure is not damage: no advice to restore a backup over it.
        for kind in [
            std::io::ErrorKind::PermissionDenied,
            std::io::ErrorKind::StorageFull,
            std::io::ErrorKind::Other,
        ] {
            let io = fjall::Error::Storage(fjall::LsmError::Io(kind.into()));
            let said = store_failure(dir, "opening", &io).to_string();
            assert!(!said.contains("backup"), "{said}");
        }
        let tables = fjall::Error::Storage(fjall::LsmError::InvalidTrailer);
        let said = store_failure(dir, "reading", &tables).to_string();
        assert!(said.contains("damaged"), "{said}");
    }
}
