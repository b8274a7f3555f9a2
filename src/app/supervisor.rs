//! A supervisor of named, long-running tasks, declared up front as a tree: each task's
//! name, the tasks it starts after, and what its failure does (stop every task, restart it
//! with back-off, or log and go on). It starts them in the declared order as they are
//! handed their runs, reports a failure or a panic by the task's name, and stops them all
//! in reverse start order. It knows nothing of what its tasks do: no kubelet concept here.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;

/// What a task's error or panic does.
#[derive(Debug, Clone)]
pub enum OnFailure {
    /// Every task stops (in reverse start order) and the supervisor reports this failure.
    Stop,
    /// The task starts again after the back-off's wait; the other tasks go on. A run that
    /// outlasted twice the wait before it starts the back-off again from its first wait.
    Restart(Backoff),
    /// The failure is logged; the task stays ended and the others go on.
    Ignore,
}

/// One task of the tree: its name, what it starts after, what its failure does.
#[derive(Debug, Clone)]
pub struct Task {
    name: &'static str,
    after: Vec<&'static str>,
    on_failure: OnFailure,
}

impl Task {
    /// The task `name`, whose failure does `on_failure`.
    #[must_use]
    pub fn new(name: &'static str, on_failure: OnFailure) -> Self {
        Self {
            name,
            after: Vec::new(),
            on_failure,
        }
    }

    /// The tasks that must have started before this one (and so stop after it).
    #[must_use]
    pub fn after(mut self, names: &[&'static str]) -> Self {
        self.after.extend_from_slice(names);
        self
    }
}

/// How a run ends when the tasks stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopping {
    /// It watches the stop token it is given and returns by itself (awaited until the
    /// supervisor's deadline, then dropped).
    Itself,
    /// It knows nothing of stopping: dropped where it waits.
    Dropped,
}

type RunFuture<E> = BoxFuture<'static, Result<(), E>>;

/// How a task's runs are made.
enum Make<E> {
    /// Anew for each run (so it can be restarted).
    Again(Box<dyn FnMut(CancellationToken) -> RunFuture<E> + Send>),
    /// Once: it owns what it runs with.
    Once(Option<Box<dyn FnOnce(CancellationToken) -> RunFuture<E> + Send>>),
}

/// What a run may return: nothing (it cannot fail but by panicking), or a result whose
/// error converts into the supervisor's.
pub trait Outcome<E>: Send + 'static {
    /// As a result.
    ///
    /// # Errors
    /// The run's own error, converted.
    fn into_result(self) -> Result<(), E>;
}

impl<E> Outcome<E> for () {
    fn into_result(self) -> Result<(), E> {
        Ok(())
    }
}

impl<E, F: Into<E> + Send + 'static> Outcome<E> for Result<(), F> {
    fn into_result(self) -> Result<(), E> {
        self.map_err(Into::into)
    }
}

/// What a task runs: made from the token that asks it to stop.
pub struct Run<E> {
    stopping: Stopping,
    make: Make<E>,
}

