//! Who holds the kubelet API's connections. Every pod can reach the node's port 10250, so
//! a connection that has not yet shown who it is must not hold what authenticated clients
//! (the kube-apiserver's `kubectl logs`, `exec`, `port-forward`, metrics scrapes) need.
//!
//! A connection is *pending* from its accept until a request on it authenticates: TLS
//! handshake (at most `HANDSHAKE_TIMEOUT`), request head (at most `HEADER_READ_TIMEOUT`),
//! credentials checked. Pending connections are bounded three ways:
//! - [`PENDING`] at once over all peers: the accept loop takes a slot before it accepts,
//!   so beyond that clients wait in the listen backlog and memory and file descriptors
//!   stay bounded;
//! - [`PENDING_PER_PEER`] at once per peer address, each further one from that address
//!   waiting for one of them (at most `HANDSHAKE_TIMEOUT`), [`WAITING_PER_PEER`] at
//!   most; a connection beyond that is closed at once. One address (one pod) thus holds
//!   at most 32 of the 512 pending slots, however many idle or stalled connections it
//!   opens, and others are not queued behind it.
//!
//! Once a request authenticates, its connection leaves the pending budget for the
//! [`AUTHENTICATED`] one, which it holds until it closes, or, when upgraded (exec,
//! attach, port-forward), until the stream ends. With that budget full, an authenticated
//! request is answered 429 and its connection closed, as the kube-apiserver's max-in-flight
//! limit does. The kubelet (Go's `net/http`) bounds none of this; these figures are
//! rkubelet's own: the 512 + 256 connections they allow stay below the 1024 open files a
//! service gets by default.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Pending connections at once, over all peers.
pub const PENDING: usize = 512;
/// Pending connections at once from one peer address.
pub const PENDING_PER_PEER: usize = 8;
/// Further connections from one peer address that wait for one of its pending slots.
pub const WAITING_PER_PEER: usize = 24;
/// Authenticated connections and streams at once.
pub const AUTHENTICATED: usize = 256;

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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            pending: PENDING,
            pending_per_peer: PENDING_PER_PEER,
            waiting_per_peer: WAITING_PER_PEER,
            authenticated: AUTHENTICATED,
        }
    }
}

/// The authenticated budget is spent: the request is answered 429.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("Too many requests, please try again later.")]
pub struct Busy;

/// One peer address's pending slots and the connections waiting for them.
struct Peer {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
}

/// The connection budgets of one listener.
pub struct Budget {
    limits: Limits,
    pending: Arc<Semaphore>,
    authenticated: Arc<Semaphore>,
    /// The peers with a connection pending or waiting; an entry goes with its last one.
    peers: Mutex<HashMap<IpAddr, Arc<Peer>>>,
}

impl Budget {
    /// Budgets of these sizes.
    #[must_use]
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            pending: Arc::new(Semaphore::new(limits.pending)),
            authenticated: Arc::new(Semaphore::new(limits.authenticated)),
            peers: Mutex::new(HashMap::new()),
        })
    }

    /// The global pending slots, one taken per accepted connection.
    #[must_use]
    pub fn pending_slots(&self) -> Arc<Semaphore> {
        self.pending.clone()
    }

    /// A connection from `peer` accepted on `slot` (of [`Self::pending_slots`]): pending,
    /// once one of its peer's slots is free (waiting at most `wait`); `None` when its
    /// peer already has too many connections waiting, or none became free in time.
    pub async fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
        slot: OwnedSemaphorePermit,
        wait: Duration,
    ) -> Option<Connection> {
        let entry = PeerEntry::of(self, peer);
        let peer_slot = match entry.peer.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let waiting = entry.peer.waiting.fetch_add(1, Ordering::SeqCst);
                let got = if waiting < self.limits.waiting_per_peer {
                    tokio::time::timeout(wait, entry.peer.slots.clone().acquire_owned())
                        .await
                        .ok()
                        .and_then(Result::ok)
                } else {
                    None
                };
                entry.peer.waiting.fetch_sub(1, Ordering::SeqCst);
                got?
            }
        };
        Some(Connection {
            budget: self.clone(),
            stage: Mutex::new(Stage::Pending {
                _peer_slot: peer_slot,
                _slot: slot,
                _entry: entry,
            }),
        })
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Arc<Peer>>> {
        crate::lock::lock(&self.peers)
    }

    #[cfg(test)]
    fn peer_count(&self) -> usize {
        self.peers().len()
    }
}

/// A connection's hold on its peer's entry; the entry is forgotten with its last hold.
struct PeerEntry {
    budget: Arc<Budget>,
    address: IpAddr,
    peer: Arc<Peer>,
}

impl PeerEntry {
    fn of(budget: &Arc<Budget>, address: IpAddr) -> Self {
        let peer = budget
            .peers()
            .entry(address)
            .or_insert_with(|| {
                Arc::new(Peer {
                    slots: Arc::new(Semaphore::new(budget.limits.pending_per_peer)),
                    waiting: AtomicUsize::new(0),
                })
            })
            .clone();
        Self {
            budget: budget.clone(),
            address,
            peer,
        }
    }
}

impl Drop for PeerEntry {
    fn drop(&mut self) {
        let mut peers = self.budget.peers();
        // Holds are only made under this lock: the map's and this one are the last two.
        if Arc::strong_count(&self.peer) == 2 {
            peers.remove(&self.address);
        }
    }
}

/// Where a connection stands.
enum Stage {
    /// Not yet authenticated: a pending slot of its peer and a global one.
    Pending {
        _peer_slot: OwnedSemaphorePermit,
        _slot: OwnedSemaphorePermit,
        _entry: PeerEntry,
    },
    /// A request authenticated: an authenticated slot.
    Authenticated { _slot: OwnedSemaphorePermit },
}

/// One connection's hold on the budgets, released when the last clone of it goes (the
/// connection's, and an upgraded stream's).
pub struct Connection {
    budget: Arc<Budget>,
    stage: Mutex<Stage>,
}

impl Connection {
    /// A request on this connection authenticated: the connection moves from the pending
    /// budget to the authenticated one (once; later requests keep it there).
    ///
    /// # Errors
    /// [`Busy`]: the authenticated budget is spent.
    pub fn authenticated(&self) -> Result<(), Busy> {
        let mut stage = crate::lock::lock(&self.stage);
        if matches!(*stage, Stage::Pending { .. }) {
            let slot = self
                .budget
                .authenticated
                .clone()
                .try_acquire_owned()
                .map_err(|_| Busy)?;
            // The pending slots go back with the old stage.
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
        })
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    async fn admit(budget: &Arc<Budget>, peer: IpAddr) -> Option<Connection> {
        let slot = budget
            .pending_slots()
            .try_acquire_owned()
            .expect("a global slot");
        budget.admit(peer, slot, WAIT).await
    }

    /// One address with its pending slots taken, and one waiting, gets no more; another
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
                let slot = budget.pending_slots().try_acquire_owned().expect("slot");
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
    }

    /// Authentication moves a connection to the authenticated budget and frees its pending
    /// slots; with the authenticated budget spent, it is refused.
    #[tokio::test]
    async fn authenticated_connections_leave_the_pending_budget() {
        let budget = small();
        let first = admit(&budget, ip(1)).await.expect("first");
        let second = admit(&budget, ip(1)).await.expect("second");
        assert_eq!(budget.pending_slots().available_permits(), 6);
        first.authenticated().expect("authenticated");
        first.authenticated().expect("again: no second slot");
        second.authenticated().expect("authenticated");
        assert_eq!(budget.pending_slots().available_permits(), 8);
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
}
