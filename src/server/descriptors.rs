//! The process's limit on open descriptors, against the connections it is asked to serve.

/// Raises the soft limit on open descriptors to the hard one and answers the soft limit
/// now in force (`None`: unlimited or unknown). Many systems start processes with a soft
/// limit of 1,024 under a much higher hard one, which would cap a waiting room at 768
/// connections; raising it is what servers such as nginx and Go's runtime do at start.
pub(super) fn raise_descriptor_limit() -> Option<usize> {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `getrlimit` writes into the struct we pass and reads nothing else.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            // SAFETY: `setrlimit` only reads the struct we pass. Raising a soft limit up
            // to the hard one needs no privilege; on failure the old limit stays.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                lim = raised;
            } else {
                tracing::warn!(
                    soft = lim.rlim_cur,
                    hard = lim.rlim_max,
                    "cannot raise the open-descriptor limit"
                );
            }
        }
        if lim.rlim_cur != libc::RLIM_INFINITY {
            return Some(lim.rlim_cur as usize);
        }
    }
    None
}

/// Descriptors kept for what is not a client connection, beyond those open once the store
/// is open: the files opened later (the audit list, the history, branding), the connections
/// to Redis or to the site, a burst of connections accepted before they are refused.
pub(super) const DESCRIPTOR_HEADROOM: usize = 64;

/// Warns when `max_connections` client connections do not fit in the descriptor limit
/// `limit` beside the `open` descriptors and [`DESCRIPTOR_HEADROOM`] (or a quarter of the
/// limit, when that is less: what the default cap leaves). Past the limit a connection is
/// not refused at once as over a cap: `accept` fails (EMFILE), and the connection waits
/// unaccepted until a descriptor frees up or its client gives up. Answers whether it
/// warned.
pub(super) fn check_descriptor_room(max_connections: usize, limit: usize, open: usize) -> bool {
    let reserved = open + DESCRIPTOR_HEADROOM.min(limit / 4);
    let short = max_connections.saturating_add(reserved) > limit;
    if short {
        tracing::warn!(
            max_connections,
            descriptor_limit = limit,
            open_descriptors = open,
            "--max-connections {max_connections} does not fit in the open-descriptor limit \
             of {limit} ({reserved} are kept for the store, the logs and other connections): \
             past the limit, new connections wait unaccepted instead of being refused; raise \
             the limit (`ulimit -n`, systemd's `LimitNOFILE`) or lower --max-connections to \
             {} at most",
            limit - reserved
        );
    }
    short
}

/// How many descriptors the process has open (0 where that cannot be read).
pub(super) fn open_descriptors() -> usize {
    // Linux lists them in /proc/self/fd, the BSDs and macOS in /dev/fd.
    ["/proc/self/fd", "/dev/fd"]
        .iter()
        .find_map(|dir| std::fs::read_dir(dir).ok())
        .map_or(0, |entries| entries.count())
}

/// Three quarters of the descriptor limit, the rest being for the store's files, the
/// Redis connections and the logs; less where that does not fit beside the descriptors
/// open now ([`default_for`]). Without a limit to read, 10,000.
pub(super) fn default_max_connections() -> usize {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `getrlimit` writes into the struct we pass and reads nothing else.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0
            && lim.rlim_cur != libc::RLIM_INFINITY
        {
            return default_for(lim.rlim_cur as usize, open_descriptors());
        }
    }
    10_000
}

/// The default cap under the descriptor limit `limit` with `open` descriptors open: three
/// quarters of the limit, or what [`check_descriptor_room`] finds room for when that is
/// less (at a limit of 64, the default of 48 beside the ~15 open at start ran the process
/// out of descriptors: connections went unaccepted and audit entries were lost), and at
/// least 16.
pub(super) fn default_for(limit: usize, open: usize) -> usize {
    let room = limit.saturating_sub(open + DESCRIPTOR_HEADROOM.min(limit / 4));
    (limit / 4 * 3).min(room).max(16)
}
