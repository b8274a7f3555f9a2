//! The command line as the kubelet's: `--config`, the kubelet's common flags that
//! rkubelet accepts without acting on them, bare flags meaning `run` (the kubelet has no
//! subcommands), and the file's values under the flags given on the command line.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command};

use super::fields::{self, Note};
use super::file::{ConfigError, ConfigFile};
use super::running;

/// A kubelet flag that rkubelet accepts and does not act on.
#[derive(Debug, Clone, Copy)]
pub struct NoEffect {
    /// The flag's long name.
    pub flag: &'static str,
    /// The value that is rkubelet's behaviour anyway: given, it is not worth a warning.
    pub quiet_with: Option<&'static str>,
    /// Why it has no effect.
    pub why: &'static str,
}

const fn no_effect(
    flag: &'static str,
    quiet_with: Option<&'static str>,
    why: &'static str,
) -> NoEffect {
    NoEffect {
        flag,
        quiet_with,
        why,
    }
}

/// The kubelet's flags that rkubelet accepts without effect (one line per flag).
#[rustfmt::skip]
pub const NO_EFFECT: &[NoEffect] = &[
    no_effect("container-runtime", Some("remote"), "rkubelet talks to a CRI runtime at --container-runtime-endpoint"),
    no_effect("image-service-endpoint", None, "images are pulled through --container-runtime-endpoint"),
    no_effect("fail-swap-on", Some("false"), "rkubelet does not check for swap"),
    no_effect("runtime-cgroups", None, "rkubelet does not move the runtime into a cgroup"),
    no_effect("kubelet-cgroups", None, "rkubelet does not move itself into a cgroup"),
    no_effect("system-cgroups", None, "rkubelet does not move system processes into a cgroup"),
    no_effect("network-plugin", None, "pod networks are set up as --network-owner says"),
    no_effect("cloud-provider", None, "rkubelet has no cloud provider"),
    no_effect("volume-plugin-dir", None, "rkubelet has no FlexVolume plugins"),
    no_effect("feature-gates", None, "rkubelet has the kubelet v1.20 default features"),
    no_effect("anonymous-auth", Some("false"), "anonymous requests are always refused"),
    no_effect("authentication-token-webhook", Some("true"), "bearer tokens are always checked with a TokenReview"),
    no_effect("authorization-mode", Some("Webhook"), "requests are always authorized with a SubjectAccessReview"),
    no_effect("read-only-port", Some("0"), "rkubelet serves no read-only port"),
    no_effect("serialize-image-pulls", Some("false"), "images are pulled in parallel, one pull per image at a time"),
    no_effect("v", None, "log verbosity is set with --log-level or RUST_LOG"),
    no_effect("logtostderr", Some("true"), "rkubelet logs to stderr"),
    no_effect("alsologtostderr", None, "rkubelet logs to stderr"),
    no_effect("log-dir", None, "rkubelet logs to stderr"),
    no_effect("log-file", None, "rkubelet logs to stderr"),
];

/// The id of `--config`.
const CONFIG: &str = "config";

/// What to log once logging is set up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Startup {
    /// The configuration file read, if any.
    pub config_file: Option<PathBuf>,
    /// Fields and flags without effect, file values the command line overrides.
    pub notes: Vec<Note>,
    /// The running configuration that `/configz` serves ([`running`]); null for the
    /// commands other than `run`.
    pub configuration: serde_json::Value,
}

impl Startup {
    /// Logs the file read and each note, once.
    pub fn log(&self) {
        if let Some(path) = &self.config_file {
            tracing::info!(file = %path.display(), "kubelet config file loaded");
        }
        for note in &self.notes {
            match note {
                Note::IgnoredField { field, why } => {
                    tracing::warn!(field = %field, reason = %why, "kubelet config field ignored");
                }
                Note::UnknownField { field } => {
                    tracing::warn!(field = %field, "unknown kubelet config field ignored");
                }
                Note::NoEffectFlag { flag, why } => {
                    tracing::warn!(flag = %format!("--{flag}"), reason = %why, "kubelet flag has no effect");
                }
                Note::Overridden { field, flag } => {
                    tracing::info!(field = %field, flag = %format!("--{flag}"), "kubelet config field overridden by the command line");
                }
            }
        }
    }
}

