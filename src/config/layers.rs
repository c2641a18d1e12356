//! The layers and how they merge: one struct, [`Layered`], is what the TOML file, the
//! `WAITROOM_*` environment and the flags each provide (every field optional: a layer sets
//! only what it names), and figment merges them in rising priority. Built-in defaults are
//! applied after merging, in [`super::Settings::load`], from [`super::Settings::default`].

use std::fmt;
use std::path::PathBuf;

use clap::Args;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::de::Visitor as _;
use serde::{Deserialize, Deserializer, Serialize};

use super::guard::ForwardedHeader;
use super::secret::{Secret, SecretUrl};
use super::{ConfigError, Durability, LogFormat};

/// Prefix of every environment variable we read.
pub const ENV_PREFIX: &str = "WAITROOM_";

/// The settings an environment variable may set (`WAITROOM_` + the upper-cased name): the
/// fields of [`Layered`] (a test checks they agree). Other `WAITROOM_*` variables (such as
/// `WAITROOM_CONFIG`, read by the flag parser) are left alone rather than rejected, because
/// a deployment's environment often carries more than we read.
const ENV_KEYS: &[&str] = &[
    "listen",
    "store",
    "data_dir",
    "admin_token",
    "signing_key",
    "demo",
    "log_format",
    "durability",
    "rate_limits",
    "trusted_proxies",
    "forwarded_header",
    "joins_per_minute",
    "polls_per_second",
    "admin_failures_per_minute",
    "header_timeout_sec",
    "body_timeout_sec",
    "max_connections",
    "max_connections_per_client",
    "repair",
    "otlp_endpoint",
    "redis_wait_replicas",
    "redis_replica",
    "upstream",
    "cookie_secure",
];

