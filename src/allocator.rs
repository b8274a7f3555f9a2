//! The C allocator's settings, the one place with `unsafe` code. glibc's malloc gives each
//! thread that allocates its own arena (up to eight per core) and keeps what is freed
//! there: after a burst of pods has passed through the runtime threads and the blocking
//! pool, the agent's resident memory stays at several times its live heap. Two arenas,
//! and handing free pages back to the kernel now and then, keep it close to the heap.
//! Elsewhere than glibc these are no-ops.
//!
//! Knows no other module of the agent.

use std::time::Duration;

/// Arenas malloc may create: one for the main thread, one shared by all others.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENAS: nix::libc::c_int = 2;

/// Caps malloc's arenas. Call first thing in `main`, before any other thread exists.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets a malloc parameter; called before any thread is spawned,
    // nothing allocates concurrently.
    #[allow(unsafe_code)]
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, ARENAS);
    }
}

/// Gives the free pages of every arena back to the kernel.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` is thread-safe (it takes each arena's lock) and only releases
    // memory that is free.
    #[allow(unsafe_code)]
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

/// Trims every `period`, for as long as the process runs.
pub async fn trim_every(period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_keeps_live_memory_intact() {
        let live: Vec<Vec<u8>> = (0..64).map(|i| vec![i; 64 * 1024]).collect();
        let freed: Vec<Vec<u8>> = (0..64).map(|i| vec![i; 64 * 1024]).collect();
        drop(freed);
        trim();
        assert!(
            live.iter()
                .enumerate()
                .all(|(i, v)| v.iter().all(|b| usize::from(*b) == i))
        );
    }
}
