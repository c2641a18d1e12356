//! Settings of a `waitroom` process, in layers of rising priority: built-in defaults, a TOML
//! file (`--config FILE`), `WAITROOM_*` environment variables, command-line flags. The
//! contract (flag and variable names, defaults) is API.md "Running"; this module is its one
//! implementation, so the binary, the tests and embedding programs all read settings alike.
//!
//! The layers are merged with `figment`; the result is validated once into [`Settings`],
//! whose fields are typed (an address, a backend, a path), so the rest of the program never
//! re-checks a string. Secrets (the admin token, a Redis password) never show in `Debug`,
//! because settings are logged at start.
//!
//! A TOML file uses the same names as the flags, with underscores:
//!
//! ```toml
//! listen = "0.0.0.0:8080"
//! store = "embedded"
//! data_dir = "/var/lib/waitroom"
//! admin_token = "change-me"
//! signing_key = "/etc/waitroom/signing-key.pem"
//! demo = false
//! log_format = "json"
//! durability = "sync"
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Deserializer, Serialize};

/// Prefix of every environment variable we read.
pub const ENV_PREFIX: &str = "WAITROOM_";

/// The settings an environment variable may set (`WAITROOM_` + the upper-cased name). Other
/// `WAITROOM_*` variables (such as `WAITROOM_CONFIG`, read by the flag parser) are left alone
/// rather than rejected, because a deployment's environment often carries more than we read.
const ENV_KEYS: &[&str] = &[
    "listen",
    "store",
    "data_dir",
    "admin_token",
    "signing_key",
    "demo",
    "log_format",
    "durability",
];

/// The command line: `waitroom [serve] [FLAGS]`. With no subcommand the flags of `serve`
/// apply directly, so a bare `waitroom` serves.
#[derive(Debug, Parser)]
#[command(
    name = "waitroom",
    version,
    about = "A virtual waiting room: fair queues, exact positions, paced admission, signed access tokens.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Flags of `serve`, accepted without the subcommand too.
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the server (the default when no subcommand is given).
    Serve(ServeArgs),
}

impl Cli {
    /// The flags of the `serve` command, however it was spelled.
    pub fn serve_args(&self) -> &ServeArgs {
        match &self.command {
            Some(Command::Serve(a)) => a,
            None => &self.serve,
        }
    }
}

/// Flags of `waitroom serve`. Each overrides the same setting from every other layer, and
/// only when it is given: an absent flag leaves the lower layers' value alone.
#[derive(Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML file with settings; environment variables and flags override it.
    #[arg(long, value_name = "FILE", env = "WAITROOM_CONFIG")]
    pub config: Option<PathBuf>,
    /// HTTP address to listen on, e.g. 0.0.0.0:8080 (port 0 picks a free port). [env: WAITROOM_LISTEN] [default: 127.0.0.1:8080]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// `embedded` (in-process, durable under --data-dir) or redis://host:port[/db]. [env: WAITROOM_STORE] [default: embedded]
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// Directory of the embedded store's files and the generated signing key. [env: WAITROOM_DATA_DIR] [default: ./waitroom-data]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Bearer token of the admin API; generated and printed at start when absent. Prefer the
    /// environment or the config file: flags are visible to every user of the machine. [env: WAITROOM_ADMIN_TOKEN]
    #[arg(long, value_name = "T")]
    pub admin_token: Option<String>,
    /// PEM (PKCS#8) Ed25519 private key for access tokens; generated into the data dir when absent. [env: WAITROOM_SIGNING_KEY]
    #[arg(long, value_name = "FILE")]
    pub signing_key: Option<PathBuf>,
    /// Create a small `demo` event with a simulated crowd (default: on for the embedded store). [env: WAITROOM_DEMO]
    #[arg(long, overrides_with = "no_demo")]
    pub demo: bool,
    /// Do not create the demo event.
    #[arg(long, overrides_with = "demo")]
    pub no_demo: bool,
    /// Log lines as human-readable text or as JSON. [env: WAITROOM_LOG_FORMAT] [default: text]
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Embedded store: answer a change after it is on disk (`sync`) or before (`relaxed`). [env: WAITROOM_DURABILITY] [default: sync]
    #[arg(long, value_enum, value_name = "MODE")]
    pub durability: Option<Durability>,
}

impl fmt::Debug for ServeArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeArgs")
            .field("config", &self.config)
            .field("listen", &self.listen)
            .field("store", &self.store.as_deref().map(redact_url))
            .field("data_dir", &self.data_dir)
            .field("admin_token", &self.admin_token.as_ref().map(|_| REDACTED))
            .field("signing_key", &self.signing_key)
            .field("demo", &self.demo)
            .field("no_demo", &self.no_demo)
            .field("log_format", &self.log_format)
            .field("durability", &self.durability)
            .finish()
    }
}

