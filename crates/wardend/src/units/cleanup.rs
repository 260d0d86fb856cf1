//! Cleanups that outlive the handle that needed them: a unit dropped without `stop` (a
//! session torn down mid-way) is still stopped and removed, by a task the manager tracks, so
//! that the daemon's shutdown waits for it instead of exiting with the unit half removed.

use std::future::Future;
use std::time::Duration;

use tokio_util::task::TaskTracker;

/// How long shutdown waits for the cleanups still running.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The tracked cleanups of one unit manager.
#[derive(Debug, Clone, Default)]
pub struct Cleanups {
    tracker: TaskTracker,
}

impl Cleanups {
    /// Run `cleanup` as a tracked task; without a runtime (a unit dropped outside one) it
    /// cannot run and the next start's orphan cleanup removes the unit.
    pub fn spawn<F>(&self, cleanup: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                self.tracker.spawn_on(cleanup, &rt);
                true
            }
            Err(_) => false,
        }
    }

    /// Run the blocking `cleanup` on a tracked blocking thread, or on a thread of its own
    /// without a runtime.
    pub fn spawn_blocking<F>(&self, cleanup: F)
    where
        F: FnOnce() + Send + 'static,
    {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                self.tracker.spawn_blocking_on(cleanup, &rt);
            }
            Err(_) => {
                let _ = std::thread::Builder::new()
                    .name("unit-cleanup".into())
                    .spawn(cleanup);
            }
        }
    }

    /// Cleanups still running.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }

    /// Wait (bounded) for every cleanup started so far, and any started meanwhile.
    pub async fn drain(&self) {
        self.tracker.close();
        if tokio::time::timeout(DRAIN_TIMEOUT, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running = self.tracker.len(),
                "unit cleanups still running at exit; the next start removes what they leave"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drain_waits_for_async_and_blocking_cleanups() {
        let c = Cleanups::default();
        let (done_a, seen_a) = tokio::sync::oneshot::channel();
        let (done_b, seen_b) = std::sync::mpsc::channel();
        assert!(c.spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = done_a.send(());
        }));
        c.spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(50));
            let _ = done_b.send(());
        });
        c.drain().await;
        assert_eq!(c.running(), 0);
        let mut seen_a = seen_a;
        assert!(
            seen_a.try_recv().is_ok(),
            "drain returned before the task ended"
        );
        assert!(
            seen_b.try_recv().is_ok(),
            "drain returned before the thread ended"
        );
    }
}
