//! Runs the `waitroom` binary the way a user does: a child process with flags, talked to
//! over HTTP. The server picks a free port (`--listen 127.0.0.1:0`) and reports it on stdout
//! as `listening on http://ADDR`; when it generates an admin token it prints
//! `admin token: T` first. Both lines are part of the command-line contract.

#![allow(dead_code)] // each test binary uses the part it needs

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_waitroom");

/// A running `waitroom` process.
pub struct Server {
    pub child: Child,
    pub base: String,
    /// Lines printed to stdout before `listening on`.
    pub banner: Vec<String>,
    pub stderr_file: PathBuf,
}

impl Server {
    /// Starts the binary in `cwd` and waits until it reports its address.
    pub fn start(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        Server::start_adjusted(cwd, args, env, |_| {})
    }

    /// [`Server::start`] with `adjust` applied to the command before it runs (e.g. a
    /// resource limit set in `pre_exec`).
    pub fn start_adjusted(
        cwd: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        adjust: impl FnOnce(&mut Command),
    ) -> Server {
        let stderr_file = cwd.join(format!("stderr-{}.log", rand_suffix()));
        let mut cmd = command();
        cmd.args(args)
            .current_dir(cwd)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_file).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        adjust(&mut cmd);
        let mut child = cmd.spawn().expect("the binary starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        // Keeps draining stdout for the whole life of the process.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut banner = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(addr) = line.strip_prefix("listening on ") {
                        return Server {
                            child,
                            base: addr.trim().to_string(),
                            banner,
                            stderr_file,
                        };
                    }
                    banner.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "no `listening on` line; stdout so far: {banner:?}; stderr: {}",
                        std::fs::read_to_string(&stderr_file).unwrap_or_default()
                    );
                }
            }
        }
    }

    /// `serve` in `dir` as [`serve_args`] has it, with its data in `dir/data`.
    pub fn serve(dir: &Path, extra: &[&str]) -> Server {
        let data = dir.join("data");
        Server::start(dir, &serve_args(&data, extra), &[])
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The generated admin token printed at start, if any.
    pub fn printed_admin_token(&self) -> Option<String> {
        self.banner
            .iter()
            .find_map(|l| l.strip_prefix("admin token: "))
            .map(|t| t.trim().to_string())
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(self, within: Duration) -> ExitStatus {
        self.signal("TERM", within)
    }

    /// Sends `SIG<name>` and waits for the exit, within `within`.
    pub fn signal(mut self, name: &str, within: Duration) -> ExitStatus {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        wait_exit(&mut self.child, within).unwrap_or_else(|| {
            panic!(
                "still running {within:?} after SIG{name}; stderr: {}",
                std::fs::read_to_string(&self.stderr_file).unwrap_or_default()
            )
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A failed assertion must not leave a server running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binary under test; `WAITROOM_TEST_BIN` runs the tests against another build of it.
pub fn command() -> Command {
    Command::new(std::env::var_os("WAITROOM_TEST_BIN").unwrap_or_else(|| BIN.into()))
}

/// `serve` on a free port, with no demo event and its data in `data`, then `extra`.
pub fn serve_args<'a>(data: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let data = data.to_str().unwrap();
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--no-demo"];
    args.extend(["--data-dir", data]);
    args.extend_from_slice(extra);
    args
}

/// Runs the binary to its exit (it must not serve) and answers (status, stderr).
pub fn run_to_exit(cwd: &Path, args: &[&str]) -> (ExitStatus, String) {
    let mut child = command()
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(20));
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{args:?} did not exit");
    };
    let mut err = String::new();
    use std::io::Read as _;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, err)
}

pub fn wait_exit(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

pub fn rand_suffix() -> String {
    format!("{:x}", waitroom::tokens::random_u128())
}

impl Server {
    /// Kills the process with SIGKILL (no chance to flush anything) and waits for it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The process's stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_file).unwrap_or_default()
    }
}

/// One HTTP call; answers the status and the JSON body (`Null` when empty).
pub async fn call(
    method: Method,
    url: &str,
    bearer: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let client = reqwest::Client::new();
    let mut req = client.request(method, url);
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, value)
}

/// Nodes that share one Redis, as users run them behind a load balancer: one directory
/// holding the signing key they all use (nodes on one Redis must share `--signing-key`:
/// waiting tokens carry a MAC derived from it), and a data directory per node.
pub struct Nodes {
    pub dir: tempfile::TempDir,
    pub key: PathBuf,
    admin: String,
}

impl Nodes {
    pub fn new(admin: &str) -> Nodes {
        let dir = tempfile::tempdir().unwrap();
        waitroom::tokens::load_or_generate_key(None, dir.path()).unwrap();
        let key = dir.path().join("signing-key.pem");
        assert!(key.exists());
        Nodes {
            dir,
            key,
            admin: admin.to_string(),
        }
    }

    /// Starts a node on `redis_url` with a data directory of its own.
    pub fn start(&self, redis_url: &str) -> Server {
        self.start_with_env(redis_url, &[])
    }

    /// [`Nodes::start`] with settings in the environment (`WAITROOM_…`).
    pub fn start_with_env(&self, redis_url: &str, env: &[(&str, &str)]) -> Server {
        let data = self.dir.path().join(format!("node-{}", rand_suffix()));
        std::fs::create_dir_all(&data).unwrap();
        let flags = [
            "--store",
            redis_url,
            "--signing-key",
            self.key.to_str().unwrap(),
            "--admin-token",
            &self.admin,
            // Every test client shares one address: joins are not what these test.
            "--joins-per-minute",
            "100000",
        ];
        Server::start(self.dir.path(), &serve_args(&data, &flags), env)
    }
}
