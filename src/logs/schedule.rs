//! When to look at a container's current log again, between the kubelet's periodic passes
//! (not in the kubelet): from how fast the file grew since the last look, the next look is
//! due when it would reach the policy's size, so a fast writer is rotated near the size
//! instead of a whole period later. Decisions only: no files, no clock (times are given).
//!
//! A container the agent has just started, or one first seen by a pass, is looked at soon
//! ([`FIRST_CHECK`]) and, while its file does not grow, at doubling intervals until the
//! periodic pass is sooner: an idle container costs a few looks once, then nothing beyond
//! the pass.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

/// The shortest time between two looks at one container's log: a look is one `stat`.
pub const MIN_CHECK: Duration = Duration::from_millis(20);
/// The first look at a container started or first seen.
pub const FIRST_CHECK: Duration = Duration::from_millis(20);

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

/// How long until the next look at a log that grew as `growth` and now holds `size` bytes
/// (after a rotation: the new file's), with the policy's `max_size` and the periodic pass
/// every `period`; `None` when the pass comes soon enough.
///
/// A growing file is due when it would reach `max_size` at its last rate, but not sooner
/// than [`MIN_CHECK`]; a file that did not grow is looked at after twice the last interval.
#[must_use]
pub fn next_check(max_size: u64, growth: Growth, size: u64, period: Duration) -> Option<Duration> {
    let rate = growth.rate();
    let wait = if rate > 0.0 {
        Duration::from_secs_f64(max_size.saturating_sub(size) as f64 / rate)
    } else {
        growth.over.saturating_mul(2)
    };
    (wait < period).then(|| wait.max(MIN_CHECK))
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
    /// Bytes per second at the last look.
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
        watch.due =
            next_check(max_size, growth, current.size, period).map(|wait| current.at + wait);
        watch.rate = growth.rate();
        if current != seen {
            watch.cut = current.at.saturating_duration_since(seen.at);
        }
        watch.path = path;
        watch.last = current;
    }

    /// From what size to rotate `id`'s log: `max_size` less what it writes, at its last
    /// rate, while its last rotation cut the file (the runtime still writes to the renamed
    /// file meanwhile), so that the rotated file ends near `max_size` instead of past it;
    /// never less than half of `max_size`. `max_size` for a container not growing or not
    /// watched (the kubelet's rule).
    #[must_use]
    pub fn rotate_from(&self, id: &str, max_size: u64) -> u64 {
        let Some(watch) = self.0.get(id) else {
            return max_size;
        };
        let during_cut = (watch.rate * watch.cut.as_secs_f64()) as u64;
        max_size.saturating_sub(during_cut).max(max_size / 2)
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

    #[test]
    fn a_growing_log_is_due_when_it_would_reach_the_size() {
        // 10 MiB/s, 0.5 MiB left: in 50 ms.
        let g = growth(0, MIB / 2, ms(50));
        assert_eq!(g.rate(), 10.0 * MIB as f64);
        assert_eq!(next_check(MIB, g, MIB / 2, PERIOD), Some(ms(50)));
        // Just rotated (the new file holds 64 KiB) at the rate seen before the rotation.
        let g = growth(MIB / 2, MIB + MIB / 2, ms(100));
        assert_eq!(
            next_check(MIB, g, MIB / 16, PERIOD),
            Some(Duration::from_secs_f64(15.0 / 16.0 / 10.0))
        );
        // Rotated in between by someone else: the new file grew from empty.
        assert_eq!(growth(5 * MIB, MIB, ms(500)).rate(), 2.0 * MIB as f64);
    }

    #[test]
    fn a_fast_log_is_looked_at_no_sooner_than_the_minimum() {
        // 100 MiB/s: it would reach the size in 5 ms.
        let g = growth(0, MIB / 2, ms(5));
        assert_eq!(next_check(MIB, g, MIB / 2, PERIOD), Some(MIN_CHECK));
        // At or past the size already (a look that did not rotate it).
        assert_eq!(next_check(MIB, g, 2 * MIB, PERIOD), Some(MIN_CHECK));
    }

    #[test]
    fn a_slow_log_is_left_to_the_pass() {
        // 50 KiB/s with 1 MiB left: ~20 s, after the pass.
        let g = growth(0, 500 << 10, Duration::from_secs(10));
        assert_eq!(next_check(MIB, g, 0, PERIOD), None);
        // Reached 9.9 s from now: still before the pass.
        let g = growth(0, MIB / 10, Duration::from_secs(1));
        assert!(next_check(MIB, g, 1024, PERIOD).is_some_and(|d| d < PERIOD));
    }

    #[test]
    fn an_idle_log_is_looked_at_ever_less_often_then_left_to_the_pass() {
        let mut wait = FIRST_CHECK;
        let mut looks = 0;
        while let Some(next) = next_check(MIB, growth(7, 7, wait), 7, PERIOD) {
            assert_eq!(next, wait * 2);
            wait = next;
            looks += 1;
        }
        // 20 ms, then 40, 80, … 5120 ms: 9 looks in all, then only the pass.
        assert_eq!(looks, 8);
        assert_eq!(growth(7, 7, ms(100)).rate(), 0.0);
        assert_eq!(growth(0, 7, Duration::ZERO).rate(), 0.0);
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
        // The cut took 10 ms, at 10 MiB/s: rotated from 0.9 MiB on; never below half.
        assert_eq!(w.rotate_from("fast", MIB), MIB - MIB / 10);
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