impl<E: Send + 'static> Run<E> {
    /// Runs `run` on a clone of `state`, made anew when the task is restarted.
    pub fn again<S, F, Fut>(state: S, run: F) -> Self
    where
        S: Clone + Send + 'static,
        F: Fn(S, CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output: Outcome<E>> + Send + 'static,
    {
        Self::made(Make::Again(Box::new(move |stop| {
            run(state.clone(), stop).map(Outcome::into_result).boxed()
        })))
    }

    /// Runs `run` once: it owns what it runs with, so its task cannot be restarted.
    pub fn once<F, Fut>(run: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output: Outcome<E>> + Send + 'static,
    {
        Self::made(Make::Once(Some(Box::new(move |stop| {
            run(stop).map(Outcome::into_result).boxed()
        }))))
    }

    fn made(make: Make<E>) -> Self {
        Self {
            stopping: Stopping::Itself,
            make,
        }
    }

    /// The run knows nothing of its stop token: when the tasks stop, it is dropped where
    /// it waits instead of being awaited.
    #[must_use]
    pub fn dropped_on_stop(mut self) -> Self {
        self.stopping = Stopping::Dropped;
        self
    }

    /// The next run, if one can be made.
    fn next(&mut self, stop: CancellationToken) -> Option<RunFuture<E>> {
        match &mut self.make {
            Make::Again(make) => Some(make(stop)),
            Make::Once(make) => make.take().map(|make| make(stop)),
        }
    }
}

/// A task that failed under [`OnFailure::Stop`].
#[derive(Debug, thiserror::Error)]
pub enum Failure<E: std::error::Error + 'static> {
    /// It returned an error.
    #[error("task {task}: {source}")]
    Error {
        /// The task's name.
        task: &'static str,
        /// Its error.
        source: E,
    },
    /// It panicked.
    #[error("task {task} panicked: {message}")]
    Panic {
        /// The task's name.
        task: &'static str,
        /// The panic's message.
        message: String,
    },
}

/// A run handed to the supervisor in a way its tree does not allow.
#[derive(Debug, thiserror::Error)]
pub enum DeclarationError {
    /// No task of the tree has this name.
    #[error("task {task} is not declared")]
    Undeclared {
        /// The name.
        task: String,
    },
    /// A task declared after it has started already (or it has itself).
    #[error("task {task} is declared before {started}, which has started")]
    OutOfOrder {
        /// The task.
        task: &'static str,
        /// The task started already.
        started: &'static str,
    },
    /// A task it starts after has not started.
    #[error("task {task} starts after {after}, which has not started")]
    NotStartedYet {
        /// The task.
        task: &'static str,
        /// What it starts after.
        after: &'static str,
    },
    /// It is to be restarted, but runs only once.
    #[error("task {task} is restarted on failure but its run cannot be made again")]
    NotRestartable {
        /// The task.
        task: &'static str,
    },
}

struct Running {
    name: &'static str,
    stop: CancellationToken,
    stopping: Stopping,
    handle: JoinHandle<()>,
}

/// Runs the tasks of a declared tree until asked to stop, or until a task whose failure
/// stops them all fails; then stops them in reverse start order.
pub struct Supervisor<E: std::error::Error + 'static> {
    tree: Vec<Task>,
    /// How many of `tree`'s tasks have been passed (started or skipped) in order.
    passed: usize,
    /// Fires when the tasks must stop: the outer cancellation, or a [`OnFailure::Stop`]
    /// failure.
    stopping: CancellationToken,
    failures: mpsc::UnboundedSender<Failure<E>>,
    failed: mpsc::UnboundedReceiver<Failure<E>>,
    running: Vec<Running>,
    stop_within: Duration,
}