/// One layer of settings: the TOML file, the environment or the flags. The same names in
/// every layer; unknown keys are refused so that a typo in the TOML file is an error rather
/// than silently ignored. Absent fields are not serialized, so a layer that does not name a
/// setting leaves the lower layers' value alone.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Layered {
    /// HTTP address to listen on, e.g. 0.0.0.0:8080 (port 0 picks a free port). [env: WAITROOM_LISTEN] [default: 127.0.0.1:8080]
    #[arg(long, value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `embedded` (in-process, durable under --data-dir), redis://host:port[/db] (rediss://… for TLS), or redis+sentinel://host:port[,host:port…]/service[/db]. [env: WAITROOM_STORE] [default: embedded]
    #[arg(long, value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<SecretUrl>,
    /// Directory of the embedded store's files and the generated signing key. [env: WAITROOM_DATA_DIR] [default: ./waitroom-data]
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Bearer token of the admin API; generated and printed at start when absent. Prefer the
    /// environment or the config file: flags are visible to every user of the machine. [env: WAITROOM_ADMIN_TOKEN]
    #[arg(long, value_name = "T")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<Secret<String>>,
    /// PEM (PKCS#8) Ed25519 private key for access tokens, or a directory of `*.pem` keys (name order); repeat for several keys: the last signs, all verify (key rotation). Generated into the data dir when absent. [env: WAITROOM_SIGNING_KEY, comma-separated]
    #[arg(long, value_name = "FILE|DIR")]
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "paths_or_list"
    )]
    pub signing_key: Vec<PathBuf>,
    /// `None`: on for the embedded store, off for Redis (where many nodes would each create
    /// it). On the command line it is the `--demo` / `--no-demo` pair of
    /// [`super::ServeArgs`].
    #[arg(skip)]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_bool"
    )]
    pub demo: Option<bool>,
    /// Log lines as human-readable text or as JSON. [env: WAITROOM_LOG_FORMAT] [default: text]
    #[arg(long, value_enum, value_name = "FORMAT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
    /// Embedded store: answer a change after it is on disk (`sync`) or before (`relaxed`). [env: WAITROOM_DURABILITY] [default: sync]
    #[arg(long, value_enum, value_name = "MODE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durability: Option<Durability>,
    /// Start even if the embedded store's journal is damaged (cut back at the damage, logging how many acknowledged records came after it) or its signing key was lost (the places are kept and expire unheard); on Redis, start with signing keys that share none of those recorded there, and record them. [env: WAITROOM_REPAIR] [default: false]
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL", value_parser = parse_bool)]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_bool"
    )]
    pub repair: Option<bool>,
    /// Per-client limits, `on` or `off` (off only for load tests). [env: WAITROOM_RATE_LIMITS] [default: on]
    #[arg(long, value_name = "on|off", value_parser = parse_bool)]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_bool"
    )]
    pub rate_limits: Option<bool>,
    /// Comma-separated addresses or CIDR blocks of proxies whose X-Forwarded-For / Forwarded headers name the client (a list in TOML). [env: WAITROOM_TRUSTED_PROXIES] [default: none]
    #[arg(long, value_name = "CIDRS")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "string_or_list"
    )]
    pub trusted_proxies: Option<String>,
    /// The header that names the client behind a trusted proxy: `x-forwarded-for` or `forwarded` (RFC 7239); only that one is read. [env: WAITROOM_FORWARDED_HEADER] [default: x-forwarded-for]
    #[arg(long, value_enum, value_name = "HEADER")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarded_header: Option<ForwardedHeader>,
    /// Joins per client per event: a burst of N, refilled over a minute. [env: WAITROOM_JOINS_PER_MINUTE] [default: 30]
    #[arg(long, value_name = "N")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_u64"
    )]
    pub joins_per_minute: Option<u64>,
    /// Polls per place per second (status, heartbeat, enter, live connects); bursts of 5 s. [env: WAITROOM_POLLS_PER_SECOND] [default: 2]
    #[arg(long, value_name = "N")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_u64"
    )]
    pub polls_per_second: Option<u64>,
    /// Wrong admin tokens per client: a burst of N, refilled over a minute. [env: WAITROOM_ADMIN_FAILURES_PER_MINUTE] [default: 10]
    #[arg(long, value_name = "N")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_u64"
    )]
    pub admin_failures_per_minute: Option<u64>,
    /// Seconds to receive a request head, and the idle keep-alive timeout. [env: WAITROOM_HEADER_TIMEOUT_SEC] [default: 10]
    #[arg(long, value_name = "SEC")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_u64"
    )]
    pub header_timeout_sec: Option<u64>,
    /// Seconds to receive a request body. [env: WAITROOM_BODY_TIMEOUT_SEC] [default: 10]
    #[arg(long, value_name = "SEC")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_u64"
    )]
    pub body_timeout_sec: Option<u64>,
    /// Most open connections in total. [env: WAITROOM_MAX_CONNECTIONS] [default: 3/4 of the descriptor limit]
    #[arg(long, value_name = "N")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_u64"
    )]
    pub max_connections: Option<u64>,
    /// Most open connections per client address. [env: WAITROOM_MAX_CONNECTIONS_PER_CLIENT] [default: 256]
    #[arg(long, value_name = "N")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_u64"
    )]
    pub max_connections_per_client: Option<u64>,
    /// Export request traces over OTLP/HTTP to the OpenTelemetry collector at this base URL (`http://host:4318`; spans go to `/v1/traces`); an incoming `traceparent` continues its trace. Off when unset. [env: WAITROOM_OTLP_ENDPOINT] [default: off]
    #[arg(long, value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// Redis store: answer a change only once this many replicas have it (`WAIT`), so a
    /// failover cannot lose what a client was told; 0 answers at once (replication is
    /// asynchronous). Standalone and Sentinel only. [env: WAITROOM_REDIS_WAIT_REPLICAS] [default: 0]
    #[arg(long, value_name = "N")]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_u64"
    )]
    pub redis_wait_replicas: Option<u64>,
    /// Redis store: answer `status` from this node's replica of the event (fed by the event's change log) and batch the renewals of its polls; off: every status is one script call on Redis. [env: WAITROOM_REDIS_REPLICA] [default: on]
    #[arg(long, value_name = "on|off", value_parser = parse_bool)]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_bool"
    )]
    pub redis_replica: Option<bool>,
    /// Gateway mode: proxy every request that is not waitroom's own to the site at this URL (`http://127.0.0.1:3000`), queueing the paths events gate. Off when unset. [env: WAITROOM_UPSTREAM] [default: off]
    #[arg(long, value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Mark the session cookies of gated paths `Secure` even when requests arrive over plain http (TLS ends at a proxy not in trusted_proxies). [env: WAITROOM_COOKIE_SECURE] [default: false]
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL", value_parser = parse_bool)]
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_bool"
    )]
    pub cookie_secure: Option<bool>,
}

