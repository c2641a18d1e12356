//! The packaging files (Dockerfile, docker-compose.yml, docs/waitroom.service) name only
//! settings, flags and subcommands that the binary accepts, with values it accepts; and the
//! two subcommands they use besides `serve`, `healthcheck` and `keygen`, do their job.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

mod support;

use support::binary::{Server, BIN};

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stdout(args: &[&str]) -> String {
    let out = run(args, &[]);
    assert!(out.status.success(), "{args:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Words of `text` that start with `prefix` and go on with the characters of a name.
fn words(text: &str, prefix: &str, name_char: fn(char) -> bool) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let tail = &rest[i..];
        let end = tail[prefix.len()..]
            .find(|c: char| !name_char(c))
            .map_or(tail.len(), |n| n + prefix.len());
        if end > prefix.len() {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

fn env_char(c: char) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'
}

fn flag_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
}

/// What the binary says it accepts: environment names, flags, subcommands.
struct Accepted {
    env: BTreeSet<String>,
    flags: BTreeSet<String>,
    commands: BTreeSet<String>,
}

fn accepted() -> Accepted {
    let top = stdout(&["--help"]);
    let commands: BTreeSet<String> = top
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    let mut help = String::new();
    for c in &commands {
        if c != "help" {
            help.push_str(&stdout(&[c, "--help"]));
        }
    }
    let flags = help
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("--"))
        .flat_map(|l| words(l.split(' ').next().unwrap(), "--", flag_char))
        .collect();
    Accepted {
        env: words(&help, "WAITROOM_", env_char),
        flags,
        commands,
    }
}

/// `(name, value)` of the `WAITROOM_*` setting of each line of the form
/// `…WAITROOM_X<sep>value`, comments left out.
fn settings_in(text: &str, sep: char) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let tail = &l[l.find("WAITROOM_")?..];
            let end = tail.find(|c: char| !env_char(c)).unwrap_or(tail.len());
            let (name, after) = tail.split_at(end);
            let v = after.strip_prefix(sep)?.trim();
            let v = v.split([' ', '\\']).next().unwrap_or("");
            Some((name.to_string(), v.to_string()))
        })
        .collect()
}

/// The settings load with exactly these variables set (as the unit or the container
/// would run the binary).
// `Jail::expect_with` takes closures returning `figment::Error`, which is large; the type is
// figment's, not ours to box.
#[allow(clippy::result_large_err)]
fn assert_loads(what: &str, vars: &[(String, String)]) {
    figment::Jail::expect_with(|jail| {
        for (k, v) in vars {
            jail.set_env(k, v);
        }
        if let Err(e) = waitroom::config::Settings::from_args(["waitroom", "serve"]) {
            panic!("{what}: the settings {vars:?} do not load: {e:#}");
        }
        Ok(())
    });
}

/// The words of each JSON array (`["waitroom", "keygen", "/keys"]`) in the lines of `text`
/// that start with one of `keys`.
fn exec_forms(text: &str, keys: &[&str]) -> Vec<Vec<String>> {
    text.lines()
        .map(str::trim)
        .filter(|l| keys.iter().any(|k| l.starts_with(k)))
        .filter_map(|l| {
            let list = &l[l.find('[')?..=l.rfind(']')?];
            serde_json::from_str::<Vec<String>>(list).ok()
        })
        .collect()
}

fn check_command(a: &Accepted, what: &str, args: &[String]) {
    let (sub, rest) = args.split_first().unwrap();
    assert!(a.commands.contains(sub), "{what}: no subcommand `{sub}`");
    for f in rest.iter().filter(|w| w.starts_with("--")) {
        let f = f.split('=').next().unwrap();
        assert!(a.flags.contains(f), "{what}: no flag `{f}`");
    }
}

