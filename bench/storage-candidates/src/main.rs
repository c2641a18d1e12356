//! Side-by-side measurement of embedded storage engines for waitroom's durable store.
//!
//! Candidates: fjall 3 (LSM tree + journal), redb 4 (copy-on-write B-tree), and a plain
//! append-only file of length+crc32 framed records (the physical limit of "write + fsync").
//!
//! The workload is the durable store's: small keys (event id + 0x00 + 8-byte big-endian
//! sequence = 24 bytes) with 64-byte values for a join, a 25-byte key with a 16-byte value
//! for an admit, and two deletes for an end. A writer thread does GROUP COMMIT: everything
//! queued is written as one atomic batch, then fsynced once.
//!
//! Usage:
//!   cargo run --release                      # full suite, prints markdown tables to stdout
//!   cargo run --release -- --quick           # smoke run with small numbers
//!   options: --records N (default 1000000), --secs S (seconds per throughput cell, default 2),
//!            --dir PATH (data dir, default /tmp/waitroom-storage-bench-<pid>, removed at the end)
//!
//! Internal sub-commands (spawned as child processes, so that resident memory, panics and
//! log output of one engine do not leak into the next measurement):
//!   recover <engine> <dir> <cold:0|1>
//!   torn <engine> <dir>

use std::collections::BTreeMap;
use std::error::Error;
use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type R<T> = Result<T, Box<dyn Error + Send + Sync>>;

// ---------------------------------------------------------------------------------------------
// logging (fjall and redb log through the `log` facade)

struct StderrLogger;
impl log::Log for StderrLogger {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            eprintln!("LOG {} {}: {}", r.level(), r.target(), r.args());
        }
    }
    fn flush(&self) {}
}
static LOGGER: StderrLogger = StderrLogger;
fn init_log(level: log::LevelFilter) {
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}

// ---------------------------------------------------------------------------------------------
// workload

const EVENTS: u64 = 8;
const JOIN_VALUE: usize = 64;
const ADMIT_VALUE: usize = 16;

/// event id ("event-000000003", 15 bytes) + 0x00 + 8-byte big-endian sequence = 24 bytes.
fn join_key(i: u64) -> Vec<u8> {
    let ev = i % EVENTS;
    let seq = i / EVENTS;
    let mut k = Vec::with_capacity(25);
    k.extend_from_slice(format!("event-{ev:09}").as_bytes());
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    debug_assert_eq!(k.len(), 24);
    k
}

/// The join key with a 1-byte suffix (25 bytes).
fn admit_key(i: u64) -> Vec<u8> {
    let mut k = join_key(i);
    k.push(b'a');
    k
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

enum Op {
    Put(Vec<u8>, Vec<u8>),
    Del(Vec<u8>),
}

/// Steady-state request stream: visitor i joins; visitor i-ADMIT_LAG is admitted; visitor
/// i-END_LAG ends (both of its keys are deleted). Live set stays around END_LAG visitors.
/// One "record" = one queued request (join, admit or end).
struct Gen {
    tick: u64,
    phase: u8,
    rng: Rng,
}
const ADMIT_LAG: u64 = 1_000;
const END_LAG: u64 = 5_000;

impl Gen {
    fn new() -> Self {
        Gen { tick: 0, phase: 0, rng: Rng(0x9E37_79B9_7F4A_7C15) }
    }
    /// Appends the key operations of the next request; returns false if the request was a
    /// no-op (warm-up of the admit/end lag), in which case nothing was appended.
    fn next_request(&mut self, ops: &mut Vec<Op>) -> bool {
        let i = self.tick;
        let phase = self.phase;
        self.phase += 1;
        if self.phase == 3 {
            self.phase = 0;
            self.tick += 1;
        }
        match phase {
            0 => {
                ops.push(Op::Put(join_key(i), self.rng.bytes(JOIN_VALUE)));
                true
            }
            1 if i >= ADMIT_LAG => {
                ops.push(Op::Put(admit_key(i - ADMIT_LAG), self.rng.bytes(ADMIT_VALUE)));
                true
            }
            2 if i >= END_LAG => {
                ops.push(Op::Del(join_key(i - END_LAG)));
                ops.push(Op::Del(admit_key(i - END_LAG)));
                true
            }
            _ => false,
        }
    }
    fn batch(&mut self, n: usize, ops: &mut Vec<Op>) {
        ops.clear();
        let mut got = 0;
        while got < n {
            if self.next_request(ops) {
                got += 1;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// engines

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Fjall,
    Redb,
    File,
}
impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Fjall => "fjall",
            Kind::Redb => "redb",
            Kind::File => "file",
        }
    }
    fn parse(s: &str) -> Kind {
        match s {
            "fjall" => Kind::Fjall,
            "redb" => Kind::Redb,
            "file" => Kind::File,
            _ => panic!("unknown engine {s}"),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// fsync per batch (fjall: PersistMode::SyncAll, redb: Durability::Immediate, file: sync_data)
    Sync,
    /// fjall only: PersistMode::SyncData (fdatasync) per batch
    SyncData,
    /// no fsync (fjall: commit = write to OS buffers, redb: Durability::None, file: write only)
    Relaxed,
}
impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Sync => "fsync",
            Mode::SyncData => "fdatasync",
            Mode::Relaxed => "relaxed",
        }
    }
}

const REDB_TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("q");

enum Store {
    Fjall { db: fjall::Database, ks: fjall::Keyspace, mode: Mode },
    Redb { db: redb::Database, mode: Mode },
    File { f: File, mode: Mode, buf: Vec<u8> },
}

const FILE_LOG: &str = "log.bin";
const REDB_FILE: &str = "db.redb";

