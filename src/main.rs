//! The `rkubelet` command: the binary edge, where flags are parsed and errors become
//! exit codes. Everything else lives in the library.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use rkubelet::app;
use rkubelet::cri::{self, Cri, CriClient, Endpoint, RuntimeHealth};
use rkubelet::kubeletconfig::{self, ParseError};
use rkubelet::observability::{self, LogFormat};
use rkubelet::server::{ServerConfig, ServingCertificateSource};

/// A kubelet-compatible node agent.
#[derive(Debug, Parser)]
// A flag given again overrides its earlier value, as on the kubelet: the systemd drop-in
// puts the administrator's flags after kubeadm's.
#[command(
    name = "rkubelet",
    about,
    disable_version_flag = true,
    args_override_self = true
)]
struct Cli {
    /// Print the version as the kubelet prints its own (`Kubernetes v1.20.2+rkubelet-…`).
    #[arg(long)]
    version: bool,
    /// Log line format.
    #[arg(long, value_enum, default_value_t, global = true)]
    log_format: LogFormat,
    /// Log filter when RUST_LOG is unset (e.g. `info`, `rkubelet=debug`).
    #[arg(long, default_value = "info", global = true)]
    log_level: String,
    /// Log every step's duration when its span closes (for `bench breakdown`).
    #[arg(long, global = true)]
    log_span_timings: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent: register the node and run the pods bound to it.
    Run(Box<RunArgs>),
    /// Talk to the container runtime over CRI.
    Cri(CriArgs),
    /// Show how the node's pods are wired and where their start-up time went, from the
    /// live system (run as root on the node).
    Inspect(InspectArgs),
}

/// Who runs the CNI plugins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum NetworkOwnerArg {
    /// rkubelet runs bridge, host-local, portmap and loopback itself; containerd's CNI call
    /// is handed to it by the thin plugin `rkubelet-cni`.
    Agent,
    /// containerd's own CNI configuration does the work (as on a kind node).
    Runtime,
}

