//! Reads the live system for `rkubelet inspect`: CRI, /proc, netlink, the CNI cache and the
//! host-local store.

pub mod netlink;
