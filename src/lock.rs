//! Poison-tolerant locking: one place for what a lock does when a thread panicked while
//! holding it. Owns nothing else and knows no other module.
//!
//! A panic while a guard is held poisons the lock; the agent's shared maps stay usable
//! (every writer leaves them consistent between statements), so the guard is taken anyway
//! rather than spreading the panic to every later caller.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_still_taken() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let l = std::sync::Arc::new(RwLock::new(2));
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
