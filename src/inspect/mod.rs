//! Reads the live system for `rkubelet inspect`: the runtime over CRI, /proc, netlink,
//! the CNI cache and the host-local store — not the agent's memory, so it also works
//! while the agent is stopped — and shows how pods are wired, in tables, JSON and SVG.

pub mod svg;
pub mod view;
