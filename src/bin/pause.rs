//! rkubelet's pause program: the first process of every pod sandbox.
//!
//! It does what Kubernetes' `build/pause/linux/pause.c` does. The sandbox's
//! namespaces (network, IPC, and PID when the pod shares its process namespace)
//! belong to this process, so it must stay alive, use no CPU and almost no memory:
//!
//! * it warns on stderr when it is not PID 1, but carries on;
//! * SIGINT and SIGTERM make it exit with status 0 at once;
//! * SIGCHLD reaps every exited child with `waitpid(-1, WNOHANG)`: as PID 1 of a
//!   shared PID namespace it inherits the orphans of all the pod's containers;
//! * otherwise it sleeps in `pause(2)` forever;
//! * `-v` prints its version and exits.
//!
//! It uses only `std` and a few C library functions declared below, so that it
//! builds standalone and statically, with no crates:
//!
//! ```text
//! rustc --edition 2024 -C opt-level=s -C panic=abort -C strip=symbols \
//!       -C target-feature=+crt-static -o pause src/bin/pause.rs
//! ```

// The rkubelet package denies `unsafe_code`. This program cannot avoid it: there
// is no signal handling or `pause(2)` in `std`, and it may use no crates (it is
// built standalone with `rustc`). Every unsafe block below is a single call to a
// C library function, with a SAFETY comment.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::io::Write;
use std::process::ExitCode;

/// The pause program's version, printed by `-v`; the pause image's tag.
const VERSION: &str = "1.0";

// <signal.h> and <sys/wait.h> values. They are the same on every Linux
// architecture Rust supports with glibc or musl for these three signals.
const SIGINT: c_int = 2;
const SIGTERM: c_int = 15;
const SIGCHLD: c_int = 17;
const WNOHANG: c_int = 1;
/// `SIG_ERR` as returned by `signal`: `(sighandler_t) -1`.
const SIG_ERR: usize = usize::MAX;

/// The type of a signal handler, `void (*)(int)`.
type SigHandler = extern "C" fn(c_int);

unsafe extern "C" {
    /// Installs a handler. glibc's `signal` has BSD semantics: the handler stays
    /// installed, the signal is blocked while it runs, system calls restart.
    fn signal(signum: c_int, handler: SigHandler) -> usize;
    /// Sleeps until a signal handler has run.
    fn pause() -> c_int;
    /// Reaps a child; `status` may be null.
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    /// Ends the process at once, without running atexit handlers or flushing.
    fn _exit(status: c_int) -> !;
    /// The address of the calling thread's `errno` (glibc and musl).
    fn __errno_location() -> *mut c_int;
}

/// SIGINT and SIGTERM: exit cleanly with status 0.
///
/// Only async-signal-safe functions may be called here: `_exit` is one.
extern "C" fn on_terminate(_signal: c_int) {
    // SAFETY: `_exit` is async-signal-safe and takes no pointers.
    unsafe { _exit(0) }
}

/// SIGCHLD: reap every child that has exited, without blocking.
///
/// Only async-signal-safe functions may be called here: `waitpid` is one, and
/// reading or writing `errno` through its address is allowed. `errno` is saved
/// and restored so that the interrupted code never sees `waitpid`'s.
extern "C" fn on_child(_signal: c_int) {
    // SAFETY: `__errno_location` has no preconditions and returns a valid,
    // aligned pointer to this thread's `errno`, live for the thread's lifetime.
    let errno = unsafe { __errno_location() };
    // SAFETY: `errno` is valid for reads (see above).
    let saved = unsafe { errno.read() };
    // SAFETY: a null `status` is allowed: the exit status is not stored.
    while unsafe { waitpid(-1, std::ptr::null_mut(), WNOHANG) } > 0 {}
    // SAFETY: `errno` is valid for writes (see above).
    unsafe { errno.write(saved) };
}

/// Installs `handler` for `signum`, or says why it could not.
fn install(signum: c_int, handler: SigHandler) -> Result<(), std::io::Error> {
    // SAFETY: `handler` is an `extern "C" fn(c_int)` that lives as long as the
    // program and calls only async-signal-safe functions.
    if unsafe { signal(signum, handler) } == SIG_ERR {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn main() -> ExitCode {
    // Like pause.c, `-v` (any case) anywhere on the command line prints the version.
    if std::env::args_os()
        .skip(1)
        .any(|arg| arg.eq_ignore_ascii_case("-v"))
    {
        if writeln!(std::io::stdout(), "pause.rs {VERSION}").is_err() {
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }

    if std::process::id() != 1 {
        eprintln!("Warning: pause should be the first process");
    }

    let handlers: [(c_int, SigHandler); 3] = [
        (SIGINT, on_terminate),
        (SIGTERM, on_terminate),
        (SIGCHLD, on_child),
    ];
    for (signum, handler) in handlers {
        if let Err(err) = install(signum, handler) {
            eprintln!("Error: cannot install a handler for signal {signum}: {err}");
            return ExitCode::FAILURE;
        }
    }

    loop {
        // SAFETY: `pause` takes no arguments and only waits for a signal.
        unsafe { pause() };
    }
}
