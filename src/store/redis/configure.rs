//! `put_event` and `update_event` on Redis: the settings read, patched and validated
//! here, then written by the script only if nobody changed them meanwhile (optimistic, no
//! lock held), and the event listed for every node's scheduler.

use std::time::Duration;

use super::*;

/// What [`Inner::configure`] wrote, and what it found, read by the script that wrote it.
pub(super) struct Configured {
    /// The settings the patch was applied to (the defaults for an event it created).
    pub(super) before: EventConfig,
    pub(super) config: EventConfig,
    /// The places waiting just before the change (`Store::end_sale`'s count): once what
    /// was due had ended, none when the sale had ended already or the event is new.
    pub(super) waiting: u64,
}

impl Inner {
    /// Writes `patch` over the event's stored settings (over the defaults when `create` and
    /// the event does not exist; `EventNotFound` when not `create` and it does not).
    pub(super) async fn configure(
        &self,
        event_id: &str,
        patch: &EventPatch,
        now: Millis,
        create: bool,
    ) -> StoreResult<Configured> {
        validate_event_id(event_id)?;
        let s = self;
        let mut conn = s.connection().await?;
        for _ in 0..PUT_ATTEMPTS {
            // Read, apply and validate here; the script then writes only if nobody changed
            // the settings (nor recorded the opening reached, nor the end by closes_at
            // seen) in between (optimistic: updates are rare, and no lock is held).
            let (cfg, ver, reached, seen) = s.settings(event_id, now).await?;
            let base = match &cfg {
                Some(json) => {
                    let mut c: EventConfig =
                        serde_json::from_str(json).map_err(|_| Malformed("a config in JSON"))?;
                    c.opening_reached = reached;
                    c.end_seen_at = seen;
                    c
                }
                None if create => EventConfig::default(),
                // Missing, or deleted since the last attempt read it: an update never
                // creates (the script's version check refuses a write over a deletion,
                // and this refuses to retry it as a creation).
                None => return Err(QueueError::EventNotFound.into()),
            };
            let config = patch.apply(event_id, &base, now)?;
            // The version the script must still find: 0 for "must not exist yet". Every
            // stored config has one of at least 1, so an update can never pass for a creation.
            let expected = match (&cfg, ver) {
                (None, _) => 0,
                (Some(_), Some(v)) if v > 0 => v,
                (Some(_), _) => return Err(Malformed("a config version").into()),
            };
            if expected == 0 {
                // Listed before it exists, so the scheduler of every node finds it.
                s.list(&mut conn, event_id).await?;
            }
            // The records of the opening and of the end go into the meta's numbers, where
            // the scripts keep them up to date; a copy in the JSON would only go stale.
            let json = serde_json::to_string(&EventConfig {
                opening_reached: None,
                end_seen_at: None,
                ..config.clone()
            })
            .expect("config serialises");
            let ms = |sec: u32| (u64::from(sec) * 1000).to_string();
            let nums = [
                expected.to_string(),
                json,
                config.capacity().to_string(),
                config.admit_per_minute.unwrap_or(0).to_string(),
                ms(config.ready_ttl_sec),
                ms(config.session_idle_sec),
                ms(config.session_max_sec),
                ms(config.waiting_idle_sec),
                config.max_queue_length.unwrap_or(0).to_string(),
                u8::from(config.paused).to_string(),
                u8::from(config.accept_joins).to_string(),
                u8::from(config.access == Access::Invite).to_string(),
                script_instant(config.opens_at),
                config.queueing_method.number().to_string(),
            ];
            let secrets = config
                .event_secret
                .map(|s| (s.shuffle_seed(), s.lottery_key()));
            let mut args: Vec<&[u8]> = nums.iter().map(|a| a.as_bytes()).collect();
            match &secrets {
                Some((seed, key)) => args.extend([&seed[..], &key[..]]),
                None => args.extend([&b""[..], &b""[..]]),
            }
            // The end of the sale (`core::lifecycle`): closes_at (ms, 0: none), ended; then
            // the record of the opening the patch was applied to, and the new one; then the
            // record of the end by closes_at it was applied to (an `end` keeps that moment).
            let end = [
                script_instant(config.closes_at),
                u8::from(config.ended.is_some()).to_string(),
                reached.unwrap_or(0).to_string(),
                config.opening_reached.unwrap_or(0).to_string(),
                seen.unwrap_or(0).to_string(),
            ];
            args.extend(end.iter().map(|a| a.as_bytes()));
            let r = s.run(event_id, "put", now, &args, None).await?;
            match &r.code[..] {
                OK => {
                    // Listed (again) now that it exists, at every change, not only a
                    // creation: a deletion of the same id whose SREM (and its check that
                    // nothing was re-created) fell between the listing above and this
                    // creation left it unlisted, so no node's scheduler or list ever saw
                    // it; and a list lost with its shard (a Cluster master back empty, a
                    // failover to a replica that missed it) is mended by a change of each
                    // event. A listed id that is gone again is skipped by the lists, as one
                    // listed just before it is created.
                    s.list(&mut conn, event_id).await?;
                    s.tell(vec![Notice::EventChanged {
                        event_id: event_id.into(),
                    }]);
                    // `{version, waiting}`: the count comes from the step that wrote.
                    let waiting = uint(field(array(&r.payload)?, 1)?)?;
                    return Ok(Configured {
                        before: base,
                        config,
                        waiting,
                    });
                }
                CONFLICT => {
                    // Another change won: a short random pause spreads the retries of many
                    // racing updates, so each gets its turn within the attempts.
                    let pause = 1 + crate::tokens::random_u128() % 4;
                    tokio::time::sleep(Duration::from_millis(pause as u64)).await;
                    continue;
                }
                SCHEDULE_LOCKED => return Err(invalid(crate::core::queue::SCHEDULE_LOCKED)),
                REOPEN_LOCKED => return Err(invalid(crate::core::lifecycle::REOPEN_LOCKED)),
                other => return Err(unexpected(other)),
            }
        }
        Err(StoreError::Unavailable(
            "the event's settings kept changing under concurrent updates".into(),
        ))
    }

