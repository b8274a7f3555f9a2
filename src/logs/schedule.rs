//! When to look at a container's current log again, between the kubelet's periodic passes
//! (not in the kubelet): from how fast the file grew, the next look is due when it would
//! reach the policy's size, so a fast writer is rotated near the size instead of a whole
//! period later. Decisions only: no files, no clock (times are given).
//!
//! The rate a look plans with is the fastest growth seen lately ([`held_rate`]: the last
//! growth, or the rate before it halved every [`RATE_HALF_LIFE`], whichever is higher): a
//! writer's output reaches its file in bursts (the runtime copies it in chunks, and stalls
//! while it reopens the file), so one look that sees little growth must not stretch the
//! next wait while the writer still runs at full speed. After a burst the rate decays and
//! the looks thin out until the periodic pass is sooner.
//!
//! A container the agent has just started, or one first seen by a pass, is looked at soon
//! ([`FIRST_CHECK`]) and, while its file does not grow, at doubling intervals until the
//! periodic pass is sooner: an idle container costs a few looks once, then nothing beyond
//! the pass.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

/// The shortest time between two looks at one container's log: a look is one `stat`
/// (~100 a second for a container writing at full speed, none for a quiet one).
pub const MIN_CHECK: Duration = Duration::from_millis(10);
/// The first look at a container started or first seen.
pub const FIRST_CHECK: Duration = Duration::from_millis(20);
/// The longest wait between two looks at a log fast enough to reach the size within one
/// period: a writer that speeds up between two looks (tenfold was seen) passes the size by
/// at most what it writes in this time, instead of what it writes until the look planned
/// at its slower rate. A look is one `stat`: 20 a second for such a log.
pub const FAST_CHECK: Duration = Duration::from_millis(50);
/// How fast the rate a look plans with decays when the file grows slower than it.
pub const RATE_HALF_LIFE: Duration = Duration::from_secs(1);

/// How a current log grew between two looks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Growth {
    /// Its size at the earlier look.
    pub before: u64,
    /// Its size now: smaller than `before` when the file was rotated in between (it then
    /// grew from empty).
    pub after: u64,
    /// The time between the two looks.
    pub over: Duration,
}

impl Growth {
    /// Bytes per second (0 without growth).
    #[must_use]
    pub fn rate(self) -> f64 {
        let grown = if self.after >= self.before {
            self.after - self.before
        } else {
            self.after
        };
        let seconds = self.over.as_secs_f64();
        if seconds > 0.0 {
            grown as f64 / seconds
        } else {
            0.0
        }
    }
}

/// The rate to plan the next look with, in bytes per second: the `growth` since the last
/// look, or the rate planned with then (`previous`) halved every [`RATE_HALF_LIFE`] since,
/// whichever is higher.
#[must_use]
pub fn held_rate(previous: f64, growth: Growth) -> f64 {
    let halvings = growth.over.as_secs_f64() / RATE_HALF_LIFE.as_secs_f64();
    growth.rate().max(previous * 0.5_f64.powf(halvings))
}

/// How long until the next look at a log that grows at `rate` bytes per second (see
/// [`held_rate`]) and now holds `size` bytes (after a rotation: the new file's), with the
/// policy's `max_size` and the periodic pass every `period`; `idle` is the time since the
/// last look, for a log that has not grown since it is watched. `None` when the pass comes
/// soon enough.
///
/// A growing file is due when it would reach `max_size` at that rate, but not sooner
/// than [`MIN_CHECK`], and not later than [`FAST_CHECK`] when it writes `max_size` or more
/// in a period; a file that never grew is looked at after twice the last interval.
#[must_use]
pub fn next_check(
    max_size: u64,
    (rate, size): (f64, u64),
    idle: Duration,
    period: Duration,
) -> Option<Duration> {
    let wait = if rate > 0.0 {
        let until_full = Duration::from_secs_f64(
            (max_size.saturating_sub(size) as f64 / rate).min(f64::from(u32::MAX)),
        );
        if rate * period.as_secs_f64() >= max_size as f64 {
            until_full.min(FAST_CHECK)
        } else {
            until_full
        }
    } else {
        idle.saturating_mul(2)
    };
    (wait < period).then(|| wait.max(MIN_CHECK))
}

