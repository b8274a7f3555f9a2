//! `/stats/summary`: the kubelet's stats summary (API `stats/v1alpha1`). The figures come
//! from the node's stats provider ([`crate::stats`], the kubelet's `pkg/kubelet/stats`);
//! this module only re-exports what the server (and older callers of
//! `server::stats`) use.

pub use crate::stats::{
    ContainerStats, CpuStats, MemoryStats, NodeStats, PodReference, PodStats, Summary,
    parse_proc_stat,
};
