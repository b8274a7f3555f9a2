//! The kubelet's configuration: the `kubelet.config.k8s.io/v1beta1` KubeletConfiguration
//! file named by `--config` and the kubelet's command line (the kubelet's
//! `pkg/kubelet/apis/config` and `cmd/kubelet/app/options`).
//!
//! Precedence is the kubelet's: defaults, then the file, then flags given on the command
//! line. The file is decoded ([`file`]), each field it sets is classified against one
//! table ([`fields`]: implemented through a flag, fixed in rkubelet, owned by work under
//! way, known but not implemented, unknown), and the implemented ones become flags that
//! the command line did not give ([`flags`]), parsed by the same flag parsers. Fields and
//! flags without effect are logged once at start-up, never refused. Flag values in the
//! kubelet's own syntax (reservations, taints) are parsed in [`values`]. The merged result,
//! as a KubeletConfiguration, is [`running`] (served on `/configz`).
//!
//! Knows no running subsystem: it turns the file into flags before anything starts.

pub mod fields;
pub mod file;
pub mod flags;
pub mod running;
pub mod values;

pub use fields::Note;
pub use file::{ConfigError, ConfigFile};
pub use flags::{ParseError, Startup, parse};