/// Flags of `rkubelet run`, named like the kubelet's where the meaning is the same.
#[derive(Debug, clap::Args)]
struct RunArgs {
    #[command(flatten)]
    runtime: RuntimeFlags,
    /// Kubeconfig with the node's identity (`system:node:<name>`); written by the TLS
    /// bootstrap when missing or expired and --bootstrap-kubeconfig is given.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Kubeconfig with a bootstrap token, used to request the node's client certificate
    /// (signer kubernetes.io/kube-apiserver-client-kubelet) into --cert-dir.
    #[arg(long)]
    bootstrap_kubeconfig: Option<PathBuf>,
    /// Renew the client certificate through the certificates API before it expires.
    #[arg(
        long,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true",
        require_equals = true
    )]
    rotate_certificates: bool,
    /// The node's name (default: the host name).
    #[arg(long)]
    hostname_override: Option<String>,
    /// The node's IP address (InternalIP): one of this host's, not loopback. Default: the
    /// address the node name resolves to, else that of the default route's interface.
    #[arg(long)]
    node_ip: Option<IpAddr>,
    /// The agent's state directory (the kubelet's default: where device plugins, CSI
    /// drivers and kubeadm look for it).
    #[arg(long, default_value = rkubelet::node::DEFAULT_ROOT_DIR)]
    root_dir: PathBuf,
    /// Where container logs are written, one directory per pod.
    #[arg(long, default_value = "/var/log/pods")]
    pod_logs_dir: PathBuf,
    /// Who wires pod networks. Also read from `RKUBELET_NETWORK_OWNER`: a setting the
    /// kubelet ignores, for a node whose unit starts either agent with the same command
    /// line (`/etc/default/kubelet` on a kubeadm or kind node).
    #[arg(
        long,
        value_enum,
        default_value = "agent",
        env = "RKUBELET_NETWORK_OWNER"
    )]
    network_owner: NetworkOwnerArg,
    /// How pod traffic reaches the other nodes' pods: routes kept by the agent from a watch
    /// on every Node, as flannel's backends.
    #[arg(long, value_enum, default_value = "none")]
    pod_network_routes: rkubelet::cni::routes::Mode,
    /// Directories searched for CNI plugins, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "/opt/cni/bin,/usr/lib/cni"
    )]
    cni_bin_dir: Vec<PathBuf>,
    /// The agent's CNI configuration directory: its first .conflist is used, with
    /// `{{.PodCIDR}}` replaced by the node's pod CIDR.
    #[arg(long, default_value = "/etc/rkubelet/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// The runtime's CNI conf dir (agent-owned networking installs its thin plugin's
    /// conflist there).
    #[arg(long, default_value = "/etc/cni/net.d")]
    runtime_cni_conf_dir: PathBuf,
    /// The runtime's CNI bin dir (agent-owned networking installs `rkubelet-cni` there).
    #[arg(long, default_value = "/opt/cni/bin")]
    runtime_cni_bin_dir: PathBuf,
    /// Cluster DNS server addresses, comma-separated.
    #[arg(long, value_delimiter = ',')]
    cluster_dns: Vec<IpAddr>,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// The most pods set up in the runtime at once (sandbox, create, start) while no exec
    /// probe runs; the others wait their turn, pods already begun first. Within it, the
    /// number adapts to the runtime's latency (it starts at half), and image downloads and
    /// postStart hooks hold no turn. Each exec probe in flight lends one turn more, so that
    /// the starts keep their share of a runtime busy with the probes of running pods.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..))]
    parallel_pod_starts: u16,
    /// Resolver configuration given to `dnsPolicy: Default` pods. Empty: none.
    #[arg(long, default_value = "/etc/resolv.conf")]
    resolv_conf: String,
    /// Extra node labels, `key=value` comma-separated.
    #[arg(long, value_delimiter = ',')]
    node_labels: Vec<String>,
    /// The most pods this node runs.
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// The pod CIDR to use when the Node has none at registration (else the agent waits
    /// for the controller manager's).
    #[arg(long)]
    pod_cidr: Option<String>,
    /// The Node's `spec.providerID` (at registration).
    #[arg(long)]
    provider_id: Option<String>,
    /// Taints the Node is registered with, `key=value:Effect` comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = kubeletconfig::values::parse_taint)]
    register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// Resources set aside for Kubernetes daemons: `cpu=100m,memory=1Gi,ephemeral-storage=1Gi`.
    #[arg(long, value_parser = kubeletconfig::values::parse_reservation)]
    kube_reserved: Option<rkubelet::node::Reservation>,
    /// Resources set aside for system daemons, as --kube-reserved.
    #[arg(long, value_parser = kubeletconfig::values::parse_reservation)]
    system_reserved: Option<rkubelet::node::Reservation>,
    /// How long a pressure condition (MemoryPressure, DiskPressure, PIDPressure) is held
    /// after its threshold stops being met, as a Go duration (`5m0s`, `30s`).
    #[arg(long, default_value = "5m0s", value_parser = rkubelet::node::parse_go_duration)]
    eviction_pressure_transition_period: Duration,
    /// Container GC: a dead container younger than this is kept (Go duration).
    #[arg(long, default_value = "0s", value_parser = rkubelet::node::parse_go_duration)]
    minimum_container_ttl_duration: Duration,
    /// Container GC: dead containers kept per container name; negative: no limit.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    maximum_dead_containers_per_container: i32,
    /// Container GC: dead containers kept on the node; negative: no limit.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    maximum_dead_containers: i32,
    /// Image GC starts at this percent of the image filesystem used (100: never).
    #[arg(long, default_value_t = 85, allow_negative_numbers = true)]
    image_gc_high_threshold: i32,
    /// Image GC frees down to this percent used.
    #[arg(long, default_value_t = 80, allow_negative_numbers = true)]
    image_gc_low_threshold: i32,
    /// Image GC: an unused image first seen less than this ago is kept (Go duration).
    #[arg(long, default_value = "2m0s", value_parser = rkubelet::node::parse_go_duration)]
    minimum_image_ttl_duration: Duration,
    /// The pause image: image GC never removes it (the runtime picks the sandbox image
    /// pods run with, and GC keeps that one too).
    #[arg(long, default_value = rkubelet::images::gc::DEFAULT_POD_SANDBOX_IMAGE)]
    pod_infra_container_image: String,
    /// Static pods: a directory of pod manifests (YAML or JSON; files starting with a dot
    /// are ignored) or one manifest file.
    #[arg(long)]
    pod_manifest_path: Option<PathBuf>,
    /// How often the static pods' manifests are read besides on changes, as a Go duration.
    #[arg(long, default_value = "20s", value_parser = rkubelet::node::parse_go_duration)]
    file_check_frequency: Duration,
    /// The size (a quantity: `10Mi`, `256Ki`) at which a container's log file is rotated.
    #[arg(long, default_value = rkubelet::logs::DEFAULT_MAX_SIZE)]
    container_log_max_size: String,
    /// The most log files kept per container, the current one included (at least 2).
    #[arg(long, default_value_t = rkubelet::logs::DEFAULT_MAX_FILES, allow_negative_numbers = true)]
    container_log_max_files: i32,
    /// Hard eviction thresholds, `<signal><<value>` comma-separated
    /// (`memory.available<100Mi,nodefs.available<10%`); signals not named get none.
    /// Default: the kubelet's (`memory.available<100Mi,nodefs.available<10%,
    /// nodefs.inodesFree<5%,imagefs.available<15%`, and `pid.available<10%`).
    #[arg(long, value_parser = rkubelet::eviction::parse_eviction_hard, overrides_with = "eviction_hard")]
    eviction_hard: Option<rkubelet::eviction::ParsedThresholds>,
    /// Unsafe sysctls or sysctl patterns (ending in `*`) pods may set besides the safe
    /// ones, comma-separated.
    #[arg(long, value_delimiter = ',')]
    allowed_unsafe_sysctls: Vec<String>,
    /// Pod cgroups under a QoS hierarchy (`kubepods`, `kubepods/burstable`,
    /// `kubepods/besteffort`), each the cgroup parent of its pod's sandbox.
    #[arg(
        long,
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        require_equals = true
    )]
    cgroups_per_qos: bool,
    /// The cgroup the QoS hierarchy goes under.
    #[arg(long, default_value = "/")]
    cgroup_root: String,
    /// How cgroups are made: `cgroupfs` (directly in the cgroup file system) or `systemd`
    /// (slice units through systemd); the container runtime must use the same.
    #[arg(long, default_value = "cgroupfs")]
    cgroup_driver: rkubelet::cm::CgroupDriver,
    #[command(flatten)]
    server: ServerFlags,
}

