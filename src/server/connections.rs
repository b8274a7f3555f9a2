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
//! - [`PENDING`] pending or waiting at once over all peers: a connection accepted beyond
//!   that cuts the oldest connection of the peer that holds the most (its own peer's
//!   oldest when it is that peer). A peer never holds more than its share while others
//!   want slots: however many addresses flood the port, an address with fewer pending
//!   connections than each flooding one (the API server's, with its one or few at a time)
//!   is never cut, and among equals the oldest goes first, so a new connection outlives
//!   at least the next `PENDING - 1` accepted. The kubelet's listener holds no budget of
//!   this kind; a fixed share per address did not do (16 addresses filled the 512 slots,
//!   and the API server's connections then waited in the listen backlog until the
//!   attackers' timed out);
//! - the accept loop takes a slot of [`ACCEPTED`] before it accepts, a bound on file
//!   descriptors while cut connections close.
//!
//! Once a request authenticates, its connection leaves the pending budget for the
//! [`AUTHENTICATED`] one, which it holds until it closes, or, when upgraded (exec,
//! attach, port-forward), until the stream ends. With that budget full, an authenticated
//! request is answered 429 and its connection closed, as the kube-apiserver's max-in-flight
//! limit does. These figures are rkubelet's own: the 512 + 256 connections they allow
//! stay below the 1024 open files a service gets by default.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
/// Connections accepted and not yet authenticated, cut ones still closing included.
pub const ACCEPTED: usize = 2 * PENDING;

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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            pending: PENDING,
            pending_per_peer: PENDING_PER_PEER,
            waiting_per_peer: WAITING_PER_PEER,
            authenticated: AUTHENTICATED,
            accepted: ACCEPTED,
        }
    }
}

/// The authenticated budget is spent: the request is answered 429.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("Too many requests, please try again later.")]
pub struct Busy;

/// One peer address's pending connections.
struct Peer {
    /// Its handshake slots.
    slots: Arc<Semaphore>,
    /// Its connections pending or waiting, oldest first: their number and how to cut them.
    held: VecDeque<(u64, CancellationToken)>,
}

/// Every peer's pending connections.
#[derive(Default)]
struct Pending {
    next: u64,
    total: usize,
    peers: HashMap<IpAddr, Peer>,
}

impl Pending {
    /// Cuts the oldest connection of the peer holding the most (ties: the one whose
    /// oldest is oldest).
    fn cut_one(&mut self) {
        let victim = self
            .peers
            .iter()
            .filter_map(|(ip, p)| Some((p.held.len(), std::cmp::Reverse(p.held.front()?.0), *ip)))
            .max()
            .map(|(_, _, ip)| ip);
        let Some(ip) = victim else { return };
        if let Some((_, token)) = self.peers.get_mut(&ip).and_then(|p| p.held.pop_front()) {
            token.cancel();
            self.total -= 1;
        }
        self.forget_if_idle(ip);
    }

    /// Removes connection `seq` of `ip` if it is still held (not cut).
    fn release(&mut self, ip: IpAddr, seq: u64) {
        if let Some(peer) = self.peers.get_mut(&ip)
            && let Some(at) = peer.held.iter().position(|(s, _)| *s == seq)
        {
            peer.held.remove(at);
            self.total -= 1;
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
    /// once one of its peer's handshake slots is free (waiting at most `wait`); `None`
    /// when its peer already has too many connections waiting, none became free in time,
    /// or it was cut meanwhile. Admitting it may cut another peer's oldest connection
    /// (see the module's comment).
    pub async fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
        slot: OwnedSemaphorePermit,
        wait: Duration,
    ) -> Option<Connection> {
        let (seq, cut, slots) = {
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
            entry.held.push_back((seq, cut.clone()));
            let slots = entry.slots.clone();
            pending.total += 1;
            while pending.total > self.limits.pending {
                pending.cut_one();
            }
            (seq, cut, slots)
        };
        let registration = Registration {
            budget: self.clone(),
            peer,
            seq,
        };
        let peer_slot = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => tokio::select! {
                () = cut.cancelled() => return None,
                got = tokio::time::timeout(wait, slots.acquire_owned()) => got.ok()?.ok()?,
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
                _slot: slot,
                _registration: registration,
            }),
        })
    }

    #[cfg(test)]
    fn peer_count(&self) -> usize {
        self.pending().peers.len()
    }

    #[cfg(test)]
    fn pending_count(&self) -> usize {
        self.pending().total
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
    /// Not yet authenticated: a handshake slot of its peer, an accept slot, its place.
    Pending {
        _peer_slot: OwnedSemaphorePermit,
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

    fn small() -> Arc<Budget> {
        Budget::new(Limits {
            pending: 8,
            pending_per_peer: 2,
            waiting_per_peer: 1,
            authenticated: 2,
            accepted: 16,
        })
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
        let started = std::time::Instant::now();
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
        let started = std::time::Instant::now();
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
        for round in 0..2 {
            for peer in 1..=4 {
                flood.push((peer, round, admit(&budget, ip(peer)).await.expect("flood")));
            }
        }
        assert_eq!(budget.pending_count(), 8);
        let newcomer = admit(&budget, ip(9)).await.expect("the newcomer");
        assert_eq!(budget.pending_count(), 8);
        let cut: Vec<(u8, u8)> = flood
            .iter()
            .filter(|(_, _, c)| c.cut.is_cancelled())
            .map(|(peer, round, _)| (*peer, *round))
            .collect();
        assert_eq!(cut, [(1, 0)], "the oldest of the biggest peers");
        // A cut connection cannot authenticate, and its server sees the cut.
        let (first, mut flood): (Vec<_>, Vec<_>) = flood
            .into_iter()
            .partition(|(_, _, c)| c.cut.is_cancelled());
        let (_, _, cut) = &first[0];
        assert_eq!(cut.authenticated(), Err(Busy));
        tokio::time::timeout(WAIT, cut.cut())
            .await
            .expect("cut resolves");
        // Its server drops it, freeing its handshake slot.
        drop(first);
        // The flood goes on: each new connection of theirs cuts one of theirs.
        for peer in [1, 2, 3, 4, 1, 2, 3, 4] {
            flood.retain(|(_, _, c)| !c.cut.is_cancelled());
            let c = admit(&budget, ip(peer)).await;
            flood.push((peer, 2, c.expect("admitted")));
            assert!(!newcomer.cut.is_cancelled(), "the newcomer was cut");
        }
        assert_eq!(budget.pending_count(), 8);
        newcomer.authenticated().expect("authenticated");
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
        let young = admit(&budget, ip(100)).await.expect("young");
        assert!(held[0].cut.is_cancelled() && !held[1].cut.is_cancelled());
        for peer in 10..17 {
            // Cut connections are dropped by their servers.
            held.retain(|c| !c.cut.is_cancelled());
            held.push(admit(&budget, ip(peer)).await.expect("admitted"));
            assert!(!young.cut.is_cancelled(), "cut after {peer}");
        }
        held.retain(|c| !c.cut.is_cancelled());
        let _last = admit(&budget, ip(17)).await.expect("admitted");
        assert!(young.cut.is_cancelled(), "the oldest by then");
    }
}