impl Store {
    fn open(kind: Kind, dir: &Path, mode: Mode) -> R<Store> {
        fs::create_dir_all(dir)?;
        Ok(match kind {
            Kind::Fjall => {
                let db = fjall::Database::builder(dir).open()?;
                let ks = db.keyspace("q", fjall::KeyspaceCreateOptions::default)?;
                Store::Fjall { db, ks, mode }
            }
            Kind::Redb => {
                let db = redb::Database::create(dir.join(REDB_FILE))?;
                // make sure the table exists
                let tx = db.begin_write()?;
                tx.open_table(REDB_TABLE)?;
                tx.commit()?;
                Store::Redb { db, mode }
            }
            Kind::File => {
                let path = dir.join(FILE_LOG);
                let f = OpenOptions::new().create(true).append(true).open(&path)?;
                Store::File { f, mode, buf: Vec::with_capacity(1 << 20) }
            }
        })
    }

    /// One group commit: all ops as one atomic batch, then (depending on mode) one fsync.
    fn commit(&mut self, ops: &[Op]) -> R<()> {
        match self {
            Store::Fjall { db, ks, mode } => {
                let mut b = db.batch();
                for op in ops {
                    match op {
                        Op::Put(k, v) => b.insert(ks, k.as_slice(), v.as_slice()),
                        Op::Del(k) => b.remove(ks, k.as_slice()),
                    }
                }
                b.commit()?;
                match mode {
                    Mode::Sync => db.persist(fjall::PersistMode::SyncAll)?,
                    Mode::SyncData => db.persist(fjall::PersistMode::SyncData)?,
                    Mode::Relaxed => {}
                }
            }
            Store::Redb { db, mode } => {
                let mut tx = db.begin_write()?;
                match mode {
                    Mode::Relaxed => tx.set_durability(redb::Durability::None)?,
                    _ => tx.set_durability(redb::Durability::Immediate)?,
                }
                {
                    let mut t = tx.open_table(REDB_TABLE)?;
                    for op in ops {
                        match op {
                            Op::Put(k, v) => {
                                t.insert(k.as_slice(), v.as_slice())?;
                            }
                            Op::Del(k) => {
                                t.remove(k.as_slice())?;
                            }
                        }
                    }
                }
                tx.commit()?;
            }
            Store::File { f, mode, buf, .. } => {
                buf.clear();
                for op in ops {
                    frame(buf, op);
                }
                f.write_all(buf)?;
                if *mode != Mode::Relaxed {
                    f.sync_data()?;
                }
            }
        }
        Ok(())
    }

    fn close(self) -> R<()> {
        match self {
            Store::Fjall { db, ks, .. } => {
                drop(ks);
                drop(db);
            }
            Store::Redb { db, .. } => {
                // Database::close() returns errors that drop would ignore
                db.close()?;
            }
            Store::File { f, .. } => {
                f.sync_all()?;
            }
        }
        Ok(())
    }
}

