//! Work on client-chosen paths, off the async workers.
//!
//! Resolving a unit's view stats, canonicalizes and reads paths the client picked (its cwd,
//! its home, repositories in them). On a stalled FUSE or NFS mount any of those calls can
//! block for as long as the mount stalls, and a thread blocked in the kernel cannot be
//! cancelled. So that work runs on tokio's blocking threads, at most [`MAX_BLOCKING`] at
//! once, and the session waits for it only until its deadline: a stalled mount costs the one
//! request (and, until the mount answers, one of the bounded threads), never the runtime.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::time::Instant;

/// At most this many blocking jobs at once (stalled ones included).
pub const MAX_BLOCKING: usize = 32;

/// Why a blocking job gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum BlockingError {
    /// The deadline passed before the job got a thread or before it finished.
    #[error("did not finish in time")]
    Timeout,
    /// The job panicked.
    #[error("failed: {0}")]
    Failed(String),
}

/// A bounded set of blocking threads for work on client-chosen paths.
#[derive(Debug, Clone)]
pub struct BlockingPool {
    permits: Arc<Semaphore>,
}

impl Default for BlockingPool {
    fn default() -> Self {
        Self::new(MAX_BLOCKING)
    }
}

impl BlockingPool {
    /// A pool of at most `max` jobs at once.
    pub fn new(max: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max.max(1))),
        }
    }

    /// Jobs that could start now.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    /// Run `job` on a blocking thread and wait for it until `deadline`. A job still running
    /// then goes on by itself (holding its place in the pool) and its result is dropped.
    pub async fn run<T, F>(&self, deadline: Instant, job: F) -> Result<T, BlockingError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let permit = tokio::time::timeout_at(deadline, Arc::clone(&self.permits).acquire_owned())
            .await
            .map_err(|_| BlockingError::Timeout)?
            .map_err(|e| BlockingError::Failed(e.to_string()))?;
        let handle = tokio::task::spawn_blocking(move || {
            let out = job();
            drop(permit);
            out
        });
        match tokio::time::timeout_at(deadline, handle).await {
            Err(_) => Err(BlockingError::Timeout),
            Ok(Err(e)) => Err(BlockingError::Failed(e.to_string())),
            Ok(Ok(out)) => Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_stuck_job_costs_its_request_and_its_place_only() -> Result<(), BlockingError> {
        let pool = BlockingPool::new(2);
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let soon = || Instant::now() + Duration::from_millis(200);
        let r = pool
            .run(soon(), move || {
                let _ = stuck.recv();
            })
            .await;
        assert!(matches!(r, Err(BlockingError::Timeout)));
        assert_eq!(pool.available(), 1, "the stuck job keeps its place");
        // Others still run.
        assert_eq!(pool.run(soon(), || 7).await?, 7);
        // With every place stuck, a job waits for one only until its deadline.
        let (release2, stuck2) = std::sync::mpsc::channel::<()>();
        let _ = pool
            .run(soon(), move || {
                let _ = stuck2.recv();
            })
            .await;
        assert!(matches!(
            pool.run(soon(), || 8).await,
            Err(BlockingError::Timeout)
        ));
        // Once the mount answers, the places come back.
        let _ = release.send(());
        let _ = release2.send(());
        let deadline = Instant::now() + Duration::from_secs(5);
        while pool.available() < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(pool.available(), 2);
        Ok(())
    }
}