#[test]
fn packaging_files_name_only_what_the_binary_accepts() {
    let a = accepted();
    assert!(
        a.env.contains("WAITROOM_LISTEN") && a.env.contains("WAITROOM_OTLP_ENDPOINT"),
        "{:?}",
        a.env
    );
    assert!(a.flags.contains("--otlp-endpoint"), "{:?}", a.flags);
    for c in ["serve", "healthcheck", "keygen"] {
        assert!(a.commands.contains(c), "{:?}", a.commands);
    }

    let files = [
        ("docs/waitroom.service", repo_file("docs/waitroom.service")),
        ("Dockerfile", repo_file("Dockerfile")),
        ("docker-compose.yml", repo_file("docker-compose.yml")),
    ];
    for (name, text) in &files {
        for env in words(text, "WAITROOM_", env_char) {
            assert!(
                a.env.contains(&env),
                "{name} names {env}, which nothing reads"
            );
        }
    }

    // The unit: its command line and its settings.
    let unit = &files[0].1;
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap();
    let argv: Vec<String> = exec.split_whitespace().map(str::to_string).collect();
    assert_eq!(argv[0], "/usr/local/bin/waitroom");
    check_command(&a, "the unit", &argv[1..]);
    let vars = settings_in(unit, '=');
    assert!(vars.len() >= 3, "{vars:?}");
    assert_loads("the unit", &vars);
    assert!(
        vars.contains(&("WAITROOM_DATA_DIR".into(), "/var/lib/waitroom".into()))
            && unit.contains("StateDirectory=waitroom"),
        "the data dir is the unit's state directory"
    );

    // The image: its entry point, default command, health check and settings.
    let docker = &files[1].1;
    let forms = exec_forms(docker, &["ENTRYPOINT", "CMD"]);
    assert_eq!(forms.len(), 3, "{forms:?}");
    for f in &forms {
        let args: Vec<String> = match f.first().map(String::as_str) {
            Some("/usr/local/bin/waitroom") => f[1..].to_vec(),
            _ => f.clone(),
        };
        if !args.is_empty() {
            check_command(&a, "the Dockerfile", &args);
        }
    }
    assert!(
        forms.contains(&vec![
            "/usr/local/bin/waitroom".into(),
            "healthcheck".into()
        ]),
        "{forms:?}"
    );
    let vars = settings_in(docker, '=');
    assert_loads("the image", &vars);
    assert!(docker.contains("USER 65532"), "runs as a non-root user");

    // Compose: the waitroom commands and the nodes' settings (the admin token comes from
    // the environment of `docker compose`).
    let compose = &files[2].1;
    for f in exec_forms(compose, &["command:"]) {
        if f[0] != "redis-server" {
            check_command(&a, "docker-compose.yml", &f);
        }
    }
    let vars: Vec<(String, String)> = settings_in(compose, ':')
        .into_iter()
        .map(|(k, v)| {
            if v.starts_with("${") {
                (k, "an-admin-token".to_string())
            } else {
                (k, v)
            }
        })
        .collect();
    assert!(
        vars.iter()
            .any(|(k, v)| k == "WAITROOM_STORE" && v.starts_with("redis://")),
        "{vars:?}"
    );
    assert_loads("the compose nodes", &vars);
    // Both nodes share the key the keygen service writes.
    assert_eq!(compose.matches("keys:/keys:ro").count(), 2);
    assert!(compose.contains("WAITROOM_SIGNING_KEY: /keys/signing-key.pem"));
    assert!(compose.contains(r#"command: ["keygen", "/keys"]"#));
}

#[tokio::test]
async fn healthcheck_asks_the_server_the_same_settings_run() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--no-demo", "--admin-token", "t"],
        &[],
    );
    let addr = s.base.trim_start_matches("http://").to_string();
    let port = addr.rsplit(':').next().unwrap().to_string();
    let ok = run(&["healthcheck", "--listen", &addr], &[]);
    assert!(ok.status.success(), "{ok:?}");
    // As in the image: the setting from the environment, on every address (asked on
    // loopback).
    let any = format!("0.0.0.0:{port}");
    let ok = run(&["healthcheck"], &[("WAITROOM_LISTEN", any.as_str())]);
    assert!(ok.status.success(), "{ok:?}");

    assert!(s.terminate(Duration::from_secs(10)).success());
    let down = run(&["healthcheck", "--listen", &addr], &[]);
    assert_eq!(down.status.code(), Some(1));
    let err = String::from_utf8_lossy(&down.stderr);
    assert!(
        err.contains("unhealthy") && err.contains("/healthz"),
        "{err}"
    );
    // Whatever is wrong, a health check answers 1, never 2 (which Docker reserves): a
    // malformed command line, or settings that do not load.
    let bad_flag = run(&["healthcheck", "--no-such-flag"], &[]);
    assert_eq!(bad_flag.status.code(), Some(1), "{bad_flag:?}");
    let bad_config = run(
        &["healthcheck"],
        &[("WAITROOM_CONFIG", "/no/such/waitroom.toml")],
    );
    assert_eq!(bad_config.status.code(), Some(1), "{bad_config:?}");
    // `serve` keeps 2 for those.
    assert_eq!(
        run(&["serve", "--no-such-flag"], &[]).status.code(),
        Some(2)
    );
}

/// Request logging at debug level names each request's path, never its query, where a
/// waiting token may travel (`?token=`).
#[tokio::test]
async fn debug_request_logs_keep_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--no-demo", "--admin-token", "t"],
        &[("RUST_LOG", "debug")],
    );
    let secret = "AQJzaG9wc2VjcmV0dG9rZW5zZWNyZXR0b2tlbg";
    let r = reqwest::get(s.url(&format!("/api/v1/queue/status?token={secret}")))
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let log_file = s.stderr_file.clone();
    assert!(s.terminate(Duration::from_secs(10)).success());
    let log = std::fs::read_to_string(log_file).unwrap();
    assert!(
        log.contains("/api/v1/queue/status"),
        "no request line: {log}"
    );
    assert!(!log.contains(secret), "the token is in the log: {log}");
}

