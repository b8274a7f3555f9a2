//! Back-off policies: exponential back-off per key, as the kubelet's `flowcontrol.Backoff`
//! (a failure waits `initial`, each further failure doubles the wait up to `max`), and
//! [`WatchRetry`], the pause before a failed watch is tried again (client-go's reflector).
//! Knows nothing of what is retried: no image, pod, API object or client.

use std::time::{Duration, Instant};

/// The back-off state of one thing (an image pull, a sandbox).
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Option<Duration>,
    until: Option<Instant>,
}

impl Backoff {
    /// A back-off from `initial` doubling to `max`.
    #[must_use]
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            current: None,
            until: None,
        }
    }

    /// Records a failure at `now`; returns how long to wait.
    pub fn failed(&mut self, now: Instant) -> Duration {
        let next = self.current.map_or(self.initial, |d| (d * 2).min(self.max));
        self.current = Some(next);
        self.until = Some(now + next);
        next
    }

    /// Still waiting at `now`?
    #[must_use]
    pub fn waiting(&self, now: Instant) -> bool {
        self.until.is_some_and(|u| now < u)
    }

    /// When the wait ends, if waiting.
    #[must_use]
    pub fn until(&self) -> Option<Instant> {
        self.until
    }
}

/// A random number in `[0, 1)`, to spread waits (jitter): from the TLS provider's secure
/// random source, else one half.
#[must_use]
pub fn random_fraction() -> f64 {
    let mut bytes = [0u8; 4];
    if crate::tls::provider()
        .secure_random
        .fill(&mut bytes)
        .is_err()
    {
        return 0.5;
    }
    f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0)
}

/// The pause before a failed watch is tried again, as client-go's reflector waits: two
/// back-offs, one for a refused connection (the API server is restarting: the watch is
/// resumed where it was, not relisted) and one for every other failure, each from 800 ms
/// doubling to 30 s and started over after 2 min without a failure, each wait stretched by
/// up to as much again at random (jitter 1.0), so that the node's watches do not all come
/// back in the same instant.
///
/// One more, beyond client-go: a watch of a Secret or ConfigMap that the Node authorizer
/// refuses with "no relationship found" is a watch that came before the authorizer's graph
/// learnt of the pod bound to this node (it follows the API server's own watch, a few ms
/// behind). Every pod of a burst waits for that object (at most a second, then its sync
/// is retried), so that refusal is tried again from 100 ms, doubling.
#[derive(Debug, Default)]
pub struct WatchRetry {
    refused: RetryBackoff,
    other: RetryBackoff,
    graph_lag: RetryBackoff<GRAPH_LAG_FIRST_MS>,
}

/// The first wait after a refusal of the Node authorizer's graph, in ms.
const GRAPH_LAG_FIRST_MS: u64 = 100;
/// The Node authorizer's refusal of an object no pod bound to the node references (yet).
const GRAPH_LAG: &str = "no relationship found between node";

/// See [`WatchRetry`].
const WATCH_BACKOFF_CAP: Duration = Duration::from_secs(30);
const WATCH_BACKOFF_RESET: Duration = Duration::from_secs(120);

/// One of client-go's `ExponentialBackoffManager`s as the reflector makes them (from
/// `FIRST_MS`, 800 ms unless said).
#[derive(Debug)]
struct RetryBackoff<const FIRST_MS: u64 = 800> {
    backoff: Backoff,
    last_failure: Option<Instant>,
}

impl<const FIRST_MS: u64> Default for RetryBackoff<FIRST_MS> {
    fn default() -> Self {
        Self {
            backoff: Backoff::new(Duration::from_millis(FIRST_MS), WATCH_BACKOFF_CAP),
            last_failure: None,
        }
    }
}

impl<const FIRST_MS: u64> RetryBackoff<FIRST_MS> {
    fn failed(&mut self, now: Instant) -> Duration {
        if self
            .last_failure
            .is_some_and(|at| now.saturating_duration_since(at) >= WATCH_BACKOFF_RESET)
        {
            *self = Self::default();
        }
        self.last_failure = Some(now);
        self.backoff.failed(now)
    }
}

impl WatchRetry {
    /// The wait [`Self::after`] gives for `error` now, with its jitter, to be awaited.
    pub fn pause(&mut self, error: &(dyn std::error::Error + 'static)) -> tokio::time::Sleep {
        let base = self.after(error, Instant::now());
        tokio::time::sleep(jittered(base, random_fraction()))
    }

    /// How long to wait after `error` at `now`, before jitter.
    pub(crate) fn after(
        &mut self,
        error: &(dyn std::error::Error + 'static),
        now: Instant,
    ) -> Duration {
        if connection_refused(error) {
            self.refused.failed(now)
        } else if error.to_string().contains(GRAPH_LAG) {
            self.graph_lag.failed(now)
        } else {
            self.other.failed(now)
        }
    }
}

/// `base` stretched by `fraction` (in [0, 1)) of itself, as `wait.Jitter(base, 1.0)`.
pub(crate) fn jittered(base: Duration, fraction: f64) -> Duration {
    base + base.mul_f64(fraction.clamp(0.0, 1.0))
}

/// Whether `error` (or an error it wraps) is a refused TCP connection.
fn connection_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(25));
        let t = Instant::now();
        assert!(!b.waiting(t));
        assert_eq!(b.failed(t), Duration::from_secs(10));
        assert!(b.waiting(t + Duration::from_secs(9)));
        assert!(!b.waiting(t + Duration::from_secs(10)));
        assert_eq!(b.failed(t), Duration::from_secs(20));
        assert_eq!(b.failed(t), Duration::from_secs(25));
        assert_eq!(b.until(), Some(t + Duration::from_secs(25)));
    }
}
