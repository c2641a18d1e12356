use super::*;

fn failed() -> std::io::Result<SignalFuture> {
    Err(std::io::Error::other("no handler"))
}

/// A handler that fires when the answered sender sends.
fn handler() -> (
    tokio::sync::oneshot::Sender<()>,
    std::io::Result<SignalFuture>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    (
        tx,
        Ok(Box::pin(async move {
            let _ = rx.await;
        })),
    )
}

async fn resolves(f: impl Future<Output = ()>) -> bool {
    tokio::time::timeout(Duration::from_millis(100), f)
        .await
        .is_ok()
}

#[tokio::test(start_paused = true)]
async fn a_failed_handler_does_not_drop_the_other() {
    // SIGINT failed, SIGTERM installed: SIGTERM still shuts down gracefully.
    let (term, ok) = handler();
    let wait = first_signal(vec![("SIGTERM", ok), ("SIGINT", failed())]);
    term.send(()).unwrap();
    assert!(resolves(wait).await);

    // And the other way round.
    let (int, ok) = handler();
    let wait = first_signal(vec![("SIGTERM", failed()), ("SIGINT", ok)]);
    int.send(()).unwrap();
    assert!(resolves(wait).await);
}

#[tokio::test(start_paused = true)]
async fn waits_for_a_signal_and_forever_without_handlers() {
    let (_term, ok) = handler();
    let (int, ok2) = handler();
    let mut wait = Box::pin(first_signal(vec![("SIGTERM", ok), ("SIGINT", ok2)]));
    assert!(!resolves(wait.as_mut()).await, "nothing fired yet");
    int.send(()).unwrap();
    assert!(resolves(wait).await);
    assert!(
        !resolves(first_signal(vec![
            ("SIGTERM", failed()),
            ("SIGINT", failed())
        ]))
        .await
    );
}

/// `OnWake` polls its future at first and then only after the future's own waker
/// fired: the task's other wake-ups pass it by, and none of its own is lost.
#[test]
fn on_wake_polls_only_when_its_future_was_woken() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Waker};
    let polls = AtomicUsize::new(0);
    let kept: parking_lot::Mutex<Option<Waker>> = parking_lot::Mutex::new(None);
    let mut f = std::pin::pin!(std::future::poll_fn(|cx| {
        polls.fetch_add(1, Ordering::SeqCst);
        *kept.lock() = Some(cx.waker().clone());
        Poll::<()>::Pending
    }));
    struct Count(AtomicUsize);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let task = Arc::new(Count(AtomicUsize::new(0)));
    let task_waker = Waker::from(task.clone());
    let on = OnWake::new();
    let mut cx = Context::from_waker(&task_waker);
    for _ in 0..5 {
        assert!(on.poll(f.as_mut(), &mut cx).is_pending());
    }
    assert_eq!(polls.load(Ordering::SeqCst), 1, "polled once, at first");
    kept.lock().take().unwrap().wake();
    assert_eq!(
        task.0.load(Ordering::SeqCst),
        1,
        "its wake-up wakes the task"
    );
    assert!(on.poll(f.as_mut(), &mut cx).is_pending());
    assert!(on.poll(f.as_mut(), &mut cx).is_pending());
    assert_eq!(
        polls.load(Ordering::SeqCst),
        2,
        "once more after its wake-up"
    );
}

#[test]
fn a_cap_that_does_not_fit_in_the_descriptor_limit_is_warned_about() {
    // The default cap fits beside the descriptors open (down to its floor of 16).
    for limit in [64, 256, 1024, 65_536] {
        for open in [0, 15, 30, limit / 2] {
            let cap = default_for(limit, open);
            assert!(cap <= limit / 4 * 3, "{limit} {open}");
            if cap > 16 {
                assert!(!check_descriptor_room(cap, limit, open), "{limit} {open}");
            }
        }
    }
    assert_eq!(default_for(1024, 15), 768);
    assert_eq!(default_for(64, 15), 33);
    assert!(check_descriptor_room(1_000, 256, 20));
    assert!(check_descriptor_room(256, 256, 20));
    // The descriptors open count whole (defect: they were capped with the headroom at a
    // quarter of the limit, so 48 under a limit of 64 with 15 open, and 75 under 100, went
    // unwarned, and the process ran out of descriptors).
    assert!(check_descriptor_room(48, 64, 15));
    assert!(check_descriptor_room(75, 100, 15));
    // Beside a large limit, the descriptors open and the headroom are what is kept.
    assert!(!check_descriptor_room(65_000, 65_536, 30));
    assert!(check_descriptor_room(65_500, 65_536, 30));
}
