//! Poison-tolerant locking: one place for what a lock does when a thread panicked while
//! holding it; and [`KeyedTurns`], a few holders at a time per key (one pull per image,
//! one operation per volume, a few token reviews per peer). Knows no other module.
//!
//! A panic while a guard is held poisons the lock; the agent's shared maps stay usable
//! (every writer leaves them consistent between statements), so the guard is taken anyway
//! rather than spreading the panic to every later caller.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Locks `m`, also when an earlier holder panicked.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes `l` for reading, also when an earlier writer panicked.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Takes `l` for writing, also when an earlier holder panicked.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// At most `per_key` holders at once for each key, the others waiting in turn (FIFO);
/// a key is forgotten with its last holder or waiter, so keys that come and go (images,
/// volumes, peers) leave nothing behind.
#[derive(Debug)]
pub struct KeyedTurns<K> {
    per_key: usize,
    keys: Mutex<HashMap<K, Arc<Semaphore>>>,
}

impl<K: Eq + Hash + Clone> KeyedTurns<K> {
    /// Turns of `per_key` holders at once per key.
    #[must_use]
    pub fn new(per_key: usize) -> Self {
        Self {
            per_key,
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for a turn of `key`, held until the [`Turn`] is dropped.
    pub async fn acquire(&self, key: K) -> Turn<'_, K> {
        let gate = lock(&self.keys)
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_key)))
            .clone();
        let mut turn = Turn {
            turns: self,
            key,
            gate,
            _permit: None,
        };
        // Declared after the turn: dropped first when the wait is given up, so that the
        // turn's drop sees no other hold but the map's.
        let wait = turn.gate.clone().acquire_owned();
        turn._permit = wait.await.ok();
        turn
    }

    /// The keys held or waited for now.
    #[must_use]
    pub fn len(&self) -> usize {
        lock(&self.keys).len()
    }

    /// Whether no key is held or waited for.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K: Eq + Hash + Clone> Default for KeyedTurns<K> {
    /// One holder at a time per key.
    fn default() -> Self {
        Self::new(1)
    }
}

/// A turn of one key (see [`KeyedTurns::acquire`]).
#[derive(Debug)]
pub struct Turn<'a, K: Eq + Hash + Clone> {
    turns: &'a KeyedTurns<K>,
    key: K,
    gate: Arc<Semaphore>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl<K: Eq + Hash + Clone> Drop for Turn<'_, K> {
    fn drop(&mut self) {
        // The permit holds the gate too: given back first.
        drop(self._permit.take());
        let mut keys = lock(&self.turns.keys);
        // Holds are taken under this lock: the map's and this one are the last two
        // (holders and waiters each hold the gate).
        if Arc::strong_count(&self.gate) == 2 {
            keys.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_are_bounded_per_key_and_keys_go_with_their_last_holder() {
        let turns = Arc::new(KeyedTurns::new(1));
        let first = turns.acquire("a").await;
        let _other = turns.acquire("b").await;
        let second = tokio::spawn({
            let turns = turns.clone();
            async move {
                let _turn = turns.acquire("a").await;
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!second.is_finished(), "a second holder of a waits");
        drop(first);
        second.await.unwrap();
        assert_eq!(turns.len(), 1, "a is forgotten, b is held");
        // A waiter that gives up leaves nothing behind either.
        let held = turns.acquire("c").await;
        let gave_up =
            tokio::time::timeout(std::time::Duration::from_millis(10), turns.acquire("c")).await;
        assert!(gave_up.is_err());
        drop(held);
        assert_eq!(turns.len(), 1);
    }

    #[test]
    fn a_poisoned_lock_is_still_taken() {
        let m = Arc::new(Mutex::new(1));
        let l = Arc::new(RwLock::new(2));
        let (m2, l2) = (m.clone(), l.clone());
        let r = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            let _w = l2.write().unwrap();
            panic!("poison both");
        })
        .join();
        assert!(r.is_err());
        assert!(m.is_poisoned() && l.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
        *write(&l) += 1;
        assert_eq!(*read(&l), 3);
    }
}
