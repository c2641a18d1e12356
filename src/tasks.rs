//! Plumbing for background tasks: a stop signal, a spawn helper that names each task, and
//! [`Tasks`], a named set of tasks that is stopped and joined as one.
//!
//! It sits below every module that runs a task (the scheduler, the live hub, the demo
//! crowd, the gauge upkeep) and imports nothing from the crate, so none of them has to
//! import another to share it.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

/// Tells background tasks to stop: they end when it turns `true`, or when its sender is
/// dropped (so a forgotten sender cannot leave tasks running).
pub type Stop = watch::Receiver<bool>;

/// A fresh stop signal: send `true` (or drop the sender) to stop every task holding a receiver.
pub fn stop_channel() -> (watch::Sender<bool>, Stop) {
    watch::channel(false)
}

/// Resolves once stop was asked.
pub async fn stopped(stop: &mut Stop) {
    // An error means the sender is gone, which also means stop.
    let _ = stop.wait_for(|s| *s).await;
}

/// Spawns a background task under a tracing span named after it, so that its log lines say
/// which task wrote them, and logs its end.
pub fn spawn_task<F>(name: &'static str, task: F) -> JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let span = tracing::info_span!("task", name);
    tokio::spawn(
        async move {
            tracing::debug!("started");
            task.await;
            tracing::debug!("stopped");
        }
        .instrument(span),
    )
}

/// Background tasks that share one stop signal, each known by its name.
///
/// Dropping it stops the tasks too (the stop sender goes with it), without waiting for
/// them; [`stop`](Tasks::stop) waits, and says which ones did not stop in time.
pub struct Tasks {
    stop_tx: watch::Sender<bool>,
    stop: Stop,
    running: Vec<(&'static str, JoinHandle<()>)>,
}

impl Default for Tasks {
    fn default() -> Self {
        let (stop_tx, stop) = stop_channel();
        Tasks {
            stop_tx,
            stop,
            running: Vec::new(),
        }
    }
}

impl Tasks {
    pub fn new() -> Self {
        Self::default()
    }

    /// A receiver of the shared stop signal, for a task about to be spawned.
    pub fn stop_signal(&self) -> Stop {
        self.stop.clone()
    }

    /// Spawns `task` (see [`spawn_task`]) and keeps it under `name`.
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.running.push((name, spawn_task(name, task)));
    }

    /// Names of the tasks, in the order they were spawned.
    pub fn names(&self) -> Vec<&'static str> {
        self.running.iter().map(|(n, _)| *n).collect()
    }

    /// Asks every task to stop and waits for each, all within `grace` together. Answers
    /// (and logs) the names of those that had not stopped by then; they are aborted.
    pub async fn stop(self, grace: Duration) -> Vec<&'static str> {
        let _ = self.stop_tx.send(true);
        let deadline = tokio::time::Instant::now() + grace;
        let mut late = Vec::new();
        for (name, handle) in self.running {
            let abort = handle.abort_handle();
            match tokio::time::timeout_at(deadline, handle).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(task = name, error = %e, "background task failed"),
                Err(_) => {
                    tracing::warn!(task = name, "background task did not stop in time");
                    abort.abort();
                    late.push(name);
                }
            }
        }
        late
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stop_joins_by_name_and_names_the_late_ones() {
        let mut tasks = Tasks::new();
        let mut stop = tasks.stop_signal();
        tasks.spawn("polite", async move { stopped(&mut stop).await });
        tasks.spawn("deaf", std::future::pending());
        assert_eq!(tasks.names(), ["polite", "deaf"]);
        let late = tasks.stop(Duration::from_millis(100)).await;
        assert_eq!(late, ["deaf"]);
    }

    #[tokio::test]
    async fn dropping_the_set_stops_its_tasks() {
        let mut tasks = Tasks::new();
        let mut stop = tasks.stop_signal();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        tasks.spawn("t", async move {
            stopped(&mut stop).await;
            let _ = done_tx.send(());
        });
        drop(tasks);
        tokio::time::timeout(Duration::from_secs(1), done_rx)
            .await
            .expect("stopped")
            .unwrap();
    }
}
