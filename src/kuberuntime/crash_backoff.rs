//! The crash-loop back-off of containers, as the kubelet's `doBackOff` keeps it in
//! client-go's `flowcontrol.Backoff`: one entry per container *spec* (pod, container name
//! and spec hash, the kubelet's `getStableKey`), so that a changed spec (a new image)
//! starts from the first back-off again; the wait is counted from the moment the last
//! instance finished, not from its start; and an entry not used for twice the longest
//! back-off is forgotten (a container that ran for ten minutes before it crashed restarts
//! at once, then after 10 s again).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;

use super::container::container_hash;

/// Crashing containers wait 10 s, doubling to 5 min, before they are started again (the
/// kubelet's `backOffPeriod` and `MaxContainerBackOff`).
const INITIAL: Duration = Duration::from_secs(10);
/// See [`INITIAL`].
const MAX: Duration = Duration::from_secs(300);

/// One container spec's entry: its current back-off and when it was last counted.
#[derive(Debug, Clone, Copy)]
struct Entry {
    backoff: Duration,
    /// ns since the epoch.
    last_update: i64,
}

/// One container spec of one pod: (pod UID, container name, spec hash), the kubelet's
/// `getStableKey` (its pod name and namespace add nothing to the UID).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpecKey(String, String, String);

impl SpecKey {
    /// The key of `container` in the pod `uid`. Hashing the spec takes a JSON encoding:
    /// done before the node-wide table is locked.
    #[must_use]
    pub fn new(uid: &str, container: &Container) -> Self {
        Self(
            uid.to_owned(),
            container.name.clone(),
            container_hash(container),
        )
    }
}

/// The back-offs of one node's containers.
#[derive(Debug, Default)]
pub struct CrashBackoff {
    entries: HashMap<SpecKey, Entry>,
}

/// A container still in back-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InBackoff {
    /// The back-off's length (the kubelet's message names it: "back-off 40s ...").
    pub backoff: Duration,
    /// What is left of it.
    pub remaining: Duration,
}

/// `later - earlier`, in ns, as a duration (zero when `later` is not later).
fn since(later: i64, earlier: i64) -> Duration {
    Duration::from_nanos(u64::try_from(later.saturating_sub(earlier)).unwrap_or(0))
}

/// The wall clock in ns since the epoch, the runtime's clock for a container's exit (the
/// kubelet compares the two too).
#[must_use]
pub fn now_ns() -> i64 {
    i64::try_from(k8s_openapi::jiff::Timestamp::now().as_nanosecond()).unwrap_or(i64::MAX)
}

/// Not used for twice the longest back-off: the container is taken as stable.
fn expired(event: i64, last_update: i64) -> bool {
    since(event, last_update) > 2 * MAX
}

impl CrashBackoff {
    /// May the container spec `key`, whose last instance exited at `finished_at`, start
    /// again at `now` (both ns since the epoch)? If so its back-off is counted (the
    /// next one is twice as long, up to 5 min); if not, how long it still waits. Without an
    /// exit time from the runtime (0) the wait counts from the last restart, so that such a
    /// container is not restarted in a loop either.
    pub fn check(&mut self, key: SpecKey, finished_at: i64, now: i64) -> Result<(), InBackoff> {
        // The kubelet's GC (every 2 s in its housekeeping), here at each check.
        self.entries.retain(|_, e| !expired(now, e.last_update));
        let entry = self.entries.get(&key);
        let finished_at = match entry {
            Some(e) if finished_at <= 0 => e.last_update,
            _ => finished_at,
        };
        // `IsInBackOffSince`'s own expiry, counted at the exit: after the GC above it can
        // only drop an entry for an exit stamped after `now` (a clock stepped back).
        let current = entry.filter(|e| !expired(finished_at, e.last_update));
        if let Some(entry) = current {
            let waited = since(now, finished_at);
            if waited < entry.backoff {
                return Err(InBackoff {
                    backoff: entry.backoff,
                    remaining: entry.backoff - waited,
                });
            }
        }
        let backoff = current.map_or(INITIAL, |e| (e.backoff * 2).min(MAX));
        self.entries.insert(
            key,
            Entry {
                backoff,
                last_update: now,
            },
        );
        Ok(())
    }

    /// Has a container of the pod `uid` a back-off?
    #[must_use]
    pub fn holds(&self, uid: &str) -> bool {
        self.entries.keys().any(|k| k.0 == uid)
    }