/// A boolean flag's value: the spellings the environment and the TOML file accept
/// ([`LenientBool`]), so `--repair=yes` is not refused where `WAITROOM_REPAIR=yes` is read.
fn parse_bool(s: &str) -> Result<bool, String> {
    LenientBool
        .visit_str::<serde::de::value::Error>(s)
        .ok()
        .flatten()
        .ok_or_else(|| format!("`{s}` is not a boolean ({BOOL_SPELLINGS})"))
}

/// What every layer accepts for a boolean setting (in any case).
const BOOL_SPELLINGS: &str = "true/false, 1/0, yes/no, on/off";

/// A number, or from the environment its digits.
fn lenient_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    // `expecting`: the message of a value that is neither (`-5`, `1.5`), which is
    // otherwise "data did not match any variant of untagged enum N".
    #[derive(Deserialize)]
    #[serde(untagged, expecting = "a whole number, 0 or more")]
    enum N {
        N(u64),
        S(String),
    }
    match Option::<N>::deserialize(d)? {
        None => Ok(None),
        Some(N::N(n)) => Ok(Some(n)),
        Some(N::S(s)) => s.trim().parse().map(Some).map_err(|_| {
            serde::de::Error::invalid_value(serde::de::Unexpected::Str(&s), &"a whole number")
        }),
    }
}

/// A comma-separated string, or (in TOML) a list of strings.
fn string_or_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged, expecting = "a string, or a list of strings")]
    enum L {
        S(String),
        L(Vec<String>),
    }
    Ok(Option::<L>::deserialize(d)?.map(|l| match l {
        L::S(s) => s,
        L::L(v) => v.join(","),
    }))
}

/// A path, a comma-separated string of paths (the environment), or (in TOML) a list.
fn paths_or_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
    Ok(string_or_list(d)?
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default())
}

/// The settings whose values are secrets: an error about one never quotes its value.
pub const SECRET_KEYS: [&str; 2] = ["admin_token", "store"];

/// Merges the TOML file `file` (which must exist when named), the environment and `flags`,
/// in rising priority. Also answers, for each lower layer (the file, the environment), the
/// merge as if that layer came last: a value a higher layer overrides is then checked as
/// well (`Settings::load` validates each), in the company of the settings it would run
/// with, so it cannot stop a start only the day the override goes.
pub fn merge(
    file: Option<&PathBuf>,
    flags: Layered,
) -> Result<(Layered, Vec<(String, Layered)>), ConfigError> {
    let mut figment = Figment::new();
    if let Some(path) = file {
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
    // Each lower layer read on its own first: merged, a malformed value that a higher layer
    // overrides is never read, and would stop the start only the day the override goes.
    let alone = |f: Figment| {
        f.extract::<Layered>()
            .map(drop)
            .map_err(|e| ConfigError::Layers(Box::new(e)))
    };
    if let Some(path) = file {
        alone(Figment::from(Toml::file_exact(path)))?;
    }
    alone(Figment::from(RawEnv::new()))?;
    let figment = figment
        .merge(RawEnv::new())
        .merge(Serialized::defaults(flags));
    let extract = |f: Figment| {
        f.extract::<Layered>()
            .map_err(|e| ConfigError::Layers(Box::new(e)))
    };
    let mut lower_on_top = Vec::new();
    if let Some(path) = file {
        let on_top = extract(figment.clone().merge(Toml::file_exact(path)))?;
        lower_on_top.push((path.display().to_string(), on_top));
    }
    let on_top = extract(figment.clone().merge(RawEnv::new()))?;
    lower_on_top.push(("the environment".to_string(), on_top));
    Ok((extract(figment)?, lower_on_top))
}

/// The `WAITROOM_*` variables of the environment that name no setting (nor
/// `WAITROOM_CONFIG`), sorted. They are not refused (see [`ENV_KEYS`]), but a misspelt one
/// (`WAITROOM_DURABILTY`) would be ignored without a word, while a misspelt key in the
/// file is refused: the server warns of them at start.
pub fn unknown_env() -> Vec<String> {
    unknown_among(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))
}

