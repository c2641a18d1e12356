//! The signing keys' files: generated on first start, loaded (one file, several, or a
//! directory of them), and the record of which keys a store's places were issued under, so
//! a start with none of them is refused rather than orphaning every place.

use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use ed25519_dalek::SigningKey;
use sha2::{Digest, Sha256};

use super::hex_prefix;

/// Loads the signing key from `path` (PEM, PKCS#8), or else from `data_dir/signing-key.pem`,
/// generating that file (mode 0600) on first start so tokens keep verifying after restarts.
pub fn load_or_generate_key(path: Option<&Path>, data_dir: &Path) -> anyhow::Result<SigningKey> {
    if let Some(p) = path {
        let pem = std::fs::read_to_string(p)
            .map_err(|e| anyhow::anyhow!("reading signing key {}: {e}", p.display()))?;
        return SigningKey::from_pkcs8_pem(&pem).map_err(|e| {
            anyhow::anyhow!(
                "signing key {} is not an Ed25519 PKCS#8 PEM key: {e}",
                p.display()
            )
        });
    }
    let file: PathBuf = data_dir.join("signing-key.pem");
    if file.exists() {
        narrow_secret_file(&file);
        return load_or_generate_key(Some(&file), data_dir);
    }
    create_owner_dirs(data_dir)?;
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("no OS randomness: {e}"))?;
    let key = SigningKey::from_bytes(&seed);
    let pem = key
        .to_pkcs8_pem(Default::default())
        .map_err(|e| anyhow::anyhow!("encoding the signing key: {e}"))?;
    if !write_private_new(&file, pem.as_bytes())? {
        // Another process (a `keygen` run at the same time) made one first: that one is the
        // key, never replaced.
        return load_or_generate_key(Some(&file), data_dir);
    }
    tracing::info!(path = %file.display(), "generated a new signing key");
    Ok(key)
}

/// File in the data dir that records which signing key the store's places were issued
/// under (a hash of the public key, hex): a store whose key went missing or changed would
/// otherwise hold places that no waiting token can reach any more.
pub const KEY_FINGERPRINT_FILE: &str = "signing-key.fingerprint";

/// The fingerprint of a signing key: SHA-256 of its public key, hex.
pub fn key_fingerprint(key: &SigningKey) -> String {
    hex_prefix(&Sha256::digest(key.verifying_key().as_bytes()), 32)
}

/// Loads the signing keys named by `paths` (files, or directories whose `*.pem` files are
/// taken in name order), oldest first: the last one signs (API.md "Key rotation").
pub fn load_signing_keys(paths: &[PathBuf]) -> anyhow::Result<Vec<SigningKey>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut pems: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| anyhow::anyhow!("reading signing key directory {}: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "pem") && f.is_file())
                .collect();
            if pems.is_empty() {
                anyhow::bail!("signing key directory {} holds no *.pem file", p.display());
            }
            pems.sort();
            files.extend(pems);
        } else {
            files.push(p.clone());
        }
    }
    let mut keys: Vec<SigningKey> = Vec::with_capacity(files.len());
    for f in &files {
        let key = load_or_generate_key(Some(f), Path::new(""))?;
        // The same key twice (a file named and also in a named directory) would make the
        // order of "newest" ambiguous.
        if keys.iter().any(|k| k.to_bytes() == key.to_bytes()) {
            anyhow::bail!("the signing key {} is given twice", f.display());
        }
        keys.push(key);
    }
    Ok(keys)
}

/// Loads the signing keys as [`load_signing_keys`] (or, when `paths` is empty, the data
/// dir's key as [`load_or_generate_key`]), but refuses when the store holds `places` that
/// were issued under other keys only (or a key file that has gone missing), unless
/// `repair`: then the places are kept (no token reaches them, so they expire after their
/// idle period) and the new keys are recorded. Records the keys' fingerprints in the data
/// dir. Removing one of several recorded keys is a rotation, not a loss: it is logged.
pub fn load_key_for_store(
    paths: &[PathBuf],
    data_dir: &Path,
    places: u64,
    repair: bool,
) -> anyhow::Result<Vec<SigningKey>> {
    let generated = data_dir.join("signing-key.pem");
    let record = data_dir.join(KEY_FINGERPRINT_FILE);
    let recorded = std::fs::read_to_string(&record).ok();
    if places > 0 && !repair && paths.is_empty() && !generated.exists() {
        anyhow::bail!(
            "the store in {} holds {places} places, but its signing key {} is missing: a new \
             key would invalidate every waiting token while the orphaned places keep everyone's \
             position inflated. Restore the key file, or start with --repair to continue with \
             a new key (the orphaned places expire after their idle period)",
            data_dir.display(),
            generated.display()
        );
    }
    let keys = if paths.is_empty() {
        vec![load_or_generate_key(None, data_dir)?]
    } else {
        load_signing_keys(paths)?
    };
    let current: Vec<String> = keys.iter().map(key_fingerprint).collect();
    let old: Vec<&str> = recorded
        .as_deref()
        .map(|r| r.lines().map(str::trim).filter(|l| !l.is_empty()).collect())
        .unwrap_or_default();
    check_key_change(
        &old,
        &current,
        places,
        repair,
        &format!("the store in {}", data_dir.display()),
        recorded.is_none(),
    )?;
    if old != current.iter().map(String::as_str).collect::<Vec<_>>() {
        let mut text = current.join("\n");
        text.push('\n');
        write_private(&record, text.as_bytes())?;
    }
    Ok(keys)
}

