//! Exponential back-off per key, as the kubelet's `flowcontrol.Backoff`: a failure waits
//! `initial`, each further failure doubles the wait up to `max`.

use std::time::{Duration, Instant};

/// The back-off state of one thing (an image pull, a crashing container, a sandbox).
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

    /// Image pulls: 10 s doubling to 5 min.
    #[must_use]
    pub fn image_pull() -> Self {
        Self::new(
            crate::images::IMAGE_BACKOFF.0,
            crate::images::IMAGE_BACKOFF.1,
        )
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
