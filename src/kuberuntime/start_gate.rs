//! The start gate: how many pods are set up in the runtime at once (sandbox, container
//! creates and starts), and in which order the waiting ones get their turn.
//!
//! The kubelet starts every pod worker at once and lets the runtime queue them; on a small
//! node that makes every start slow together, and the runtime's answers to the pods already
//! running (status, exec probes) wait behind the new starts. A fixed number of turns does
//! not fit every load either. The gate adapts the number of turns to what the runtime
//! answers: each sandbox run, container create and start reports how long it took, against
//! the best time of that call in its recent quiet past (a call made while at most
//! [`QUIET`] pods were being set up: a burst's calls alone would compare a crowded runtime
//! with itself); while calls take more than
//! [`CROWDED`] times their best, the number of turns shrinks, and while they take less than
//! [`ROOMY`] times their best and the turns are all in use, it grows (additive increase,
//! multiplicative decrease), between [`MIN_TURNS`] (or half the ceiling, when lower) and
//! the configured ceiling.
//!
//! The runtime also serves the agent's other work, the exec probes of the pods already
//! running above all (a `runc exec` each). Measured on a 2-core node with a hundred pods
//! probed every second (a third by exec): with ten starts in flight beside some seventy exec
//! probes, about two pods started a second once sixty ran (ten at first), and the last was
//! Ready 24–35 s after the burst, 5–13 s behind the kubelet, which starts every pod at
//! once. So each exec probe in flight lends the gate one more turn ([`StartGate::lend`]): the
//! starts keep at least half of the calls in flight, the probes the rest (a probe is not
//! held back). Not capped at the ceiling: a cap at it (20) showed no gain in the one clean
//! run measured (docs/benchmarks.md). With no exec probe in flight the rule is as above
//! (what the limit learnt meanwhile, from starts made on lent turns too, stays). And while
//! pods wait for a turn ([`StartGate::queued`]), the exec probes of containers that pass
//! them wait too (for ten seconds at most: the prober's rule), so that the runtime sets the
//! waiting pods up first.
//!
//! The order favours finishing what has begun: a pod that already had a turn (it came back
//! from an image pull, or starts its next container) goes before any pod that has not begun;
//! within each class, first come first served.
//!
//! Owns only the counting and the queue: knows no CRI call, no pod, no clock (the caller
//! measures), so its decisions are unit-tested as plain arithmetic.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

/// Calls take more than this many times their best: the runtime is crowded.
pub const CROWDED: f64 = 8.0;
/// Calls take less than this many times their best: the runtime has room.
pub const ROOMY: f64 = 5.0;
/// Never fewer turns than this (or half the ceiling, 2 at least, when that is lower): the
/// CRI floor on a 2-core node is fastest with 5 to 10 pods set up at once, and when the
/// runtime is crowded by other work (the exec probes of a hundred running pods) fewer
/// starts do not relieve it, they only queue the pods still to start behind that work.
/// Not higher: a runtime whose every start goes through systemd (runc's scopes with
/// `SystemdCgroup`) is quicker with fewer pods at once (docs/benchmarks.md has the runs).
pub const MIN_TURNS: f64 = 5.0;
/// A call made while at most this many pods were being set up shows the runtime's own
/// speed; until one was seen, the turns stay as they are.
pub const QUIET: usize = 2;
/// The share of the latest sample in the smoothed pressure.
const SMOOTHING: f64 = 0.1;
/// Each sample that finds the runtime crowded takes this share of the turns away.
const DECREASE: f64 = 0.95;
/// How many recent quiet samples of each call its best time is taken from: a lasting
/// change of the machine's speed is followed.
const WINDOW: usize = 256;

/// The runtime calls whose latency the gate follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StartCall {
    /// `RunPodSandbox` (with the pod's network when the runtime owns it).
    RunPodSandbox,
    /// `CreateContainer`.
    CreateContainer,
    /// `StartContainer`.
    StartContainer,
}

/// Who asks for a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    /// A pod that had a turn before (back from an image pull, or its next container).
    Begun,
    /// A pod that has not begun.
    New,
}

/// The number of turns, from the runtime's latencies (pure arithmetic, no clock).
#[derive(Debug, Clone)]
pub struct AdaptiveLimit {
    limit: f64,
    ceiling: f64,
    floor: f64,
    /// Each call's recent quiet samples, for its best time.
    recent: BTreeMap<StartCall, VecDeque<Duration>>,
    /// Smoothed ratio of the calls' latency to their best time.
    pressure: f64,
}