/// Flags of the kubelet API server, named like the kubelet's.
#[derive(Debug, clap::Args)]
struct ServerFlags {
    /// The IP address the kubelet API listens on.
    #[arg(long, default_value = "0.0.0.0")]
    address: IpAddr,
    /// The kubelet API's HTTPS port; 0 disables the server.
    #[arg(long, default_value_t = 10250)]
    port: u16,
    /// The IP address of the plain-HTTP healthz endpoint.
    #[arg(long, default_value = "127.0.0.1")]
    healthz_bind_address: IpAddr,
    /// The healthz port; 0 disables it.
    #[arg(long, default_value_t = 10248)]
    healthz_port: u16,
    /// The serving certificate (chain, PEM). Without it, the certificate is requested from
    /// the cluster (--rotate-server-certificates; given with it, as on the kubelet, these
    /// files serve clients that connect by IP, the rotated one clients that name a host)
    /// or self-signed in --cert-dir.
    #[arg(long, requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The serving certificate's private key (PEM).
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// CA bundle that client certificates are verified against (the cluster CA).
    /// Without it, clients can only authenticate with bearer tokens.
    #[arg(long)]
    client_ca_file: Option<PathBuf>,
    /// Request the serving certificate from the certificates API (signer
    /// kubernetes.io/kubelet-serving) and renew it before it expires (the kubelet's
    /// serverTLSBootstrap; see --tls-cert-file for both).
    #[arg(
        long,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true",
        require_equals = true
    )]
    rotate_server_certificates: bool,
    /// Where the client certificate and generated or requested serving certificates are
    /// kept (default: <root-dir>/pki).
    #[arg(long)]
    cert_dir: Option<PathBuf>,
}