impl<E: std::error::Error + Send + 'static> Supervisor<E> {
    /// A supervisor of `tree`, whose tasks start in this order (a task may be left out)
    /// and stop when `cancel` fires; when they stop, they are given `stop_within` in all
    /// to end by themselves before the rest are dropped.
    #[must_use]
    pub fn new(cancel: &CancellationToken, stop_within: Duration, tree: Vec<Task>) -> Self {
        let (failures, failed) = mpsc::unbounded_channel();
        Self {
            tree,
            passed: 0,
            stopping: cancel.child_token(),
            failures,
            failed,
            running: Vec::new(),
            stop_within,
        }
    }

    /// Fires when the tasks must stop (for start-up steps that take a token).
    #[must_use]
    pub fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }

    /// Runs a start-up step unless the tasks must stop first: `None` then.
    pub async fn step<T>(&self, step: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            () = self.stopping.cancelled() => None,
            done = step => Some(done),
        }
    }

    /// Starts the task `name` with `run`.
    ///
    /// # Errors
    /// [`DeclarationError`] if the tree has no such task, if a task declared after it has
    /// started, if a task it starts after has not, or if it is to be restarted but `run`
    /// runs once.
    pub fn start(&mut self, name: &str, run: Run<E>) -> Result<(), DeclarationError> {
        let index = self
            .tree
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| DeclarationError::Undeclared {
                task: name.to_owned(),
            })?;
        let task = self.tree[index].clone();
        if index < self.passed {
            let started = self.running.last().map_or(task.name, |r| r.name);
            return Err(DeclarationError::OutOfOrder {
                task: task.name,
                started,
            });
        }
        if let Some(after) = task
            .after
            .iter()
            .find(|a| !self.running.iter().any(|r| r.name == **a))
        {
            return Err(DeclarationError::NotStartedYet {
                task: task.name,
                after,
            });
        }
        if matches!(
            (&task.on_failure, &run.make),
            (OnFailure::Restart(_), Make::Once(_))
        ) {
            return Err(DeclarationError::NotRestartable { task: task.name });
        }
        self.passed = index + 1;
        let stop = CancellationToken::new();
        tracing::debug!(task = task.name, "starting task");
        self.running.push(Running {
            name: task.name,
            stop: stop.clone(),
            stopping: run.stopping,
            handle: tokio::spawn(supervise(
                task,
                run,
                stop,
                self.stopping.clone(),
                self.failures.clone(),
            )),
        });
        Ok(())
    }

    /// Waits until the tasks must stop, then stops them.
    ///
    /// # Errors
    /// The first [`OnFailure::Stop`] failure.
    pub async fn run(self) -> Result<(), Failure<E>> {
        self.stopping.cancelled().await;
        self.stop().await
    }

    /// Stops the tasks in reverse start order: each is asked to stop and awaited, until
    /// the deadline; those still running then are dropped.
    ///
    /// # Errors
    /// The first [`OnFailure::Stop`] failure.
    pub async fn stop(mut self) -> Result<(), Failure<E>> {
        self.stopping.cancel();
        let deadline = Instant::now() + self.stop_within;
        while let Some(mut task) = self.running.pop() {
            task.stop.cancel();
            if task.stopping == Stopping::Dropped {
                task.handle.abort();
            }
            if tokio::time::timeout_at(deadline, &mut task.handle)
                .await
                .is_err()
            {
                tracing::warn!(task = task.name, within = ?self.stop_within, "task did not stop in time; dropped");
                task.handle.abort();
            }
            tracing::debug!(task = task.name, "task stopped");
        }
        match self.failed.try_recv() {
            Ok(failure) => Err(failure),
            Err(_) => Ok(()),
        }
    }
}

impl<E: std::error::Error + 'static> Drop for Supervisor<E> {
    /// Left without [`Supervisor::stop`] (a start-up step failed): the tasks are dropped.
    fn drop(&mut self) {
        for task in self.running.iter().rev() {
            task.handle.abort();
        }
    }
}

/// Runs `task` until it ends, fails for good, or `stop` fires, applying its policy.
async fn supervise<E: std::error::Error + Send + 'static>(
    task: Task,
    mut run: Run<E>,
    stop: CancellationToken,
    stopping: CancellationToken,
    failures: mpsc::UnboundedSender<Failure<E>>,
) {
    let mut backoff: Option<Backoff> = None;
    let mut last_wait = Duration::ZERO;
    loop {
        let began = Instant::now();
        let Some(failure) = run_once(task.name, &mut run, &stop).await else {
            return;
        };
        if stop.is_cancelled() {
            tracing::warn!(task = task.name, error = %failure, "task failed while stopping");
            return;
        }
        let policy = match &task.on_failure {
            OnFailure::Restart(policy) => policy,
            OnFailure::Stop => {
                tracing::error!(task = task.name, error = %failure, "task failed; stopping all tasks");
                let _ = failures.send(failure);
                stopping.cancel();
                return;
            }
            OnFailure::Ignore => {
                tracing::error!(task = task.name, error = %failure, "task failed; the others go on without it");
                return;
            }
        };
        // A run that outlasted twice the wait before it was a healthy one.
        if began.elapsed() > last_wait * 2 {
            backoff = None;
        }
        last_wait = backoff
            .get_or_insert_with(|| policy.clone())
            .failed(std::time::Instant::now());
        tracing::error!(task = task.name, error = %failure, retry_in = ?last_wait, "task failed; restarting it");
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(last_wait) => {}
        }
    }
}

