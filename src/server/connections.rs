//! Who holds the kubelet API's connections. Every pod can reach the node's port 10250, so
//! a connection that has not yet shown who it is must not hold what authenticated clients
//! (the kube-apiserver's `kubectl logs`, `exec`, `port-forward`, metrics scrapes) need.
//!
//! A connection is *pending* from its accept until it authenticates: TLS handshake (at
//! most `HANDSHAKE_TIMEOUT`), then, unless the handshake verified a client certificate,
//! request head (at most `HEADER_READ_TIMEOUT`) and credentials checked. Pending
//! connections are bounded three ways:
//! - [`PENDING_PER_PEER`] at once per peer address are in their handshake; each further
//!   one from that address waits for one of them (at most `HANDSHAKE_TIMEOUT`),
//!   [`WAITING_PER_PEER`] at most; a connection beyond that is closed at once;
//! - [`PENDING`] pending at once over all peers. A connection accepted when they are all
//!   taken cuts the oldest pending connection that is older than [`CUT_AFTER`] of the
//!   peer address that holds the most, if that address holds as many as the newcomer's
//!   or more; else it waits for a slot (at most `HANDSHAKE_TIMEOUT`, looking again for one to
//!   cut). So a flood that holds the slots with idle or stalled connections cannot keep
//!   out an address with no more pending connections than the flooding ones (the API
//!   server's, with its one or few at a time, each authenticated by its certificate
//!   within its handshake, never that old): it gets the slot of the flood's oldest at
//!   once, or once the flood's connections are [`CUT_AFTER`] old; while a burst of quick
//!   clients, none of them that old, waits its turn and loses none. The kubelet's
//!   listener holds no budget of this kind; a fixed share per address did not do (16
//!   addresses filled the 512 slots, and the API server's connections then waited in the
//!   listen backlog until the attackers' timed out);
//! - the accept loop takes a slot of [`ACCEPTED`] before it accepts (the pending ones and
//!   a few more that wait or cut): beyond that, clients wait in the listen backlog, and
//!   file descriptors stay bounded.
//!
//! Once a request authenticates, its connection leaves the pending budget for the
//! [`AUTHENTICATED`] one, which it holds until it closes, or, when upgraded (exec,
//! attach, port-forward), until the stream ends. With that budget full, an authenticated
//! request is answered 429 and its connection closed, as the kube-apiserver's max-in-flight
//! limit does. These figures are rkubelet's own: the 576 + 256 connections they allow
//! stay below the 1024 open files a service gets by default.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Pending connections (in their handshake or waiting for it) at once, over all peers.
pub const PENDING: usize = 512;
/// Connections from one peer address in their handshake at once.
pub const PENDING_PER_PEER: usize = 8;
/// Further connections from one peer address that wait for one of its handshake slots.
pub const WAITING_PER_PEER: usize = 24;
/// Authenticated connections and streams at once.
pub const AUTHENTICATED: usize = 256;
/// Connections accepted and not yet authenticated: the pending ones, and those that wait
/// for a pending slot or cut one.
pub const ACCEPTED: usize = PENDING + 64;
/// How old a pending connection must be before a newcomer may cut it: a client that
/// is served does not stay pending that long; one that idles or stalls does.
pub const CUT_AFTER: Duration = Duration::from_secs(5);

/// The budgets' sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// [`PENDING`].
    pub pending: usize,
    /// [`PENDING_PER_PEER`].
    pub pending_per_peer: usize,
    /// [`WAITING_PER_PEER`].
    pub waiting_per_peer: usize,
    /// [`AUTHENTICATED`].
    pub authenticated: usize,
    /// [`ACCEPTED`].
    pub accepted: usize,
    /// [`CUT_AFTER`].
    pub cut_after: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            pending: PENDING,
            pending_per_peer: PENDING_PER_PEER,
            waiting_per_peer: WAITING_PER_PEER,
            authenticated: AUTHENTICATED,
            accepted: ACCEPTED,
            cut_after: CUT_AFTER,
        }
    }
}

/// The authenticated budget is spent: the request is answered 429.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("Too many requests, please try again later.")]
pub struct Busy;

