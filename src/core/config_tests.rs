use super::*;

fn patch(json: &str) -> EventPatch {
    serde_json::from_str(json).unwrap()
}

#[test]
fn null_clears_and_absent_keeps() {
    let base = EventConfig {
        admit_per_minute: Some(10),
        ..EventConfig::default()
    };
    let kept = patch("{}").apply("e", &base, 0).unwrap();
    assert_eq!(kept.admit_per_minute, Some(10));
    let cleared = patch(r#"{"admit_per_minute": null}"#)
        .apply("e", &base, 0)
        .unwrap();
    assert_eq!(cleared.admit_per_minute, None);
}

#[test]
fn validation_rejects_out_of_range() {
    let base = EventConfig::default();
    for bad in [
        r#"{"max_active": 0}"#,
        r#"{"overbooking_ratio": 0.5}"#,
        r#"{"overbooking_ratio": 11}"#,
        r#"{"ready_ttl_sec": 0}"#,
        r#"{"admit_per_minute": 0}"#,
        r#"{"target_url": "javascript:alert(1)"}"#,
        r#"{"target_url": "//evil.example/book"}"#,
        r#"{"target_url": "/\\evil.example"}"#,
        r#"{"event_id": "other"}"#,
        r#"{"user_token_secret": "too short"}"#,
        r#"{"user_token_public_key": "not a key"}"#,
        r#"{"require_user_token": true}"#,
        r#"{"access": "friends"}"#,
        r#"{"pow_difficulty": 29}"#,
        r#"{"pow_auto_above": 0}"#,
        r#"{"rate_limits": {"joins_per_minute": 0}}"#,
        r#"{"rate_limits": {"polls_per_second": 100000001}}"#,
        r#"{"opens_at": "2026-12-01"}"#,
        r#"{"opens_at": "soon"}"#,
        r#"{"opens_at": 1700000000}"#,
        r#"{"queueing_method": "lifo"}"#,
        r#"{"closes_at": "tomorrow"}"#,
        r#"{"closes_at": 1795395600}"#,
    ] {
        let refused = serde_json::from_str::<EventPatch>(bad)
            .map_or(true, |p| p.apply("e", &base, 0).is_err());
        assert!(refused, "{bad} accepted");
    }
    assert!(serde_json::from_str::<EventPatch>(r#"{"max_activ": 3}"#).is_err());
    // The end and the announcement have their own calls: a settings body cannot set them.
    assert!(serde_json::from_str::<EventPatch>(r#"{"end": {"reason": "closed"}}"#).is_err());
    assert!(serde_json::from_str::<EventPatch>(r#"{"announcement": null}"#).is_err());
    assert!(serde_json::from_str::<EventPatch>(r#"{"rate_limits": {"joins": 3}}"#).is_err());
    // Nested settings are objects: serde would read an array field by field (`[7, 3]`
    // as both limits), and an empty one as "nothing set", which clears the setting.
    for bad in [
        r#"{"rate_limits": [7, 3]}"#,
        r#"{"rate_limits": []}"#,
        r#"{"title": ["x"]}"#,
        r#"{"headline": ["ko", "en"]}"#,
        r#"{"note": []}"#,
        r#"{"turn_message": "x"}"#,
        r#"{"note": 3}"#,
    ] {
        assert!(
            serde_json::from_str::<EventPatch>(bad).is_err(),
            "{bad} read"
        );
    }
    // `null` clears a nullable setting only; elsewhere it is a value of the wrong type,
    // not "left out".
    for field in [
        "event_id",
        "name",
        "max_active",
        "overbooking_ratio",
        "ready_ttl_sec",
        "session_idle_sec",
        "session_max_sec",
        "waiting_idle_sec",
        "paused",
        "accept_joins",
        "require_user_token",
        "access",
        "pow_difficulty",
        "queueing_method",
        "paths",
        "hosts",
        "bypass_paths",
        "bypass_cidrs",
        "hold_ttl_sec",
        "max_holds_per_session",
        "session_extend_sec",
        "max_extensions",
    ] {
        let bad = format!(r#"{{"{field}": null}}"#);
        assert!(
            serde_json::from_str::<EventPatch>(&bad).is_err(),
            "{bad} read"
        );
    }
    let p = patch(r#"{"rate_limits": {"joins_per_minute": 7}, "note": null}"#);
    assert_eq!(p.note, Some(None), "null still clears");
    assert_eq!(
        p.rate_limits,
        Some(Some(RateLimits {
            joins_per_minute: Some(7),
            polls_per_second: None
        }))
    );
    // A format that is not human-readable (postcard) reads a nested struct as it is.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Inner {
        a: u32,
        b: Option<String>,
    }
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Outer {
        #[serde(deserialize_with = "object")]
        one: Inner,
        #[serde(deserialize_with = "optional_object")]
        two: Option<Inner>,
    }
    let o = Outer {
        one: Inner { a: 4, b: None },
        two: Some(Inner {
            a: 5,
            b: Some("x".into()),
        }),
    };
    let bytes = postcard::to_stdvec(&o).unwrap();
    assert_eq!(postcard::from_bytes::<Outer>(&bytes).unwrap(), o);
    let json = serde_json::to_string(&o).unwrap();
    assert_eq!(serde_json::from_str::<Outer>(&json).unwrap(), o);
    assert!(serde_json::from_str::<Outer>(r#"{"one": [4, null], "two": null}"#).is_err());
    assert!(serde_json::from_str::<EventPatch>(r#"{"max_active": -3}"#).is_err());
    assert!(EventPatch::default().apply("bad id!", &base, 0).is_err());
    assert!(EventPatch::default()
        .apply(&"x".repeat(65), &base, 0)
        .is_err());
}

/// Everyone admitted is sent to `target_url`: a URL without a host or with a port no
/// connection can use is refused, not stored.
#[test]
fn a_target_url_names_a_host() {
    let base = EventConfig::default();
    for bad in [
        "https://[::1]:99999/",
        "https://example.com:0/",
        "https://example.com:65536/",
        "http://",
        "https://",
        "http:///x",
        "https:////example.com/",
        "http://:80/",
        "http://?x",
        "http://#x",
        // Shown to everyone (defect: accepted, and the public read gave the password out).
        "https://staff:pw@tickets.example.com/book",
        "https://staff@tickets.example.com/book",
    ] {
        let json = serde_json::json!({ "target_url": bad }).to_string();
        match patch(&json).apply("e", &base, 0) {
            Err(QueueError::Invalid(m)) => {
                assert!(m.starts_with("target_url must be"), "{bad}: {m}")
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    for ok in [
        "https://tickets.example.com/book",
        "http://example.com:8080",
        "https://[::1]:65535/x?y#z",
        "https://192.0.2.7:1/",
        "/book?from=queue",
    ] {
        let json = serde_json::json!({ "target_url": ok }).to_string();
        let c = patch(&json).apply("e", &base, 0).unwrap();
        assert_eq!(c.target_url.as_deref(), Some(ok), "stored as written");
    }
}

#[test]
fn a_schedule_gets_a_secret_that_stays() {
    let base = EventConfig::default();
    let plain = patch(r#"{"queueing_method": "reject"}"#)
        .apply("e", &base, 0)
        .unwrap();
    assert_eq!(plain.event_secret, None, "no secret without a use for it");
    let mut p = patch(r#"{"opens_at": "2026-12-01T10:00:00+09:00"}"#);
    p.fresh_secret = Some([3; 32]);
    let c = p.apply("e", &base, 0).unwrap();
    assert_eq!(c.opens_at, Some(1_796_086_800_000));
    assert_eq!(c.event_secret, Some(EventSecret([3; 32])));
    let mut again = patch(r#"{"opens_at": null, "queueing_method": "random"}"#);
    again.fresh_secret = Some([4; 32]);
    let c = again.apply("e", &c, 0).unwrap();
    assert_eq!(c.opens_at, None);
    assert_eq!(c.event_secret, Some(EventSecret([3; 32])), "kept once made");
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(serde_json::from_str::<EventConfig>(&json).unwrap(), c);
}

/// A second opening must not reuse a secret whose seed the first one published; a
/// postponed opening keeps its secret (its commitment is out).
#[test]
fn a_new_prequeue_gets_a_new_secret() {
    let opens = 1_796_086_800_000; // 2026-12-01T01:00:00Z
    let mut first = patch(r#"{"opens_at": "2026-12-01T10:00:00+09:00"}"#);
    first.fresh_secret = Some([3; 32]);
    let c = first.apply("e", &EventConfig::default(), 0).unwrap();
    let mut later = patch(r#"{"opens_at": "2026-12-02T10:00:00+09:00"}"#);
    later.fresh_secret = Some([4; 32]);
    // Postponed before the opening: kept.
    let postponed = later.apply("e", &c, opens - 1).unwrap();
    assert_eq!(postponed.event_secret, Some(EventSecret([3; 32])));
    // After the opening (its seed published): a new one.
    let again = later.apply("e", &c, opens).unwrap();
    assert_eq!(again.event_secret, Some(EventSecret([4; 32])));
    // Cleared after the opening, then set ahead again: a new one too.
    let cleared = patch(r#"{"opens_at": null}"#)
        .apply("e", &c, opens + 1)
        .unwrap();
    assert_eq!(cleared.event_secret, Some(EventSecret([3; 32])));
    let again = later.apply("e", &cleared, opens + 1).unwrap();
    assert_eq!(again.event_secret, Some(EventSecret([4; 32])));
    // Other settings of an opened event leave it alone.
    let renamed = patch(r#"{"name": "x"}"#).apply("e", &c, opens + 1).unwrap();
    assert_eq!(renamed.event_secret, Some(EventSecret([3; 32])));
}

/// The ratio is checked and multiplied as written; a ratio with more digits than an
/// `f64` keeps is refused, not rounded into the range or into a larger capacity.
#[test]
fn a_ratio_is_taken_as_written() {
    let base = EventConfig::default();
    for (json, want) in [
        (r#"{"overbooking_ratio": 1}"#, 1.0),
        (r#"{"overbooking_ratio": 10.0}"#, 10.0),
        (r#"{"overbooking_ratio": 1.15000000000000000000}"#, 1.15),
        (r#"{"overbooking_ratio": 115e-2}"#, 1.15),
        (r#"{"overbooking_ratio": 0.0115E2}"#, 1.15),
        (
            r#"{"overbooking_ratio": 1.99999999999999}"#,
            1.99999999999999,
        ),
        (
            r#"{"overbooking_ratio": 9.99999999999999}"#,
            9.99999999999999,
        ),
    ] {
        let c = patch(json).apply("e", &base, 0).unwrap();
        assert_eq!(c.overbooking_ratio, want, "{json}");
    }
    for json in [
        r#"{"overbooking_ratio": 0.99999999999999999999}"#,
        r#"{"overbooking_ratio": 10.0000000000000001}"#,
        r#"{"overbooking_ratio": 1.9999999999999999999}"#,
        r#"{"overbooking_ratio": 1.0000000000000001}"#,
    ] {
        let e = serde_json::from_str::<EventPatch>(json).unwrap_err();
        assert!(
            e.to_string().contains("at most 15 significant digits"),
            "{json}: {e}"
        );
    }
    for json in [
        r#"{"overbooking_ratio": 0.999999999999999}"#,
        r#"{"overbooking_ratio": 10.0000000000001}"#,
    ] {
        assert!(patch(json).apply("e", &base, 0).is_err(), "{json}");
    }
    // A double's own shortest form is that double exactly, however many digits: what
    // the admin form sends back for a ratio stored earlier, or computed.
    for (json, want) in [
        (r#"{"overbooking_ratio": 1.2100000000000002}"#, 1.1 * 1.1),
        (r#"{"overbooking_ratio": 12100000000000002e-16}"#, 1.1 * 1.1),
        // Shortest forms a fast decimal reader lands a unit off (they were refused).
        (
            r#"{"overbooking_ratio": 1.9999999999999998}"#,
            2.0 - f64::EPSILON,
        ),
        (
            r#"{"overbooking_ratio": 1.0999999999999999}"#,
            1.1 - f64::EPSILON,
        ),
        (
            r#"{"overbooking_ratio": 1.0000000000000007}"#,
            1.0 + 3.0 * f64::EPSILON,
        ),
    ] {
        let c = patch(json).apply("e", &base, 0).unwrap();
        assert_eq!(c.overbooking_ratio.to_bits(), f64::to_bits(want), "{json}");
    }
    for json in [
        r#"{"overbooking_ratio": "1.5"}"#,
        r#"{"overbooking_ratio": null}"#,
        r#"{"overbooking_ratio": [1.5]}"#,
    ] {
        let e = serde_json::from_str::<EventPatch>(json).unwrap_err();
        assert!(e.to_string().starts_with("invalid type"), "{json}: {e}");
    }
    // 15 digits keep the capacity exact: 10^8 × 1.99999999999999 is 199999999.999999.
    let c = patch(r#"{"max_active": 100000000, "overbooking_ratio": 1.99999999999999}"#)
        .apply("e", &base, 0)
        .unwrap();
    assert_eq!(c.capacity(), 199_999_999);
    // A stored ratio reads back as it was written.
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(serde_json::from_str::<EventConfig>(&json).unwrap(), c);
}

/// The name reaches the pages like the other texts and refuses control characters as
/// they do; a name stored before that still reads, and other settings still change.
#[test]
fn a_name_has_no_control_characters() {
    let base = EventConfig::default();
    for name in [
        "A\u{0}B",
        "A\u{1b}[31mC",
        "two\nlines",
        "tab\there",
        "c1\u{85}",
    ] {
        let json = serde_json::json!({ "name": name }).to_string();
        match patch(&json).apply("e", &base, 0) {
            Err(QueueError::Invalid(m)) => {
                assert_eq!(m, "name must not contain control characters", "{name:?}")
            }
            other => panic!("{name:?}: {other:?}"),
        }
    }
    let c = patch(r#"{"name": "Spring concert 봄"}"#)
        .apply("e", &base, 0)
        .unwrap();
    assert_eq!(c.name, "Spring concert 봄");
    let old = EventConfig {
        name: "A\u{0}B\u{1b}[31mC\nD".into(),
        ..EventConfig::default()
    };
    let stored = serde_json::to_string(&old).unwrap();
    let read: EventConfig = serde_json::from_str(&stored).unwrap();
    assert_eq!(read, old);
    let paused = patch(r#"{"paused": true}"#).apply("e", &read, 0).unwrap();
    assert_eq!(paused.name, old.name);
    // The admin form sends the stored name back with every save: still accepted.
    let resent = serde_json::json!({ "name": old.name, "paused": true }).to_string();
    let saved = patch(&resent).apply("e", &read, 0).unwrap();
    assert!(saved.paused);
}

/// A `target_url` with a user and password, stored before such URLs were refused, is let
/// through when sent back unchanged (defect: the admin form sends every field, so every
/// save of such an event was refused until the URL was fixed); a new one is still refused.
#[test]
fn a_stored_target_url_from_before_its_rule_is_accepted_unchanged() {
    let old = EventConfig {
        target_url: Some("https://user:secret@shop.example.com/buy".into()),
        ..EventConfig::default()
    };
    let resent = serde_json::json!({ "target_url": old.target_url, "paused": true }).to_string();
    let saved = patch(&resent).apply("e", &old, 0).unwrap();
    assert!(saved.paused);
    assert_eq!(saved.target_url, old.target_url);
    for changed in [
        "https://user:other@shop.example.com/buy",
        "https://user@shop.example.com/buy",
    ] {
        let body = serde_json::json!({ "target_url": changed }).to_string();
        assert!(
            patch(&body).apply("e", &old, 0).is_err(),
            "{changed} is a new value: checked"
        );
    }
    let fixed = patch(r#"{"target_url": "https://shop.example.com/buy"}"#)
        .apply("e", &old, 0)
        .unwrap();
    assert_eq!(
        fixed.target_url.as_deref(),
        Some("https://shop.example.com/buy")
    );
}

#[test]
fn capacity_floors_the_product() {
    let c = EventConfig {
        max_active: 10,
        overbooking_ratio: 1.25,
        ..EventConfig::default()
    };
    assert_eq!(c.capacity(), 12);
}

/// The product is exact for the ratio as written: in floating point 100 × 1.15 is
/// 114.99999999999999, whose floor would lose a slot.
#[test]
fn capacity_is_exact_for_the_written_ratio() {
    let cap = |max_active, overbooking_ratio| {
        EventConfig {
            max_active,
            overbooking_ratio,
            ..EventConfig::default()
        }
        .capacity()
    };
    for (m, r, want) in [
        (100, 1.15, 115),
        (100, 1.13, 113),
        (1000, 1.001, 1001),
        (100, 2.3, 230),
        (50, 1.14, 57),
        (3, 1.5, 4),
        (7, 1.0, 7),
        (1, 1.0, 1),
        (u32::MAX, 10.0, 42_949_672_950),
        (u32::MAX, 1.1, 4_724_464_024),
        (10, 1.0999, 10),
        (123_456, 1.234_567, 152_414),
        // Whole ratios, and products that land on an integer.
        (100, 2.0, 200),
        (u32::MAX, 2.0, 8_589_934_590),
        (u32::MAX, 9.0, 38_654_705_655),
        (1, 10.0, 10),
        (4, 1.25, 5),
        (8, 1.125, 9),
        (1_000_000, 1.000_001, 1_000_001),
        (999_999, 1.000_001, 999_999),
    ] {
        assert_eq!(cap(m, r), want, "{m} × {r}");
    }
    // Against the exact product of many written ratios.
    for m in [1u32, 7, 50, 100, 999, 1000, 12_345, 4_000_000_000] {
        for hundredths in 100..=1000u64 {
            let r: f64 = format!("{}.{:02}", hundredths / 100, hundredths % 100)
                .parse()
                .unwrap();
            assert_eq!(cap(m, r), u64::from(m) * hundredths / 100, "{m} × {r}");
        }
    }
}

/// A ratio whose shortest form has more than 15 digits (a stored or computed one sent back
/// as it reads) is multiplied as that decimal too, though its `f64` product rounds to the
/// next integer: 3 × 1.3333333333333333 is 3.9999999999999999, which is 4.0 in an `f64`.
#[test]
fn capacity_is_exact_for_a_long_shortest_form() {
    let cap = |json: &str| {
        patch(json)
            .apply("e", &EventConfig::default(), 0)
            .unwrap()
            .capacity()
    };
    for (json, want) in [
        (
            r#"{"max_active": 3, "overbooking_ratio": 1.3333333333333333}"#,
            3,
        ),
        (
            r#"{"max_active": 7, "overbooking_ratio": 1.1428571428571428}"#,
            7,
        ),
        (
            r#"{"max_active": 6, "overbooking_ratio": 1.1666666666666667}"#,
            7,
        ),
        (
            r#"{"max_active": 100, "overbooking_ratio": 1.2100000000000002}"#,
            121,
        ),
        (r#"{"max_active": 100, "overbooking_ratio": 1.15}"#, 115),
    ] {
        assert_eq!(cap(json), want, "{json}");
    }
}

/// floor(`m` × `r`) for `r` taken as its shortest decimal (`Display`), in integers.
fn exact_capacity(m: u32, r: f64) -> u64 {
    let text = r.to_string();
    assert!(!text.contains('e'), "{text}");
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let digits: u128 = format!("{int}{frac}").parse().unwrap();
    let scale = 10u128.pow(frac.len() as u32);
    u64::try_from(u128::from(m) * digits / scale).unwrap()
}

proptest::proptest! {
    /// Against exact decimal arithmetic, for ratios near n / m (the `f64` product then lies
    /// next to an integer, and the shortest form is often 16 or 17 digits), a few ulps
    /// either side, for any ratio in the range, for whole ratios, and for ratios written
    /// with 0 to 9 decimals (to 6 they are multiplied without being formatted).
    #[test]
    fn capacity_is_the_floor_of_the_decimal_product(
        m in proptest::prop_oneof![1u32..=1000, 1u32..=100_000_000, proptest::num::u32::ANY],
        tenths in 10u64..=100,
        nudge in -3i64..=3,
        any_ratio in 1.0f64..=10.0,
        whole in 1u32..=10,
        decimals in 0u32..=9,
        digits in proptest::num::u64::ANY,
    ) {
        let m = m.max(1);
        // n / m for a whole n in [m, 10 m] close to m × tenths / 10.
        let n = (u64::from(m) * tenths / 10).clamp(u64::from(m), 10 * u64::from(m));
        let near = n as f64 / f64::from(m);
        let nudged = f64::from_bits(near.to_bits().wrapping_add_signed(nudge));
        // v / 10^decimals in [1, 10], as JSON would carry it.
        let unit = 10u64.pow(decimals);
        let v = unit + digits % (9 * unit + 1);
        let written: f64 = format!("{v}e-{decimals}").parse().unwrap();
        for r in [near, nudged, any_ratio, f64::from(whole), written] {
            if !(1.0..=10.0).contains(&r) {
                continue;
            }
            let c = EventConfig { max_active: m, overbooking_ratio: r, ..EventConfig::default() };
            proptest::prop_assert_eq!(c.capacity(), exact_capacity(m, r).max(1), "{} × {}", m, r);
        }
    }
}

/// A sale cannot end before it opens: `closes_at` at or before `opens_at` is refused,
/// whether the change sets both or one against the other's stored value, with a message
/// naming both. A pair stored before the rule does not block other changes.
#[test]
fn a_sale_closes_after_it_opens() {
    let base = EventConfig::default();
    let refused = |json: &str, base: &EventConfig| match patch(json).apply("e", base, 0) {
        Err(QueueError::Invalid(m)) => {
            assert!(m.contains("closes_at") && m.contains("opens_at"), "{m}");
            assert!(m.contains("2026-12-01T01:00:00Z"), "{m}");
        }
        other => panic!("{json}: {other:?}"),
    };
    for json in [
        r#"{"opens_at": "2026-12-01T10:00:00+09:00", "closes_at": "2026-12-01T00:30:00Z"}"#,
        r#"{"opens_at": "2026-12-01T10:00:00+09:00", "closes_at": "2026-12-01T01:00:00Z"}"#,
    ] {
        refused(json, &base);
    }
    let both = patch(
        r#"{"opens_at": "2026-12-01T10:00:00+09:00", "closes_at": "2026-12-01T01:00:00.001Z"}"#,
    )
    .apply("e", &base, 0)
    .unwrap();
    assert_eq!(both.closes_at, Some(1_796_086_800_001));
    // One against the other's stored value, either way round.
    refused(r#"{"closes_at": "2026-12-01T01:00:00Z"}"#, &both);
    let closing = patch(r#"{"closes_at": "2026-12-01T01:00:00Z"}"#)
        .apply("e", &base, 0)
        .unwrap();
    refused(r#"{"opens_at": "2026-12-01T10:00:00+09:00"}"#, &closing);
    // Either one alone, or cleared, is fine.
    patch(r#"{"opens_at": null}"#).apply("e", &both, 0).unwrap();
    // A pair stored before the rule: other settings still change, and the admin form
    // that sends the pair back unchanged still saves.
    let old = EventConfig {
        opens_at: Some(1_796_086_800_000),
        closes_at: Some(1_796_000_000_000),
        ..EventConfig::default()
    };
    patch(r#"{"paused": true}"#).apply("e", &old, 0).unwrap();
    patch(r#"{"opens_at": "2026-12-01T01:00:00Z", "closes_at": "2026-11-30T00:53:20Z", "paused": true}"#)
        .apply("e", &old, 0)
        .unwrap();
}

/// `waiting_idle_sec` starts at 3: polls come at least 1 s apart, and a place polling as
/// told must have three of them in its idle period. A shorter period stored before that
/// still reads, and the admin form that sends it back unchanged still saves.
#[test]
fn the_waiting_idle_period_holds_three_polls() {
    let base = EventConfig::default();
    for v in [0, 1, 2] {
        let json = format!(r#"{{"waiting_idle_sec": {v}}}"#);
        match patch(&json).apply("e", &base, 0) {
            Err(QueueError::Invalid(m)) => {
                assert!(
                    m.starts_with("waiting_idle_sec must be between 3 and"),
                    "{m}"
                )
            }
            other => panic!("{v}: {other:?}"),
        }
    }
    let c = patch(r#"{"waiting_idle_sec": 3}"#)
        .apply("e", &base, 0)
        .unwrap();
    assert_eq!(c.waiting_idle_sec, 3);
    let t = crate::core::view::Timeouts::of(&c);
    assert_eq!(crate::core::view::poll_after_sec(Some(1000), None, &t), 1);

    let old = EventConfig {
        waiting_idle_sec: 1,
        ..EventConfig::default()
    };
    let read: EventConfig = serde_json::from_str(&serde_json::to_string(&old).unwrap()).unwrap();
    assert_eq!(read.waiting_idle_sec, 1);
    let paused = patch(r#"{"paused": true}"#).apply("e", &read, 0).unwrap();
    assert_eq!(paused.waiting_idle_sec, 1);
    let resent = patch(r#"{"waiting_idle_sec": 1, "paused": true}"#)
        .apply("e", &read, 0)
        .unwrap();
    assert!(resent.paused);
    // Changed, it must meet the bound: 2 is refused there too.
    assert!(patch(r#"{"waiting_idle_sec": 2}"#)
        .apply("e", &read, 0)
        .is_err());
}

/// A `hosts` entry no request can carry, stored before such entries were refused, does not
/// block other changes (pause, the admin form sending every field back); a new one is
/// refused.
#[test]
fn hosts_stored_before_their_check_do_not_block_other_changes() {
    let mut base = EventConfig::default();
    base.gate.paths = vec!["/buy".into()];
    base.gate.hosts = vec![".shop.example".into()];
    let paused = patch(r#"{"paused": true}"#).apply("e", &base, 0).unwrap();
    assert!(paused.paused);
    let resent = patch(r#"{"hosts": [".shop.example"], "paused": false}"#)
        .apply("e", &base, 0)
        .unwrap();
    assert_eq!(resent.gate.hosts, [".shop.example"]);
    assert!(patch(r#"{"hosts": [".shop.example", "..x"]}"#)
        .apply("e", &base, 0)
        .is_err());
}