/// [`unknown_env`] among the given names.
fn unknown_among(names: impl Iterator<Item = String>) -> Vec<String> {
    let mut unknown: Vec<String> = names
        .filter(|k| {
            // In any case, as figment matches the prefix (`waitroom_durability` is read).
            let prefix = k.get(..ENV_PREFIX.len());
            prefix.is_some_and(|p| p.eq_ignore_ascii_case(ENV_PREFIX)) && {
                let key = k[ENV_PREFIX.len()..].to_ascii_lowercase();
                key != "config" && !ENV_KEYS.contains(&key.as_str())
            }
        })
        .collect();
    unknown.sort_unstable();
    unknown
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

/// Accepts a boolean, or (the environment, a TOML string, a flag's value) `true/false`,
/// `1/0`, `yes/no`, `on/off`.
fn lenient_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    d.deserialize_option(LenientBool)
}

struct LenientBool;

impl<'de> serde::de::Visitor<'de> for LenientBool {
    type Value = Option<bool>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a boolean ({BOOL_SPELLINGS})")
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A misspelt variable is named; settings, `WAITROOM_CONFIG` and other programs'
    /// variables are not.
    #[test]
    fn misspelt_variables_are_found() {
        let names = [
            "WAITROOM_DURABILTY",
            "WAITROOM_LISTEN",
            "WAITROOM_CONFIG",
            "WAITROOMX",
            "OTHER_DURABILITY",
            // Read in any case, so misspelt in any case too.
            "waitroom_durability",
            "waitroom_listenn",
            "Waitroom_Demoo",
            "waitroom_config",
            "waitroö",
        ];
        assert_eq!(
            unknown_among(names.iter().map(|n| n.to_string())),
            ["WAITROOM_DURABILTY", "Waitroom_Demoo", "waitroom_listenn"]
        );
    }

    /// The environment reads exactly the settings a layer has: a new setting that is not
    /// added to `ENV_KEYS` would silently be ignored in the environment.
    #[test]
    fn env_keys_are_the_fields_of_a_layer() {
        let full = Layered {
            listen: Some(String::new()),
            store: Some(SecretUrl::default()),
            data_dir: Some(PathBuf::new()),
            admin_token: Some(Secret::default()),
            signing_key: vec![PathBuf::new()],
            demo: Some(true),
            log_format: Some(LogFormat::Text),
            durability: Some(Durability::Sync),
            rate_limits: Some(true),
            trusted_proxies: Some(String::new()),
            forwarded_header: Some(ForwardedHeader::Forwarded),
            joins_per_minute: Some(1),
            polls_per_second: Some(1),
            admin_failures_per_minute: Some(1),
            header_timeout_sec: Some(1),
            body_timeout_sec: Some(1),
            max_connections: Some(1),
            max_connections_per_client: Some(1),
            repair: Some(true),
            otlp_endpoint: Some(String::new()),
            redis_wait_replicas: Some(1),
            redis_replica: Some(false),
            upstream: Some(String::new()),
            cookie_secure: Some(true),
        };
        let dict = Serialized::defaults(full).data().unwrap();
        let mut keys: Vec<&str> = dict[&Profile::Default].keys().map(String::as_str).collect();
        let mut expected = ENV_KEYS.to_vec();
        keys.sort_unstable();
        expected.sort_unstable();
        assert_eq!(keys, expected);
        assert!(
            Serialized::defaults(Layered::default()).data().unwrap()[&Profile::Default].is_empty(),
            "an empty layer masks nothing"
        );
    }
}