impl AdaptiveLimit {
    /// Starts at half the ceiling (rounded up, 2 at least where the ceiling allows):
    /// room to grow and to shrink.
    pub fn new(ceiling: usize) -> Self {
        let ceiling = ceiling.max(1) as f64;
        let half = (ceiling / 2.0).ceil().max(ceiling.min(2.0));
        Self {
            limit: half,
            ceiling,
            floor: half.min(MIN_TURNS),
            recent: BTreeMap::new(),
            pressure: 1.0,
        }
    }

    /// The number of turns now.
    pub fn turns(&self) -> usize {
        // Whole turns, the fraction carried for the next samples.
        self.limit.floor() as usize
    }

    /// The smoothed ratio of the calls' latency to their best time.
    pub fn pressure(&self) -> f64 {
        self.pressure
    }

    /// Takes one call's latency, with the turns in use when it ended, and returns the
    /// number of turns.
    pub fn observe(&mut self, call: StartCall, took: Duration, in_use: usize) -> usize {
        let recent = self.recent.entry(call).or_default();
        if in_use <= QUIET {
            if recent.len() == WINDOW {
                recent.pop_front();
            }
            recent.push_back(took);
        }
        let Some(best) = recent.iter().min().copied() else {
            return self.turns();
        };
        let ratio = if best.is_zero() {
            1.0
        } else {
            took.as_secs_f64() / best.as_secs_f64()
        };
        self.pressure += SMOOTHING * (ratio - self.pressure);
        if self.pressure > CROWDED {
            self.limit = (self.limit * DECREASE).max(self.floor);
        } else if self.pressure < ROOMY && in_use + 1 >= self.turns() {
            // Grows only when the turns are used: a node starting two pods learns nothing
            // about twenty.
            self.limit = (self.limit + 1.0 / self.limit).min(self.ceiling);
        }
        self.turns()
    }
}

/// The pods set up at once, and the queue of those waiting.
#[derive(Debug)]
pub struct StartGate {
    state: Mutex<GateState>,
}

#[derive(Debug)]
struct GateState {
    limit: AdaptiveLimit,
    in_use: usize,
    /// The turns lent by the agent's other runtime work in flight ([`StartGate::lend`]).
    lent: usize,
    next_ticket: u64,
    waiting: BTreeMap<(Priority, u64), oneshot::Sender<StartTurn>>,
}

/// One call of the agent's other runtime work in flight (an exec probe), lending the gate a
/// turn until dropped.
#[derive(Debug)]
pub struct Lent {
    gate: Arc<StartGate>,
}

impl Drop for Lent {
    fn drop(&mut self) {
        let mut state = crate::lock::lock(&self.gate.state);
        // Turns in use are not taken back; fewer new ones are given.
        state.lent = state.lent.saturating_sub(1);
    }
}

/// A pod's turn: given back when dropped.
#[derive(Debug)]
pub struct StartTurn {
    /// `None` once counted back by the gate itself.
    gate: Option<Arc<StartGate>>,
}

impl Drop for StartTurn {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            let mut state = crate::lock::lock(&gate.state);
            state.in_use = state.in_use.saturating_sub(1);
            StartGate::admit(&gate, &mut state);
        }
    }
}

impl GateState {
    /// The adaptive turns and the lent ones (at most one per container with an exec probe:
    /// never more pods at once than the kubelet, which starts them all).
    fn turns(&self) -> usize {
        self.limit.turns() + self.lent
    }
}