impl ServerFlags {
    fn config(
        self,
        node_name: &str,
        node_ip: IpAddr,
        root_dir: &std::path::Path,
        configuration: serde_json::Value,
    ) -> Option<ServerConfig> {
        if self.port == 0 {
            return None;
        }
        let cert_dir = self.cert_dir.unwrap_or_else(|| root_dir.join("pki"));
        let files = self.tls_cert_file.zip(self.tls_private_key_file);
        let serving_certificate = match files {
            files if self.rotate_server_certificates => {
                ServingCertificateSource::Rotate { cert_dir, files }
            }
            Some((cert, key)) => ServingCertificateSource::Files { cert, key },
            None => ServingCertificateSource::SelfSigned { cert_dir },
        };
        Some(ServerConfig {
            address: self.address,
            port: self.port,
            healthz_address: self.healthz_bind_address,
            healthz_port: self.healthz_port,
            serving_certificate,
            client_ca_file: self.client_ca_file,
            node_name: node_name.to_owned(),
            node_ip,
            configuration,
        })
    }
}

/// Flags shared by every command that talks to the container runtime.
#[derive(Debug, clap::Args)]
struct RuntimeFlags {
    /// The container runtime's CRI endpoint.
    #[arg(
        long,
        default_value = "unix:///run/containerd/containerd.sock",
        global = true
    )]
    container_runtime_endpoint: String,
    /// Deadline of each CRI call but image pulls: a duration (`2m0s`) or seconds.
    #[arg(long, default_value = "2m0s", value_parser = kubeletconfig::values::parse_timeout, global = true)]
    runtime_request_timeout: Duration,
}

impl RuntimeFlags {
    fn client(&self) -> anyhow::Result<CriClient> {
        let endpoint: Endpoint = self.container_runtime_endpoint.parse()?;
        // Image pulls have no deadline, as the kubelet's.
        Ok(CriClient::new(endpoint, self.runtime_request_timeout, None))
    }
}

/// How `inspect` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OutputArg {
    /// Aligned tables.
    Table,
    /// JSON.
    Json,
    /// A picture (`node` and `timeline`).
    Svg,
}

/// Flags of `rkubelet inspect`: the agent's own where they differ from its defaults.
#[derive(Debug, clap::Args)]
struct InspectArgs {
    #[command(flatten)]
    runtime: RuntimeFlags,
    /// The agent's state directory.
    #[arg(long, default_value = rkubelet::node::DEFAULT_ROOT_DIR, global = true)]
    root_dir: PathBuf,
    /// The runtime's CNI conf dir.
    #[arg(long, default_value = "/etc/cni/net.d", global = true)]
    runtime_cni_conf_dir: PathBuf,
    /// The agent's kubeconfig: with it, `node` reads the Node's pod CIDR from the API.
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The node's name (default: the host name).
    #[arg(long, global = true)]
    hostname_override: Option<String>,
    /// How to print.
    #[arg(long, short, value_enum, default_value = "table", global = true)]
    output: OutputArg,
    #[command(subcommand)]
    what: InspectCommand,
}

#[derive(Debug, Subcommand)]
enum InspectCommand {
    /// One pod: sandbox, pause process, namespaces, veth, bridge, IP, CNI, containers.
    Pod {
        /// `namespace/name`.
        pod: String,
    },
    /// The node's pod network: pod CIDR, bridge and its ports, each pod's IP and veth.
    Node,
    /// A pod's start-up timeline, kept by the running agent (every pod's without one).
    Timeline {
        /// `namespace/name`.
        pod: Option<String>,
    },
}

#[derive(Debug, clap::Args)]
struct CriArgs {
    #[command(flatten)]
    runtime: RuntimeFlags,
    #[command(subcommand)]
    command: CriCommand,
}