/// From what size a log growing at `rate` bytes per second is rotated at a look: when it
/// would pass `max_size` before the next look ([`MIN_CHECK`]) plus the time a rotation
/// takes to `cut` the file (the runtime writes to the renamed file until it has reopened),
/// so that neither the current nor the rotated file ends much past `max_size`; never less
/// than half of `max_size`. `max_size` itself for a log that does not grow (the kubelet's
/// rule).
#[must_use]
pub fn rotate_from(max_size: u64, rate: f64, cut: Duration) -> u64 {
    let ahead = (rate * (cut + MIN_CHECK).as_secs_f64()) as u64;
    max_size.saturating_sub(ahead).max(max_size / 2)
}

/// One look at a current log: its size, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// Bytes.
    pub size: u64,
    /// When.
    pub at: Instant,
}

/// A container between passes: where its log is, the last look, and when the next is due.
#[derive(Debug, Clone)]
struct Watch {
    path: PathBuf,
    last: Look,
    due: Option<Instant>,
    /// Bytes per second to plan with ([`held_rate`]).
    rate: f64,
    /// How long its last rotation took to cut the file (rename and reopen): the runtime
    /// writes to the renamed file until it has reopened.
    cut: Duration,
}

/// The containers watched between passes, by id.
#[derive(Debug, Default)]
pub struct Watches(HashMap<String, Watch>);

impl Watches {
    /// A container seen for the first time (started, or found by a pass): looked at after
    /// [`FIRST_CHECK`], its growth measured from this look.
    pub fn first(&mut self, id: &str, path: PathBuf, look: Look) {
        let due = Some(look.at + FIRST_CHECK);
        self.0.insert(
            id.to_owned(),
            Watch {
                path,
                last: look,
                due,
                rate: 0.0,
                cut: Duration::ZERO,
            },
        );
    }

    /// Records a look at `id`'s log and schedules the next: `seen` is what the look found,
    /// `current` the file after it (another, new file when the look rotated it; else
    /// `seen`). The rate is the growth up to `seen`; the next look is due when the current
    /// file would reach `max_size` at that rate. An unknown container is watched from
    /// this look on.
    pub fn looked(
        &mut self,
        id: &str,
        path: PathBuf,
        (seen, current): (Look, Look),
        (max_size, period): (u64, Duration),
    ) {
        let Some(watch) = self.0.get_mut(id) else {
            self.first(id, path, current);
            return;
        };
        let growth = Growth {
            before: watch.last.size,
            after: seen.size,
            over: seen.at.saturating_duration_since(watch.last.at),
        };
        watch.rate = held_rate(watch.rate, growth);
        watch.due = next_check(max_size, (watch.rate, current.size), growth.over, period)
            .map(|wait| current.at + wait);
        if current != seen {
            watch.cut = current.at.saturating_duration_since(seen.at);
        }
        watch.path = path;
        watch.last = current;
    }

    /// From what size to rotate `id`'s log ([`rotate_from`] at its rate and its last cut);
    /// `max_size` for a container not watched (the kubelet's rule).
    #[must_use]
    pub fn rotate_from(&self, id: &str, max_size: u64) -> u64 {
        self.0
            .get(id)
            .map_or(max_size, |w| rotate_from(max_size, w.rate, w.cut))
    }

    /// Forgets the containers not in `running`.
    pub fn retain_running(&mut self, running: &[String]) {
        self.0.retain(|id, _| running.contains(id));
    }

    /// The containers due at `now`, with their log paths.
    #[must_use]
    pub fn due(&self, now: Instant) -> Vec<(String, PathBuf)> {
        self.0
            .iter()
            .filter(|(_, w)| w.due.is_some_and(|due| due <= now))
            .map(|(id, w)| (id.clone(), w.path.clone()))
            .collect()
    }

    /// When the next look at `id` is due.
    #[must_use]
    pub fn due_at(&self, id: &str) -> Option<Instant> {
        self.0.get(id)?.due
    }

    /// The earliest look due.
    #[must_use]
    pub fn next_due(&self) -> Option<Instant> {
        self.0.values().filter_map(|w| w.due).min()
    }