    /// The stored settings (JSON), their version and the records of the opening reached
    /// and of the end by `closes_at` seen (`EventConfig::opening_reached` and
    /// `end_seen_at`, kept in the meta's numbers); `None`s when the event does not exist.
    async fn settings(
        &self,
        event_id: &str,
        now: Millis,
    ) -> StoreResult<(Option<String>, Option<u64>, Option<Millis>, Option<Millis>)> {
        let r = self.run(event_id, "settings", now, &[], None).await?;
        if r.code != OK {
            return match queue_error(&r.code) {
                Some(QueueError::EventNotFound) => Ok((None, None, None, None)),
                _ => Err(unexpected(&r.code)),
            };
        }
        let a = array(&r.payload)?;
        let ver = text(field(a, 1)?)?
            .map(|v| v.parse().map_err(|_| Malformed("a config version")))
            .transpose()?;
        let reached = uint(field(a, 2)?)?;
        let seen = uint(field(a, 3)?)?;
        Ok((
            text(field(a, 0)?)?,
            ver,
            (reached > 0).then_some(reached),
            (seen > 0).then_some(seen),
        ))
    }

    /// Adds `event_id` to the events' list every node's scheduler and lists read.
    async fn list(&self, conn: &mut super::Conn, event_id: &str) -> StoreResult<()> {
        self.bounded(
            redis::cmd("SADD")
                .arg(&self.events_key)
                .arg(event_id)
                .query_async::<i64>(conn),
        )
        .await
        .map(drop)
    }
}

/// `opens_at` or `closes_at` as the script takes it: milliseconds, 0 for none. The epoch
/// itself (`1970-01-01T00:00:00Z`, a valid setting) would read as none there, so it is
/// sent as the millisecond after it: both are long past for every clock the store runs
/// on, so the sale has opened, or ended, just as the embedded store decides it.
fn script_instant(t: Option<Millis>) -> String {
    t.map_or(0, |t| t.max(1)).to_string()
}
