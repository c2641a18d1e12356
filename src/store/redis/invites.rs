//! Reading an event's invite codes back (`GET /admin/events/{id}/invites`), Rust-side: the
//! codes live in one hash (`K_INVITES`, `lua/rules.lua` says what its values hold), read
//! with `HSCAN` so that a large event does not hold Redis for one long `HGETALL`.

use std::collections::BTreeMap;

use super::decode::Malformed;
use super::script::KEYS;
use super::{Inner, StoreResult};
use crate::core::{InviteHolder, Millis};

/// How many fields one `HSCAN` step asks for.
const SCAN_COUNT: usize = 1000;

/// One `HSCAN` answer: the next cursor (0: done) and (code, value) pairs.
type ScanStep = (u64, Vec<(Vec<u8>, Vec<u8>)>);

impl Inner {
    /// The codes after `after` in byte order, at most `limit`, each with what it is bound
    /// to. A hash keeps no order, so every page scans the whole hash and keeps the `limit`
    /// smallest codes past `after`: memory bounded by the page, time by the codes.
    pub(super) async fn invites(
        &self,
        event_id: &str,
        after: &str,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<(String, Option<InviteHolder>)>> {
        // An unknown event is not found (its hash would read as empty).
        self.snapshot(event_id, now).await?;
        let keys = self.keys(event_id);
        let at = KEYS.iter().position(|(k, _)| *k == "iv");
        let key = &keys[at.expect("a key of the script")];
        let mut conn = self.connection().await?;
        // `HSCAN` may answer a field twice (a rehash between steps): the map keeps one.
        let mut page: BTreeMap<String, Option<InviteHolder>> = BTreeMap::new();
        let mut cursor = 0u64;
        loop {
            let (next, fields): ScanStep = self
                .bounded(
                    redis::cmd("HSCAN")
                        .arg(key)
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(SCAN_COUNT)
                        .query_async(&mut conn),
                )
                .await?;
            for (code, value) in fields {
                let code = String::from_utf8(code).map_err(|_| Malformed("an invite code"))?;
                if code.as_str() <= after {
                    continue;
                }
                if page.len() == limit && page.last_key_value().is_some_and(|(c, _)| *c < code) {
                    continue;
                }
                page.insert(code, holder(&value)?);
                if page.len() > limit {
                    page.pop_last();
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok(page.into_iter().collect())
    }
}

/// A code's value: `''` unused, `'=' .. user id` (a proven join), `'#' .. seq` (another).
fn holder(value: &[u8]) -> Result<Option<InviteHolder>, Malformed> {
    const WHAT: &str = "an invite's holder";
    match value.split_first() {
        None => Ok(None),
        Some((b'=', user)) => {
            let user = std::str::from_utf8(user).map_err(|_| Malformed(WHAT))?;
            Ok(Some(InviteHolder::User(user.into())))
        }
        Some((b'#', seq)) => std::str::from_utf8(seq)
            .ok()
            .and_then(|s| s.parse().ok())
            .map(|seq| Some(InviteHolder::Place(seq)))
            .ok_or(Malformed(WHAT)),
        Some(_) => Err(Malformed(WHAT)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_read_as_the_script_writes_them() {
        assert_eq!(holder(b"").unwrap(), None);
        assert_eq!(
            holder(b"=alice").unwrap(),
            Some(InviteHolder::User("alice".into()))
        );
        assert_eq!(holder(b"#42").unwrap(), Some(InviteHolder::Place(42)));
        assert!(holder(b"#x").is_err());
        assert!(holder(b"?").is_err());
    }
}
