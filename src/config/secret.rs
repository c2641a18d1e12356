//! Values that must never reach a log: [`Secret`] (the admin token) and [`SecretUrl`] (a
//! store URL, whose password is hidden but whose host stays visible for diagnosis).
//!
//! Settings are logged at start and show up in panics and error chains, so redaction lives
//! in the type, not at each place that prints: `Debug` and `Display` never show the value,
//! and reading it takes an explicit [`Secret::expose`].

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a redacted value prints as.
pub const REDACTED: &str = "<redacted>";

/// A value whose `Debug` and `Display` print `<redacted>`.
///
/// It serializes as the bare value, because the config layers pass settings through figment
/// as serialized data; nothing else serializes settings.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    pub fn new(value: T) -> Self {
        Secret(value)
    }

    /// The value itself: the one way to read it, easy to find in a review.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl From<&str> for Secret<String> {
    fn from(s: &str) -> Self {
        Secret(s.to_string())
    }
}

impl From<String> for Secret<String> {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

/// For the command line parser.
impl FromStr for Secret<String> {
    type Err = Infallible;
    fn from_str(s: &str) -> Result<Self, Infallible> {
        Ok(Secret(s.to_string()))
    }
}

/// A URL that may carry a password (`redis://user:password@host/db`), or a plain word such
/// as `embedded`. `Debug` and `Display` show it with the password replaced by `<redacted>`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// The URL with its password, to dial the backend.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl From<&str> for SecretUrl {
    fn from(s: &str) -> Self {
        SecretUrl(s.to_string())
    }
}

impl From<String> for SecretUrl {
    fn from(s: String) -> Self {
        SecretUrl(s)
    }
}

/// For the command line parser.
impl FromStr for SecretUrl {
    type Err = Infallible;
    fn from_str(s: &str) -> Result<Self, Infallible> {
        Ok(SecretUrl(s.to_string()))
    }
}

/// Replaces the password of a URL (`scheme://user:password@host`) with `<redacted>`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // The credentials end at the last `@`, wherever it is: a password may hold a `/` (one
    // made by `openssl rand -base64` often does), so the authority cannot be cut at the
    // first `/` before looking (that printed such a password whole). An `@` in a path
    // redacts too much, never too little.
    match rest.rsplit_once('@') {
        Some((cred, host)) => {
            let user = cred.split_once(':').map_or("", |(u, _)| u);
            // A user name holds no `/`; if one seems to, the `:` came after a slash of the
            // password, and nothing of it is shown.
            let user = if user.contains('/') { "" } else { user };
            format!("{scheme}://{user}:{REDACTED}@{host}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_print_redacted() {
        let s = Secret::from("sup3r-secret");
        assert_eq!(format!("{s:?} {s}"), "<redacted> <redacted>");
        assert_eq!(s.expose(), "sup3r-secret");
        let u = SecretUrl::from("rediss://app:hun@ter2@redis.example:6379/1");
        assert_eq!(
            format!("{u:?} {u}"),
            "rediss://app:<redacted>@redis.example:6379/1 rediss://app:<redacted>@redis.example:6379/1"
        );
        assert_eq!(format!("{}", SecretUrl::from("embedded")), "embedded");
        // A password with slashes (base64) is hidden whole, and so is a user-less one.
        assert_eq!(
            redact_url("redis://:Ab3/xY9+PW==@127.0.0.1:1/0"),
            "redis://:<redacted>@127.0.0.1:1/0"
        );
        assert_eq!(
            redact_url("redis+sentinel://:PA/SS@127.0.0.1:1/svc"),
            "redis+sentinel://:<redacted>@127.0.0.1:1/svc"
        );
        assert_eq!(
            redact_url("redis://app:a/b:c@h:1/0"),
            "redis://app:<redacted>@h:1/0"
        );
        assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(u.expose(), "rediss://app:hun@ter2@redis.example:6379/1");
    }
}
