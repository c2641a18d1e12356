//! The signing keys' files: generated on first start, loaded (one file, several, or a
//! directory of them), and the record of which keys a store's places were issued under, so
//! a start with none of them is refused rather than orphaning every place.

use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::spki::der::{self, pem::LineEnding, zeroize::Zeroizing};
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey, KeypairBytes};
use ed25519_dalek::SigningKey;
use sha2::{Digest, Sha256};

use super::hex_prefix;

/// Loads the signing key from `path` (PEM, PKCS#8 v1 or v2), or else from
/// `data_dir/signing-key.pem`, generating that file (mode 0600) on first start so tokens keep
/// verifying after restarts.
pub fn load_or_generate_key(path: Option<&Path>, data_dir: &Path) -> anyhow::Result<SigningKey> {
    if let Some(p) = path {
        let bytes = std::fs::read(p)
            .map_err(|e| anyhow::anyhow!("reading signing key {}: {e}", p.display()))?;
        let error = match std::str::from_utf8(&bytes).map(SigningKey::from_pkcs8_pem) {
            Ok(Ok(key)) => return Ok(key),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        // The parser's own error names what it expected rather than what it found (an RSA
        // key reads "unknown OID 1.3.101.112", Ed25519's), so the file is described.
        return Err(match describe_key_file(&bytes) {
            Some(found) => anyhow::anyhow!(
                "signing key {} holds {found}; expected {EXPECTED_KEY}",
                p.display()
            ),
            None => anyhow::anyhow!("signing key {} is not {EXPECTED_KEY}: {error}", p.display()),
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
    let pem = key_pem(&key)?;
    if !write_private_new(&file, pem.as_bytes())? {
        // Another process (a `keygen` run at the same time) made one first: that one is the
        // key, never replaced.
        return load_or_generate_key(Some(&file), data_dir);
    }
    tracing::info!(path = %file.display(), "generated a new signing key");
    Ok(key)
}

/// What a signing key file must hold, for the messages.
const EXPECTED_KEY: &str =
    "an Ed25519 private key in PKCS#8 PEM (\"-----BEGIN PRIVATE KEY-----\", \
     as `waitroom keygen` or `openssl genpkey -algorithm ed25519` writes it)";

/// `key` as the PEM file waitroom writes: PKCS#8 v1 (RFC 8410), the private key alone. The
/// v2 form that `SigningKey::to_pkcs8_pem` writes (the public key added) is refused by
/// OpenSSL 3.0, Python's `cryptography` and Node; both forms are read.
fn key_pem(key: &SigningKey) -> anyhow::Result<Zeroizing<String>> {
    let pair = KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    };
    pair.to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| anyhow::anyhow!("encoding the signing key: {e}"))
}

/// What a key file that does not load holds instead of an Ed25519 PKCS#8 key ("an RSA
/// private key", "no PEM block"), or `None` when it is such a key and the parser's own
/// error says more (a damaged one).
fn describe_key_file(bytes: &[u8]) -> Option<String> {
    use ed25519_dalek::pkcs8::PrivateKeyInfo;
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Some("binary data, not PEM text (a DER file?)".into());
    };
    if text.trim().is_empty() {
        return Some("nothing (the file is empty)".into());
    }
    let Some(start) = text.find("-----BEGIN ") else {
        return Some("no PEM block (no \"-----BEGIN\" line)".into());
    };
    let block = &text[start..];
    let label = block["-----BEGIN ".len()..]
        .split_once("-----")
        .map_or("", |(l, _)| l);
    let found = match label {
        "PRIVATE KEY" => {
            // Only up to its end line: what follows (another block, text) is not the key's.
            let end = "-----END PRIVATE KEY-----";
            let block = block.find(end).map_or(block, |i| &block[..i + end.len()]);
            let (_, der) = der::pem::decode_vec(block.as_bytes()).ok()?;
            let info = PrivateKeyInfo::try_from(der.as_slice()).ok()?;
            let oid = info.algorithm.oid.to_string();
            let curve = info.algorithm.parameters_oid().ok().map(|c| c.to_string());
            let name = match (oid.as_str(), curve.as_deref()) {
                // Ed25519 itself: the parser's error (a damaged key) is the better message.
                ("1.3.101.112", _) => return None,
                ("1.2.840.113549.1.1.1" | "1.2.840.113549.1.1.10", _) => "an RSA",
                ("1.2.840.10045.2.1", Some("1.2.840.10045.3.1.7")) => "a P-256 (EC)",
                ("1.2.840.10045.2.1", Some("1.3.132.0.34")) => "a P-384 (EC)",
                ("1.2.840.10045.2.1", Some("1.3.132.0.35")) => "a P-521 (EC)",
                ("1.2.840.10045.2.1", _) => "an EC",
                ("1.3.101.110", _) => "an X25519",
                ("1.3.101.111", _) => "an X448",
                ("1.3.101.113", _) => "an Ed448",
                _ => return Some(format!("a PKCS#8 private key of algorithm OID {oid}")),
            };
            return Some(format!("{name} private key"));
        }
        "RSA PRIVATE KEY" => "an RSA private key (PKCS#1)",
        "EC PRIVATE KEY" | "EC PARAMETERS" => "an EC key (SEC1)",
        "ENCRYPTED PRIVATE KEY" => "an encrypted private key (keys are read unencrypted)",
        "OPENSSH PRIVATE KEY" => "an OpenSSH private key",
        "PUBLIC KEY" => "a public key, not the private key",
        "CERTIFICATE" => "a certificate, not a private key",
        other => return Some(format!("a PEM block labelled {other:?}")),
    };
    Some(found.into())
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
    // Whoever may write it could block the next start, or clear it to have a new key
    // recorded with only a warning: its owner's only, as the store's other files.
    narrow_secret_file(&record);
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
        // An empty record is as good as none (a crash can leave one): said out loud as a
        // missing one is, not taken as "nothing to check".
        old.is_empty(),
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
        } else if places > 0 && unrecorded {
            // A store written before keys were recorded (or whose record was lost): nothing
            // says which key its places were issued under, so the first start records its
            // own. Said out loud: with a wrong key every waiting token of those places is
            // refused, and nodes started later with the right key are refused in turn.
            tracing::warn!(
                places,
                fingerprint = current.join(", "),
                %store,
                "the store holds places but no record of the signing keys they were issued \
                 under (written by an earlier version, or the record was lost): recording \
                 the keys in use. If they are not the keys those places were issued under, \
                 their waiting tokens are refused: stop, and start with the original key \
                 and --repair"
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
    // The rename itself made durable: without it a power cut may lose the new name (or
    // leave the file empty), and the next start finds no record.
    // (A directory cannot be opened so on Windows, whose renames need no such sync.)
    #[cfg(unix)]
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
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

    /// The DER of a PEM file's one block.
    fn der_of(pem: &str) -> Vec<u8> {
        der::pem::decode_vec(pem.as_bytes()).unwrap().1
    }

    /// The key file a first start (and `waitroom keygen`) writes is PKCS#8 v1 as RFC 8410
    /// shows it, byte for byte: SEQUENCE { INTEGER 0, SEQUENCE { OID 1.3.101.112 }, OCTET
    /// STRING { OCTET STRING (32 bytes) } } and nothing after, the form OpenSSL 3.0,
    /// Python's `cryptography` and Node read (they refuse v2, which adds the public key).
    #[test]
    fn a_generated_key_file_is_pkcs8_v1() {
        let dir = tempfile::tempdir().unwrap();
        let key = load_or_generate_key(None, dir.path()).unwrap();
        let pem = std::fs::read_to_string(dir.path().join("signing-key.pem")).unwrap();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{pem}");
        let der = der_of(&pem);
        let head = [
            0x30, 0x2e, // SEQUENCE, 46 bytes
            0x02, 0x01, 0x00, // version 0 (v1)
            0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, // { OID 1.3.101.112 }, no parameters
            0x04, 0x22, 0x04, 0x20, // the private key: OCTET STRING { OCTET STRING (32) }
        ];
        assert_eq!(der.len(), head.len() + 32, "{der:02x?}");
        assert_eq!(der[..head.len()], head, "{der:02x?}");
        assert_eq!(der[head.len()..], key.to_bytes());
        // And it reads back as the same key.
        let again = load_or_generate_key(None, dir.path()).unwrap();
        assert_eq!(again.to_bytes(), key.to_bytes());
    }

    /// Files written before in the v2 form (the public key added) keep loading, named and
    /// in the data dir.
    #[test]
    fn a_pkcs8_v2_key_file_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let key = SigningKey::from_bytes(&[7; 32]);
        let pem = key.to_pkcs8_pem(LineEnding::LF).unwrap();
        // The version INTEGER after the outer SEQUENCE's header is 1: v2.
        assert_eq!(der_of(&pem)[2..5], [0x02, 0x01, 0x01], "a v2 file");
        let file = dir.path().join("signing-key.pem");
        std::fs::write(&file, pem.as_bytes()).unwrap();
        let named = load_or_generate_key(Some(&file), Path::new("")).unwrap();
        assert_eq!(named.to_bytes(), key.to_bytes());
        let in_data_dir = load_or_generate_key(None, dir.path()).unwrap();
        assert_eq!(in_data_dir.to_bytes(), key.to_bytes());
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            pem.as_str(),
            "an existing file is kept as it is"
        );
    }

    /// `openssl genpkey -algorithm rsa -pkeyopt rsa_keygen_bits:512`.
    const RSA_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIIBVQIBADANBgkqhkiG9w0BAQEFAASCAT8wggE7AgEAAkEAsv+g9Jx6DIRh/wWJ
c7pRuNGT8IbSp9ffLRBJeq/L5qWS+ZDIFJJW7D6C67uhGBTSd8vEC62YhN1/Fz4p
RMH4DwIDAQABAkEAmStFgAumJK/ja2ZBiFYXOB+eiGPWPunqf5VAS0vDH0l/kY92
7PEel3psvA3MXb2Wz0R3C07IknF8jRd/D2BNAQIhAOzPbychVW7k/F2XZRd53a4R
v7uZlv3HF0B7O8h1chP5AiEAwYDn0QahIrZKYUO10HxaZiXLcClQubQ7xKQ+gaVR
XkcCID7+55jHO0zmyWO0VIYsOxaFTjX/o7Ua80qJ/dtTsucxAiEAmR15UasfQipg
fMppScm8dmudqOjoWanGSXl1hHzd/+0CIAoH1z5b092w4frx2M0BYAOHfb6MKriV
CFkW5+aBsfPN
-----END PRIVATE KEY-----
";

    /// `openssl genpkey -algorithm ec -pkeyopt ec_paramgen_curve:P-256`.
    const P256_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgbeq6VA4sUekjf82O
klSSkLL11OiLjIoUv+lJqMA8aZGhRANCAATS3mgD20P9iRqc3dDbw2GOKN+AyzJL
Y71hx1Ddj2VnhTzl37Bgs6m/ZQXHIKWuqHMnoglVflENK/79BJ+nt7IA
-----END PRIVATE KEY-----
";

    /// A key file that is not an Ed25519 key is refused with a message that says what it
    /// holds and what is expected (the parser alone named Ed25519's own OID for an RSA key,
    /// and a "NUL byte" for plain text).
    #[test]
    fn a_wrong_key_file_is_named_for_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let refusal = |name: &str, body: &[u8]| {
            let f = dir.path().join(name);
            std::fs::write(&f, body).unwrap();
            let e = load_or_generate_key(Some(&f), Path::new(""))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&f.display().to_string()), "{e}");
            assert!(e.contains("an Ed25519 private key in PKCS#8 PEM"), "{e}");
            assert!(!e.contains("1.3.101.112") && !e.contains("NUL"), "{e}");
            e
        };
        let e = refusal("rsa.pem", RSA_PEM.as_bytes());
        assert!(e.contains("; expected an Ed25519"), "{e}");
        assert!(e.contains("holds an RSA private key;"), "{e}");
        let e = refusal("ec.pem", P256_PEM.as_bytes());
        assert!(e.contains("holds a P-256 (EC) private key;"), "{e}");
        let e = refusal("garbage.pem", b"garbage\n");
        assert!(e.contains("holds no PEM block"), "{e}");
        let e = refusal("empty.pem", b"");
        assert!(e.contains("holds nothing"), "{e}");
        let e = refusal("key.der", &der_of(RSA_PEM));
        assert!(e.contains("holds binary data"), "{e}");
        let public = "-----BEGIN PUBLIC KEY-----\n\
                      MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n\
                      -----END PUBLIC KEY-----\n";
        let e = refusal("pub.pem", public.as_bytes());
        assert!(e.contains("holds a public key, not the private key"), "{e}");
        // A damaged Ed25519 key keeps the parser's own account.
        let mut der = der_of(&key_pem(&SigningKey::from_bytes(&[3; 32])).unwrap());
        der[15] = 0x1f; // the inner OCTET STRING says 31 bytes
        let damaged = der::pem::encode_string("PRIVATE KEY", LineEnding::LF, &der).unwrap();
        let e = refusal("damaged.pem", damaged.as_bytes());
        assert!(e.contains("is not an Ed25519 private key"), "{e}");
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
