//! The kubelet's `kuberuntime`: translates between the Pod API and the Container Runtime
//! Interface. It builds sandbox and container configs from a PodSpec, reads a pod's state
//! back from the runtime, decides what to start and stop, and carries that out over CRI.
//! Knows no pod worker, prober or status manager: it is told what to run and reports what runs.

pub mod actions;
pub mod container;
pub mod context;
pub mod crash_backoff;
pub mod env;
pub mod gc;
pub mod labels;
pub mod logs;
pub mod manager;
pub mod names;
pub mod runtime_status;
pub mod sandbox;
pub mod security_context;
pub mod start_gate;
pub mod termination;

pub use manager::{PodContext, RuntimeManager, SyncOutcome, Waiting};
pub use runtime_status::{PodRuntimeStatus, RunState, get_pod_status};
