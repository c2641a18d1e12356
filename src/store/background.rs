//! fjall's background threads (memtable flushes, compactions) at a lower CPU priority.
//!
//! On two cores the server's request threads and the load they answer already take most of
//! the CPU at 10,000 joins/s; a flush of the `places` memtable then takes one core for
//! 100–250 ms, and for that long requests queue behind it (docs/PERFORMANCE.md, "What
//! stalls joins at 10,000/s"). Background work has no deadline of its own, so it runs at a
//! higher nice value: a request thread that wakes up preempts it at once, and it still gets
//! about a tenth of a core while both cores are busy (nice 10 weighs 110 against nice 0's
//! 1024), so flushes keep up (fjall halts writes only at four unflushed memtables, ~40 s of
//! joins at 10,000/s). Not 19 (RocksDB's "low" priority): the same threads hold fjall's
//! journal lock while they sync it, and one starved while holding it would stall every
//! writer; at nice 10 the wait for the CPU after its sync is a few ms at worst.
//!
//! How: on Linux the nice value belongs to a thread and a new thread inherits its creator's.
//! So the database is opened on a short-lived thread that raised its own nice value first
//! (no privilege needed to lower one's own priority; raising it back would need one, hence
//! the separate thread): the worker threads fjall starts while opening inherit it, and the
//! runtime's threads keep theirs.

/// The nice value of fjall's background threads (see the module's notes).
pub(super) const BACKGROUND_NICE: i32 = 10;

/// Runs `open` on a new thread at [`BACKGROUND_NICE`], so the threads it starts inherit
/// that priority. If the priority cannot be changed (not Linux, or refused), `open` runs
/// anyway at the usual priority: the store works the same, only its tail is longer.
pub(super) fn open_at_background_priority<T: Send>(open: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("waitroom-open".into())
            .spawn_scoped(s, || {
                if let Err(e) = lower_own_priority() {
                    tracing::warn!(error = %e, "could not lower the priority of the store's background threads");
                }
                open()
            })
            .expect("spawning the thread that opens the store")
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Raises the calling thread's nice value to [`BACKGROUND_NICE`].
fn lower_own_priority() -> std::io::Result<()> {
    // `PRIO_PROCESS` with id 0 names the calling thread on Linux (nice is per thread).
    // SAFETY: plain system call with no pointers.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, BACKGROUND_NICE) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The nice value of each thread of this process named `name` (from `/proc/self/task`).
#[cfg(test)]
pub(super) fn nice_of_threads(name: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != name {
            continue;
        }
        // After the name: state is field 3 of stat(5), nice field 19.
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        out.push(fields[16].parse().unwrap());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads started by the opener inherit its priority; the caller's is unchanged.
    #[test]
    fn threads_started_while_opening_run_at_the_background_priority() {
        let before = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let child = open_at_background_priority(|| {
            std::thread::Builder::new()
                .name("bg-prio-test".into())
                .spawn(move || {
                    let _ = rx.recv();
                })
                .unwrap()
        });
        // The child names itself when it starts: wait for it.
        let mut nice = Vec::new();
        for _ in 0..1000 {
            nice = nice_of_threads("bg-prio-test");
            if !nice.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(nice, vec![BACKGROUND_NICE]);
        let after = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        assert_eq!(before, after, "the caller's own priority must not change");
        drop(tx);
        child.join().unwrap();
    }
}
