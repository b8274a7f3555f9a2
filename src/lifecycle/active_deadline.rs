//! `spec.activeDeadlineSeconds`, the kubelet's `activeDeadlineHandler`: counted from the
//! pod's `status.startTime`; once it has passed, the pod ends `Failed` with reason
//! `DeadlineExceeded` and its containers are killed.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

/// The reason of the Normal event and of the Failed status.
pub const REASON: &str = "DeadlineExceeded";
/// The message of the event and of the status.
pub const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// How long the pod may still be active: `None` when it has no deadline or no start time
/// yet, zero once the deadline has passed (the kubelet's `pastActiveDeadline` is
/// `elapsed >= allowed`). Rounded up to the millisecond, so a worker sleeping this long
/// wakes at or after the deadline, never just before it.
#[must_use]
pub fn remaining(pod: &Pod, start: Option<Timestamp>, now: Timestamp) -> Option<Duration> {
    let seconds = pod.spec.as_ref()?.active_deadline_seconds?;
    let start = start?;
    let deadline_ns = start.as_nanosecond() + i128::from(seconds) * 1_000_000_000;
    let left_ns = deadline_ns - now.as_nanosecond();
    if left_ns <= 0 {
        return Some(Duration::ZERO);
    }
    let millis = u64::try_from((left_ns + 999_999) / 1_000_000).unwrap_or(u64::MAX);
    Some(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::testing::pod;

    fn with_deadline(seconds: Option<i64>) -> Pod {
        let mut p = pod("p", &[("c", "busybox")]);
        if let Some(spec) = p.spec.as_mut() {
            spec.active_deadline_seconds = seconds;
        }
        p
    }

    fn at(seconds: i64, nanos: i32) -> Timestamp {
        Timestamp::new(1_700_000_000 + seconds, nanos).unwrap()
    }

    #[test]
    fn no_deadline_or_no_start_time_never_expires() {
        assert_eq!(
            remaining(&with_deadline(None), Some(at(0, 0)), at(99, 0)),
            None
        );
        assert_eq!(remaining(&with_deadline(Some(5)), None, at(99, 0)), None);
    }

    #[test]
    fn counts_from_the_start_time() {
        let p = with_deadline(Some(5));
        assert_eq!(
            remaining(&p, Some(at(0, 0)), at(2, 0)),
            Some(Duration::from_secs(3))
        );
        // Rounded up to the millisecond: never wakes before the deadline.
        assert_eq!(
            remaining(&p, Some(at(0, 0)), at(4, 999_999_999)),
            Some(Duration::from_millis(1))
        );
    }

    #[test]
    fn expires_exactly_at_the_deadline_and_after_it() {
        let p = with_deadline(Some(5));
        assert_eq!(
            remaining(&p, Some(at(0, 0)), at(5, 0)),
            Some(Duration::ZERO)
        );
        assert_eq!(
            remaining(&p, Some(at(0, 0)), at(60, 0)),
            Some(Duration::ZERO)
        );
        // A deadline shortened below the pod's age has passed at once.
        let short = with_deadline(Some(1));
        assert_eq!(
            remaining(&short, Some(at(0, 0)), at(3, 0)),
            Some(Duration::ZERO)
        );
    }
}
