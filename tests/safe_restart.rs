//! Safe restart through `waitroom::server::run` (in-process, port 0): a store that holds
//! places refuses to start when its signing key went missing or was swapped, unless
//! repairing; the data dir and its files are private.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use waitroom::config::Settings;

#[cfg(unix)]
#[path = "support/private.rs"]
mod private;

const ADMIN: &str = "restart-admin";

/// A generated admin token is kept (owner-only) in the data dir and survives a restart.
#[tokio::test]
async fn a_generated_admin_token_is_kept_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let generated = || Settings {
        admin_token: None,
        ..settings(&data, false)
    };
    let works = |token: String| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(waitroom::server::run(generated(), listener, async move {
            let _ = rx.await;
        }));
        let c = reqwest::Client::new();
        let mut status = None;
        for _ in 0..250 {
            if let Ok(r) = c
                .get(format!("{base}/api/v1/admin/events"))
                .bearer_auth(&token)
                .send()
                .await
            {
                status = Some(r.status());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = tx.send(());
        done.await.unwrap().unwrap();
        status
    };
    // First start: nothing kept yet, so a token is made and kept.
    assert_eq!(
        works("nope".into()).await,
        Some(reqwest::StatusCode::UNAUTHORIZED)
    );
    let kept = std::fs::read_to_string(data.join("admin-token")).unwrap();
    assert_eq!(kept.len(), 64);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(data.join("admin-token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // After a restart the same token still opens the admin API.
    assert_eq!(works(kept.clone()).await, Some(reqwest::StatusCode::OK));
    assert_eq!(
        std::fs::read_to_string(data.join("admin-token")).unwrap(),
        kept
    );
    // A kept token edited by hand is checked as a configured one is: the start is refused,
    // naming the file, rather than a token with a space accepted.
    std::fs::write(data.join("admin-token"), "my token\n").unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let started = waitroom::server::run(generated(), listener, std::future::pending());
    let err = tokio::time::timeout(Duration::from_secs(20), started)
        .await
        .expect("started and served with an admin token that has a space")
        .expect_err("started with an admin token that has a space");
    let err = format!("{err:#}");
    assert!(
        err.contains("admin-token") && err.contains("printable ASCII"),
        "{err}"
    );
}

fn settings(dir: &Path, repair: bool) -> Settings {
    Settings {
        data_dir: dir.to_path_buf(),
        admin_token: Some(ADMIN.into()),
        demo: false,
        repair,
        ..Settings::default()
    }
}

/// Runs a server on `dir` with `f` given its base URL, then stops it; answers the error of
/// a server that refused to start instead.
async fn with_server<F, Fut>(dir: &Path, repair: bool, f: F) -> Result<(), String>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let mut done = tokio::spawn(waitroom::server::run(
        settings(dir, repair),
        listener,
        async move {
            let _ = rx.await;
        },
    ));
    // Started, or refused?
    let client = reqwest::Client::new();
    loop {
        if done.is_finished() {
            return Err(format!("{:#}", done.await.unwrap().unwrap_err()));
        }
        if client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f(base).await;
    let _ = tx.send(());
    tokio::time::timeout(Duration::from_secs(10), &mut done)
        .await
        .expect("server stops")
        .unwrap()
        .expect("clean shutdown");
    Ok(())
}

async fn seed(base: String) {
    let c = reqwest::Client::new();
    let r = c
        .put(format!("{base}/api/v1/admin/events/show"))
        .bearer_auth(ADMIN)
        .json(&json!({"max_active": 1}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    for u in ["a", "b", "c"] {
        let r = c
            .post(format!("{base}/api/v1/queue/join"))
            .json(&json!({"event_id": "show", "user_id": u}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
}

async fn nothing(_: String) {}

#[tokio::test]
async fn a_lost_signing_key_refuses_to_start_over_places() {
    let dir = tempfile::tempdir().unwrap();
    with_server(dir.path(), false, seed).await.unwrap();
    let key = dir.path().join("signing-key.pem");
    let original = std::fs::read(&key).unwrap();
    std::fs::remove_file(&key).unwrap();
    let err = with_server(dir.path(), false, nothing).await.unwrap_err();
    assert!(
        err.contains("3 places") && err.contains("signing-key.pem") && err.contains("missing"),
        "{err}"
    );
    assert!(!key.exists(), "no key was generated by the refused start");
    // The original key back: a normal start.
    std::fs::write(&key, &original).unwrap();
    with_server(dir.path(), false, nothing).await.unwrap();

    // A different key under the same name is refused too.
    let other = tempfile::tempdir().unwrap();
    with_server(other.path(), false, nothing).await.unwrap();
    std::fs::copy(other.path().join("signing-key.pem"), &key).unwrap();
    let err = with_server(dir.path(), false, nothing).await.unwrap_err();
    assert!(err.contains("fingerprint"), "{err}");

    // --repair continues with the key in use, and records it.
    with_server(dir.path(), true, nothing).await.unwrap();
    with_server(dir.path(), false, nothing).await.unwrap();
}

#[tokio::test]
async fn an_empty_store_may_get_a_new_key() {
    let dir = tempfile::tempdir().unwrap();
    with_server(dir.path(), false, nothing).await.unwrap();
    std::fs::remove_file(dir.path().join("signing-key.pem")).unwrap();
    with_server(dir.path(), false, nothing).await.unwrap();
}

#[cfg(unix)]
#[tokio::test]
async fn the_data_dir_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    with_server(&data, false, seed).await.unwrap();
    let files = private::assert_private_tree(&data);
    assert!(files >= 4, "only {files} files");
}

/// Two processes on one data dir would both check and write the same journal: the second
/// is refused at once, saying so, before it reads anything.
#[tokio::test]
async fn a_second_server_on_the_same_data_dir_is_refused_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let again = data.clone();
    with_server(&data, false, |_| async move {
        let err = with_server(&again, false, |_| async {}).await.unwrap_err();
        assert!(
            err.contains("is in use by another waitroom process"),
            "{err}"
        );
        assert!(!err.contains("Locked"), "{err}");
    })
    .await
    .unwrap();
    // Once the first has stopped, the data dir is free again.
    with_server(&data, false, |_| async {}).await.unwrap();
}