    /// Forgets the back-offs of the pod `uid`.
    pub fn forget(&mut self, uid: &str) {
        self.entries.retain(|k, _| k.0 != uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn container(image: &str) -> Container {
        Container {
            name: "c".into(),
            image: Some(image.into()),
            ..Container::default()
        }
    }

    /// Four restarts of `c`, each as soon as it may (1 s runs): its back-off is at 80 s,
    /// counted at 73 s.
    fn four_restarts(b: &mut CrashBackoff, c: &Container) {
        for (exited, started) in [(0, 0), (1, 11), (12, 32), (33, 73)] {
            assert_eq!(
                b.check(SpecKey::new("u", c), exited * S, started * S),
                Ok(())
            );
        }
    }

    /// A container that runs 5 s each time and is restarted as soon as it may: the waits
    /// between its exit and its next start are the kubelet's 10 s, 20 s, 40 s, ... 300 s,
    /// counted from the exit (a start counted from the previous start would be 5 s early
    /// each time, and never reach the 5 min the suite's `MaxContainerBackOff` test wants).
    #[test]
    fn the_wait_doubles_from_each_exit_up_to_five_minutes() {
        let mut b = CrashBackoff::default();
        let c = container("busybox");
        let mut exited = 100 * S;
        assert_eq!(
            b.check(SpecKey::new("u", &c), exited, exited),
            Ok(()),
            "the first restart"
        );
        let mut waits = Vec::new();
        for _ in 0..8 {
            exited += 5 * S;
            let mut now = exited;
            while let Err(wait) = b.check(SpecKey::new("u", &c), exited, now) {
                assert_eq!(
                    wait.remaining,
                    since(exited + wait.backoff.as_nanos() as i64, now)
                );
                now += S;
            }
            waits.push((now - exited) / S);
            exited = now;
        }
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    /// The kubelet's key holds the spec's hash: a new image starts over (the suite's "back-off
    /// timer reset on image update" test).
    #[test]
    fn a_changed_spec_starts_over() {
        let mut b = CrashBackoff::default();
        let old = container("busybox");
        four_restarts(&mut b, &old);
        let exited = 74 * S;
        assert_eq!(
            b.check(SpecKey::new("u", &old), exited, exited + S),
            Err(InBackoff {
                backoff: Duration::from_secs(80),
                remaining: Duration::from_secs(79)
            })
        );
        let new = container("nginx");
        assert_eq!(b.check(SpecKey::new("u", &new), exited, exited + S), Ok(()));
        assert_eq!(
            b.check(SpecKey::new("u", &new), exited + 6 * S, exited + 7 * S)
                .unwrap_err()
                .backoff,
            Duration::from_secs(10)
        );
    }

    /// A container that ran longer than twice the longest back-off before it crashed is
    /// stable again: restarted at once, with the first back-off after.
    #[test]
    fn a_long_run_forgets_the_back_off() {
        let mut b = CrashBackoff::default();
        let c = container("busybox");
        four_restarts(&mut b, &c);
        let exited = 73 * S + 601 * S;
        assert_eq!(b.check(SpecKey::new("u", &c), exited, exited), Ok(()));
        assert_eq!(
            b.check(SpecKey::new("u", &c), exited + S, exited + 2 * S)
                .unwrap_err()
                .backoff,
            INITIAL
        );
    }

    /// An exit without a time waits its back-off from the last restart.
    #[test]
    fn an_exit_without_a_time_still_waits() {
        let mut b = CrashBackoff::default();
        let c = container("busybox");
        assert_eq!(b.check(SpecKey::new("u", &c), 0, 100 * S), Ok(()));
        assert!(b.check(SpecKey::new("u", &c), 0, 101 * S).is_err());
        assert_eq!(b.check(SpecKey::new("u", &c), 0, 111 * S), Ok(()));
    }

    /// A pod that is gone leaves no back-off behind.
    #[test]
    fn a_gone_pods_back_offs_are_forgotten() {
        let mut b = CrashBackoff::default();
        let c = container("busybox");
        assert_eq!(b.check(SpecKey::new("u", &c), 0, 0), Ok(()));
        assert!(
            b.check(SpecKey::new("u", &c), S, S).is_err(),
            "then a back-off"
        );
        assert_eq!(b.check(SpecKey::new("other", &c), S, S), Ok(()));
        b.forget("u");
        assert!(!b.holds("u") && b.holds("other"));
        b.forget("other");
        assert!(b.entries.is_empty());
    }
}