/// How log lines are written (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

pub use crate::store::journal::Durability;

/// Which store backs the queues.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreBackend {
    /// In-process, durable under the data dir.
    Embedded,
    /// A shared Redis, `redis://` or `rediss://` (TLS).
    Redis { url: String },
}

impl StoreBackend {
    /// Parses `embedded` or a `redis://` / `rediss://` URL (syntax only; nothing is dialled).
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("embedded") {
            return Ok(StoreBackend::Embedded);
        }
        let rest = s
            .strip_prefix("redis://")
            .or_else(|| s.strip_prefix("rediss://"))
            .ok_or_else(|| {
                format!("expected `embedded` or a redis://host:port[/db] URL, got `{s}`")
            })?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        // Credentials come before the last `@`; a password may itself contain `@`.
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = split_host_port(host_port);
        if host.is_empty() {
            return Err(format!("the Redis URL `{}` names no host", redact_url(s)));
        }
        if let Some(p) = port {
            if p.parse::<u16>().is_err() {
                return Err(format!("the Redis URL `{}` has a bad port", redact_url(s)));
            }
        }
        let db = path.split('?').next().unwrap_or("");
        if !db.is_empty() && db.parse::<u32>().is_err() {
            return Err(format!(
                "the Redis URL `{}` has a bad database number `{db}`",
                redact_url(s)
            ));
        }
        Ok(StoreBackend::Redis { url: s.to_string() })
    }

    pub fn is_embedded(&self) -> bool {
        matches!(self, StoreBackend::Embedded)
    }
}

impl fmt::Debug for StoreBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Shows a Redis URL with its password hidden, so it can be logged.
impl fmt::Display for StoreBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreBackend::Embedded => f.write_str("embedded"),
            StoreBackend::Redis { url } => f.write_str(&redact_url(url)),
        }
    }
}

/// Splits `host:port` or `[v6]:port`; the port is `None` when absent.
fn split_host_port(s: &str) -> (&str, Option<&str>) {
    if let Some(rest) = s.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((h, tail)) => (h, tail.strip_prefix(':')),
            None => ("", None),
        };
    }
    match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    }
}

const REDACTED: &str = "<redacted>";

/// Replaces the password of a URL (`scheme://user:password@host`) with `<redacted>`.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((cred, host)) => {
            let user = cred.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:{REDACTED}@{host}{path}")
        }
        None => url.to_string(),
    }
}

/// The validated settings of one process.
#[derive(Clone, PartialEq)]
pub struct Settings {
    /// Address to listen on, `host:port`; port 0 picks a free port (the chosen address is
    /// printed as `listening on http://ADDR`).
    pub listen: String,
    pub store: StoreBackend,
    /// Embedded store's files and the generated signing key.
    pub data_dir: PathBuf,
    /// Bearer token of the admin API. `None`: one is generated at start and printed to
    /// stdout as `admin token: T`, so a newcomer can use the admin API without configuring.
    pub admin_token: Option<String>,
    /// `None`: the key in the data dir, generated on first start.
    pub signing_key: Option<PathBuf>,
    /// Create the `demo` event and its simulated crowd.
    pub demo: bool,
    pub log_format: LogFormat,
    pub durability: Durability,
}

impl Default for Settings {
    /// The built-in defaults of API.md "Running".
    fn default() -> Self {
        Settings {
            listen: "127.0.0.1:8080".into(),
            store: StoreBackend::Embedded,
            data_dir: PathBuf::from("./waitroom-data"),
            admin_token: None,
            signing_key: None,
            demo: true,
            log_format: LogFormat::Text,
            durability: Durability::Sync,
        }
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("listen", &self.listen)
            .field("store", &self.store)
            .field("data_dir", &self.data_dir)
            .field("admin_token", &self.admin_token.as_ref().map(|_| REDACTED))
            .field("signing_key", &self.signing_key)
            .field("demo", &self.demo)
            .field("log_format", &self.log_format)
            .field("durability", &self.durability)
            .finish()
    }
}

/// Why the settings could not be loaded. Each message names the setting or the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    /// A value of the wrong type, an unknown key in the TOML file, a malformed file.
    #[error("{0}")]
    Layers(Box<figment::Error>),
    #[error("invalid {setting}: {reason}")]
    Invalid {
        setting: &'static str,
        reason: String,
    },
}