#[derive(Debug, Subcommand)]
enum CriCommand {
    /// Print the runtime's name and version and the CRI version it serves.
    Version,
    /// Print RuntimeReady and NetworkReady; exit 1 if either is false.
    Status,
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    rkubelet::allocator::limit_arenas();
    // Invoked by the container runtime as the thin CNI plugin: hand the call to the agent.
    if let Some(argv0) = std::env::args_os().next()
        && rkubelet::cni::shim::invoked_as_plugin(&argv0)
    {
        return Ok(rkubelet::cni::shim::run_plugin());
    }
    let (matches, startup) =
        match kubeletconfig::parse(Cli::command(), std::env::args_os().collect()) {
            Ok(parsed) => parsed,
            Err(ParseError::CommandLine(e)) => e.exit(),
            Err(e) => return Err(e.into()),
        };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let Some(command) = cli.command else {
        let mut out = std::io::stdout().lock();
        if cli.version {
            writeln!(
                out,
                "Kubernetes {}",
                rkubelet::node::DEFAULT_KUBELET_VERSION
            )?;
            return Ok(std::process::ExitCode::SUCCESS);
        }
        Cli::command().write_help(&mut out)?;
        return Ok(std::process::ExitCode::from(2));
    };
    let timelines = rkubelet::timeline::Timelines::new();
    let record = matches!(command, Command::Run(_)).then(|| timelines.clone());
    observability::init(cli.log_format, &cli.log_level, cli.log_span_timings, record)
        .map_err(|e| anyhow::anyhow!("setting up logging: {e}"))?;
    startup.log();
    // The blocking pool serves short file-system calls: a few threads are plenty, and
    // every extra thread is resident memory.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(8)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match command {
            Command::Run(args) => {
                // First of all: a SIGTERM from now on stops the agent cleanly, also one
                // that comes while it starts.
                let cancel = stop_on_signals().context("installing the SIGTERM handler")?;
                run_command(*args, timelines, startup.configuration, cancel).await
            }
            Command::Cri(args) => cri_command(args).await,
            Command::Inspect(args) => inspect_command(args).await,
        }
    })
}

/// A token cancelled on the first SIGTERM or SIGINT. Both handlers are installed before
/// this returns (the process no longer dies of either); must be called in the runtime.
fn stop_on_signals() -> std::io::Result<tokio_util::sync::CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        tracing::info!("stop requested");
        stop.cancel();
    });
    Ok(cancel)
}

async fn run_command(
    args: RunArgs,
    timelines: std::sync::Arc<rkubelet::timeline::Timelines>,
    configuration: serde_json::Value,
    cancel: tokio_util::sync::CancellationToken,
) -> anyhow::Result<std::process::ExitCode> {
    let node_name = match args.hostname_override {
        Some(name) => name,
        None => nix::unistd::gethostname()?.to_string_lossy().to_lowercase(),
    };
    let mut node_labels = std::collections::BTreeMap::new();
    for label in args.node_labels.iter().filter(|l| !l.is_empty()) {
        let (k, v) = label
            .split_once('=')
            .with_context(|| format!("--node-labels: {label:?} is not key=value"))?;
        node_labels.insert(k.to_owned(), v.to_owned());
    }
    let node_ip = rkubelet::node::node_ip(args.node_ip, &node_name, &rkubelet::node::LinuxHost)
        .await
        .context("--node-ip")?;
    tracing::info!(node = %node_name, %node_ip, "node IP");
    let client_certificate = rkubelet::certificate::bootstrap::ClientCertificateConfig {
        bootstrap_kubeconfig: args.bootstrap_kubeconfig,
        cert_dir: (args.server.cert_dir.clone()).unwrap_or_else(|| args.root_dir.join("pki")),
        rotate: args.rotate_certificates,
    };
    let server = args
        .server
        .config(&node_name, node_ip, &args.root_dir, configuration);
    let config = app::Config {
        kubeconfig: args.kubeconfig,
        client_certificate,
        node_name,
        node_ip,
        cri: args.runtime.client()?,
        timelines,
        root_dir: args.root_dir,
        pod_logs_dir: args.pod_logs_dir,
        network_owner: match args.network_owner {
            NetworkOwnerArg::Agent => app::NetworkOwner::Agent,
            NetworkOwnerArg::Runtime => app::NetworkOwner::Runtime,
        },
        pod_network_routes: args.pod_network_routes,
        cni_bin_dirs: args.cni_bin_dir,
        cni_conf_dir: args.cni_conf_dir,
        runtime_cni_conf_dir: args.runtime_cni_conf_dir,
        runtime_cni_bin_dir: args.runtime_cni_bin_dir,
        cluster_dns: args.cluster_dns,
        cluster_domain: args.cluster_domain,
        parallel_pod_starts: args.parallel_pod_starts.into(),
        resolv_conf: (!args.resolv_conf.is_empty()).then(|| args.resolv_conf.into()),
        node_labels,
        max_pods: args.max_pods,
        pod_cidr: args.pod_cidr,
        provider_id: args.provider_id,
        register_with_taints: args.register_with_taints,
        kube_reserved: args.kube_reserved.unwrap_or_default(),
        system_reserved: args.system_reserved.unwrap_or_default(),
        eviction_pressure_transition_period: args.eviction_pressure_transition_period,
        container_gc: rkubelet::kuberuntime::gc::ContainerGcPolicy::new(
            args.minimum_container_ttl_duration,
            args.maximum_dead_containers_per_container,
            args.maximum_dead_containers,
        ),
        image_gc: rkubelet::images::gc::ImageGcPolicy::new(
            args.image_gc_high_threshold,
            args.image_gc_low_threshold,
            args.minimum_image_ttl_duration,
        )?,
        pod_infra_container_image: args.pod_infra_container_image,
        eviction_hard: args.eviction_hard,
        allowed_unsafe_sysctls: args.allowed_unsafe_sysctls,
        server,
        cgroups_per_qos: args.cgroups_per_qos,
        cgroup_root: args.cgroup_root,
        cgroup_driver: args.cgroup_driver,
        pod_manifest_path: args.pod_manifest_path.filter(|p| !p.as_os_str().is_empty()),
        file_check_frequency: args.file_check_frequency,
        container_log_policy: rkubelet::logs::LogRotatePolicy::new(
            &args.container_log_max_size,
            args.container_log_max_files,
        )
        .context("failed to initialize container log manager")?,
    };
    app::run(config, cancel).await?;
    Ok(std::process::ExitCode::SUCCESS)
}