/// File framing: [u32 LE payload len][u32 LE crc32(payload)][payload]
/// payload = op (1 = put, 2 = del) + key len (u8) + key + value
fn frame(buf: &mut Vec<u8>, op: &Op) {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; 8]);
    match op {
        Op::Put(k, v) => {
            buf.push(1);
            buf.push(k.len() as u8);
            buf.extend_from_slice(k);
            buf.extend_from_slice(v);
        }
        Op::Del(k) => {
            buf.push(2);
            buf.push(k.len() as u8);
            buf.extend_from_slice(k);
        }
    }
    let payload_len = (buf.len() - start - 8) as u32;
    let crc = crc32fast::hash(&buf[start + 8..]);
    buf[start..start + 4].copy_from_slice(&payload_len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

struct FileRecovery {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    valid_len: u64,
    file_len: u64,
}

/// Replays the log into an ordered in-memory map, stopping at the first short or corrupt frame.
fn file_replay(path: &Path) -> R<FileRecovery> {
    let f = File::open(path)?;
    let file_len = f.metadata()?.len();
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut map = BTreeMap::new();
    let mut pos = 0u64;
    let mut hdr = [0u8; 8];
    let mut payload = Vec::new();
    loop {
        if r.read_exact(&mut hdr).is_err() {
            break;
        }
        let len = u32::from_le_bytes(hdr[0..4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(hdr[4..8].try_into().unwrap());
        if len < 2 || len > 1 << 16 {
            break;
        }
        payload.resize(len, 0);
        if r.read_exact(&mut payload).is_err() {
            break;
        }
        if crc32fast::hash(&payload) != crc {
            break;
        }
        let klen = payload[1] as usize;
        if 2 + klen > len {
            break;
        }
        let key = payload[2..2 + klen].to_vec();
        match payload[0] {
            1 => {
                map.insert(key, payload[2 + klen..].to_vec());
            }
            2 => {
                map.remove(&key);
            }
            _ => break,
        }
        pos += 8 + len as u64;
    }
    Ok(FileRecovery { map, valid_len: pos, file_len })
}

/// Restart for the file baseline: replay, cut off a torn tail.
fn file_recover(path: &Path) -> R<FileRecovery> {
    let rec = file_replay(path)?;
    if rec.valid_len < rec.file_len {
        let f = OpenOptions::new().write(true).open(path)?;
        f.set_len(rec.valid_len)?;
        f.sync_all()?;
    }
    Ok(rec)
}

/// Compaction for the file baseline: rewrite the live set into a new log, fsync, rename.
fn file_compact(dir: &Path) -> R<()> {
    let path = dir.join(FILE_LOG);
    let rec = file_recover(&path)?;
    let tmp = dir.join("log.tmp");
    let mut buf = Vec::with_capacity(1 << 20);
    {
        let mut f = File::create(&tmp)?;
        for (k, v) in &rec.map {
            frame(&mut buf, &Op::Put(k.clone(), v.clone()));
            if buf.len() > 1 << 20 {
                f.write_all(&buf)?;
                buf.clear();
            }
        }
        f.write_all(&buf)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, &path)?;
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Restart: reopen + full ordered scan. Returns (open time, scan time, records, key+value bytes).
fn reopen_and_scan(kind: Kind, dir: &Path) -> R<(Duration, Duration, u64, u64)> {
    let t0 = Instant::now();
    let mut count = 0u64;
    let mut bytes = 0u64;
    let mut prev: Vec<u8> = Vec::new();
    let mut check = |k: &[u8], v: &[u8]| {
        assert!(count == 0 || prev.as_slice() < k, "scan not in key order");
        prev.clear();
        prev.extend_from_slice(k);
        count += 1;
        bytes += (k.len() + v.len()) as u64;
    };
    match kind {
        Kind::Fjall => {
            let db = fjall::Database::builder(dir).open()?;
            let ks = db.keyspace("q", fjall::KeyspaceCreateOptions::default)?;
            let t_open = t0.elapsed();
            let t1 = Instant::now();
            for g in ks.iter() {
                let (k, v) = g.into_inner()?;
                check(&k, &v);
            }
            let t_scan = t1.elapsed();
            drop(ks);
            drop(db);
            Ok((t_open, t_scan, count, bytes))
        }
        Kind::Redb => {
            let db = redb::Database::open(dir.join(REDB_FILE))?;
            let t_open = t0.elapsed();
            let t1 = Instant::now();
            {
                let rtx = redb::ReadableDatabase::begin_read(&db)?;
                let t = rtx.open_table(REDB_TABLE)?;
                for e in redb::ReadableTable::iter(&t)? {
                    let (k, v) = e?;
                    check(k.value(), v.value());
                }
            }
            let t_scan = t1.elapsed();
            drop(db);
            Ok((t_open, t_scan, count, bytes))
        }
        Kind::File => {
            // "open" = replay of the whole log into an ordered map (the file has no index)
            let rec = file_recover(&dir.join(FILE_LOG))?;
            let t_open = t0.elapsed();
            let t1 = Instant::now();
            for (k, v) in &rec.map {
                check(k, v);
            }
            let t_scan = t1.elapsed();
            // keep the map alive until here so RSS is measured with it
            let out = (t_open, t_scan, count, bytes);
            std::mem::forget(rec);
            Ok(out)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// helpers

fn proc_status_kb(field: &str) -> u64 {
    let s = fs::read_to_string("/proc/self/status").unwrap_or_default();
    for line in s.lines() {
        if let Some(rest) = line.strip_prefix(field) {
            let rest = rest.trim_start_matches(':').trim();
            return rest.split_whitespace().next().and_then(|x| x.parse().ok()).unwrap_or(0);
        }
    }
    0
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
}

/// (apparent bytes, allocated bytes) of all files under dir
fn dir_size(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut files = Vec::new();
    walk(dir, &mut files);
    let mut a = 0;
    let mut b = 0;
    for f in files {
        if let Ok(m) = fs::metadata(&f) {
            a += m.len();
            b += m.blocks() * 512;
        }
    }
    (a, b)
}

/// (apparent, allocated) bytes of fjall journal files (*.jnl) under dir
fn journal_bytes(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut files = Vec::new();
    walk(dir, &mut files);
    let mut a = 0;
    let mut b = 0;
    for f in files.iter().filter(|p| p.extension().is_some_and(|e| e == "jnl")) {
        if let Ok(m) = fs::metadata(f) {
            a += m.len();
            b += m.blocks() * 512;
        }
    }
    (a, b)
}

fn copy_dir(from: &Path, to: &Path) -> R<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let p = e.path();
        let t = to.join(e.file_name());
        if p.is_dir() {
            copy_dir(&p, &t)?;
        } else {
            fs::copy(&p, &t)?;
        }
    }
    Ok(())
}

/// Push a directory's files out of the page cache (fsync, then POSIX_FADV_DONTNEED).
fn evict(dir: &Path) {
    use std::os::unix::io::AsRawFd;
    let mut files = Vec::new();
    walk(dir, &mut files);
    for f in files {
        if let Ok(file) = File::open(&f) {
            let _ = file.sync_all();
            unsafe {
                libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }
}

fn mb(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

fn fmt_rate(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// Run a child sub-command with a time limit; returns (exit ok?, status text, stdout, stderr).
fn run_child(args: &[&str], limit: Duration) -> (bool, String, String, String) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out_pipe.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break Some(st);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = t_out.join().unwrap_or_default();
    let err = t_err.join().unwrap_or_default();
    match status {
        Some(st) => (st.success(), format!("{st}"), out, err),
        None => (false, format!("killed after {limit:?}"), out, err),
    }
}

fn result_field<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    let line = out.lines().rev().find(|l| l.starts_with("RESULT "))?;
    for kv in line["RESULT ".len()..].split_whitespace() {
        if let Some((k, v)) = kv.split_once('=') {
            if k == key {
                return Some(v);
            }
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// measurement 1 + 2: group-commit throughput and latency

struct Cell {
    requests: u64,
    key_ops: u64,
    batches: u64,
    wall: Duration,
    lat: Vec<Duration>,
}

fn throughput(kind: Kind, mode: Mode, bs: usize, secs: f64, dir: &Path) -> R<Cell> {
    let _ = fs::remove_dir_all(dir);
    let mut store = Store::open(kind, dir, mode)?;
    let mut gen = Gen::new();
    let mut ops = Vec::with_capacity(bs * 2);
    // warm-up to steady state: run the request stream (in batches of 1024) until ends start,
    // so the store holds the live set (~END_LAG joined, ~END_LAG-ADMIT_LAG admitted) and every
    // measured cell sees the same 1 join : 1 admit : 1 end mix (4 key ops per 3 records)
    let mut warm = Vec::with_capacity(2048);
    while gen.tick <= END_LAG {
        gen.batch(1024, &mut warm);
        store.commit(&warm)?;
    }
    for _ in 0..3 {
        gen.batch(bs, &mut ops);
        store.commit(&ops)?;
    }
    let limit = Duration::from_secs_f64(secs);
    let mut cell = Cell { requests: 0, key_ops: 0, batches: 0, wall: Duration::ZERO, lat: Vec::new() };
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        gen.batch(bs, &mut ops);
        let t = Instant::now();
        store.commit(&ops)?;
        cell.lat.push(t.elapsed());
        cell.requests += bs as u64;
        cell.key_ops += ops.len() as u64;
        cell.batches += 1;
    }
    cell.wall = t0.elapsed();
    store.close()?;
    let _ = fs::remove_dir_all(dir);
    Ok(cell)
}

// ---------------------------------------------------------------------------------------------
// measurement 3 + 4: recovery, memory and disk

struct Lifecycle {
    load_wall: Duration,
    disk_full: (u64, u64),
    rec_cold: String,
    rec_warm: String,
    rec_crash: String,
    crash_acked: u64,
    delete_wall: Duration,
    compact_wall: Duration,
    compact_note: String,
    disk_compacted: (u64, u64),
    disk_reopened: (u64, u64),
    live_after: u64,
    files_compacted: String,
    files_reopened: String,
    journal_reopened: (u64, u64),
}

fn lifecycle(kind: Kind, records: u64, deletes: u64, dir: &Path) -> R<Lifecycle> {
    let _ = fs::remove_dir_all(dir);
    // load: `records` joins in group commits of 1024 with fsync
    let mut rng = Rng(42);
    let t0 = Instant::now();
    {
        let mut store = Store::open(kind, dir, Mode::Sync)?;
        let mut i = 0u64;
        let mut ops = Vec::with_capacity(1024);
        while i < records {
            ops.clear();
            let end = (i + 1024).min(records);
            for j in i..end {
                ops.push(Op::Put(join_key(j), rng.bytes(JOIN_VALUE)));
            }
            store.commit(&ops)?;
            i = end;
        }
        store.close()?;
    }
    let load_wall = t0.elapsed();
    let disk_full = dir_size(dir);

    let d = dir.to_str().unwrap();
    let (ok, st, out, err) = run_child(&["recover", kind.name(), d, "1"], Duration::from_secs(180));
    let rec_cold = if ok { out.lines().rev().find(|l| l.starts_with("RESULT")).unwrap_or("").to_string() } else { format!("FAILED {st}: {}", err.lines().last().unwrap_or("")) };
    let (ok, st, out, err) = run_child(&["recover", kind.name(), d, "0"], Duration::from_secs(180));
    let rec_warm = if ok { out.lines().rev().find(|l| l.starts_with("RESULT")).unwrap_or("").to_string() } else { format!("FAILED {st}: {}", err.lines().last().unwrap_or("")) };

    // crash at scale: kill -9 a writer (fsynced group commits of 16, overwriting existing keys)
    // 1.5 s after it starts on the loaded store, then restart = reopen (incl. repair) + scan
    let (crash_acked, rec_crash) = {
        use std::io::BufRead;
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(["crashwrite", kind.name(), d, &records.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let out = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut acked = 0u64;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("ACK ") {
                    acked = n.trim().parse().unwrap_or(acked);
                }
            }
            acked
        });
        std::thread::sleep(Duration::from_millis(1500));
        child.kill()?;
        let _ = child.wait();
        let acked = reader.join().unwrap_or(0);
        let (ok, st, out, err) = run_child(&["recover", kind.name(), d, "0"], Duration::from_secs(180));
        let line = if ok { out.lines().rev().find(|l| l.starts_with("RESULT")).unwrap_or("").to_string() } else { format!("FAILED {st}: {}", err.lines().last().unwrap_or("")) };
        (acked, line)
    };

    // delete the oldest `deletes` records (FIFO, like a queue draining), group commits of 1024 + fsync
    let t1 = Instant::now();
    let mut store = Store::open(kind, dir, Mode::Sync)?;
    let mut i = 0u64;
    let mut ops = Vec::with_capacity(1024);
    while i < deletes {
        ops.clear();
        let end = (i + 1024).min(deletes);
        for j in i..end {
            ops.push(Op::Del(join_key(j)));
        }
        store.commit(&ops)?;
        i = end;
    }
    let delete_wall = t1.elapsed();

    let t2 = Instant::now();
    let compact_note;
    match store {
        Store::Fjall { db, ks, .. } => {
            // flush the memtable (holding the tombstones), then major compaction.
            // `Keyspace::major_compact` is public but #[doc(hidden)] in fjall 3.1.
            ks.rotate_memtable_and_wait()?;
            ks.major_compact()?;
            compact_note = format!(
                "rotate_memtable_and_wait + major_compact (doc-hidden); tables={} journals={}",
                ks.table_count(),
                db.journal_count()
            );
            drop(ks);
            drop(db);
        }
        Store::Redb { mut db, .. } => {
            let mut rounds = 0;
            while db.compact()? {
                rounds += 1;
                if rounds > 100 {
                    break;
                }
            }
            compact_note = format!("Database::compact() until false: {rounds} rounds that did work");
            db.close()?;
        }
        Store::File { f, .. } => {
            drop(f);
            file_compact(dir)?;
            compact_note = "rewrite live set to a new log + fsync + rename".to_string();
        }
    }
    let compact_wall = t2.elapsed();
    let disk_compacted = dir_size(dir);
    let files_compacted = list_files(dir);
    // reopen once more (fjall may drop journals only on recovery/maintenance), count live records
    let (_, _, live_after, _) = reopen_and_scan(kind, dir)?;
    let disk_reopened = dir_size(dir);
    let journal_reopened = journal_bytes(dir);
    let files_reopened = list_files(dir);
    let _ = fs::remove_dir_all(dir);
    Ok(Lifecycle {
        load_wall,
        disk_full,
        rec_cold,
        rec_warm,
        rec_crash,
        crash_acked,
        delete_wall,
        compact_wall,
        compact_note,
        disk_compacted,
        disk_reopened,
        live_after,
        files_compacted,
        files_reopened,
        journal_reopened,
    })
}

fn cmd_recover(kind: Kind, dir: &Path, cold: bool) -> R<()> {
    init_log(log::LevelFilter::Warn);
    if cold {
        evict(dir);
    }
    let rss0 = proc_status_kb("VmRSS");
    let (t_open, t_scan, count, bytes) = reopen_and_scan(kind, dir)?;
    let rss = proc_status_kb("VmRSS");
    let hwm = proc_status_kb("VmHWM");
    println!(
        "RESULT open_ms={:.1} scan_ms={:.1} total_ms={:.1} count={} kv_bytes={} rss_before_kb={} rss_after_scan_kb={} peak_kb={}",
        t_open.as_secs_f64() * 1e3,
        t_scan.as_secs_f64() * 1e3,
        (t_open + t_scan).as_secs_f64() * 1e3,
        count,
        bytes,
        rss0,
        rss,
        hwm
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// measurement 5: torn / corrupted tail

fn newest_journal(dir: &Path) -> Option<PathBuf> {
    let mut files = Vec::new();
    walk(dir, &mut files);
    files
        .into_iter()
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_string();
            let id: u64 = name.strip_suffix(".jnl")?.parse().ok()?;
            Some((id, p))
        })
        .max_by_key(|(id, _)| *id)
        .map(|(_, p)| p)
}

fn list_files(dir: &Path) -> String {
    let mut files = Vec::new();
    walk(dir, &mut files);
    files.sort();
    let n = files.len();
    let mut parts: Vec<String> = files
        .iter()
        .take(24)
        .map(|p| {
            let len = fs::metadata(p).map(|m| m.len()).unwrap_or(0);
            format!("{}={}", p.strip_prefix(dir).unwrap_or(p).display(), len)
        })
        .collect();
    if n > 24 {
        parts.push(format!("... {} more files", n - 24));
    }
    parts.join(", ")
}

/// Logical end of a fjall journal: the journal is pre-allocated (sparse, 64 MiB of zeros) and
/// every batch ends with an end marker followed by non-zero magic bytes, so the data ends after
/// the last non-zero byte.
fn logical_end(path: &Path) -> R<u64> {
    let data = fs::read(path)?;
    Ok(data.iter().rposition(|&b| b != 0).map(|p| p as u64 + 1).unwrap_or(0))
}

struct Torn {
    variant: &'static str,
    target: String,
    opened: String,
    open_ms: String,
    survived: String,
    write_after: String,
    reopen_count: String,
    logs: String,
}

#[derive(Clone, Copy)]
enum Damage {
    /// append 100 random bytes at the physical end of the file
    Append,
    /// truncate the physical file by 37 bytes
    Truncate,
    /// fjall: write 100 random bytes right after the last journal batch (inside the pre-allocation)
    GarbageAtLogicalEnd,
    /// fjall: zero the last 37 bytes of journal data (a torn append inside the pre-allocation)
    ZeroLogicalTail,
    /// overwrite the last 100 bytes of the file in place with random bytes (length unchanged)
    OverwriteEnd,
}

impl Damage {
    fn label(self) -> &'static str {
        match self {
            Damage::Append => "append 100 random bytes to file end",
            Damage::Truncate => "truncate file by 37 bytes",
            Damage::GarbageAtLogicalEnd => "100 random bytes written just after the last journal batch",
            Damage::ZeroLogicalTail => "last 37 bytes of journal data zeroed (torn last batch)",
            Damage::OverwriteEnd => "last 100 bytes of file overwritten in place with random bytes",
        }
    }
    fn tag(self) -> &'static str {
        match self {
            Damage::Append => "append",
            Damage::Truncate => "trunc",
            Damage::GarbageAtLogicalEnd => "garbage",
            Damage::ZeroLogicalTail => "zero",
            Damage::OverwriteEnd => "overwrite",
        }
    }
}

fn clean_log_line(l: &str) -> String {
    let mut l = l.to_string();
    // redb prints its whole FileBackend debug struct as the database name
    while let Some(i) = l.find("\"FileBackend {") {
        match l[i..].find("}\"") {
            Some(j) => l.replace_range(i..i + j + 2, "<db file>"),
            None => break,
        }
    }
    if let Some(i) = l.find("/tmp/") {
        let end = l[i..].find(|c: char| c.is_whitespace() || c == '"' || c == ',').map(|j| i + j).unwrap_or(l.len());
        l.replace_range(i..end, "<path>");
    }
    l.chars().take(160).collect()
}

fn summarize_logs(err: &str) -> String {
    let mut seen = std::collections::HashSet::new();
    let mut log_lines: Vec<String> = err
        .lines()
        .filter(|l| {
            let ll = l.to_lowercase();
            (l.starts_with("LOG WARN")
                || l.starts_with("LOG ERROR")
                || l.contains("panicked")
                || ll.contains("truncating")
                || ll.contains("corrupt")
                || ll.contains("invalid")
                || ll.contains("discard")
                || ll.contains("repairing")
                || ll.contains("full repair")
                || ll.contains("checksum"))
                && !ll.contains("committing transaction")
        })
        .map(clean_log_line)
        .filter(|l| seen.insert(l.clone()))
        .collect();
    let n = log_lines.len();
    log_lines.truncate(3);
    if n > 3 {
        log_lines.push(format!("... {} more", n - 3));
    }
    if log_lines.is_empty() {
        "(none)".into()
    } else {
        log_lines.join(" / ").replace('|', "\\|")
    }
}

fn check_child(kind: Kind, dir: &Path, variant: &'static str, target: String) -> Torn {
    let (ok, st, out, err) = run_child(&["torn", kind.name(), dir.to_str().unwrap()], Duration::from_secs(120));
    let field = |k: &str| result_field(&out, k).unwrap_or("-").replace('_', " ");
    let opened = if !ok && result_field(&out, "open").is_none() { format!("child died ({st})") } else { field("open") };
    Torn {
        variant,
        target,
        opened,
        open_ms: field("open_ms"),
        survived: field("count"),
        write_after: field("write"),
        reopen_count: field("reopen_count"),
        logs: summarize_logs(&err),
    }
}

fn torn(kind: Kind, base: &Path, records: u64, per_batch: u64) -> R<(String, Vec<Torn>)> {
    let orig = base.join(format!("torn-{}-orig", kind.name()));
    let _ = fs::remove_dir_all(&orig);
    {
        let mut store = Store::open(kind, &orig, Mode::Sync)?;
        let mut rng = Rng(7);
        let mut i = 0;
        let mut ops = Vec::new();
        while i < records {
            ops.clear();
            for j in i..i + per_batch {
                ops.push(Op::Put(join_key(j), rng.bytes(JOIN_VALUE)));
            }
            store.commit(&ops)?;
            i += per_batch;
        }
        store.close()?;
    }
    let layout = list_files(&orig);
    let damages: Vec<Damage> = match kind {
        Kind::Fjall => vec![Damage::Append, Damage::Truncate, Damage::GarbageAtLogicalEnd, Damage::ZeroLogicalTail],
        _ => vec![Damage::Append, Damage::Truncate, Damage::OverwriteEnd],
    };
    let mut results = Vec::new();
    for damage in damages {
        let dir = base.join(format!("torn-{}-{}", kind.name(), damage.tag()));
        let _ = fs::remove_dir_all(&dir);
        copy_dir(&orig, &dir)?;
        let target = match kind {
            Kind::Fjall => newest_journal(&dir).ok_or("no fjall journal found")?,
            Kind::Redb => dir.join(REDB_FILE),
            Kind::File => dir.join(FILE_LOG),
        };
        let len = fs::metadata(&target)?.len();
        let junk = Rng(0xDEAD_BEEF).bytes(100);
        let mut desc = format!("{} (len {len}", target.strip_prefix(&dir).unwrap_or(&target).display());
        {
            use std::os::unix::fs::FileExt;
            let f = OpenOptions::new().write(true).open(&target)?;
            match damage {
                Damage::Append => f.write_all_at(&junk, len)?,
                Damage::Truncate => f.set_len(len.saturating_sub(37))?,
                Damage::GarbageAtLogicalEnd => {
                    let end = logical_end(&target)?;
                    desc.push_str(&format!(", data ends at {end}"));
                    f.write_all_at(&junk, end)?;
                }
                Damage::ZeroLogicalTail => {
                    let end = logical_end(&target)?;
                    desc.push_str(&format!(", data ends at {end}"));
                    f.write_all_at(&[0u8; 37], end.saturating_sub(37))?;
                }
                Damage::OverwriteEnd => f.write_all_at(&junk, len.saturating_sub(100))?,
            }
            f.sync_all()?;
        }
        desc.push(')');
        results.push(check_child(kind, &dir, damage.label(), desc));
        let _ = fs::remove_dir_all(&dir);
    }
    let _ = fs::remove_dir_all(&orig);
    Ok((layout, results))
}

/// kill -9 a writer child in the middle of fsynced group commits of 16; every acknowledged
/// record must survive.
fn crash(kind: Kind, base: &Path, after: Duration) -> R<(u64, Torn)> {
    use std::io::BufRead;
    let dir = base.join(format!("crash-{}", kind.name()));
    let _ = fs::remove_dir_all(&dir);
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["crashwrite", kind.name(), dir.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut acked = 0u64;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("ACK ") {
                acked = n.trim().parse().unwrap_or(acked);
            }
        }
        acked
    });
    std::thread::sleep(after);
    child.kill()?; // SIGKILL
    let _ = child.wait();
    let acked = reader.join().unwrap_or(0);
    let t = check_child(kind, &dir, "kill -9 during fsynced group commits of 16", format!("killed after {:?}", after));
    let _ = fs::remove_dir_all(&dir);
    Ok((acked, t))
}

/// Writes joins in fsynced group commits of 16 until killed; keys wrap at `wrap` (overwrites).
fn cmd_crashwrite(kind: Kind, dir: &Path, wrap: u64) -> R<()> {
    let mut store = Store::open(kind, dir, Mode::Sync)?;
    let mut rng = Rng(99);
    let mut i = 0u64;
    let mut ops = Vec::new();
    let stdout = std::io::stdout();
    loop {
        ops.clear();
        for j in i..i + 16 {
            ops.push(Op::Put(join_key(j % wrap), rng.bytes(JOIN_VALUE)));
        }
        store.commit(&ops)?;
        i += 16;
        let mut l = stdout.lock();
        writeln!(l, "ACK {i}")?;
        l.flush()?;
    }
}

fn cmd_torn(kind: Kind, dir: &Path) -> R<()> {
    init_log(log::LevelFilter::Debug);
    let sanitize = |s: String| s.replace(char::is_whitespace, "_");
    let opened = std::panic::catch_unwind(|| reopen_and_scan(kind, dir));
    match opened {
        Ok(Ok((t_open, _, count, _))) => {
            // can we keep writing? one more batch with fsync, close, reopen, count again
            let write = (|| -> R<()> {
                let mut s = Store::open(kind, dir, Mode::Sync)?;
                s.commit(&[Op::Put(join_key(1_000_000_007), vec![1u8; JOIN_VALUE])])?;
                s.close()
            })();
            let write_s = match write {
                Ok(()) => "ok".to_string(),
                Err(e) => sanitize(format!("error:{e}")),
            };
            let reopen = std::panic::catch_unwind(|| reopen_and_scan(kind, dir));
            let reopen_s = match reopen {
                Ok(Ok((_, _, c, _))) => c.to_string(),
                Ok(Err(e)) => sanitize(format!("error:{e}")),
                Err(_) => "panic".to_string(),
            };
            println!(
                "RESULT open=yes open_ms={:.1} count={count} write={write_s} reopen_count={reopen_s}",
                t_open.as_secs_f64() * 1e3
            );
        }
        Ok(Err(e)) => {
            println!("RESULT open={} count=0", sanitize(format!("no:{e}")));
        }
        Err(_) => {
            println!("RESULT open=panic count=0");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// main

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("recover") => return cmd_recover(Kind::parse(&args[2]), Path::new(&args[3]), args[4] == "1"),
        Some("torn") => return cmd_torn(Kind::parse(&args[2]), Path::new(&args[3])),
        Some("crashwrite") => {
            let wrap = args.get(4).map(|w| w.parse()).transpose()?.unwrap_or(u64::MAX);
            return cmd_crashwrite(Kind::parse(&args[2]), Path::new(&args[3]), wrap);
        }
        _ => {}
    }
    init_log(log::LevelFilter::Warn);

    let mut records: u64 = 1_000_000;
    let mut secs: f64 = 2.0;
    let mut dir = PathBuf::from(format!("/tmp/waitroom-storage-bench-{}", std::process::id()));
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => {
                records = 50_000;
                secs = 0.3;
            }
            "--records" => {
                i += 1;
                records = args[i].parse()?;
            }
            "--secs" => {
                i += 1;
                secs = args[i].parse()?;
            }
            "--dir" => {
                i += 1;
                dir = PathBuf::from(&args[i]);
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
        i += 1;
    }
    fs::create_dir_all(&dir)?;
    let t_all = Instant::now();

    let kinds = [Kind::Fjall, Kind::Redb, Kind::File];
    let sizes = [1usize, 16, 128, 1024];

    println!("## Run at {:?} since UNIX epoch", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs());
    println!();
    println!("loadavg at start: {}", fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
    println!();

    // ---- 1 + 2
    println!("### 1. Group-commit throughput ({secs} s per cell, measured as 2 interleaved slices of {} s, fresh store per slice; record = one queued join/admit/end request)", secs / 2.0);
    println!();
    println!("| engine | durability | batch | records/s | batches/s | key ops/s | mean commit | p99 commit |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let modes: Vec<(Kind, Mode)> = vec![
        (Kind::Fjall, Mode::Sync),
        (Kind::Fjall, Mode::SyncData),
        (Kind::Redb, Mode::Sync),
        (Kind::File, Mode::Sync),
        (Kind::Fjall, Mode::Relaxed),
        (Kind::Redb, Mode::Relaxed),
        (Kind::File, Mode::Relaxed),
    ];
    // Cells are interleaved (batch size outer, engine inner) and each cell is measured in
    // ROUNDS separate slices, so that noise from other work on the machine is spread over all
    // engines instead of hitting one engine's cells.
    const ROUNDS: usize = 2;
    let mut cells: Vec<Vec<Option<Cell>>> = (0..modes.len()).map(|_| (0..sizes.len()).map(|_| None).collect()).collect();
    let mut loads = Vec::new();
    for round in 0..ROUNDS {
        loads.push(fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string());
        for (si, &bs) in sizes.iter().enumerate() {
            for (mi, (kind, mode)) in modes.iter().enumerate() {
                // the bs=16 fsync cells double as the latency measurement: give them more samples
                let s = if bs == 16 && *mode != Mode::Relaxed { secs * 2.0 } else { secs };
                eprintln!("[{:>6.1}s] throughput round {round} {} {} bs={bs}", t_all.elapsed().as_secs_f64(), kind.name(), mode.name());
                let c = throughput(*kind, *mode, bs, s / ROUNDS as f64, &dir.join("tp"))?;
                let slot = &mut cells[mi][si];
                match slot {
                    None => *slot = Some(c),
                    Some(acc) => {
                        acc.requests += c.requests;
                        acc.key_ops += c.key_ops;
                        acc.batches += c.batches;
                        acc.wall += c.wall;
                        acc.lat.extend(c.lat);
                    }
                }
            }
        }
    }
    let dname = |kind: Kind, mode: Mode| match (kind, mode) {
        (Kind::Fjall, Mode::Sync) => "fsync (persist SyncAll)",
        (Kind::Fjall, Mode::SyncData) => "fdatasync (persist SyncData)",
        (Kind::Fjall, Mode::Relaxed) => "relaxed (commit = write to OS, no persist)",
        (Kind::Redb, Mode::Sync) => "fsync (Durability::Immediate)",
        (Kind::Redb, Mode::Relaxed) => "relaxed (Durability::None)",
        (Kind::File, Mode::Sync) => "fsync (sync_data)",
        (Kind::File, Mode::Relaxed) => "relaxed (write_all only)",
        _ => mode.name(),
    };
    let mut lat16: Vec<(String, Cell)> = Vec::new();
    for (mi, (kind, mode)) in modes.iter().enumerate() {
        for (si, &bs) in sizes.iter().enumerate() {
            let mut c = cells[mi][si].take().unwrap();
            let w = c.wall.as_secs_f64();
            c.lat.sort();
            let mean = c.lat.iter().sum::<Duration>() / c.lat.len().max(1) as u32;
            let p99 = c.lat[((c.lat.len() as f64 * 0.99) as usize).min(c.lat.len() - 1)];
            println!(
                "| {} | {} | {bs} | {} | {} | {} | {:.3} ms | {:.3} ms |",
                kind.name(),
                dname(*kind, *mode),
                fmt_rate(c.requests as f64 / w),
                fmt_rate(c.batches as f64 / w),
                fmt_rate(c.key_ops as f64 / w),
                mean.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3
            );
            if bs == 16 && *mode != Mode::Relaxed {
                lat16.push((format!("{} {}", kind.name(), dname(*kind, *mode)), c));
            }
        }
    }
    println!();
    println!("loadavg at the start of each round: {}", loads.join(" ; "));
    println!();
    println!("### 2. Latency of one group commit + fsync, batch = 16 records ({} s per engine, same slices as the bs=16 cells above)", secs * 2.0);
    println!();
    println!("| engine | samples | mean | p50 | p99 | p99.9 | max |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, c) in &lat16 {
        let n = c.lat.len();
        let q = |p: f64| c.lat[((n as f64 * p) as usize).min(n - 1)].as_secs_f64() * 1e3;
        let mean = c.lat.iter().sum::<Duration>() / n as u32;
        println!(
            "| {name} | {n} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms |",
            mean.as_secs_f64() * 1e3,
            q(0.50),
            q(0.99),
            q(0.999),
            c.lat[n - 1].as_secs_f64() * 1e3
        );
    }
    println!();

    // ---- 3 + 4
    let deletes = records * 9 / 10;
    let live = records - deletes;
    println!("### 3. Recovery: {records} joins written in group commits of 1024 (+fsync), closed, then reopen + full ordered scan in a fresh process");
    println!();
    let mut lcs = Vec::new();
    for kind in kinds {
        eprintln!("[{:>6.1}s] lifecycle {}", t_all.elapsed().as_secs_f64(), kind.name());
        lcs.push((kind, lifecycle(kind, records, deletes, &dir.join("lc"))?));
    }
    println!("| engine | load time (1024/batch, fsync) | cache | reopen | scan | reopen+scan | records seen | VmRSS after scan | VmHWM |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|");
    for (kind, lc) in &lcs {
        let crash_label = format!("warm, after kill -9 of a writer ({} records acked in 1.5 s)", lc.crash_acked);
        for (label, line) in [("cold (fadvise DONTNEED)", &lc.rec_cold), ("warm", &lc.rec_warm), (crash_label.as_str(), &lc.rec_crash)] {
            let f = |k: &str| result_field(line, k).unwrap_or("?").to_string();
            let kb = |k: &str| f(k).parse::<u64>().map(|x| mb(x * 1024)).unwrap_or_else(|_| "?".into());
            println!(
                "| {} | {:.1} s ({}/s) | {} | {} ms | {} ms | {} ms | {} | {} | {} |",
                kind.name(),
                lc.load_wall.as_secs_f64(),
                fmt_rate(records as f64 / lc.load_wall.as_secs_f64()),
                label,
                f("open_ms"),
                f("scan_ms"),
                f("total_ms"),
                f("count"),
                kb("rss_after_scan_kb"),
                kb("peak_kb"),
            );
            if line.starts_with("FAILED") {
                println!("| | | {line} | | | | | | |");
            }
        }
    }
    println!();
    println!("### 4. Disk usage: after {records} joins; after deleting the oldest {deletes} (1024/batch, fsync) and compacting ({live} live)");
    println!();
    println!("| engine | after load (apparent / allocated) | bytes per record | delete time | compaction | compaction time | after compaction (apparent / allocated) | after reopen (apparent / allocated) | bytes per live record (after reopen, allocated) | of which journal (allocated) | live records seen |");
    println!("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    for (kind, lc) in &lcs {
        println!(
            "| {} | {} / {} | {:.0} | {:.1} s | {} | {:.2} s | {} / {} | {} / {} | {:.0} | {} | {} |",
            kind.name(),
            mb(lc.disk_full.0),
            mb(lc.disk_full.1),
            lc.disk_full.1 as f64 / records as f64,
            lc.delete_wall.as_secs_f64(),
            lc.compact_note,
            lc.compact_wall.as_secs_f64(),
            mb(lc.disk_compacted.0),
            mb(lc.disk_compacted.1),
            mb(lc.disk_reopened.0),
            mb(lc.disk_reopened.1),
            lc.disk_reopened.1 as f64 / live as f64,
            mb(lc.journal_reopened.1),
            lc.live_after
        );
    }
    println!();
    println!("Files after compaction / after reopen (apparent sizes):");
    println!();
    for (kind, lc) in &lcs {
        println!("- {} after compaction: {}", kind.name(), lc.files_compacted);
        println!("- {} after reopen: {}", kind.name(), lc.files_reopened);
    }
    println!();

    // ---- 5
    println!("### 5. Torn / corrupted tail: 10000 joins in 100 group commits of 100 (+fsync), clean close, then damage the tail");
    println!();
    let mut layouts = Vec::new();
    let mut rows = Vec::new();
    for kind in kinds {
        eprintln!("[{:>6.1}s] torn tail {}", t_all.elapsed().as_secs_f64(), kind.name());
        let (layout, res) = torn(kind, &dir, 10_000, 100)?;
        layouts.push((kind, layout));
        for r in res {
            rows.push((kind, r));
        }
    }
    println!("| engine | damage | file damaged | opens? | open time (ms) | records after open | write+fsync after | records after 2nd reopen | log / error output |");
    println!("|---|---|---|---|---:|---:|---|---:|---|");
    for (kind, r) in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            kind.name(),
            r.variant,
            r.target,
            r.opened,
            r.open_ms,
            r.survived,
            r.write_after,
            r.reopen_count,
            r.logs
        );
    }
    println!();
    println!("### 5b. Process crash: kill -9 a writer doing fsynced group commits of 16 joins, then reopen (acked = records whose commit+fsync returned)");
    println!();
    println!("| engine | killed after | acked before kill | opens? | open time incl. repair (ms) | records after open | all acked present? | write+fsync after | records after 2nd reopen | log / error output |");
    println!("|---|---:|---:|---|---:|---:|---|---|---:|---|");
    for kind in kinds {
        for ms in [300u64, 1100] {
            eprintln!("[{:>6.1}s] crash {} {ms}ms", t_all.elapsed().as_secs_f64(), kind.name());
            let (acked, r) = crash(kind, &dir, Duration::from_millis(ms))?;
            let ok = r.survived.parse::<u64>().map(|c| if c >= acked { "yes" } else { "NO" }).unwrap_or("-");
            println!(
                "| {} | {ms} ms | {acked} | {} | {} | {} | {ok} | {} | {} | {} |",
                kind.name(),
                r.opened,
                r.open_ms,
                r.survived,
                r.write_after,
                r.reopen_count,
                r.logs
            );
        }
    }
    println!();
    println!("Files on disk before damage:");
    println!();
    for (kind, l) in &layouts {
        println!("- {}: {}", kind.name(), l);
    }
    println!();
    println!("loadavg at end: {}", fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
    println!();
    println!("total wall time: {:.1} s", t_all.elapsed().as_secs_f64());
    let _ = fs::remove_dir_all(&dir);
    Ok(())
}