fn invalid(setting: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        setting,
        reason: reason.into(),
    }
}

/// What the layers merge into, before validation. The same names in every layer; unknown
/// keys are refused so that a typo in the TOML file is an error rather than silently ignored.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Layered {
    listen: String,
    store: String,
    data_dir: PathBuf,
    #[serde(default)]
    admin_token: Option<String>,
    #[serde(default)]
    signing_key: Option<PathBuf>,
    /// `None`: on for the embedded store, off for Redis (where many nodes would each create it).
    #[serde(default, deserialize_with = "lenient_bool")]
    demo: Option<bool>,
    log_format: LogFormat,
    durability: Durability,
}

impl Default for Layered {
    fn default() -> Self {
        let d = Settings::default();
        Layered {
            listen: d.listen,
            store: "embedded".into(),
            data_dir: d.data_dir,
            admin_token: None,
            signing_key: None,
            demo: None,
            log_format: d.log_format,
            durability: d.durability,
        }
    }
}

/// The flags that were given, and only those (absent flags are skipped, not `null`, so they
/// do not mask the lower layers).
#[derive(Serialize)]
struct FlagLayer<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<&'a Path>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_token: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    signing_key: Option<&'a Path>,
    #[serde(skip_serializing_if = "Option::is_none")]
    demo: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    log_format: Option<LogFormat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    durability: Option<Durability>,
}

/// `WAITROOM_*` variables taken as literal strings. figment's own `Env` provider parses
/// values (`123` becomes a number, `[a]` an array), which would make an all-digit admin
/// token fail to load; settings here are all strings, paths or words, so nothing is lost.
struct RawEnv(Env);

impl RawEnv {
    fn new() -> Self {
        RawEnv(Env::prefixed(ENV_PREFIX).only(ENV_KEYS))
    }
}

impl Provider for RawEnv {
    fn metadata(&self) -> Metadata {
        self.0.metadata()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let dict: Dict = self
            .0
            .iter()
            // `VAR=` (as env files and compose files write an unset value) means "not set".
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.as_str().to_string(), Value::from(v)))
            .collect();
        Ok(Profile::Default.collect(dict))
    }
}

/// Accepts a boolean, or from the environment `true/false`, `1/0`, `yes/no`, `on/off`.
fn lenient_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    d.deserialize_option(LenientBool)
}

struct LenientBool;

impl<'de> serde::de::Visitor<'de> for LenientBool {
    type Value = Option<bool>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a boolean (true/false, 1/0, yes/no, on/off)")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok(Some(b))
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Self::Value, E> {
        match n {
            0 => Ok(Some(false)),
            1 => Ok(Some(true)),
            _ => Err(E::invalid_value(serde::de::Unexpected::Unsigned(n), &self)),
        }
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Self::Value, E> {
        match n {
            0 => Ok(Some(false)),
            1 => Ok(Some(true)),
            _ => Err(E::invalid_value(serde::de::Unexpected::Signed(n), &self)),
        }
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
        match s.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(Some(true)),
            "false" | "0" | "no" | "off" => Ok(Some(false)),
            _ => Err(E::invalid_value(serde::de::Unexpected::Str(s), &self)),
        }
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(LenientBool)
    }
}