async fn cri_command(args: CriArgs) -> anyhow::Result<std::process::ExitCode> {
    let client = args.runtime.client()?;
    let mut out = std::io::stdout().lock();
    match args.command {
        CriCommand::Version => {
            let v = client
                .version(cri::version_request())
                .await
                .with_context(|| format!("asking {} for its version", client.endpoint()))?;
            writeln!(out, "Version:           {}", v.version)?;
            writeln!(out, "RuntimeName:       {}", v.runtime_name)?;
            writeln!(out, "RuntimeVersion:    {}", v.runtime_version)?;
            writeln!(out, "RuntimeApiVersion: {}", v.runtime_api_version)?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        CriCommand::Status => {
            let status = client
                .status(cri::api::StatusRequest { verbose: false })
                .await
                .with_context(|| format!("asking {} for its status", client.endpoint()))?;
            let health = RuntimeHealth::from(&status);
            writeln!(out, "{}", health.runtime)?;
            writeln!(out, "{}", health.network)?;
            Ok(if health.ready() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            })
        }
    }
}

fn to_json(value: &impl serde::Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(value)?)
}

fn pod_key(pod: &str) -> anyhow::Result<(&str, &str)> {
    pod.split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .with_context(|| format!("{pod:?} is not namespace/name"))
}

async fn inspect_command(args: InspectArgs) -> anyhow::Result<std::process::ExitCode> {
    use rkubelet::inspect::{self, Locations, table};
    let at = Locations {
        root_dir: args.root_dir.clone(),
        runtime_cni_conf_dir: args.runtime_cni_conf_dir.clone(),
        libcni_dir: "/var/lib/cni".into(),
        proc: rkubelet::procfs::ProcFs::default(),
    };
    let text = match (&args.what, args.output) {
        (InspectCommand::Pod { .. }, OutputArg::Svg) => {
            anyhow::bail!("there is no picture of one pod: try `inspect node --output svg`")
        }
        (InspectCommand::Pod { pod }, output) => {
            let (namespace, name) = pod_key(pod)?;
            let view = inspect::pod::inspect(&args.runtime.client()?, &at, namespace, name).await?;
            if output == OutputArg::Json {
                to_json(&view)?
            } else {
                table::pod(&view)
            }
        }
        (InspectCommand::Node, output) => {
            let node_name = match args.hostname_override.clone() {
                Some(name) => name,
                None => nix::unistd::gethostname()?.to_string_lossy().to_lowercase(),
            };
            let pod_cidr = match &args.kubeconfig {
                Some(path) => node_pod_cidr(path, &node_name).await?,
                None => None,
            };
            let view =
                inspect::node::inspect(&args.runtime.client()?, &at, Some(node_name), pod_cidr)
                    .await?;
            match output {
                OutputArg::Json => to_json(&view)?,
                OutputArg::Svg => inspect::svg::node(&view),
                OutputArg::Table => table::node(&view),
            }
        }
        (InspectCommand::Timeline { pod: None }, output) => {
            let all: Vec<rkubelet::timeline::PodTimeline> =
                inspect::ask_agent(&args.root_dir, "/debug/timeline").await?;
            match output {
                OutputArg::Json => to_json(&all)?,
                OutputArg::Svg => anyhow::bail!("one picture per pod: name the pod"),
                OutputArg::Table => all
                    .iter()
                    .map(table::timeline)
                    .collect::<Vec<_>>()
                    .join("\n"),
            }
        }
        (InspectCommand::Timeline { pod: Some(pod) }, output) => {
            let (namespace, name) = pod_key(pod)?;
            let timeline: rkubelet::timeline::PodTimeline = inspect::ask_agent(
                &args.root_dir,
                &format!("/debug/timeline/{namespace}/{name}"),
            )
            .await?;
            match output {
                OutputArg::Json => to_json(&timeline)?,
                OutputArg::Svg => inspect::svg::timeline(&timeline),
                OutputArg::Table => table::timeline(&timeline),
            }
        }
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    if !text.ends_with('\n') {
        writeln!(out)?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// The Node's pod CIDR, from the API.
async fn node_pod_cidr(kubeconfig: &std::path::Path, node: &str) -> anyhow::Result<Option<String>> {
    let client = app::kube_client(kubeconfig).await?;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    let found = nodes
        .get_opt(node)
        .await
        .with_context(|| format!("reading node {node}"))?;
    Ok(found.and_then(|n| n.spec).and_then(|s| s.pod_cidr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_implemented_config_field_has_its_flag() {
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("run");
        for field in kubeletconfig::fields::IMPLEMENTED {
            assert!(
                run.get_arguments()
                    .any(|a| a.get_long() == Some(field.flag)),
                "{} maps to --{}, which `run` does not have",
                field.path,
                field.flag
            );
        }
    }

    fn run_args(args: &[&str]) -> RunArgs {
        let argv = ["rkubelet", "run", "--kubeconfig", "/k"]
            .into_iter()
            .chain(args.iter().copied());
        let (matches, _) = kubeletconfig::parse(Cli::command(), argv.map(Into::into).collect())
            .expect("command line");
        match Cli::from_arg_matches(&matches).expect("cli").command {
            Some(Command::Run(args)) => *args,
            other => panic!("not run: {other:?}"),
        }
    }

    #[test]
    fn log_rotation_comes_from_the_defaults_the_file_and_the_flags() {
        let policy = |args: &RunArgs| {
            rkubelet::logs::LogRotatePolicy::new(
                &args.container_log_max_size,
                args.container_log_max_files,
            )
        };
        let defaults = run_args(&[]);
        assert_eq!(policy(&defaults), Ok(Default::default()));
        let dir = std::env::temp_dir().join(format!("rk-main-logrotate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\n",
        )
        .unwrap();
        let config = config.to_str().unwrap();
        let from_file = run_args(&["--config", config]);
        let expected = rkubelet::logs::LogRotatePolicy {
            max_size: 1 << 20,
            max_files: 3,
        };
        assert_eq!(policy(&from_file), Ok(expected));
        let flag_over_file = run_args(&["--config", config, "--container-log-max-files", "4"]);
        assert_eq!(policy(&flag_over_file).unwrap().max_files, 4);
        // An explicit 0 is the kubelet's pointer field set to 0: refused, not the default.
        std::fs::write(
            dir.join("config.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             containerLogMaxFiles: 0\n",
        )
        .unwrap();
        let zero = run_args(&["--config", config]);
        assert_eq!(
            policy(&zero).unwrap_err().to_string(),
            "invalid MaxFiles 0, must be > 1"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