    /// Stops looking at `id` between passes (its log is unreadable; the pass retries).
    pub fn forget(&mut self, id: &str) {
        self.0.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const PERIOD: Duration = Duration::from_secs(10);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn growth(before: u64, after: u64, over: Duration) -> Growth {
        Growth {
            before,
            after,
            over,
        }
    }

    /// The next look after `g`, for a log first watched at that look's start.
    fn check(g: Growth, size: u64) -> Option<Duration> {
        next_check(MIB, (held_rate(0.0, g), size), g.over, PERIOD)
    }

    #[test]
    fn a_growing_log_is_due_when_it_would_reach_the_size() {
        // 64 KiB/s (0.625 MiB a period: not a fast log), 0.5 MiB left: in 8 s.
        let g = growth(0, MIB / 16, ms(1000));
        assert_eq!(g.rate(), (MIB / 16) as f64);
        assert_eq!(check(g, MIB / 2), Some(ms(8000)));
        // 10 MiB/s, 0.5 MiB left: in 50 ms.
        let g = growth(0, MIB / 2, ms(50));
        assert_eq!(g.rate(), 10.0 * MIB as f64);
        assert_eq!(check(g, MIB / 2), Some(ms(50)));
        // Just rotated (the new file holds 64 KiB) at the rate seen before the rotation:
        // 40 ms to the size.
        let g = growth(MIB / 2, MIB + MIB / 2, ms(40));
        assert_eq!(
            check(g, MIB / 16),
            Some(Duration::from_secs_f64(15.0 / 16.0 / 25.0))
        );
        // Rotated in between by someone else: the new file grew from empty.
        assert_eq!(growth(5 * MIB, MIB, ms(500)).rate(), 2.0 * MIB as f64);
    }

    #[test]
    fn a_log_that_fills_a_file_within_a_period_waits_no_longer_than_fast_check() {
        // 200 KiB/s: 2 MiB a period. At its rate the size is 4.5 s away, but a writer that
        // speeds up meanwhile would pass it by far.
        let g = growth(0, MIB / 5, ms(1000));
        assert_eq!(check(g, MIB / 10), Some(FAST_CHECK));
        // Just under a file a period (100 KiB/s): planned from its rate.
        let g = growth(0, MIB / 10, ms(1000));
        assert!(check(g, MIB / 2).unwrap() > Duration::from_secs(4));
    }

    #[test]
    fn a_fast_log_is_looked_at_no_sooner_than_the_minimum() {
        // 100 MiB/s: it would reach the size in 5 ms.
        let g = growth(0, MIB / 2, ms(5));
        assert_eq!(check(g, MIB / 2), Some(MIN_CHECK));
        // At or past the size already (a look that did not rotate it).
        assert_eq!(check(g, 2 * MIB), Some(MIN_CHECK));
    }

    #[test]
    fn a_slow_log_is_left_to_the_pass() {
        // 50 KiB/s with 1 MiB left: ~20 s, after the pass.
        let g = growth(0, 500 << 10, Duration::from_secs(10));
        assert_eq!(check(g, 0), None);
        // Reached 9.9 s from now: still before the pass.
        let g = growth(0, MIB / 10, Duration::from_secs(1));
        assert!(check(g, 1024).is_some_and(|d| d < PERIOD));
    }

    #[test]
    fn an_idle_log_is_looked_at_ever_less_often_then_left_to_the_pass() {
        let mut wait = FIRST_CHECK;
        let mut looks = 0;
        while let Some(next) = check(growth(7, 7, wait), 7) {
            assert_eq!(next, wait * 2);
            wait = next;
            looks += 1;
        }
        // 20 ms, then 40, 80, … 5120 ms: 9 looks in all, then only the pass.
        assert_eq!(looks, 8);
        assert_eq!(growth(7, 7, ms(100)).rate(), 0.0);
        assert_eq!(growth(0, 7, Duration::ZERO).rate(), 0.0);
    }

    #[test]
    fn a_stall_within_a_burst_does_not_stretch_the_next_look() {
        // 25 MiB/s, then a look 10 ms later sees no growth (the runtime was reopening the
        // file, or copying a chunk): the next look stays ~40 ms away, not 20 ms doubled on
        // and on (the 9 MiB files seen before this rule).
        let fast = 25.0 * MIB as f64;
        let stalled = held_rate(fast, growth(MIB / 4, MIB / 4, ms(10)));
        assert!((stalled / fast - 0.5_f64.powf(0.01)).abs() < 1e-9);
        let next = next_check(MIB, (stalled, MIB / 4), ms(10), PERIOD).unwrap();
        assert!(next > ms(29) && next < ms(31), "{next:?}");
        // Faster growth than planned with is taken at once.
        assert_eq!(held_rate(fast, growth(0, MIB, ms(20))), 50.0 * MIB as f64);
        // Once the writer stopped, the rate halves every second: while it still fills a
        // file a period, looks come every FAST_CHECK (~8 s from 25 MiB/s), then they thin
        // out, and ~16 s after the burst the periodic pass is sooner.
        let mut rate = fast;
        let mut after = Duration::ZERO;
        let mut looks = 0;
        while let Some(wait) = next_check(MIB, (rate, MIB / 4), ms(0), PERIOD) {
            rate = held_rate(rate, growth(MIB / 4, MIB / 4, wait));
            after += wait;
            looks += 1;
        }
        assert!(after > PERIOD && after < PERIOD * 2, "{after:?}");
        // ~170 `stat`s in all.
        assert!(looks < 200, "{looks} looks after the burst");
    }

    #[test]
    fn a_fast_log_is_rotated_before_it_would_pass_the_size_by_the_next_look() {
        // 10 MiB/s with a 10 ms cut: what it writes in the cut and until the next look
        // (10 ms) is 0.2 MiB.
        let rate = 10.0 * MIB as f64;
        assert_eq!(rotate_from(MIB, rate, ms(10)), MIB - MIB / 5);
        // Never below half the size, however fast.
        assert_eq!(rotate_from(MIB, 100.0 * rate, ms(10)), MIB / 2);
        // A log that does not grow: the kubelet's rule, at the size.
        assert_eq!(rotate_from(MIB, 0.0, ms(10)), MIB);
    }

    fn look(size: u64, at: Instant) -> Look {
        Look { size, at }
    }

    #[test]
    fn watches_schedule_each_container_from_its_own_growth() {
        let t0 = Instant::now();
        let limits = (MIB, PERIOD);
        let mut w = Watches::default();
        w.first("fast", "/l/fast.log".into(), look(0, t0));
        w.first("idle", "/l/idle.log".into(), look(0, t0));
        assert_eq!(w.next_due(), Some(t0 + FIRST_CHECK));
        assert!(w.due(t0 + FIRST_CHECK - ms(1)).is_empty());
        let mut due = w.due(t0 + FIRST_CHECK);
        due.sort();
        assert_eq!(
            due,
            [
                ("fast".to_owned(), PathBuf::from("/l/fast.log")),
                ("idle".to_owned(), PathBuf::from("/l/idle.log"))
            ]
        );
        // The fast one wrote 0.75 MiB in 100 ms: 7.5 MiB/s, the last 0.25 MiB in 33.3 ms.
        let t1 = t0 + ms(100);
        let seen = look(MIB * 3 / 4, t1);
        w.looked("fast", "/l/fast.log".into(), (seen, seen), limits);
        let seen = look(0, t1);
        w.looked("idle", "/l/idle.log".into(), (seen, seen), limits);
        let near = |at: Option<Instant>, expected: Instant| {
            at.is_some_and(|at| at.max(expected) - at.min(expected) < Duration::from_micros(1))
        };
        assert!(near(w.next_due(), t1 + Duration::from_secs_f64(0.25 / 7.5)));
        assert!(w.due(t1 + ms(33)).is_empty());
        assert_eq!(
            w.due(t1 + ms(34)),
            [("fast".to_owned(), "/l/fast.log".into())]
        );
        // It rotated at 1.25 MiB, 50 ms later (10 MiB/s); the new file holds 0.5 MiB 10 ms
        // later: due when that one reaches the size at 10 MiB/s.
        let t2 = t1 + ms(50);
        let seen = look(MIB * 5 / 4, t2);
        let current = look(MIB / 2, t2 + ms(10));
        w.looked("fast", "/l/fast.log".into(), (seen, current), limits);
        assert!(near(w.next_due(), t2 + ms(10) + ms(50)));
        // The cut took 10 ms, at 10 MiB/s: rotated from 0.8 MiB on; never below half.
        assert_eq!(
            w.rotate_from("fast", MIB),
            rotate_from(MIB, 10.0 * MIB as f64, ms(10))
        );
        assert_eq!(w.rotate_from("fast", MIB / 8), MIB / 16);
        assert_eq!(w.rotate_from("idle", MIB), MIB);
        assert_eq!(w.rotate_from("unknown", MIB), MIB);
        // The idle one is due at twice its last interval.
        assert_eq!(w.due(t1 + ms(200)).len(), 2);
        // Stopped containers are forgotten; so is one whose log cannot be read.
        w.retain_running(&["idle".to_owned()]);
        assert_eq!(
            w.due(t1 + ms(200)),
            [("idle".to_owned(), "/l/idle.log".into())]
        );
        w.forget("idle");
        assert_eq!(w.next_due(), None);
        // A container a pass finds for the first time is looked at soon.
        let seen = look(3, t2);
        w.looked("old", "/l/old.log".into(), (seen, seen), limits);
        assert_eq!(w.next_due(), Some(t2 + FIRST_CHECK));
    }
}
