//! The syntax of the address-like settings: the store (`embedded` or a Redis URL), the
//! listening address, and gateway mode's origin (`upstream`). Syntax only: nothing is dialled or bound here.

use std::fmt;

use super::secret::SecretUrl;

/// Which store backs the queues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreBackend {
    /// In-process, durable under the data dir.
    Embedded,
    /// A shared Redis, `redis://` or `rediss://` (TLS).
    Redis { url: SecretUrl },
}

impl StoreBackend {
    /// Parses `embedded` or a `redis://` / `rediss://` URL (syntax only; nothing is dialled).
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("embedded") {
            return Ok(StoreBackend::Embedded);
        }
        let redacted = SecretUrl::from(s);
        if let Some(parsed) = crate::store::redis::sentinel::parse(s) {
            return match parsed {
                Ok(_) => Ok(StoreBackend::Redis { url: redacted }),
                Err(e) => Err(format!("the Sentinel URL `{redacted}`: {e}")),
            };
        }
        let rest = s
            .strip_prefix("redis://")
            .or_else(|| s.strip_prefix("rediss://"))
            .ok_or_else(|| {
                format!(
                    "expected `embedded`, a redis://host:port[/db] URL or \
                     redis+sentinel://host:port[,host:port…]/service[/db], got `{redacted}`"
                )
            })?;
        // Credentials come before the last `@`: a password may itself hold `@` or `/` (so
        // the authority is not cut at the first `/` before: that read a password's end as
        // the database and quoted it in the error).
        let after_cred = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        let (host_port, path) = after_cred.split_once('/').unwrap_or((after_cred, ""));
        let (host, port) = split_host_port(host_port);
        if host.is_empty() {
            return Err(format!("the Redis URL `{redacted}` names no host"));
        }
        if let Some(p) = port {
            if p.parse::<u16>().is_err() {
                return Err(format!("the Redis URL `{redacted}` has a bad port"));
            }
        }
        let db = path.split('?').next().unwrap_or("");
        if !db.is_empty() && db.parse::<u32>().is_err() {
            return Err(format!(
                "the Redis URL `{redacted}` has a bad database number `{db}`"
            ));
        }
        Ok(StoreBackend::Redis { url: redacted })
    }

    pub fn is_embedded(&self) -> bool {
        matches!(self, StoreBackend::Embedded)
    }
}

/// Shows a Redis URL with its password hidden, so it can be logged.
impl fmt::Display for StoreBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreBackend::Embedded => f.write_str("embedded"),
            StoreBackend::Redis { url } => fmt::Display::fmt(url, f),
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

/// `host:port`, `[v6]:port` or an IP socket address; the host is resolved at bind time.
pub fn check_listen(s: &str) -> Result<(), String> {
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

/// The origin: `http://host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub authority: axum::http::uri::Authority,
}

impl Upstream {
    /// Parses `http://host[:port][/]`. Plain http: the origin is on the host or a private
    /// network (no TLS client is built in).
    pub fn parse(url: &str) -> Result<Self, String> {
        // Credentials are refused below, and never echoed in an error either.
        let shown = super::secret::redact_url(url.trim());
        let uri: axum::http::Uri = url
            .trim()
            .parse()
            .map_err(|e| format!("`{shown}` is not a URL ({e})"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(
                    "https is not supported: proxy to the origin over http:// on a private network"
                        .into(),
                )
            }
            _ => return Err(format!("`{shown}` must start with http://")),
        }
        let authority = uri
            .authority()
            .filter(|a| !a.host().is_empty())
            .ok_or_else(|| format!("`{shown}` names no host"))?
            .clone();
        if authority.as_str().contains('@') {
            return Err(format!("`{shown}` must not carry credentials"));
        }
        if uri.path() != "/" && !uri.path().is_empty() || uri.query().is_some() {
            return Err(format!("`{shown}` must have no path or query"));
        }
        Ok(Upstream { authority })
    }
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}", self.authority)
    }
}

#[cfg(test)]
mod tests {
    use super::Upstream;

    #[test]
    fn upstream_urls() {
        assert_eq!(
            Upstream::parse("http://127.0.0.1:3000/")
                .unwrap()
                .to_string(),
            "http://127.0.0.1:3000"
        );
        for bad in [
            "https://a:1",
            "127.0.0.1:3000",
            "http://",
            "http://a:1/x",
            "http://a:1/?q",
            "http://u:p@a:1",
        ] {
            assert!(Upstream::parse(bad).is_err(), "{bad}");
        }
        // A Redis URL's password is never echoed either, even one holding `/` or `@`.
        for secret in ["redis://u:1234/s3cr3t@h:6379/x", "redis://:p@ss/s3cr3t@h/y"] {
            let e = StoreBackend::parse(secret).unwrap_err();
            assert!(!e.contains("s3cr3t"), "{e}");
        }
        assert!(StoreBackend::parse("redis://:pa/ss@h:6379/0").is_ok());
        // A refused URL's password is never echoed, whatever else is wrong with it.
        for secret in [
            "http://u:s3cr3t@a:1",
            "http://u:s3/cr3t@a:1/x",
            "ftp://u:s3cr3t@a",
        ] {
            let e = Upstream::parse(secret).unwrap_err();
            assert!(!e.contains("s3cr3t") && !e.contains("cr3t"), "{e}");
        }
    }

    use super::*;

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
}
