//! rkubelet: a kubelet-compatible node agent.
//!
//! It takes the kubelet's place on a node: it watches the Pods bound to its node, runs
//! their sandboxes and containers through the Container Runtime Interface ([`cri`]), wires
//! their networks with the standard CNI plugins, and reports their status to the
//! kube-apiserver. Each module owns one kubelet concept and is named after it.

pub mod allocator;
pub mod app;
pub mod atomic_file;
pub mod backoff;
pub mod certificate;
pub mod cm;
pub mod cni;
pub mod credentialprovider;
pub mod cri;
pub mod dns;
pub mod envvars;
pub mod errno;
pub mod events;
pub mod eviction;
pub mod expansion;
pub mod fault;
#[cfg(any(test, fuzzing))]
pub mod fuzzing;
pub mod goapi;
pub mod image_reference;
pub mod images;
pub mod inspect;
pub mod kubeclient;
pub mod kubelet;
pub mod kubeletconfig;
pub mod kuberuntime;
pub mod kubetypes;
pub mod lifecycle;
pub mod lock;
pub mod logs;
pub mod metrics;
pub mod node;
pub mod observability;
pub mod pleg;
pub mod pluginmanager;
pub mod pod;
pub mod probe;
pub mod prober;
pub mod procfs;
pub mod resources;
pub mod server;
pub mod stats;
pub mod status;
pub mod timeline;
pub mod tls;
pub mod unix_socket;
pub mod volume;
pub mod watch_manager;