/// What a start does when the signing keys in use are not those `old` records (in
/// `store`, for the messages): nothing is recorded yet, or a key is kept (a rotation:
/// removed keys are logged); with no key kept while the store holds places, every waiting
/// token would be invalid, which is refused unless `repair`. `unrecorded`: no record at
/// all (a store from before records), where `repair` only notes the key it records.
pub fn check_key_change(
    old: &[&str],
    current: &[String],
    places: u64,
    repair: bool,
    store: &str,
    unrecorded: bool,
) -> anyhow::Result<()> {
    let kept = old.iter().any(|f| current.iter().any(|c| c == f));
    let removed: Vec<&str> = old
        .iter()
        .copied()
        .filter(|f| !current.iter().any(|c| c == f))
        .collect();
    if old.is_empty() {
        if places > 0 && unrecorded && repair {
            tracing::warn!(
                places,
                "repair: recording the signing key in use; places issued under a lost key \
                 expire after their idle period"
            );
        }
    } else if !kept && places > 0 {
        let old = old.join(", ");
        let fingerprint = current.join(", ");
        if !repair {
            anyhow::bail!(
                "{} holds {places} places issued under the signing key with \
                 fingerprint {old}, but the key in use has fingerprint {fingerprint}: every \
                 waiting token would be invalid. Use the original key, or start with \
                 --repair to continue with this one (the orphaned places expire after \
                 their idle period)",
                store
            );
        }
        tracing::error!(
            places,
            old_fingerprint = old,
            fingerprint,
            "repair: the signing key changed; the store's places are orphaned and expire \
             after their idle period"
        );
    } else if !removed.is_empty() && places > 0 {
        // Key rotation's last step: the tokens the removed keys signed are retired on purpose.
        tracing::warn!(
            places,
            removed = removed.join(", "),
            "signing keys removed: access tokens they signed are refused, and places whose \
             waiting tokens they issued expire after their idle period"
        );
    }
    Ok(())
}

/// Writes a secret file readable by its owner only, atomically (temp file + rename).
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = private_temp(path, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(())
}

/// [`write_private`], but only if `path` does not exist yet (a hard link, which never
/// replaces): `false` when another process made it first.
pub fn write_private_new(path: &Path, bytes: &[u8]) -> anyhow::Result<bool> {
    let tmp = private_temp(path, bytes)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        // A filesystem without hard links (vfat, SMB, some FUSE mounts): the file made
        // directly, still only if it is not there (not atomic against a crash mid-write,
        // which the link is).
        Err(_) => {
            use std::io::Write;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let mut f = match opts.open(path) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
                other => other?,
            };
            f.write_all(bytes)?;
            f.sync_all()?;
            Ok(true)
        }
    }
}

/// `bytes` written and synced to a new owner-only file beside `path`, named for this
/// process and call: writers at the same time (two `keygen` runs) never share one, where a
/// shared name let each remove the other's.
fn private_temp(path: &Path, bytes: &[u8]) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    let mut salt = [0u8; 6];
    getrandom::fill(&mut salt).map_err(|e| anyhow::anyhow!("no OS randomness: {e}"))?;
    let tmp = path.with_extension(format!(
        "tmp.{}.{}",
        std::process::id(),
        hex_prefix(&salt, salt.len())
    ));
    // A new file, never one found there: the mode below applies only to files it creates,
    // and an existing one (or a symlink, which `create_new` does not follow) would keep the
    // secret under someone else's permissions.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp)?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.into());
    }
    Ok(tmp)
}

/// Creates `dir` and its missing parents with mode 0755 (less what the umask takes): under
/// a umask of 000, `create_dir_all` made them writable by every user, who could then put
/// their own signing key or journal in place. Not 0700: other users (the service's own,
/// once a key made by root is given to it) must still pass through them; the data dir
/// itself is narrowed after (`create_private_dir`). Directories already there are left
/// as they are.
pub fn create_owner_dirs(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir)
}

/// Narrows a secret file this user keeps (`signing-key.pem`, `admin-token` in the data
/// dir) to 0600 if group or others may read it: one copied in or restored from a backup
/// with 0644 stayed so, readable by anyone once the directory is not narrowed (another
/// owner's). Not this user's to narrow: a warning.
pub fn narrow_secret_file(file: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let Ok(meta) = std::fs::metadata(file) else {
            return;
        };
        if meta.permissions().mode() & 0o077 == 0 {
            return;
        }
        if let Err(e) = std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)) {
            tracing::warn!(file = %file.display(), error = %e,
                "a secret file is readable by other users and cannot be narrowed to 0600");
        }
    }
    #[cfg(not(unix))]
    let _ = file;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The directories made for a data dir or a key are writable by their owner only (the
    /// umask of 000 that showed the defect is set in `tests/packaging.rs`, in a process of
    /// its own). Existing ones are left alone.
    #[cfg(unix)]
    #[test]
    fn made_parents_are_the_owners_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        create_owner_dirs(&deep).unwrap();
        for d in ["a", "a/b", "a/b/c"] {
            let m = std::fs::metadata(dir.path().join(d))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(m & 0o022, 0, "{d}");
        }
        create_owner_dirs(&deep).unwrap();
    }

    /// A secret file of ours that group or others may read is narrowed to 0600.
    #[cfg(unix)]
    #[test]
    fn a_loose_secret_file_is_narrowed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("admin-token");
        std::fs::write(&f, "t").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        narrow_secret_file(&f);
        let m = std::fs::metadata(&f).unwrap().permissions().mode();
        assert_eq!(m & 0o777, 0o600);
        narrow_secret_file(&dir.path().join("absent"));
    }
}