impl Settings {
    /// Parses `args` (the first is the program name) as a command line, then loads. A
    /// malformed command line is an error here rather than an exit, for tests and embedding.
    pub fn from_args<I, T>(args: I) -> Result<Self, anyhow::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cli = Cli::try_parse_from(args)?;
        Ok(Self::load(cli.serve_args())?)
    }

    /// Merges defaults, the TOML file named by `args.config`, the environment and the given
    /// flags, then validates.
    pub fn load(args: &ServeArgs) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Layered::default()));
        if let Some(path) = &args.config {
            // figment skips a missing file silently; a file named on purpose must exist.
            match std::fs::metadata(path) {
                Ok(m) if m.is_file() => {}
                Ok(_) => {
                    return Err(ConfigError::File {
                        path: path.clone(),
                        reason: "not a regular file".into(),
                    })
                }
                Err(e) => {
                    return Err(ConfigError::File {
                        path: path.clone(),
                        reason: e.to_string(),
                    })
                }
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        let flags = FlagLayer {
            listen: args.listen.as_deref(),
            store: args.store.as_deref(),
            data_dir: args.data_dir.as_deref(),
            admin_token: args.admin_token.as_deref(),
            signing_key: args.signing_key.as_deref(),
            demo: match (args.demo, args.no_demo) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            log_format: args.log_format,
            durability: args.durability,
        };
        let layered: Layered = figment
            .merge(RawEnv::new())
            .merge(Serialized::defaults(flags))
            .extract()
            .map_err(|e| ConfigError::Layers(Box::new(e)))?;
        Self::validate(layered)
    }

    fn validate(l: Layered) -> Result<Self, ConfigError> {
        let listen = l.listen.trim().to_string();
        check_listen(&listen).map_err(|r| invalid("listen", r))?;
        let store = StoreBackend::parse(&l.store).map_err(|r| invalid("store", r))?;
        if l.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty"));
        }
        if let Some(t) = &l.admin_token {
            // It travels in an `Authorization` header, so it must be a plain visible string.
            if t.is_empty() {
                return Err(invalid(
                    "admin_token",
                    "must not be empty (leave it unset to have one generated)",
                ));
            }
            if !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(invalid(
                    "admin_token",
                    "must be printable ASCII without spaces",
                ));
            }
        }
        if let Some(p) = &l.signing_key {
            if p.as_os_str().is_empty() {
                return Err(invalid("signing_key", "must not be empty"));
            }
        }
        let demo = l.demo.unwrap_or(store.is_embedded());
        Ok(Settings {
            listen,
            store,
            data_dir: l.data_dir,
            admin_token: l.admin_token,
            signing_key: l.signing_key,
            demo,
            log_format: l.log_format,
            durability: l.durability,
        })
    }
}

/// `host:port`, `[v6]:port` or an IP socket address; the host is resolved at bind time.
fn check_listen(s: &str) -> Result<(), String> {
    if s.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    let (host, port) = split_host_port(s);
    let port_ok = port.is_some_and(|p| p.parse::<u16>().is_ok());
    if host.is_empty() || !port_ok || host.contains(['/', ' ']) {
        return Err(format!(
            "expected host:port such as 127.0.0.1:8080 or 0.0.0.0:8080, got `{s}`"
        ));
    }
    Ok(())
}

