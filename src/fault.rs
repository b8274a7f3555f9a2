//! Fault injection for the reliability drills: named points in a pod's start-up and
//! teardown where a debug build of the agent SIGKILLs itself, so that integration tests can
//! crash it at the worst moment and check what a restart makes of the half-done work.
//!
//! `RKUBELET_FAULT=<point>` kills the agent at the first hit of `<point>`,
//! `RKUBELET_FAULT=<point>:<n>` at the n-th. The variable is read once, at the first hit of
//! any point. Release builds (`debug_assertions` off) compile every [`point`] to nothing:
//! no variable is read and no signal can be sent.
//!
//! Knows no other module of the agent: callers name their points.

/// After `RunPodSandbox` returned a sandbox, before anything else is done with it.
pub const AFTER_RUN_POD_SANDBOX: &str = "after-run-pod-sandbox";
/// During a CNI `ADD`: the whole chain answered (veth, IP, port rules made) but its result
/// is not cached yet.
pub const CNI_ADD: &str = "cni-add";
/// While a CNI result is cached: written and synced to its temporary file, not yet renamed
/// into place.
pub const CNI_CACHE_WRITE: &str = "cni-cache-write";
/// After `CreateContainer` returned a container, before `StartContainer`.
pub const AFTER_CREATE_CONTAINER: &str = "after-create-container";
/// During a CNI `DEL` (as `StopPodSandbox` runs it): after each plugin's `DEL`, the first
/// hit being the chain's last plugin.
pub const CNI_DEL: &str = "cni-del";
/// After a terminated pod's final status was sent, before it is deleted from the API.
pub const BEFORE_POD_DELETE: &str = "before-pod-delete";

/// Every point, as `RKUBELET_FAULT` names them.
pub const POINTS: [&str; 6] = [
    AFTER_RUN_POD_SANDBOX,
    CNI_ADD,
    CNI_CACHE_WRITE,
    AFTER_CREATE_CONTAINER,
    CNI_DEL,
    BEFORE_POD_DELETE,
];

/// The environment variable that arms a point.
pub const ENV: &str = "RKUBELET_FAULT";

/// A fault point: nothing in release builds.
#[cfg(not(debug_assertions))]
#[inline]
pub fn point(_name: &'static str) {}

/// A fault point: in debug builds, SIGKILLs the agent when `RKUBELET_FAULT` arms `name` and
/// this is the hit it names.
#[cfg(debug_assertions)]
pub fn point(name: &'static str) {
    if armed::hit(name) {
        tracing::warn!(point = name, "fault injection: SIGKILL");
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(debug_assertions)]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::{ENV, POINTS};

    /// An armed point: its name and which hit (from 1) kills.
    #[derive(Debug, PartialEq, Eq)]
    pub(super) struct Armed {
        pub point: &'static str,
        pub nth: u32,
    }

    /// Reads `<point>` or `<point>:<n>` (n ≥ 1); the point must be one of [`POINTS`].
    pub(super) fn parse(spec: &str) -> Result<Armed, String> {
        let (name, nth) = match spec.split_once(':') {
            Some((name, n)) => {
                let nth = n
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("{ENV}={spec}: the hit must be a number from 1"))?;
                (name, nth)
            }
            None => (spec, 1),
        };
        let point = POINTS
            .iter()
            .find(|p| **p == name)
            .ok_or_else(|| format!("{ENV}={spec}: unknown point, one of {POINTS:?}"))?;
        Ok(Armed { point, nth })
    }

    /// Counts a hit of `name`: whether it is the armed one.
    pub(super) fn hit(name: &str) -> bool {
        static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
        static HITS: AtomicU32 = AtomicU32::new(0);
        let armed = ARMED.get_or_init(|| {
            let spec = std::env::var(ENV).ok().filter(|s| !s.is_empty())?;
            parse(&spec)
                .inspect(|a| tracing::warn!(point = a.point, hit = a.nth, "fault injection armed"))
                .inspect_err(|e| tracing::error!("{e}: fault injection disarmed"))
                .ok()
        });
        armed
            .as_ref()
            .is_some_and(|a| a.point == name && HITS.fetch_add(1, Ordering::SeqCst) + 1 == a.nth)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_point_alone_kills_at_its_first_hit() {
            assert_eq!(
                parse("cni-add"),
                Ok(Armed {
                    point: "cni-add",
                    nth: 1
                })
            );
        }

        #[test]
        fn a_count_names_the_hit() {
            assert_eq!(
                parse("cni-del:3"),
                Ok(Armed {
                    point: "cni-del",
                    nth: 3
                })
            );
        }

        #[test]
        fn unknown_points_and_bad_counts_are_refused() {
            for bad in [
                "cni-adds",
                "",
                "cni-add:0",
                "cni-add:",
                "cni-add:x",
                "cni-add:-1",
                ":2",
            ] {
                let e = parse(bad).expect_err(bad);
                assert!(e.starts_with(&format!("{ENV}={bad}:")), "{e}");
            }
        }

        #[test]
        fn every_point_parses() {
            for p in POINTS {
                assert_eq!(parse(p).map(|a| a.point), Ok(p));
            }
        }
    }
}
