//! Real Redis servers for the tests: a standalone server or a three-master Cluster, each on
//! free loopback ports with its own temporary directory, started from the `redis-server`
//! and `redis-cli` on the PATH (`scripts/test.sh` installs them).
//!
//! A test binary may keep a server in a `static` (shared by its tests), and statics are
//! never dropped. So every server runs under a tiny shell watchdog that reads the test
//! process's pipe: when the test process exits, however it exits, the pipe closes and the
//! watchdog kills the server and removes its directory. Nothing outlives the tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A `redis-server` process.
pub struct RedisServer {
    pub port: u16,
    /// The server's own pid (not the watchdog's), for SIGSTOP and SIGKILL.
    pub pid: u32,
    pub dir: PathBuf,
    watchdog: Child,
    /// Closing it tells the watchdog to stop the server.
    lifeline: Option<ChildStdin>,
}

/// A free loopback port (and, for Cluster nodes, its bus port `port + 10000` too).
pub fn free_port(with_bus: bool) -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if !with_bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Sends one inline command and answers the raw reply (enough for PING and INFO).
pub fn raw_command(port: u16, cmd: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(format!("{cmd}\r\n").as_bytes())?;
    let mut r = BufReader::new(s);
    let mut first = String::new();
    r.read_line(&mut first)?;
    if let Some(len) = first.strip_prefix('$') {
        let len: i64 = len.trim().parse().unwrap_or(-1);
        if len <= 0 {
            return Ok(String::new());
        }
        let mut body = vec![0; len as usize + 2];
        r.read_exact(&mut body)?;
        return Ok(String::from_utf8_lossy(&body[..len as usize]).into_owned());
    }
    Ok(first)
}

fn wait_until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen in {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl RedisServer {
    /// A standalone server without persistence, on a free port, in a directory of its own
    /// that goes with it.
    pub fn start() -> RedisServer {
        let dir = tempfile::tempdir().unwrap().keep();
        let s = Self::launch(
            free_port(false),
            &dir,
            &[],
            &["--save", "", "--appendonly", "no"],
            true,
        );
        s.wait_ready();
        s
    }

    /// A standalone server that writes every change to its append-only file before
    /// answering, so that a restart on the same port and directory finds everything.
    pub fn start_durable(port: u16, dir: &Path) -> RedisServer {
        Self::start_with(
            port,
            dir,
            &[
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],
        )
    }

    /// Starts `redis-server` on `port` in `dir` with `extra` settings and waits until it
    /// answers PING.
    /// The directory is left in place (a durable server restarts on it).
    pub fn start_with(port: u16, dir: &Path, extra: &[&str]) -> RedisServer {
        let s = Self::launch(port, dir, &[], extra, false);
        s.wait_ready();
        s
    }

    /// A replica of the master on `master_port` (nothing saved), on a free port in `dir`.
    pub fn start_replica_of(master_port: u16, dir: &Path) -> RedisServer {
        let master = master_port.to_string();
        Self::start_with(
            free_port(false),
            dir,
            &[
                "--save",
                "",
                "--appendonly",
                "no",
                "--replicaof",
                "127.0.0.1",
                &master,
            ],
        )
    }

    /// A Sentinel on a free port watching the master on `master_port` as `service`, with
    /// short timings (down after 1 s) so a test's failover takes seconds; quorum 2.
    pub fn start_sentinel(master_port: u16, service: &str) -> RedisServer {
        let dir = tempfile::tempdir().unwrap().keep();
        // Sentinel rewrites its config file as it learns the topology: it needs its own.
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "sentinel monitor {service} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {service} 1000\n\
                 sentinel failover-timeout {service} 5000\n\
                 sentinel parallel-syncs {service} 1\n"
            ),
        )
        .unwrap();
        let s = Self::launch(
            free_port(false),
            &dir,
            &[conf.to_str().unwrap(), "--sentinel"],
            &[],
            true,
        );
        s.wait_ready();
        s
    }

    fn launch(
        port: u16,
        dir: &Path,
        lead: &[&str],
        extra: &[&str],
        remove_dir: bool,
    ) -> RedisServer {
        std::fs::create_dir_all(dir).unwrap();
        let port_s = port.to_string();
        let mut args: Vec<&str> = lead.to_vec();
        args.extend([
            "--port",
            &port_s,
            "--bind",
            "127.0.0.1",
            "--dir",
            dir.to_str().unwrap(),
            "--daemonize",
            "no",
            "--logfile",
            "redis.log",
        ]);
        args.extend_from_slice(extra);
        // The watchdog: starts the server, prints its pid, waits for its stdin to close (the
        // test process ended or dropped the server), then kills the server (and removes its
        // directory when asked to).
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(
                r#"redis-server "$@" & p=$!; echo $p
                trap 'kill -9 $p 2>/dev/null; [ -n "$WR_RM" ] && rm -rf "$WR_RM"' EXIT
                while read _; do :; done"#,
            )
            .arg("sh")
            .env(
                "WR_RM",
                if remove_dir {
                    dir.to_str().unwrap()
                } else {
                    ""
                },
            )
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts (is it installed? scripts/test.sh installs it)");
        let mut line = String::new();
        BufReader::new(watchdog.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid: u32 = line.trim().parse().expect("the watchdog prints the pid");
        let lifeline = watchdog.stdin.take().unwrap();
        RedisServer {
            port,
            pid,
            dir: dir.to_path_buf(),
            watchdog,
            lifeline: Some(lifeline),
        }
    }

    fn wait_ready(&self) {
        let port = self.port;
        wait_until("redis answering PING", Duration::from_secs(10), || {
            raw_command(port, "PING").is_ok_and(|r| r.starts_with("+PONG"))
        });
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {}", self.pid);
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills the server outright (SIGKILL) and waits until its port is free.
    pub fn kill(self) {
        self.signal("-KILL");
        let port = self.port;
        drop(self);
        wait_until("the port to be free", Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).is_err()
        });
    }

    /// The server's `INFO section` as text.
    pub fn info(&self, section: &str) -> String {
        raw_command(self.port, &format!("INFO {section}")).unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", &self.pid.to_string()])
            .status();
        // End of input: the watchdog exits by itself, removing the directory if asked.
        drop(self.lifeline.take());
        let _ = self.watchdog.wait();
    }
}