/// A fresh admin token: 32 random bytes, hex.
pub fn generate_admin_token() -> String {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("the OS random source is available");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
// `Jail::expect_with` takes closures returning `figment::Error`, which is large; the type is
// figment's, not ours to box.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;
    use figment::Jail;

    fn load(args: &[&str]) -> Result<Settings, String> {
        let mut argv = vec!["waitroom"];
        argv.extend_from_slice(args);
        Settings::from_args(argv).map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn defaults_match_the_contract() {
        Jail::expect_with(|_| {
            let s = load(&[]).unwrap();
            assert_eq!(s, Settings::default());
            assert_eq!(s.listen, "127.0.0.1:8080");
            assert_eq!(s.store, StoreBackend::Embedded);
            assert_eq!(s.data_dir, PathBuf::from("./waitroom-data"));
            assert!(s.demo, "demo is on for the embedded store");
            assert_eq!(s.durability, Durability::Sync);
            assert_eq!(
                load(&["serve"]).unwrap(),
                s,
                "bare waitroom = waitroom serve"
            );
            Ok(())
        });
    }

    #[test]
    fn each_layer_overrides_the_one_below() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "w.toml",
                r#"
                listen = "127.0.0.1:1001"
                store = "embedded"
                data_dir = "from-file"
                admin_token = "file-token"
                log_format = "json"
                demo = false
                "#,
            )?;
            // File over defaults.
            let s = load(&["--config", "w.toml"]).unwrap();
            assert_eq!(s.listen, "127.0.0.1:1001");
            assert_eq!(s.data_dir, PathBuf::from("from-file"));
            assert_eq!(s.admin_token.as_deref(), Some("file-token"));
            assert_eq!(s.log_format, LogFormat::Json);
            assert!(!s.demo);
            assert_eq!(s.durability, Durability::Sync, "default kept");

            // Environment over the file.
            jail.set_env("WAITROOM_LISTEN", "127.0.0.1:1002");
            jail.set_env("WAITROOM_ADMIN_TOKEN", "12345678901234567890");
            jail.set_env("WAITROOM_DEMO", "on");
            jail.set_env("WAITROOM_DURABILITY", "relaxed");
            let s = load(&["serve", "--config", "w.toml"]).unwrap();
            assert_eq!(s.listen, "127.0.0.1:1002");
            assert_eq!(
                s.admin_token.as_deref(),
                Some("12345678901234567890"),
                "an all-digit token stays a string"
            );
            assert!(s.demo);
            assert_eq!(s.durability, Durability::Relaxed);
            assert_eq!(s.data_dir, PathBuf::from("from-file"), "file kept");

            // Flags over the environment.
            let s = load(&[
                "serve",
                "--config",
                "w.toml",
                "--listen",
                "127.0.0.1:1003",
                "--no-demo",
                "--durability",
                "sync",
                "--log-format",
                "text",
            ])
            .unwrap();
            assert_eq!(s.listen, "127.0.0.1:1003");
            assert!(!s.demo);
            assert_eq!(s.durability, Durability::Sync);
            assert_eq!(s.log_format, LogFormat::Text);
            assert_eq!(s.admin_token.as_deref(), Some("12345678901234567890"));

            // The config file may come from the environment too.
            jail.set_env("WAITROOM_CONFIG", "w.toml");
            assert_eq!(
                load(&[]).unwrap().data_dir,
                PathBuf::from("from-file"),
                "WAITROOM_CONFIG names the file"
            );
            Ok(())
        });
    }

    #[test]
    fn demo_follows_the_backend_unless_set() {
        Jail::expect_with(|jail| {
            let s = load(&["--store", "redis://localhost:6379/0"]).unwrap();
            assert!(!s.demo, "demo is off for redis by default");
            assert_eq!(
                s.store,
                StoreBackend::Redis {
                    url: "redis://localhost:6379/0".into()
                }
            );
            assert!(
                load(&["--store", "redis://localhost", "--demo"])
                    .unwrap()
                    .demo
            );
            assert!(!load(&["--demo", "--no-demo"]).unwrap().demo, "last wins");
            assert!(load(&["--no-demo", "--demo"]).unwrap().demo, "last wins");
            jail.set_env("WAITROOM_DEMO", "0");
            assert!(!load(&[]).unwrap().demo);
            assert!(load(&["--demo"]).unwrap().demo, "flag over env");
            Ok(())
        });
    }

    #[test]
    fn bad_values_are_clear_errors() {
        Jail::expect_with(|jail| {
            let cases: &[(&[&str], &str)] = &[
                (&["--listen", "nonsense"], "listen"),
                (&["--listen", "127.0.0.1:99999"], "listen"),
                (&["--store", "mysql://x"], "store"),
                (&["--store", "redis://"], "no host"),
                (&["--store", "redis://h:port"], "port"),
                (&["--store", "redis://h:6379/x"], "database"),
                (&["--admin-token", "a b"], "admin_token"),
                (&["--admin-token", ""], "admin_token"),
                (&["--log-format", "xml"], "xml"),
                (&["--bogus"], "--bogus"),
                (&["--config", "missing.toml"], "missing.toml"),
            ];
            for (args, needle) in cases {
                let err = load(args).expect_err(&format!("{args:?} accepted"));
                assert!(err.contains(needle), "{args:?}: `{err}` lacks `{needle}`");
            }
            jail.create_file("typo.toml", "listn = \"127.0.0.1:1\"")?;
            let err = load(&["--config", "typo.toml"]).unwrap_err();
            assert!(err.contains("listn"), "{err}");
            jail.create_file("type.toml", "demo = \"maybe\"")?;
            let err = load(&["--config", "type.toml"]).unwrap_err();
            assert!(err.contains("demo") && err.contains("maybe"), "{err}");
            jail.set_env("WAITROOM_DURABILITY", "eventually");
            let err = load(&[]).unwrap_err();
            assert!(
                err.contains("eventually") && err.contains("WAITROOM_"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn listen_accepts_names_and_v6() {
        for ok in [
            "localhost:8080",
            "[::1]:0",
            "0.0.0.0:8080",
            "example.org:80",
        ] {
            assert!(check_listen(ok).is_ok(), "{ok}");
        }
        for bad in ["8080", ":8080", "host:", "a b:80"] {
            assert!(check_listen(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn secrets_do_not_show_in_debug() {
        let s = Settings {
            admin_token: Some("sup3r-secret".into()),
            store: StoreBackend::parse("redis://user:hunter2@redis.example:6379/1").unwrap(),
            ..Settings::default()
        };
        let dbg = format!("{s:?}");
        assert!(
            !dbg.contains("sup3r-secret") && !dbg.contains("hunter2"),
            "{dbg}"
        );
        assert!(dbg.contains("redis.example:6379/1"), "{dbg}");
        let args = Cli::try_parse_from(["waitroom", "--admin-token", "sup3r-secret"]).unwrap();
        assert!(!format!("{args:?}").contains("sup3r-secret"));
        assert_eq!(generate_admin_token().len(), 64);
        assert_ne!(generate_admin_token(), generate_admin_token());
    }
}
