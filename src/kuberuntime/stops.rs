//! The pod kills in flight, and the removals that wait for them. A deletion of many pods
//! at once is paced by the runtime's stops (containers, then sandboxes with their CNI
//! `DEL` chains); a pod whose final status is sent and which left the API still has its
//! stopped sandbox and containers removed (`RemovePodSandbox`: their snapshots, metadata,
//! log and network namespace files), which the runtime did beside the other pods' stops,
//! on the same cores. The kubelet leaves those removals to its garbage collector, off the
//! path of a deletion; here a removal waits until no kill is in flight, for
//! [`REMOVAL_WAIT`] at most (a node that never stops stopping pods still removes them).
//!
//! Owns only the counting; knows no CRI call and no pod.

use std::time::Duration;

use tokio::sync::watch;

/// The longest a removal waits for the kills in flight to end.
pub const REMOVAL_WAIT: Duration = Duration::from_secs(10);

/// The number of pod kills in flight.
#[derive(Debug)]
pub struct Stopping {
    in_flight: watch::Sender<usize>,
}

impl Default for Stopping {
    fn default() -> Self {
        Self {
            in_flight: watch::Sender::new(0),
        }
    }
}

/// One kill in flight, counted until dropped.
#[derive(Debug)]
pub struct Kill<'a> {
    stopping: &'a Stopping,
}

impl Drop for Kill<'_> {
    fn drop(&mut self) {
        self.stopping
            .in_flight
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Stopping {
    /// Counts a kill in flight until the returned guard is dropped.
    pub fn kill(&self) -> Kill<'_> {
        self.in_flight.send_modify(|n| *n += 1);
        Kill { stopping: self }
    }

    /// Waits until no kill is in flight, or `at_most`; whether none is.
    pub async fn settled(&self, at_most: Duration) -> bool {
        let mut rx = self.in_flight.subscribe();
        tokio::time::timeout(at_most, rx.wait_for(|n| *n == 0))
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_removal_waits_until_no_kill_is_in_flight() {
        let stopping = std::sync::Arc::new(Stopping::default());
        assert!(stopping.settled(Duration::ZERO).await, "none in flight");
        let first = stopping.kill();
        let second = stopping.kill();
        let waiting = {
            let stopping = stopping.clone();
            tokio::spawn(async move { stopping.settled(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "one kill still in flight");
        drop(second);
        assert!(waiting.await.unwrap());
    }

    #[tokio::test]
    async fn a_removal_waits_no_longer_than_asked() {
        let stopping = Stopping::default();
        let _kill = stopping.kill();
        let started = std::time::Instant::now();
        assert!(!stopping.settled(Duration::from_millis(50)).await);
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
