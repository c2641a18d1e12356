//! Tests of `journey`.

use super::*;

fn args() -> JourneyArgs {
    JourneyArgs {
        event: "journey".into(),
        nodes: 1,
        store: "embedded".into(),
        durability: "sync".into(),
        threads: 2,
        ..JourneyArgs::default()
    }
}

fn refused(a: &JourneyArgs) -> String {
    match scenario_of(a) {
        Ok(sc) => panic!("accepted: {sc:?}"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn keep_settings_refuses_the_flags_that_only_set_the_event() {
    let a = JourneyArgs {
        keep_settings: true,
        max_active: Some(50),
        waiting_idle_sec: Some(10),
        ..args()
    };
    let e = refused(&a);
    assert!(
        e.contains("--max-active, --waiting-idle-sec cannot apply with --keep-settings"),
        "{e}"
    );
    let a = JourneyArgs {
        keep_settings: true,
        admit_per_minute: Some(60),
        ..args()
    };
    assert!(refused(&a).contains("--admit-per-minute"));
    // The crowd's flags still apply, and the event flags without --keep-settings.
    let a = JourneyArgs {
        keep_settings: true,
        users: Some(40),
        ..args()
    };
    assert_eq!(scenario_of(&a).unwrap().users, 40);
    let a = JourneyArgs {
        max_active: Some(50),
        ..args()
    };
    assert_eq!(scenario_of(&a).unwrap().max_active, 50);
}

#[test]
fn the_event_settings_read_from_the_server_replace_the_scenarios() {
    let sc = Scenario {
        max_active: 50,
        admit_per_minute: None,
        waiting_idle_sec: 6,
        ready_ttl_sec: 5,
        ..Scenario::default()
    };
    let event = serde_json::json!({
        "max_active": 5, "admit_per_minute": 60, "waiting_idle_sec": 40,
        "ready_ttl_sec": 8, "session_idle_sec": 120, "session_max_sec": 900,
        "waiting": 0,
    });
    let kept = sc.with_event_settings(&event);
    assert_eq!(
        (
            kept.max_active,
            kept.admit_per_minute,
            kept.waiting_idle_sec,
            kept.ready_ttl_sec,
            kept.session_idle_sec,
            kept.session_max_sec
        ),
        (5, Some(60), 40, 8, 120, 900)
    );
    // The end-of-run wait for ghosts goes by the event's grace, not the scenario's.
    assert_eq!(kept.ghost_wait_deadline(2.0), 2.0 + 40.0 + 8.0 + 10.0);
    // `null` is no pace; absent fields keep the scenario's.
    let paced = Scenario {
        admit_per_minute: Some(600),
        ..sc.clone()
    };
    let unpaced = paced.with_event_settings(&serde_json::json!({"admit_per_minute": null}));
    assert_eq!(unpaced.admit_per_minute, None);
    assert_eq!(unpaced.waiting_idle_sec, 6);
    assert_eq!(
        paced.with_event_settings(&Value::Null).admit_per_minute,
        Some(600)
    );
}

#[test]
fn negative_behaviour_shares_are_refused() {
    let a = JourneyArgs {
        abandon_share: Some(-0.5),
        reload_share: Some(0.5),
        ..args()
    };
    let e = refused(&a);
    assert!(
        e.contains("abandon_share must be within 0..1, not -0.5"),
        "{e}"
    );
    for (reload, netloss) in [(Some(-0.1), None), (None, Some(-0.01))] {
        let a = JourneyArgs {
            reload_share: reload,
            netloss_share: netloss,
            ..args()
        };
        refused(&a);
    }
}

#[test]
fn infinite_or_absurd_durations_are_refused_not_a_panic() {
    let cases: [(&str, JourneyArgs); 5] = [
        (
            "arrival_secs",
            JourneyArgs {
                arrival_secs: Some(f64::INFINITY),
                ..args()
            },
        ),
        (
            "tail_secs",
            JourneyArgs {
                tail_secs: Some(1e300),
                ..args()
            },
        ),
        (
            "hold_secs",
            JourneyArgs {
                hold_secs: Some(vec![1.0, f64::INFINITY]),
                ..args()
            },
        ),
        (
            "arrival_secs",
            JourneyArgs {
                arrival_secs: Some(f64::NAN),
                ..args()
            },
        ),
        // Finite, but nobody would arrive before the run ends (max_run_secs 1200).
        (
            "must end before max_run_secs",
            JourneyArgs {
                arrival_secs: Some(1000.0),
                tail_secs: Some(300.0),
                ..args()
            },
        ),
    ];
    for (what, a) in cases {
        let e = refused(&a);
        assert!(e.contains(what), "{what}: {e}");
    }
    let file = std::env::temp_dir().join(format!("journey-inf-{}.toml", std::process::id()));
    std::fs::write(&file, "max_run_secs = inf\n").unwrap();
    let e = refused(&JourneyArgs {
        scenario: Some(file.clone()),
        ..args()
    });
    let _ = std::fs::remove_file(&file);
    assert!(e.contains("max_run_secs"), "{e}");
    // The shipped scenarios pass.
    for f in ["standard", "steady", "sellout"] {
        let a = JourneyArgs {
            scenario: Some(
                Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("bench/journey/{f}.toml")),
            ),
            ..args()
        };
        scenario_of(&a).unwrap();
    }
}

/// A server that fails to start: the error names its log, which must still be there
/// (the temp dir is removed, but the logs are kept) and is quoted in the error.
#[tokio::test]
async fn a_server_that_does_not_start_leaves_its_log_where_the_error_says() {
    let a = JourneyArgs {
        bin: Some("/bin/true".into()),
        ..args()
    };
    let e = match Setup::new(&a).await {
        Ok(_) => panic!("/bin/true served"),
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains("did not print its address"), "{e}");
    let log = e
        .split_whitespace()
        .find(|w| w.ends_with(".server.log"))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no log named: {e}"));
    let dir = log.parent().unwrap().to_path_buf();
    let exists = log.exists();
    let left: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(exists, "{} is gone: {e}", log.display());
    // Only the log: the signing key and the data are removed as ever.
    assert_eq!(left, vec!["node-0.server.log".to_string()], "{e}");
}