/// One accepted connection of a peer, not yet authenticated.
struct Held {
    seq: u64,
    since: Instant,
    /// Whether it holds a pending slot (else it waits for one).
    pending: bool,
    cut: CancellationToken,
}

/// One peer address's pending connections.
struct Peer {
    /// Its handshake slots.
    slots: Arc<Semaphore>,
    /// Its connections pending or waiting, oldest first.
    held: VecDeque<Held>,
}

/// Every peer's pending connections.
#[derive(Default)]
struct Pending {
    next: u64,
    peers: HashMap<IpAddr, Peer>,
}

impl Pending {
    /// Cuts, for a newcomer of `peer`, the oldest pending connection older than
    /// `cut_after` of the peer that holds the most, when that peer holds as many as
    /// `peer` (the newcomer counted) or more.
    fn cut_for(&mut self, peer: IpAddr, cut_after: Duration) {
        let mine = self.peers.get(&peer).map_or(0, |p| p.held.len());
        let now = Instant::now();
        let victim =
            self.peers
                .iter()
                .filter(|(_, p)| p.held.len() >= mine)
                .filter_map(|(ip, p)| {
                    let oldest = p.held.iter().find(|h| {
                        h.pending && now.saturating_duration_since(h.since) >= cut_after
                    })?;
                    Some((p.held.len(), std::cmp::Reverse(oldest.seq), *ip))
                })
                .max();
        let Some((_, std::cmp::Reverse(seq), ip)) = victim else {
            return;
        };
        if let Some(p) = self.peers.get_mut(&ip)
            && let Some(at) = p.held.iter().position(|h| h.seq == seq)
            && let Some(held) = p.held.remove(at)
        {
            held.cut.cancel();
        }
        self.forget_if_idle(ip);
    }

    /// Connection `seq` of `ip` holds a pending slot now.
    fn holds_slot(&mut self, ip: IpAddr, seq: u64) {
        if let Some(held) = self
            .peers
            .get_mut(&ip)
            .and_then(|p| p.held.iter_mut().find(|h| h.seq == seq))
        {
            held.pending = true;
        }
    }

    /// Removes connection `seq` of `ip` if it is still held (not cut).
    fn release(&mut self, ip: IpAddr, seq: u64) {
        if let Some(peer) = self.peers.get_mut(&ip)
            && let Some(at) = peer.held.iter().position(|h| h.seq == seq)
        {
            peer.held.remove(at);
        }
        self.forget_if_idle(ip);
    }

    /// A peer without pending connections is forgotten (none of its slots is out then).
    fn forget_if_idle(&mut self, ip: IpAddr) {
        if self.peers.get(&ip).is_some_and(|p| p.held.is_empty()) {
            self.peers.remove(&ip);
        }
    }
}

/// The connection budgets of one listener.
pub struct Budget {
    limits: Limits,
    accepted: Arc<Semaphore>,
    slots: Arc<Semaphore>,
    authenticated: Arc<Semaphore>,
    pending: Mutex<Pending>,
}