/// A command line that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The command line itself (clap prints it and exits).
    #[error(transparent)]
    CommandLine(#[from] clap::Error),
    /// The file named by `--config`.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Adds `--config` and the flags without effect to the `run` command.
fn augment(run: Command) -> Command {
    let config = Arg::new(CONFIG)
        .long(CONFIG)
        .value_name("FILE")
        .value_parser(clap::value_parser!(PathBuf))
        .help(
            "A kubelet.config.k8s.io/v1beta1 KubeletConfiguration (YAML or JSON); flags given \
             on the command line override its fields",
        );
    let accepted = NO_EFFECT.iter().map(|f| {
        Arg::new(f.flag)
            .long(f.flag)
            .num_args(0..=1)
            .value_name("VALUE")
            .default_missing_value("true")
            .help(format!("Accepted as the kubelet's; no effect: {}", f.why))
    });
    run.arg(config).args(accepted)
}

/// Parses `argv`, as `rkubelet run …` when it starts with a flag and names no subcommand
/// (the kubelet's `kubelet --config … --kubeconfig …`; the kubelet has no subcommands).
/// The command line is parsed as given first, so a flag's value that reads like a
/// subcommand (`--cluster-domain cri`) is still a value, and `--help`, `--version` (any
/// flag of the program's own) are still the program's. Returns the matches and the argv
/// they came from.
fn matches_with_implicit_run(
    cmd: &mut Command,
    mut argv: Vec<OsString>,
) -> Result<(ArgMatches, Vec<OsString>), clap::Error> {
    let direct = cmd.try_get_matches_from_mut(&argv);
    let first_is_flag = argv
        .get(1)
        .is_some_and(|a| a.to_string_lossy().starts_with('-'));
    // A flag of the program itself (not global, so not `run`'s: `--version`) settles it.
    let own_flag_given = |m: &ArgMatches| {
        cmd.get_arguments()
            .filter(|a| !a.is_global_set())
            .any(|a| given(m, a.get_id().as_str()))
    };
    let settled = match &direct {
        Ok(m) => m.subcommand().is_some() || own_flag_given(m),
        Err(e) => matches!(
            e.kind(),
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
        ),
    };
    if settled || !first_is_flag {
        return direct.map(|m| (m, argv));
    }
    argv.insert(1, "run".into());
    let matches = cmd.try_get_matches_from_mut(&argv)?;
    Ok((matches, argv))
}

/// The id of the `run` argument whose long name is `flag`.
fn arg_id(run: &Command, flag: &str) -> Option<clap::Id> {
    run.get_arguments()
        .find(|a| a.get_long() == Some(flag))
        .map(|a| a.get_id().clone())
}

fn given(run: &ArgMatches, id: &str) -> bool {
    run.value_source(id) == Some(ValueSource::CommandLine)
}

/// Parses `argv` with `cmd` (whose `run` subcommand gains `--config` and the kubelet's
/// flags without effect): the values of `--config`'s file go under the flags given on the
/// command line, above the defaults.
///
/// # Errors
/// A bad command line, or a file that cannot be used (a value a flag refuses is named
/// by its field).
pub fn parse(cmd: Command, argv: Vec<OsString>) -> Result<(ArgMatches, Startup), ParseError> {
    let mut cmd = cmd.mut_subcommand("run", augment);
    let (matches, argv) = matches_with_implicit_run(&mut cmd, argv)?;
    let Some(("run", run)) = matches.subcommand() else {
        return Ok((matches, Startup::default()));
    };
    let mut startup = Startup::default();
    for f in NO_EFFECT {
        if given(run, f.flag) && run.get_one::<String>(f.flag).map(String::as_str) != f.quiet_with {
            startup.notes.push(Note::NoEffectFlag {
                flag: f.flag,
                why: f.why,
            });
        }
    }
    let matches = match run.get_one::<PathBuf>(CONFIG).cloned() {
        Some(path) => with_file(&mut cmd, argv, run, path, &mut startup)?,
        None => matches,
    };
    if let (Some(("run", run)), Some(run_cmd)) = (matches.subcommand(), cmd.find_subcommand("run"))
    {
        startup.configuration = running::configuration(run_cmd, run);
    }
    Ok((matches, startup))
}

/// Parses `argv` again with the values of the file at `path` that the command line
/// (`run`, as first parsed) did not give.
fn with_file(
    cmd: &mut Command,
    mut argv: Vec<OsString>,
    run: &ArgMatches,
    path: PathBuf,
    startup: &mut Startup,
) -> Result<ArgMatches, ParseError> {
    let file = ConfigFile::load(&path)?;
    let plan = fields::plan(&file)?;
    let run_cmd = cmd
        .find_subcommand("run")
        .ok_or_else(|| clap::Error::new(clap::error::ErrorKind::MissingSubcommand))?;
    let mut from_file = Vec::new();
    for setting in &plan.settings {
        let Some(id) = arg_id(run_cmd, setting.flag) else {
            startup.notes.push(Note::IgnoredField {
                field: setting.field.to_owned(),
                why: format!("this build has no --{}", setting.flag),
            });
            continue;
        };
        if given(run, id.as_str()) {
            startup.notes.push(Note::Overridden {
                field: setting.field,
                flag: setting.flag,
            });
        } else {
            from_file.push(setting);
        }
    }
    startup.notes.extend(plan.notes);
    startup.config_file = Some(path.clone());
    argv.extend(
        from_file
            .iter()
            .map(|s| OsString::from(format!("--{}={}", s.flag, s.value))),
    );
    cmd.try_get_matches_from_mut(&argv)
        .map_err(|e| blame_file(e, &path, &from_file))
}

/// A parse error caused by a value from the file, named by its field.
fn blame_file(
    error: clap::Error,
    path: &std::path::Path,
    from_file: &[&fields::Setting],
) -> ParseError {
    use clap::error::{ContextKind, ContextValue};
    let names_flag = |flag: &str| {
        [ContextKind::InvalidArg, ContextKind::PriorArg]
            .into_iter()
            .filter_map(|kind| match error.get(kind) {
                Some(ContextValue::String(s)) => Some(s.clone()),
                Some(ContextValue::Strings(v)) => Some(v.join(" ")),
                _ => None,
            })
            .any(|arg| {
                arg.split_whitespace()
                    .any(|word| word == format!("--{flag}"))
            })
    };
    match from_file.iter().find(|s| names_flag(s.flag)) {
        Some(setting) => {
            let rendered = error.render().to_string();
            let first = rendered.lines().next().unwrap_or_default();
            ConfigError {
                path: path.to_owned(),
                reason: format!(
                    "{}: {}",
                    setting.field,
                    first.strip_prefix("error: ").unwrap_or(first)
                ),
            }
            .into()
        }
        None => error.into(),
    }
}

/// A command shaped like rkubelet's (which the binary defines): a `run` subcommand with
/// flags of each kind; for the tests and the fuzz target.
#[cfg(any(test, fuzzing))]
pub(crate) fn command() -> Command {
    let run = Command::new("run")
        .arg(
            Arg::new("max_pods")
                .long("max-pods")
                .default_value("110")
                .value_parser(clap::value_parser!(u32)),
        )
        .arg(
            Arg::new("cluster_dns")
                .long("cluster-dns")
                .value_delimiter(','),
        )
        .arg(
            Arg::new("cluster_domain")
                .long("cluster-domain")
                .default_value("cluster.local"),
        )
        .arg(
            Arg::new("cgroups_per_qos")
                .long("cgroups-per-qos")
                .default_value("true")
                .num_args(0..=1)
                .require_equals(true)
                .value_parser(clap::value_parser!(bool)),
        )
        .arg(Arg::new("client_ca_file").long("client-ca-file"));
    Command::new("rkubelet")
        .version("1.20.2")
        .arg(
            Arg::new("print_version")
                .long("print-version")
                .action(clap::ArgAction::SetTrue),
        )
        .arg(Arg::new("log_level").long("log-level").global(true))
        .subcommand(run)
        .subcommand(Command::new("cri"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<OsString> {
        std::iter::once("rkubelet")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect()
    }

    fn write_config(dir: &std::path::Path, body: &str) -> PathBuf {
        let path = dir.join("config.yaml");
        std::fs::write(
            &path,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}"
            ),
        )
        .unwrap();
        path
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rk-kubeletconfig-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn bare_flags_mean_run_as_on_the_kubelet() {
        let run_of = |args: &[&str]| {
            let (matches, _) = parse(command(), argv(args)).unwrap();
            let Some(("run", run)) = matches.subcommand() else {
                panic!("{args:?} is not run");
            };
            run.clone()
        };
        let run = run_of(&["--max-pods", "3", "--cluster-domain", "cri"]);
        assert_eq!(run.get_one::<u32>("max_pods"), Some(&3));
        assert_eq!(
            run.get_one::<String>("cluster_domain").map(String::as_str),
            Some("cri"),
            "a value that reads like a subcommand is a value"
        );
        let run = run_of(&["--log-level", "debug", "run", "--max-pods", "4"]);
        assert_eq!(run.get_one::<u32>("max_pods"), Some(&4));
        let (matches, _) = parse(command(), argv(&["cri"])).unwrap();
        assert_eq!(matches.subcommand_name(), Some("cri"));
        for own in [
            &[][..],
            &["--print-version"],
            &["--log-level", "info", "--print-version"],
        ] {
            let (matches, _) = parse(command(), argv(own)).unwrap();
            assert_eq!(matches.subcommand_name(), None, "{own:?}");
        }
        for (args, kind) in [
            (&["--version"][..], clap::error::ErrorKind::DisplayVersion),
            (&["--help"], clap::error::ErrorKind::DisplayHelp),
            (
                &["--max-pods", "3", "--help"],
                clap::error::ErrorKind::DisplayHelp,
            ),
        ] {
            match parse(command(), argv(args)) {
                Err(ParseError::CommandLine(e)) => assert_eq!(e.kind(), kind, "{args:?}"),
                other => panic!("{args:?}: {:?}", other.map(|(m, _)| m)),
            }
        }
    }

    #[test]
    fn defaults_then_file_then_command_line() {
        let dir = temp_dir("precedence");
        let config = write_config(
            &dir,
            "maxPods: 7\nclusterDNS: [10.96.0.10]\ncgroupsPerQOS: false\n\
             authentication: {x509: {clientCAFile: pki/ca.crt}}\n",
        );
        let config = config.to_str().unwrap();
        let (matches, startup) = parse(
            command(),
            argv(&["--config", config, "--cluster-dns", "10.0.0.1,10.0.0.2"]),
        )
        .unwrap();
        let (_, run) = matches.subcommand().unwrap();
        // From the file.
        assert_eq!(run.get_one::<u32>("max_pods"), Some(&7));
        assert_eq!(run.get_one::<bool>("cgroups_per_qos"), Some(&false));
        let ca = dir.join("pki/ca.crt").display().to_string();
        assert_eq!(run.get_one::<String>("client_ca_file"), Some(&ca));
        // From the command line, over the file.
        let dns: Vec<&String> = run.get_many("cluster_dns").unwrap().collect();
        assert_eq!(dns, ["10.0.0.1", "10.0.0.2"]);
        // The default, set by neither.
        assert_eq!(
            run.get_one::<String>("cluster_domain").unwrap(),
            "cluster.local"
        );
        assert_eq!(
            startup.config_file.as_deref(),
            Some(std::path::Path::new(config))
        );
        assert_eq!(
            startup.notes,
            [Note::Overridden {
                field: "clusterDNS",
                flag: "cluster-dns"
            }]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_running_configuration_merges_defaults_file_and_flags() {
        let dir = temp_dir("running");
        let config = write_config(
            &dir,
            "maxPods: 7\nclusterDNS: [10.96.0.10]\ncgroupsPerQOS: false\n\
             authentication: {x509: {clientCAFile: pki/ca.crt}}\nnodeStatusUpdateFrequency: 20s\n",
        );
        let config = config.to_str().unwrap();
        let (_, startup) = parse(
            command(),
            argv(&["--config", config, "--cluster-dns", "10.0.0.1,10.0.0.2"]),
        )
        .unwrap();
        let running = &startup.configuration;
        // The file's, the command line's over the file's, the flag's default, the
        // kubelet's default.
        assert_eq!(running["maxPods"], 7);
        assert_eq!(running["cgroupsPerQOS"], false);
        let ca = dir.join("pki/ca.crt").display().to_string();
        assert_eq!(
            running["authentication"]["x509"]["clientCAFile"],
            ca.as_str()
        );
        assert_eq!(
            running["clusterDNS"],
            serde_json::json!(["10.0.0.1", "10.0.0.2"])
        );
        assert_eq!(running["clusterDomain"], "cluster.local");
        assert_eq!(running["evictionHard"]["memory.available"], "100Mi");
        // Not implemented: what rkubelet behaves as, the kubelet's default.
        assert_eq!(running["nodeStatusUpdateFrequency"], "10s");
        // Not `run`: no configuration.
        let (_, cri) = parse(command(), argv(&["cri"])).unwrap();
        assert!(cri.configuration.is_null());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_kind_kubeadm_flags_start_the_agent() {
        let kind = "--container-runtime=remote --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
                    --fail-swap-on=false --node-ip=172.18.0.3 --node-labels= \
                    --pod-infra-container-image=registry.k8s.io/pause:3.9 \
                    --provider-id=kind://docker/kind/kind-worker --runtime-cgroups=/system.slice/containerd.service";
        let cmd = command().mut_subcommand("run", |run| {
            run.args(
                [
                    "container-runtime-endpoint",
                    "node-ip",
                    "pod-infra-container-image",
                    "node-labels",
                    "provider-id",
                ]
                .map(|f| Arg::new(f).long(f)),
            )
        });
        let args: Vec<&str> = kind.split_whitespace().collect();
        let (matches, startup) = parse(cmd, argv(&args)).unwrap();
        assert_eq!(matches.subcommand_name(), Some("run"));
        // remote and fail-swap-on=false are what rkubelet does: only one flag is noted.
        assert_eq!(
            startup.notes,
            [Note::NoEffectFlag {
                flag: "runtime-cgroups",
                why: "rkubelet does not move the runtime into a cgroup"
            }]
        );
    }

    #[test]
    fn a_file_value_a_flag_refuses_is_named_by_its_field() {
        let dir = temp_dir("refused");
        let config = write_config(&dir, "maxPods: -3\n");
        let err = parse(
            command(),
            argv(&["run", "--config", config.to_str().unwrap()]),
        )
        .unwrap_err();
        let ParseError::Config(err) = err else {
            panic!("not the file's fault: {err}")
        };
        assert!(err.reason.starts_with("maxPods: "), "{}", err.reason);
        assert!(err.reason.contains("-3"), "{}", err.reason);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_field_without_a_flag_in_this_build_is_ignored() {
        let dir = temp_dir("noflag");
        let config = write_config(&dir, "podCIDR: 10.1.0.0/24\n");
        let (_, startup) = parse(
            command(),
            argv(&["run", "--config", config.to_str().unwrap()]),
        )
        .unwrap();
        assert_eq!(
            startup.notes,
            [Note::IgnoredField {
                field: "podCIDR".into(),
                why: "this build has no --pod-cidr".into()
            }]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_bad_file_stops_the_start() {
        let err = parse(
            command(),
            argv(&["run", "--config", "/nonexistent/config.yaml"]),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("failed to load Kubelet config file /nonexistent/config.yaml, error"),
            "{err}"
        );
    }
}