impl StartGate {
    /// A gate with at most `ceiling` turns of its own.
    pub fn new(ceiling: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(GateState {
                limit: AdaptiveLimit::new(ceiling),
                in_use: 0,
                lent: 0,
                next_ticket: 0,
                waiting: BTreeMap::new(),
            }),
        })
    }

    /// Waits for a turn. A waiter that is dropped leaves the queue; a turn given to it as
    /// it went is given back.
    pub async fn enter(self: &Arc<Self>, priority: Priority) -> StartTurn {
        loop {
            let rx = {
                let mut state = crate::lock::lock(&self.state);
                if state.waiting.is_empty() && state.in_use < state.turns() {
                    state.in_use += 1;
                    return StartTurn {
                        gate: Some(self.clone()),
                    };
                }
                let (tx, rx) = oneshot::channel();
                let ticket = state.next_ticket;
                state.next_ticket += 1;
                state.waiting.insert((priority, ticket), tx);
                Self::admit(self, &mut state);
                rx
            };
            // The sender goes without a turn only with the gate; queue again if it did.
            if let Ok(turn) = rx.await {
                return turn;
            }
        }
    }

    /// Takes one call's latency and adjusts the turns; more turns admit waiters now.
    pub fn observe(self: &Arc<Self>, call: StartCall, took: Duration) {
        let mut state = crate::lock::lock(&self.state);
        let before = state.limit.turns();
        let in_use = state.in_use;
        let after = state.limit.observe(call, took, in_use);
        if after != before {
            tracing::debug!(
                turns = after,
                pressure = state.limit.pressure(),
                "start gate: pods set up at once"
            );
        }
        Self::admit(self, &mut state);
    }

    /// One more turn while the returned guard lives: for a call of the agent's other work
    /// that the runtime serves beside the starts (an exec probe).
    pub fn lend(self: &Arc<Self>) -> Lent {
        let mut state = crate::lock::lock(&self.state);
        state.lent += 1;
        Self::admit(self, &mut state);
        Lent { gate: self.clone() }
    }

    /// Whether pods wait for a turn: a burst is being set up, and the runtime work that
    /// can wait (the periodic exec probes of containers that pass them) gives way.
    pub fn queued(&self) -> bool {
        !crate::lock::lock(&self.state).waiting.is_empty()
    }

    /// The turns now (lent ones included) and the turns in use.
    #[cfg(test)]
    pub(crate) fn turns(&self) -> (usize, usize) {
        let state = crate::lock::lock(&self.state);
        (state.turns(), state.in_use)
    }

    /// Gives free turns to the first waiters, in priority then arrival order.
    fn admit(gate: &Arc<Self>, state: &mut GateState) {
        while state.in_use < state.turns() {
            let Some((_, tx)) = state.waiting.pop_first() else {
                return;
            };
            state.in_use += 1;
            // A waiter that went: its turn is counted back here (its `Drop` would take
            // this lock again).
            if let Err(mut turn) = tx.send(StartTurn {
                gate: Some(gate.clone()),
            }) {
                turn.gate = None;
                state.in_use -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// One call made on a quiet runtime (one pod being set up).
    fn quiet(limit: &mut AdaptiveLimit, call: StartCall, took: Duration) -> usize {
        limit.observe(call, took, 1)
    }

    #[test]
    fn starts_at_half_the_ceiling_and_never_below_the_floor_or_above_the_ceiling() {
        assert_eq!(AdaptiveLimit::new(10).turns(), 5);
        assert_eq!(AdaptiveLimit::new(3).turns(), 2);
        assert_eq!(AdaptiveLimit::new(1).turns(), 1);
        assert_eq!(AdaptiveLimit::new(2).turns(), 2);
        let mut crowded = grown(20);
        assert_eq!(crowded.turns(), 20);
        for _ in 0..200 {
            crowded.observe(StartCall::RunPodSandbox, 1000 * MS, 20);
        }
        assert_eq!(crowded.turns(), 5, "shrinks to the floor, not below");
        let mut small = grown(6);
        for _ in 0..200 {
            small.observe(StartCall::RunPodSandbox, 1000 * MS, 6);
        }
        assert_eq!(small.turns(), 3, "a low ceiling: half of it");
        let mut roomy = AdaptiveLimit::new(10);
        quiet(&mut roomy, StartCall::CreateContainer, 50 * MS);
        for _ in 0..1000 {
            let turns = roomy.turns();
            roomy.observe(StartCall::CreateContainer, 50 * MS, turns);
        }
        assert_eq!(roomy.turns(), 10, "grows to the ceiling, not above");
    }

    /// A limit of `ceiling` grown to it: a quiet call, then calls as quick with every turn
    /// in use.
    fn grown(ceiling: usize) -> AdaptiveLimit {
        let mut limit = AdaptiveLimit::new(ceiling);
        quiet(&mut limit, StartCall::RunPodSandbox, 100 * MS);
        for _ in 0..1000 {
            let turns = limit.turns();
            limit.observe(StartCall::RunPodSandbox, 100 * MS, turns);
        }
        limit
    }

    #[test]
    fn a_burst_before_any_quiet_call_keeps_the_turns() {
        // A node that starts with a burst knows only crowded calls: it cannot tell how
        // crowded, so it neither grows nor shrinks, however quick its calls.
        let mut limit = AdaptiveLimit::new(20);
        for took in [100, 100, 100, 400, 600, 800, 3000, 5000] {
            assert_eq!(limit.observe(StartCall::RunPodSandbox, took * MS, 10), 10);
        }
        // Its last pods, set up alone, show the runtime's own speed.
        quiet(&mut limit, StartCall::RunPodSandbox, 150 * MS);
        for _ in 0..30 {
            limit.observe(StartCall::RunPodSandbox, 150 * MS, 10);
        }
        assert!(limit.turns() > 10, "{}", limit.turns());
    }

    #[test]
    fn shrinks_while_calls_take_more_than_crowded_times_their_best() {
        let mut limit = grown(20);
        let mut last = limit.turns();
        let mut shrank = 0;
        for _ in 0..40 {
            let turns = limit.observe(StartCall::RunPodSandbox, 2000 * MS, 20);
            assert!(turns <= last, "never grows while crowded");
            shrank += usize::from(turns < last);
            last = turns;
        }
        assert!(limit.pressure() > CROWDED);
        assert!(shrank >= 3, "fewer turns step by step: {last}");
    }

    #[test]
    fn holds_between_roomy_and_crowded() {
        let mut limit = AdaptiveLimit::new(20);
        quiet(&mut limit, StartCall::StartContainer, 100 * MS);
        // Six and a half times the best time: neither crowded nor roomy once smoothed.
        for _ in 0..60 {
            limit.observe(StartCall::StartContainer, 650 * MS, 10);
        }
        let held = limit.turns();
        for _ in 0..30 {
            assert_eq!(limit.observe(StartCall::StartContainer, 650 * MS, 10), held);
        }
    }

    #[test]
    fn grows_only_while_its_turns_are_used() {
        let mut idle = AdaptiveLimit::new(20);
        for _ in 0..200 {
            quiet(&mut idle, StartCall::CreateContainer, 50 * MS);
        }
        assert_eq!(
            idle.turns(),
            10,
            "two pods at a time teach nothing about twenty"
        );
        let mut busy = AdaptiveLimit::new(20);
        quiet(&mut busy, StartCall::CreateContainer, 50 * MS);
        for _ in 0..200 {
            let turns = busy.turns();
            busy.observe(StartCall::CreateContainer, 50 * MS, turns);
        }
        assert!(busy.turns() > 10);
    }

    #[test]
    fn each_call_is_compared_with_its_own_best_time() {
        let mut limit = AdaptiveLimit::new(20);
        quiet(&mut limit, StartCall::RunPodSandbox, 500 * MS);
        quiet(&mut limit, StartCall::StartContainer, 50 * MS);
        // A sandbox takes ten times a container start, on a quiet runtime: no pressure.
        for _ in 0..50 {
            limit.observe(StartCall::RunPodSandbox, 500 * MS, 10);
            limit.observe(StartCall::StartContainer, 50 * MS, 10);
        }
        assert!(limit.pressure() < ROOMY, "{}", limit.pressure());
        assert!(limit.turns() >= 10);
    }

    #[test]
    fn the_best_time_is_taken_from_the_recent_window_only() {
        let mut limit = AdaptiveLimit::new(20);
        quiet(&mut limit, StartCall::RunPodSandbox, 10 * MS);
        // The machine became slower for good: once the quick sample left the window, the
        // slower times are the best and the pressure falls back.
        for _ in 1..WINDOW {
            quiet(&mut limit, StartCall::RunPodSandbox, 400 * MS);
        }
        assert!(limit.pressure() > CROWDED);
        for _ in 0..50 {
            quiet(&mut limit, StartCall::RunPodSandbox, 400 * MS);
        }
        assert!(limit.pressure() < ROOMY, "{}", limit.pressure());
    }

    /// Whether `rx` got its turn yet.
    fn admitted(rx: &mut tokio::task::JoinHandle<(usize, StartTurn)>) -> bool {
        rx.is_finished()
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn turns_go_to_begun_pods_first_then_in_arrival_order() {
        let gate = StartGate::new(3);
        let a = gate.enter(Priority::New).await;
        let b = gate.enter(Priority::New).await;
        assert_eq!(gate.turns(), (2, 2));
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for (i, priority) in [
            (0, Priority::New),
            (1, Priority::New),
            (2, Priority::Begun),
            (3, Priority::New),
            (4, Priority::Begun),
        ] {
            let gate = gate.clone();
            let order = order.clone();
            waiters.push(tokio::spawn(async move {
                let turn = gate.enter(priority).await;
                order.lock().unwrap().push(i);
                (i, turn)
            }));
            settle().await;
        }
        assert!(order.lock().unwrap().is_empty(), "no turn is free");
        drop(a);
        settle().await;
        assert_eq!(*order.lock().unwrap(), [2]);
        drop(b);
        settle().await;
        assert_eq!(*order.lock().unwrap(), [2, 4]);
        // Each turn given back admits the next waiter.
        for _ in 0..3 {
            let turn = order.lock().unwrap().len();
            let done = waiters
                .iter_mut()
                .position(admitted)
                .expect("an admitted waiter");
            let (_, t) = waiters.remove(done).await.unwrap();
            drop(t);
            settle().await;
            assert_eq!(order.lock().unwrap().len(), turn + 1);
        }
        assert_eq!(*order.lock().unwrap(), [2, 4, 0, 1, 3]);
    }

    #[tokio::test]
    async fn a_waiter_that_goes_leaves_no_turn_taken() {
        let gate = StartGate::new(2);
        let a = gate.enter(Priority::New).await;
        let b = gate.enter(Priority::New).await;
        let gone = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter(Priority::Begun).await })
        };
        settle().await;
        gone.abort();
        settle().await;
        drop(a);
        drop(b);
        assert_eq!(gate.turns(), (2, 0), "every turn back");
        let c = gate.enter(Priority::New).await;
        let d = gate.enter(Priority::New).await;
        assert_eq!(gate.turns(), (2, 2));
        drop((c, d));
        assert_eq!(gate.turns(), (2, 0));
    }

    #[tokio::test]
    async fn each_exec_probe_in_flight_lends_a_turn_that_admits_a_waiter_at_once() {
        let gate = StartGate::new(4);
        let held: Vec<StartTurn> =
            futures::future::join_all((0..2).map(|_| gate.enter(Priority::New))).await;
        assert_eq!(gate.turns(), (2, 2), "half the ceiling, all in use");
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let gate = gate.clone();
                tokio::spawn(async move { gate.enter(Priority::New).await })
            })
            .collect();
        settle().await;
        assert!(waiters.iter().all(|w| !w.is_finished()), "no turn is free");
        // Two probes' runtime calls in flight: two more pods set up beside them.
        let probes = [gate.lend(), gate.lend()];
        settle().await;
        assert_eq!(waiters.iter().filter(|w| w.is_finished()).count(), 2);
        assert_eq!(gate.turns(), (4, 4));
        // The probes are done: the lent turns in use are not taken back, and the next
        // turn given back goes to nobody until fewer than the gate's own are in use.
        drop(probes);
        assert_eq!(gate.turns(), (2, 4));
        drop(held);
        settle().await;
        assert_eq!(gate.turns(), (2, 2));
        assert_eq!(waiters.iter().filter(|w| w.is_finished()).count(), 2);
        // The gate's own turns all in use: a lend admits the last waiter.
        let probe = gate.lend();
        settle().await;
        assert_eq!(gate.turns(), (3, 3), "the last waiter, on the lent turn");
        drop(probe);
        for w in waiters {
            drop(w.await.unwrap());
        }
        assert_eq!(gate.turns(), (2, 0), "every turn back");
    }

    #[tokio::test]
    async fn more_turns_admit_waiters_at_once_and_fewer_take_none_back() {
        let gate = StartGate::new(8);
        gate.observe(StartCall::CreateContainer, 10 * MS);
        let held: Vec<StartTurn> =
            futures::future::join_all((0..4).map(|_| gate.enter(Priority::New))).await;
        assert_eq!(gate.turns(), (4, 4));
        let waiter = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter(Priority::New).await })
        };
        settle().await;
        assert!(!waiter.is_finished());
        for _ in 0..100 {
            gate.observe(StartCall::CreateContainer, 10 * MS);
            if gate.turns().0 > 4 {
                break;
            }
        }
        settle().await;
        assert!(waiter.is_finished(), "a new turn admits the waiter");
        let extra = waiter.await.unwrap();
        assert_eq!(gate.turns().1, 5);
        // Crowded: fewer turns, but the turns in use are not taken back.
        for _ in 0..50 {
            gate.observe(StartCall::CreateContainer, 1000 * MS);
        }
        assert_eq!(gate.turns(), (4, 5), "half the ceiling of 8");
        drop(held);
        drop(extra);
        assert_eq!(gate.turns(), (4, 0));
    }
}