/// With JSON logs, the error that stops the server is a JSON line too (a collector that
/// reads JSON lines would drop a plain one: the line that says why the node died). An
/// empty `RUST_LOG`, as env files write "unset", is the default level (defect: it turned
/// every line off, this one included, and the server died without a word).
#[test]
fn the_fatal_error_is_a_log_line_in_the_chosen_format() {
    for env in [&[][..], &[("RUST_LOG", "")][..]] {
        let dir = tempfile::tempdir().unwrap();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let data = dir.path().join("data");
        let out = run(
            &[
                "--log-format",
                "json",
                "--listen",
                &addr,
                "--no-demo",
                "--admin-token",
                "t",
                "--data-dir",
                data.to_str().unwrap(),
            ],
            env,
        );
        fatal_line(&out);
        drop(taken);
    }
}

fn fatal_line(out: &std::process::Output) {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    let line: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|_| panic!("{err}"));
    assert_eq!(line["level"], "ERROR", "{line}");
    assert!(
        line["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot listen"),
        "{line}"
    );
}

/// An existing data dir's lock file and key fingerprint are narrowed to 0600 on start, as
/// its other files are (defect: both kept the mode they had, e.g. 0666, and whoever could
/// write the fingerprint could block the next start).
#[cfg(unix)]
#[test]
fn an_existing_data_dirs_lock_and_key_record_are_narrowed() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = support::binary::serve_args(&data, &["--admin-token", "t"]);
    Server::start(dir.path(), &args, &[]).kill();
    let files = ["waitroom.lock", "signing-key.fingerprint"].map(|f| data.join(f));
    for f in &files {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let s = Server::start(dir.path(), &args, &[]);
    for f in &files {
        let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", f.display());
    }
    s.kill();
}

/// Under a umask of 000, the directories `keygen` and a server make are writable by their
/// owner only (defect: `keygen ./a/b/c` made all three writable by every user, who could
/// put their own key there), and the data dir is its owner's only.
#[cfg(unix)]
#[test]
fn made_directories_are_not_writable_by_others_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("a/b/keys");
    let script = format!("umask 000; exec {BIN} keygen {}", keys.display());
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    for d in ["a", "a/b", "a/b/keys"] {
        let m = std::fs::metadata(dir.path().join(d))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(m & 0o777, 0o755, "{d}: {:o}", m & 0o777);
    }
    let m = std::fs::metadata(keys.join("signing-key.pem"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(m & 0o777, 0o600);
}

#[tokio::test]
async fn keygen_writes_one_private_key_that_a_server_uses() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let out = run(&["keygen", keys.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{out:?}");
    let file = keys.join("signing-key.pem");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        file.to_str().unwrap()
    );
    let pem = std::fs::read_to_string(&file).unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "{pem}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // A directory that cannot be one is named in the error.
    let not_a_dir = dir.path().join("a-file");
    std::fs::write(&not_a_dir, "x").unwrap();
    let out = run(&["keygen", not_a_dir.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(not_a_dir.to_str().unwrap()), "{err}");
    // A second run keeps the key: nodes already using it are not cut off.
    assert!(run(&["keygen", keys.to_str().unwrap()], &[])
        .status
        .success());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), pem);

    let data = dir.path().join("data");
    let s = Server::start(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--no-demo",
            "--admin-token",
            "t",
            "--data-dir",
            data.to_str().unwrap(),
            "--signing-key",
            file.to_str().unwrap(),
        ],
        &[],
    );
    let jwks: serde_json::Value = reqwest::get(s.url("/.well-known/jwks.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(jwks["keys"][0]["crv"], "Ed25519");
    assert!(
        !data.join("signing-key.pem").exists(),
        "the given key is used, none generated"
    );
}

/// Every local path the build reads (the `path = "…"` of targets and dependencies, and the
/// workspace members) is in the image's build context: let in by `.dockerignore` and copied
/// by the Dockerfile. A crate added to the workspace but not to the image breaks
/// `docker build` at `cargo build --locked`, which this machine cannot run.
#[test]
fn the_image_build_context_holds_every_path_the_build_reads() {
    let manifest = repo_file("Cargo.toml");
    let mut roots = BTreeSet::new();
    for line in manifest.lines() {
        let line = line.trim();
        let quoted = |s: &str| -> Vec<String> {
            s.split('"')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        let paths = if line.starts_with("path = ") || line.starts_with("members = ") {
            quoted(line)
        } else if let Some(i) = line.find("path = \"") {
            quoted(&line[i..]).into_iter().take(1).collect()
        } else {
            continue;
        };
        for p in paths {
            let root = p.split('/').next().unwrap().to_string();
            if root != "." && !root.is_empty() {
                roots.insert(root);
            }
        }
    }
    assert!(
        roots.contains("src") && roots.contains("crates"),
        "the manifest scan found {roots:?}"
    );
    let ignore = repo_file(".dockerignore");
    let dockerfile = repo_file("Dockerfile");
    for root in &roots {
        assert!(
            ignore.lines().any(|l| l.trim() == format!("!{root}")),
            ".dockerignore keeps `{root}` out of the build context; add `!{root}`"
        );
        assert!(
            dockerfile
                .lines()
                .any(|l| l.trim() == format!("COPY {root} {root}")),
            "the Dockerfile does not copy `{root}`; add `COPY {root} {root}`"
        );
    }
}