/// One run of the task `name`: how it failed, if it did.
async fn run_once<E: std::error::Error + Send + 'static>(
    name: &'static str,
    run: &mut Run<E>,
    stop: &CancellationToken,
) -> Option<Failure<E>> {
    // `start` lets only runs made anew be restarted: a run-once is not run again.
    let future = run.next(stop.clone())?;
    match AssertUnwindSafe(future).catch_unwind().await {
        Ok(Ok(())) => {
            if !stop.is_cancelled() {
                tracing::info!(task = name, "task ended");
            }
            None
        }
        Ok(Err(source)) => Some(Failure::Error { task: name, source }),
        Err(panic) => Some(Failure::Panic {
            task: name,
            message: panic_message(panic.as_ref()),
        }),
    }
}

/// The message a panic was raised with.
fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(not a string)".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use OnFailure::{Ignore, Restart, Stop};

    const MS: Duration = Duration::from_millis(10);

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Boom(&'static str);

    /// A log writer that sends what is written.
    struct Sink(std::sync::mpsc::Sender<Vec<u8>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.send(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A tree of tasks, what they write when they start and stop, and what it logs (on
    /// this thread: the tests run on a current-thread runtime).
    struct Bench {
        cancel: CancellationToken,
        tree: Supervisor<Boom>,
        journal: mpsc::UnboundedSender<String>,
        written: mpsc::UnboundedReceiver<String>,
        log: std::sync::mpsc::Receiver<Vec<u8>>,
        _logging: tracing::subscriber::DefaultGuard,
    }

    /// How a bench's tree ended: its result, what its tasks wrote, its log.
    struct Ended {
        result: Result<(), Failure<Boom>>,
        written: Vec<String>,
        log: String,
    }

    impl Ended {
        /// Whether one line of the log holds every one of `words`.
        fn logged(&self, words: &[&str]) -> bool {
            self.log
                .lines()
                .any(|l| words.iter().all(|w| l.contains(w)))
        }
    }

    impl Bench {
        fn new(stop_within: Duration, tasks: Vec<Task>) -> Self {
            let (sink, log) = std::sync::mpsc::channel();
            let subscriber = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || Sink(sink.clone()))
                .finish();
            let (journal, written) = mpsc::unbounded_channel();
            let cancel = CancellationToken::new();
            Self {
                tree: Supervisor::new(&cancel, stop_within, tasks),
                cancel,
                journal,
                written,
                log,
                _logging: tracing::subscriber::set_default(subscriber),
            }
        }

        /// A run that writes when it starts and when it is asked to stop.
        fn steady(&self, name: &'static str) -> Run<Boom> {
            Run::again(self.journal.clone(), move |journal, stop| async move {
                let _ = journal.send(format!("start {name}"));
                stop.cancelled().await;
                let _ = journal.send(format!("stop {name}"));
            })
        }

        fn start_steady(&mut self, name: &'static str) {
            let run = self.steady(name);
            self.tree.start(name, run).unwrap();
        }

        /// Waits until the tree stops (asked to with `cancel`, or by a failure).
        async fn ended(mut self) -> Ended {
            let result = self.tree.run().await;
            Ended {
                result,
                written: std::iter::from_fn(|| self.written.try_recv().ok()).collect(),
                log: String::from_utf8(self.log.try_iter().flatten().collect()).unwrap_or_default(),
            }
        }
    }

    /// Lets the spawned tasks run until they wait.
    async fn settle() {
        tokio::time::sleep(MS * 2).await;
    }

    #[tokio::test]
    async fn tasks_start_in_the_declared_order_and_a_cancel_stops_them_in_reverse() {
        let mut bench = Bench::new(
            Duration::from_secs(5),
            vec![
                Task::new("a", Stop),
                Task::new("b", Ignore).after(&["a"]),
                Task::new("c", Stop).after(&["b"]),
            ],
        );
        for name in ["a", "b", "c"] {
            bench.start_steady(name);
            settle().await;
        }
        bench.cancel.cancel();
        let ended = bench.ended().await;
        assert!(ended.result.is_ok(), "{:?}", ended.result);
        let order = [
            "start a", "start b", "start c", "stop c", "stop b", "stop a",
        ];
        assert_eq!(ended.written, order);
    }

    #[tokio::test]
    async fn a_run_handed_against_the_declaration_is_refused() {
        let mut bench = Bench::new(
            Duration::from_secs(5),
            vec![
                Task::new("a", Stop),
                Task::new("b", Stop).after(&["a"]),
                Task::new("c", Ignore),
                Task::new("d", Restart(Backoff::new(MS, MS))),
            ],
        );
        let mut refused = |name, run| bench.tree.start(name, run).unwrap_err().to_string();
        let expected = [
            ("b", "task b starts after a, which has not started"),
            ("x", "task x is not declared"),
        ];
        for (name, why) in expected {
            assert_eq!(refused(name, Run::once(|_| async {})), why);
        }
        bench.start_steady("c");
        let mut refused = |name, run| bench.tree.start(name, run).unwrap_err().to_string();
        let expected = [
            ("a", "task a is declared before c, which has started"),
            (
                "d",
                "task d is restarted on failure but its run cannot be made again",
            ),
        ];
        for (name, why) in expected {
            assert_eq!(refused(name, Run::once(|_| async {})), why);
        }
    }

    #[tokio::test]
    async fn a_panicking_task_is_reported_by_name_and_stops_the_others() {
        fn give_way() {
            panic!("the shaky one gave way");
        }
        let tasks = vec![Task::new("calm", Stop), Task::new("shaky", Stop)];
        let mut bench = Bench::new(Duration::from_secs(5), tasks);
        bench.start_steady("calm");
        let shaky = Run::once(|_| async {
            settle().await;
            give_way();
        });
        bench.tree.start("shaky", shaky).unwrap();
        let ended = bench.ended().await;
        assert!(
            matches!(&ended.result, Err(Failure::Panic { task: "shaky", message }) if message == "the shaky one gave way"),
            "{:?}",
            ended.result
        );
        assert_eq!(ended.written, ["start calm", "stop calm"]);
        let reported = [
            "ERROR",
            "task=\"shaky\"",
            "task shaky panicked: the shaky one gave way",
            "stopping all tasks",
        ];
        assert!(ended.logged(&reported), "{}", ended.log);
    }

    #[tokio::test]
    async fn a_stop_tasks_error_stops_the_others_in_reverse_start_order() {
        let mut bench = Bench::new(
            Duration::from_secs(5),
            vec![
                Task::new("a", Ignore),
                Task::new("b", Restart(Backoff::new(MS, MS))),
                Task::new("fatal", Stop),
                Task::new("d", Stop),
            ],
        );
        bench.start_steady("a");
        bench.start_steady("b");
        let (fail, failing) = tokio::sync::oneshot::channel::<()>();
        let fatal = Run::once(|_| async {
            let _ = failing.await;
            Err::<(), _>(Boom("lost the lease"))
        });
        bench.tree.start("fatal", fatal).unwrap();
        bench.start_steady("d");
        settle().await;
        let _ = fail.send(());
        let ended = bench.ended().await;
        let failure = ended.result.as_ref().map_err(ToString::to_string);
        assert_eq!(failure, Err("task fatal: lost the lease".to_owned()));
        let order = [
            "start a", "start b", "start d", "stop d", "stop b", "stop a",
        ];
        assert_eq!(ended.written, order);
        let reported = ["ERROR", "task=\"fatal\"", "lost the lease", "stopping all"];
        assert!(ended.logged(&reported), "{}", ended.log);
    }

    #[tokio::test]
    async fn a_restart_task_is_restarted_with_back_off_and_the_others_are_untouched() {
        let mut bench = Bench::new(
            Duration::from_secs(5),
            vec![
                Task::new("steady", Stop),
                Task::new("flaky", Restart(Backoff::new(MS * 4, MS * 10))),
            ],
        );
        bench.start_steady("steady");
        let (starts, mut started) = mpsc::unbounded_channel();
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let flaky = Run::again((starts, runs), |(starts, runs), stop| async move {
            let _ = starts.send(Instant::now());
            if runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 3 {
                return Err(Boom("flaked"));
            }
            stop.cancelled().await;
            Ok(())
        });
        bench.tree.start("flaky", flaky).unwrap();
        tokio::time::sleep(MS * 40).await;
        bench.cancel.cancel();
        let ended = bench.ended().await;
        assert!(ended.result.is_ok(), "{:?}", ended.result);
        let at: Vec<Instant> = std::iter::from_fn(|| started.try_recv().ok()).collect();
        assert_eq!(at.len(), 4, "three failures, then a run until stopped");
        let waits: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
        for (wait, least) in waits.iter().zip([MS * 4, MS * 8, MS * 10]) {
            assert!(
                *wait >= least,
                "waited {waits:?}, want 40, 80, 100 ms at least"
            );
        }
        assert_eq!(ended.written, ["start steady", "stop steady"]);
        let restarts = ended
            .log
            .lines()
            .filter(|l| l.contains("task=\"flaky\"") && l.contains("restarting it"))
            .count();
        assert_eq!(restarts, 3, "{}", ended.log);
    }

    #[tokio::test]
    async fn an_ignored_failure_is_logged_and_the_others_go_on() {
        let tasks = vec![Task::new("steady", Stop), Task::new("best-effort", Ignore)];
        let mut bench = Bench::new(Duration::from_secs(5), tasks);
        bench.start_steady("steady");
        let once = Run::once(|_| async { Err::<(), _>(Boom("no events today")) });
        bench.tree.start("best-effort", once).unwrap();
        settle().await;
        assert!(!bench.tree.stopping().is_cancelled());
        bench.cancel.cancel();
        let ended = bench.ended().await;
        assert!(ended.result.is_ok(), "{:?}", ended.result);
        assert_eq!(ended.written, ["start steady", "stop steady"]);
        let reported = ["ERROR", "task=\"best-effort\"", "no events today", "go on"];
        assert!(ended.logged(&reported), "{}", ended.log);
    }

    #[tokio::test]
    async fn a_task_that_does_not_stop_in_time_is_dropped_and_one_dropped_on_stop_at_once() {
        let tasks = vec![Task::new("deaf", Stop), Task::new("idle", Stop)];
        let mut bench = Bench::new(MS * 5, tasks);
        let forever = || Run::once(|_| std::future::pending::<()>());
        bench.tree.start("deaf", forever()).unwrap();
        bench
            .tree
            .start("idle", forever().dropped_on_stop())
            .unwrap();
        bench.cancel.cancel();
        let began = Instant::now();
        let ended = bench.ended().await;
        assert!(began.elapsed() < Duration::from_secs(1));
        assert!(ended.result.is_ok(), "{:?}", ended.result);
        let late = |task| ended.logged(&[task, "did not stop in time"]);
        assert!(late("task=\"deaf\""), "{}", ended.log);
        assert!(!late("task=\"idle\""), "{}", ended.log);
    }

    #[tokio::test]
    async fn a_step_ends_when_the_tasks_must_stop() {
        let bench = Bench::new(Duration::from_secs(5), vec![]);
        assert_eq!(bench.tree.step(async { 7 }).await, Some(7));
        bench.cancel.cancel();
        assert_eq!(bench.tree.step(std::future::pending::<()>()).await, None);
    }
}