impl Budget {
    /// Budgets of these sizes.
    #[must_use]
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            accepted: Arc::new(Semaphore::new(limits.accepted)),
            slots: Arc::new(Semaphore::new(limits.pending)),
            authenticated: Arc::new(Semaphore::new(limits.authenticated)),
            pending: Mutex::new(Pending::default()),
        })
    }

    /// The accept slots, one taken per accepted connection until it authenticates.
    #[must_use]
    pub fn accept_slots(&self) -> Arc<Semaphore> {
        self.accepted.clone()
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        crate::lock::lock(&self.pending)
    }

    /// A connection from `peer` accepted on `slot` (of [`Self::accept_slots`]): pending,
    /// once it has a pending slot (taken from a connection it may cut, see the module's
    /// comment) and one of its peer's handshake slots is free (waiting at most `wait` for
    /// each); `None` when its peer already has too many connections waiting, none became
    /// free in time, or it was cut meanwhile.
    pub async fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
        slot: OwnedSemaphorePermit,
        wait: Duration,
    ) -> Option<Connection> {
        let (seq, cut, peer_slots) = {
            let mut pending = self.pending();
            let held = pending.peers.get(&peer).map_or(0, |p| p.held.len());
            if held >= self.limits.pending_per_peer + self.limits.waiting_per_peer {
                return None;
            }
            let seq = pending.next;
            pending.next += 1;
            let cut = CancellationToken::new();
            let entry = pending.peers.entry(peer).or_insert_with(|| Peer {
                slots: Arc::new(Semaphore::new(self.limits.pending_per_peer)),
                held: VecDeque::new(),
            });
            entry.held.push_back(Held {
                seq,
                since: Instant::now(),
                pending: false,
                cut: cut.clone(),
            });
            (seq, cut, entry.slots.clone())
        };
        let registration = Registration {
            budget: self.clone(),
            peer,
            seq,
        };
        let deadline = tokio::time::Instant::now() + wait;
        let pending_slot = self.pending_slot(peer, &cut, deadline).await?;
        self.pending().holds_slot(peer, seq);
        let peer_slot = match peer_slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => tokio::select! {
                () = cut.cancelled() => return None,
                got = tokio::time::timeout_at(deadline, peer_slots.acquire_owned()) => got.ok()?.ok()?,
            },
        };
        if cut.is_cancelled() {
            return None;
        }
        Some(Connection {
            budget: self.clone(),
            peer,
            cut,
            stage: Mutex::new(Stage::Pending {
                _peer_slot: peer_slot,
                _pending_slot: pending_slot,
                _slot: slot,
                _registration: registration,
            }),
        })
    }

    /// A pending slot for a newcomer of `peer`: a free one, else one it cuts free, else
    /// the first to come free (looking again for one to cut every so often), until
    /// `deadline`.
    async fn pending_slot(
        &self,
        peer: IpAddr,
        cut: &CancellationToken,
        deadline: tokio::time::Instant,
    ) -> Option<OwnedSemaphorePermit> {
        const LOOK_AGAIN: Duration = Duration::from_millis(250);
        loop {
            if let Ok(slot) = self.slots.clone().try_acquire_owned() {
                return Some(slot);
            }
            self.pending().cut_for(peer, self.limits.cut_after);
            let until = deadline.min(tokio::time::Instant::now() + LOOK_AGAIN);
            tokio::select! {
                () = cut.cancelled() => return None,
                got = tokio::time::timeout_at(until, self.slots.clone().acquire_owned()) => {
                    if let Ok(Ok(slot)) = got {
                        return Some(slot);
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
        }
    }

    #[cfg(test)]
    fn peer_count(&self) -> usize {
        self.pending().peers.len()
    }

    #[cfg(test)]
    fn pending_count(&self) -> usize {
        self.pending().peers.values().map(|p| p.held.len()).sum()
    }
}

/// A connection's place among its peer's pending ones, given up when it goes.
struct Registration {
    budget: Arc<Budget>,
    peer: IpAddr,
    seq: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.budget.pending().release(self.peer, self.seq);
    }
}

/// Where a connection stands.
enum Stage {
    /// Not yet authenticated: a handshake slot of its peer, a pending slot, an accept
    /// slot, its place.
    Pending {
        _peer_slot: OwnedSemaphorePermit,
        _pending_slot: OwnedSemaphorePermit,
        _slot: OwnedSemaphorePermit,
        _registration: Registration,
    },
    /// A request authenticated: an authenticated slot.
    Authenticated { _slot: OwnedSemaphorePermit },
}

/// One connection's hold on the budgets, released when the last clone of it goes (the
/// connection's, and an upgraded stream's).
pub struct Connection {
    budget: Arc<Budget>,
    peer: IpAddr,
    cut: CancellationToken,
    stage: Mutex<Stage>,
}

impl Connection {
    /// The peer's address.
    #[must_use]
    pub fn peer(&self) -> IpAddr {
        self.peer
    }

    /// Resolves when the connection is cut to make room for another peer's (only while
    /// pending): whoever serves it then drops it.
    pub async fn cut(&self) {
        self.cut.cancelled().await;
    }

    /// A request on this connection authenticated, or its handshake verified a client
    /// certificate: the connection moves from the pending budget to the authenticated
    /// one (once; later requests keep it there).
    ///
    /// # Errors
    /// [`Busy`]: the authenticated budget is spent, or the connection was cut meanwhile.
    pub fn authenticated(&self) -> Result<(), Busy> {
        let mut stage = crate::lock::lock(&self.stage);
        if matches!(*stage, Stage::Pending { .. }) {
            if self.cut.is_cancelled() {
                return Err(Busy);
            }
            let slot = self
                .budget
                .authenticated
                .clone()
                .try_acquire_owned()
                .map_err(|_| Busy)?;
            // The pending slots and the place go back with the old stage.
            *stage = Stage::Authenticated { _slot: slot };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(100);

    fn limits(cut_after: Duration) -> Limits {
        Limits {
            pending: 8,
            pending_per_peer: 2,
            waiting_per_peer: 1,
            authenticated: 2,
            accepted: 16,
            cut_after,
        }
    }

    fn small() -> Arc<Budget> {
        Budget::new(limits(Duration::ZERO))
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    async fn admit(budget: &Arc<Budget>, peer: IpAddr) -> Option<Connection> {
        let slot = budget
            .accept_slots()
            .try_acquire_owned()
            .expect("an accept slot");
        budget.admit(peer, slot, WAIT).await
    }

    /// Admits a connection of `peer` in the background while the test, as the servers do,
    /// drops the connections that were cut (which frees their pending slots).
    async fn admit_dropping_cut(
        budget: &Arc<Budget>,
        peer: IpAddr,
        held: &mut Vec<Connection>,
    ) -> Option<Connection> {
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { admit(&budget, peer).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        held.retain(|c| !c.cut.is_cancelled());
        waiting.await.expect("admit")
    }

    /// One address with its handshake slots taken, and one waiting, gets no more; another
    /// address is admitted at once.
    #[tokio::test]
    async fn one_peer_fills_only_its_own_slots() {
        let budget = small();
        let a = admit(&budget, ip(1)).await.expect("first");
        let _b = admit(&budget, ip(1)).await.expect("second");
        // A third waits for one of the two, and gets it when one goes.
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move {
                let slot = budget.accept_slots().try_acquire_owned().expect("slot");
                budget.admit(ip(1), slot, Duration::from_secs(5)).await
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A fourth finds the line full: refused at once.
        let started = Instant::now();
        assert!(admit(&budget, ip(1)).await.is_none());
        assert!(started.elapsed() < WAIT, "refused without waiting");
        // Another peer is not behind them.
        let other = admit(&budget, ip(2)).await.expect("another peer");
        drop(a);
        assert!(waiting.await.expect("task").is_some(), "the waiting one");
        drop(other);
        assert_eq!(budget.peer_count(), 1, "the other peer is forgotten");
    }

    /// A wait for a peer slot ends after its time.
    #[tokio::test]
    async fn a_wait_for_a_peer_slot_is_bounded() {
        let budget = small();
        let _held = [admit(&budget, ip(1)).await, admit(&budget, ip(1)).await];
        let started = Instant::now();
        assert!(admit(&budget, ip(1)).await.is_none());
        assert!(started.elapsed() >= WAIT);
        assert_eq!(
            budget.pending_count(),
            2,
            "the one that gave up is forgotten"
        );
    }

    /// Authentication moves a connection to the authenticated budget and frees its pending
    /// slots; with the authenticated budget spent, it is refused.
    #[tokio::test]
    async fn authenticated_connections_leave_the_pending_budget() {
        let budget = small();
        let first = admit(&budget, ip(1)).await.expect("first");
        let second = admit(&budget, ip(1)).await.expect("second");
        assert_eq!(budget.accept_slots().available_permits(), 14);
        first.authenticated().expect("authenticated");
        first.authenticated().expect("again: no second slot");
        second.authenticated().expect("authenticated");
        assert_eq!(budget.accept_slots().available_permits(), 16);
        assert_eq!(
            budget.peer_count(),
            0,
            "no pending connection: peer forgotten"
        );
        // The peer's slots are free for new connections; the authenticated ones are not.
        let third = admit(&budget, ip(1)).await.expect("third");
        assert_eq!(third.authenticated(), Err(Busy));
        drop(first);
        third.authenticated().expect("a freed authenticated slot");
    }

    /// Four addresses fill the eight pending slots (two each); a fifth address's
    /// connection cuts the oldest of a peer holding the most, and is never cut itself
    /// while every other peer holds more, however often they connect again.
    #[tokio::test]
    async fn a_flood_from_many_addresses_cuts_its_own_connections_not_a_newcomers() {
        let budget = small();
        let mut flood = Vec::new();
        for _ in 0..2 {
            for peer in 1..=4 {
                flood.push(admit(&budget, ip(peer)).await.expect("flood"));
            }
        }
        let oldest = flood[0].cut.clone();
        let newcomer = admit_dropping_cut(&budget, ip(9), &mut flood)
            .await
            .expect("the newcomer, once the cut one is dropped");
        assert!(oldest.is_cancelled(), "the oldest of the biggest peers");
        assert_eq!(flood.len(), 7, "one cut");
        // The flood goes on: each new connection of theirs cuts one of theirs.
        for peer in [1, 2, 3, 4, 1, 2, 3, 4] {
            let c = admit_dropping_cut(&budget, ip(peer), &mut flood).await;
            flood.push(c.expect("admitted"));
            assert!(!newcomer.cut.is_cancelled(), "the newcomer was cut");
        }
        assert_eq!(
            budget.pending_count(),
            8,
            "seven of theirs and the newcomer"
        );
        newcomer.authenticated().expect("authenticated");
    }

    /// A connection cut while pending cannot authenticate, and its server sees the cut.
    #[tokio::test]
    async fn a_cut_connection_cannot_authenticate() {
        let budget = small();
        let mut held = Vec::new();
        for peer in 1..=8 {
            held.push(admit(&budget, ip(peer)).await.expect("admitted"));
        }
        let slot = budget.accept_slots().try_acquire_owned().expect("slot");
        // Waits for the slot of the one it cut, which is kept here.
        assert!(budget.admit(ip(9), slot, WAIT).await.is_none());
        let cut = held.iter().find(|c| c.cut.is_cancelled()).expect("one cut");
        assert_eq!(cut.authenticated(), Err(Busy));
        tokio::time::timeout(WAIT, cut.cut())
            .await
            .expect("cut resolves");
    }

    /// With every peer at one connection, the oldest goes first: a new connection outlives
    /// the next `pending - 1` accepted.
    #[tokio::test]
    async fn among_equal_peers_the_oldest_connection_is_cut() {
        let budget = small();
        let mut held = Vec::new();
        for peer in 1..=8 {
            held.push(admit(&budget, ip(peer)).await.expect("admitted"));
        }
        let young = admit_dropping_cut(&budget, ip(100), &mut held)
            .await
            .expect("young");
        assert_eq!(held.len(), 7, "the oldest was cut");
        for peer in 10..17 {
            let admitted = admit_dropping_cut(&budget, ip(peer), &mut held)
                .await
                .expect("admitted");
            held.push(admitted);
            assert!(!young.cut.is_cancelled(), "cut after {peer}");
        }
        let _last = admit_dropping_cut(&budget, ip(17), &mut held).await;
        assert!(young.cut.is_cancelled(), "the oldest by then");
    }

    /// A burst of quick clients, none pending for long: a newcomer beyond the pending
    /// slots cuts no one and waits for a slot, which it gets when a client is served.
    #[tokio::test]
    async fn a_burst_of_young_connections_waits_and_loses_none() {
        let budget = Budget::new(limits(Duration::from_secs(60)));
        let mut held = Vec::new();
        for peer in 1..=8 {
            held.push(admit(&budget, ip(peer)).await.expect("admitted"));
        }
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move {
                let slot = budget.accept_slots().try_acquire_owned().expect("slot");
                budget.admit(ip(9), slot, Duration::from_secs(5)).await
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(held.iter().all(|c| !c.cut.is_cancelled()), "no one cut");
        assert!(!waiting.is_finished(), "it waits");
        // One is served (authenticated): its slot goes to the newcomer.
        held[3].authenticated().expect("authenticated");
        assert!(waiting.await.expect("task").is_some());
        assert!(held.iter().all(|c| !c.cut.is_cancelled()), "no one cut");
    }
}
