//! rkubelet: a kubelet-compatible node agent.
//!
//! It takes the kubelet's place on a node: it watches the Pods bound to its node, runs
//! their sandboxes and containers through the Container Runtime Interface ([`cri`]), wires
//! their networks with the standard CNI plugins, and reports their status to the
//! kube-apiserver. Each module owns one kubelet concept and is named after it.

pub mod cri;
pub mod observability;
