//! Pod status: what the kubelet reports about a pod (generated from the runtime's state)
//! and the status manager that is the only writer of `pods/status`.
//! Knows no pod worker, prober worker or runtime call: it is given results and runtime state.

pub mod generate;
pub mod manager;

pub use generate::{StatusInputs, generate_pod_status};
pub use manager::{StatusError, StatusManager};