/// One standalone server per test binary, shared by its tests (each test's store uses a
/// fresh key prefix, so they never see each other's keys).
pub fn shared() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// A Redis Cluster of three masters (no replicas).
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// A Cluster-enabled server, not yet in any Cluster.
fn cluster_node() -> RedisServer {
    RedisServer::launch(
        free_port(true),
        &tempfile::tempdir().unwrap().keep(),
        &[],
        &[
            "--save",
            "",
            "--appendonly",
            "no",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ],
        true,
    )
}

/// Runs `redis-cli --cluster ARGS`, which must succeed.
fn cluster_cli(args: &[&str]) {
    let out = Command::new("redis-cli")
        .arg("--cluster")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("redis-cli runs");
    assert!(
        out.status.success(),
        "redis-cli --cluster {args:?} failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Waits until every node agrees on the slots (`redis-cli --cluster check`): resharding
/// right after a change can find them not agreeing yet and give up.
fn wait_settled(port: u16) {
    let node = format!("127.0.0.1:{port}");
    wait_until("the nodes to agree", Duration::from_secs(30), || {
        Command::new("redis-cli")
            .args(["--cluster", "check", &node])
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success())
    });
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3).map(|_| cluster_node()).collect();
        for n in &nodes {
            n.wait_ready();
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = vec!["create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        cluster_cli(&args);
        for n in &nodes {
            wait_until(
                "the cluster state to be ok",
                Duration::from_secs(20),
                || {
                    raw_command(n.port, "CLUSTER INFO")
                        .is_ok_and(|i| i.contains("cluster_state:ok"))
                },
            );
        }
        RedisCluster { nodes }
    }

    /// The seed URL (any node; the client discovers the others).
    pub fn url(&self) -> String {
        self.nodes[0].url()
    }

    /// Adds a master without slots; answers its index in `nodes`.
    pub fn add_empty_master(&mut self) -> usize {
        let node = cluster_node();
        node.wait_ready();
        let new = format!("127.0.0.1:{}", node.port);
        let existing = format!("127.0.0.1:{}", self.nodes[0].port);
        cluster_cli(&["add-node", &new, &existing]);
        let known = format!("cluster_known_nodes:{}", self.nodes.len() + 1);
        self.nodes.push(node);
        for n in &self.nodes {
            wait_until(
                "every node to know the new one",
                Duration::from_secs(20),
                || raw_command(n.port, "CLUSTER INFO").is_ok_and(|i| i.contains(&known)),
            );
        }
        self.nodes.len() - 1
    }

    /// Moves `slots` slots (and their keys) from node `from` to node `to`.
    pub fn move_slots(&self, from: usize, to: usize, slots: u32) {
        let id = |i: usize| {
            raw_command(self.nodes[i].port, "CLUSTER MYID")
                .unwrap()
                .trim()
                .to_string()
        };
        let (from_id, to_id, n) = (id(from), id(to), slots.to_string());
        let any = format!("127.0.0.1:{}", self.nodes[to].port);
        wait_settled(self.nodes[to].port);
        cluster_cli(&[
            "reshard",
            &any,
            "--cluster-from",
            &from_id,
            "--cluster-to",
            &to_id,
            "--cluster-slots",
            &n,
            "--cluster-yes",
        ]);
    }

    /// Removes the node `i` (which must hold no slots) from the Cluster, as `redis-cli
    /// --cluster del-node` does (the others forget it, it is reset), and leaves it running.
    pub fn remove_node(&mut self, i: usize) -> RedisServer {
        let node = self.nodes.remove(i);
        let id = raw_command(node.port, "CLUSTER MYID").unwrap();
        let existing = format!("127.0.0.1:{}", self.nodes[0].port);
        wait_settled(self.nodes[0].port);
        cluster_cli(&["del-node", &existing, id.trim()]);
        node
    }
}

/// One Cluster per test binary, shared by its tests.
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

/// A key prefix no other store in this run uses.
pub fn unique_prefix() -> String {
    format!("t{:x}", waitroom::tokens::random_u128() as u64)
}
