//! The Linux security context of a pod's sandbox and containers, as the kubelet decides
//! it: the pod's `securityContext` merged under each container's
//! (`DetermineEffectiveSecurityContext`), the seccomp profile from the fields and the
//! v1.20 annotations, the `/proc` masks of `procMount`, `fsGroup` and
//! `supplementalGroups` as supplemental groups, the image's user when the pod names none,
//! and the `runAsNonRoot` check against that user (`verifyRunAsNonRoot`).

use std::path::Path;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, Pod, PodSpec, SELinuxOptions, SeccompProfile, SecurityContext,
};

use crate::cri::{Cri, CriError, api};

/// The v1.20 annotation with the seccomp profile of every container of the pod.
pub const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
/// The v1.20 annotation prefix with the seccomp profile of one container (its name follows).
pub const SECCOMP_CONTAINER_ANNOTATION_PREFIX: &str =
    "container.seccomp.security.alpha.kubernetes.io/";

/// The runtime's default seccomp profile (`runtime/default`).
const RUNTIME_DEFAULT: &str = "runtime/default";
/// The deprecated name of the runtime's default profile.
const DOCKER_DEFAULT: &str = "docker/default";
/// No seccomp filter.
const UNCONFINED: &str = "unconfined";
/// The prefix of a profile file on the node.
const LOCALHOST_PREFIX: &str = "localhost/";

/// Paths of `/proc` and `/sys` hidden from a container with the default `procMount`.
const DEFAULT_MASKED_PATHS: [&str; 9] = [
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
];
/// Paths of `/proc` read-only in a container with the default `procMount`.
const DEFAULT_READONLY_PATHS: [&str; 6] = [
    "/proc/asound",
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The user an image runs as, from `ImageStatus`: a UID, or a name only the runtime can
/// resolve. An image that says neither runs as root (UID 0), as the kubelet assumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageUser {
    /// The numeric user.
    pub uid: Option<i64>,
    /// The user name, when the image's user is not numeric.
    pub username: String,
}

impl Default for ImageUser {
    fn default() -> Self {
        Self {
            uid: Some(0),
            username: String::new(),
        }
    }
}

impl ImageUser {
    /// The user of an image as the runtime describes it (the kubelet's `getImageUser`).
    #[must_use]
    pub fn of(image: Option<&api::Image>) -> Self {
        match image {
            Some(api::Image { uid: Some(uid), .. }) => Self {
                uid: Some(uid.value),
                username: String::new(),
            },
            Some(image) if !image.username.is_empty() => Self {
                uid: None,
                username: image.username.clone(),
            },
            _ => Self::default(),
        }
    }
}

/// Which user the image runs as: what the runtime said of the image found present
/// (`present`), else what it says of `image` (a reference: the image was just pulled).
/// The kubelet asks the runtime twice per container start (`EnsureImageExists`, then
/// `getImageUser`); one `ImageStatus` answers both.
///
/// # Errors
/// The runtime's `ImageStatus` failed.
pub async fn image_user<C: Cri>(
    cri: &C,
    present: Option<&api::Image>,
    image: &str,
) -> Result<ImageUser, CriError> {
    if let Some(present) = present {
        return Ok(ImageUser::of(Some(present)));
    }
    let status = cri
        .image_status(api::ImageStatusRequest {
            image: Some(api::ImageSpec {
                image: image.to_owned(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await?;
    Ok(ImageUser::of(status.image.as_ref()))
}

/// Why a container may not run with `runAsNonRoot` (the kubelet's messages, word for word).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum NonRootError {
    /// `runAsUser: 0` with `runAsNonRoot: true`.
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsUserRoot {
        /// The pod, as `<name>_<namespace>(<uid>)`.
        pod: String,
        /// The container.
        container: String,
    },
    /// The image runs as UID 0.
    #[error(
        "container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})"
    )]
    ImageRunsAsRoot {
        /// The pod, as `<name>_<namespace>(<uid>)`.
        pod: String,
        /// The container.
        container: String,
    },
    /// The image's user is a name: whether it is root cannot be known here.
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: {pod:?}, container: {container})"
    )]
    NonNumericUser {
        /// The image's user name.
        user: String,
        /// The pod, as `<name>_<namespace>(<uid>)`.
        pod: String,
        /// The container.
        container: String,
    },
}

/// The pod as the kubelet names it in messages: `<name>_<namespace>(<uid>)`.
fn pod_desc(pod: &Pod) -> String {
    let meta = &pod.metadata;
    format!(
        "{}_{}({})",
        meta.name.as_deref().unwrap_or_default(),
        meta.namespace.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default()
    )
}

/// The container's security context with the pod's settings under it: the container's
/// `runAsUser`, `runAsGroup`, `runAsNonRoot` and `seLinuxOptions` win over the pod's;
/// the other fields exist only at the container level.
#[must_use]
pub fn effective(pod: &Pod, container: &Container) -> SecurityContext {
    let mut sc = container.security_context.clone().unwrap_or_default();
    let Some(from_pod) = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()) else {
        return sc;
    };
    sc.run_as_user = sc.run_as_user.or(from_pod.run_as_user);
    sc.run_as_group = sc.run_as_group.or(from_pod.run_as_group);
    sc.run_as_non_root = sc.run_as_non_root.or(from_pod.run_as_non_root);
    if sc.se_linux_options.is_none() {
        sc.se_linux_options.clone_from(&from_pod.se_linux_options);
    }
    sc
}

/// Refuses a container that must not run as root but would, or might (the kubelet's
/// `verifyRunAsNonRoot`): only a numeric user can be verified.
///
/// # Errors
/// The kubelet's reason, shown as the container's `CreateContainerConfigError`.
pub fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    user: &ImageUser,
) -> Result<(), NonRootError> {
    let sc = effective(pod, container);
    if sc.run_as_non_root != Some(true) {
        return Ok(());
    }
    let (pod, container) = (pod_desc(pod), container.name.clone());
    match (sc.run_as_user, user.uid) {
        (Some(0), _) => Err(NonRootError::RunAsUserRoot { pod, container }),
        (Some(_), _) => Ok(()),
        (None, Some(0)) => Err(NonRootError::ImageRunsAsRoot { pod, container }),
        (None, None) if !user.username.is_empty() => Err(NonRootError::NonNumericUser {
            user: user.username.clone(),
            pod,
            container,
        }),
        (None, _) => Ok(()),
    }
}

/// A seccomp profile named by a field: the kubelet's v1.20 profile string.
fn field_profile(profile: &SeccompProfile, root: &Path) -> String {
    match (profile.type_.as_str(), profile.localhost_profile.as_deref()) {
        ("RuntimeDefault", _) => RUNTIME_DEFAULT.into(),
        ("Unconfined", _) => UNCONFINED.into(),
        ("Localhost", Some(name)) if !name.is_empty() => localhost(root, name),
        _ => String::new(),
    }
}

/// `localhost/<root>/<name>`, `name` kept under `root` as Go's `filepath.Join` keeps it (a
/// leading `/` does not replace the root).
fn localhost(root: &Path, name: &str) -> String {
    format!(
        "{LOCALHOST_PREFIX}{}",
        root.join(name.trim_start_matches('/')).display()
    )
}

/// A seccomp profile named by an annotation: a `localhost/` one is a file under `root`.
fn annotation_profile(profile: &str, root: &Path) -> String {
    match profile.strip_prefix(LOCALHOST_PREFIX) {
        Some(name) => localhost(root, name),
        None => profile.to_owned(),
    }
}

/// The container's seccomp profile as the kubelet v1.20 names it (`runtime/default`,
/// `unconfined`, `localhost/<root>/<file>`, or empty for the runtime's unset profile:
/// none): the container's field, else its annotation, else the pod's field, else the pod's
/// annotation.
#[must_use]
pub fn seccomp_profile_path(pod: &Pod, container: &Container, root: &Path) -> String {
    let annotations = pod.metadata.annotations.as_ref();
    let annotation = |key: &str| annotations.and_then(|a| a.get(key));
    let container_field = container
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref());
    let pod_field = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.seccomp_profile.as_ref());
    let container_annotation = annotation(&format!(
        "{SECCOMP_CONTAINER_ANNOTATION_PREFIX}{}",
        container.name
    ));
    if let Some(field) = container_field {
        field_profile(field, root)
    } else if let Some(profile) = container_annotation {
        annotation_profile(profile, root)
    } else if let Some(field) = pod_field {
        field_profile(field, root)
    } else if let Some(profile) = annotation(SECCOMP_POD_ANNOTATION) {
        annotation_profile(profile, root)
    } else {
        String::new()
    }
}

/// The same profile in the runtime's newer form, which runtimes read before the path: an
/// empty path is no filter (the kubelet's `Unconfined` default); a name the runtime would
/// refuse is left to the path, so that the runtime reports it.
fn security_profile(path: &str) -> Option<api::SecurityProfile> {
    let (kind, localhost_ref) = match path {
        "" | UNCONFINED => (
            api::security_profile::ProfileType::Unconfined,
            String::new(),
        ),
        RUNTIME_DEFAULT | DOCKER_DEFAULT => (
            api::security_profile::ProfileType::RuntimeDefault,
            String::new(),
        ),
        other => (
            api::security_profile::ProfileType::Localhost,
            other.strip_prefix(LOCALHOST_PREFIX)?.to_owned(),
        ),
    };
    Some(api::SecurityProfile {
        profile_type: kind.into(),
        localhost_ref,
    })
}

fn selinux(options: &SELinuxOptions) -> api::SeLinuxOption {
    api::SeLinuxOption {
        user: options.user.clone().unwrap_or_default(),
        role: options.role.clone().unwrap_or_default(),
        r#type: options.type_.clone().unwrap_or_default(),
        level: options.level.clone().unwrap_or_default(),
    }
}

fn capabilities(caps: &Capabilities) -> api::Capability {
    api::Capability {
        add_capabilities: caps.add.clone().unwrap_or_default(),
        drop_capabilities: caps.drop.clone().unwrap_or_default(),
    }
}

/// The pod's `fsGroup` then its `supplementalGroups`.
fn supplemental_groups(spec: Option<&PodSpec>) -> Vec<i64> {
    let Some(sc) = spec.and_then(|s| s.security_context.as_ref()) else {
        return Vec::new();
    };
    sc.fs_group
        .into_iter()
        .chain(sc.supplemental_groups.iter().flatten().copied())
        .collect()
}

/// True when a container or init container of the pod is privileged: the sandbox must
/// allow it (the kubelet's `HasPrivilegedContainer`).
fn has_privileged_container(spec: &PodSpec) -> bool {
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    containers
        .filter_map(|c| c.security_context.as_ref()?.privileged)
        .any(|p| p)
}

fn int64(value: i64) -> api::Int64Value {
    api::Int64Value { value }
}

/// The container's security context for the runtime (the kubelet's
/// `determineEffectiveSecurityContext`); `user` is the image's, used when the pod names
/// no user; `seccomp_root` holds the node's `Localhost` profiles. The profile goes in
/// both forms: the path a v1.20 kubelet sends, and the newer field runtimes read first.
#[must_use]
#[expect(
    deprecated,
    reason = "the v1.20 kubelet's seccomp path, for runtimes that read it"
)]
pub fn container(
    pod: &Pod,
    container: &Container,
    user: &ImageUser,
    seccomp_root: &Path,
) -> api::LinuxContainerSecurityContext {
    let sc = effective(pod, container);
    let spec = pod.spec.as_ref();
    let seccomp_path = seccomp_profile_path(pod, container, seccomp_root);
    // procMount: Unmasked leaves /proc as the runtime mounts it.
    let unmasked = sc.proc_mount.as_deref() == Some("Unmasked");
    let paths = |defaults: &[&str]| {
        if unmasked {
            Vec::new()
        } else {
            defaults.iter().map(|p| (*p).to_owned()).collect()
        }
    };
    let (run_as_user, run_as_username) = match sc.run_as_user {
        Some(uid) => (Some(uid), String::new()),
        None => (user.uid, user.username.clone()),
    };
    api::LinuxContainerSecurityContext {
        capabilities: sc.capabilities.as_ref().map(capabilities),
        privileged: sc.privileged.unwrap_or(false),
        namespace_options: spec.map(namespace_options),
        selinux_options: sc.se_linux_options.as_ref().map(selinux),
        run_as_user: run_as_user.map(int64),
        run_as_group: sc.run_as_group.map(int64),
        run_as_username,
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups: supplemental_groups(spec),
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        masked_paths: paths(&DEFAULT_MASKED_PATHS),
        readonly_paths: paths(&DEFAULT_READONLY_PATHS),
        seccomp: security_profile(&seccomp_path),
        seccomp_profile_path: seccomp_path,
        ..Default::default()
    }
}

/// The pod's namespaces: the sandbox's, and every container's too (the kubelet's
/// `namespacesForPod`): a container left without them would share the pod's PID namespace.
pub(super) fn namespace_options(spec: &PodSpec) -> api::NamespaceOption {
    let mode = |host: Option<bool>, otherwise: api::NamespaceMode| {
        if host.unwrap_or(false) {
            api::NamespaceMode::Node
        } else {
            otherwise
        }
    };
    let pid_default = if spec.share_process_namespace.unwrap_or(false) {
        api::NamespaceMode::Pod
    } else {
        api::NamespaceMode::Container
    };
    api::NamespaceOption {
        network: mode(spec.host_network, api::NamespaceMode::Pod).into(),
        pid: mode(spec.host_pid, pid_default).into(),
        ipc: mode(spec.host_ipc, api::NamespaceMode::Pod).into(),
        target_id: String::new(),
    }
}

/// The sandbox's security context (the kubelet's `generatePodSandboxLinuxConfig`): the
/// pod's user, group, groups and SELinux options, its namespaces, privileged when a
/// container is, and the runtime's default seccomp profile (in both forms).
#[must_use]
#[expect(
    deprecated,
    reason = "the v1.20 kubelet's seccomp path, for runtimes that read it"
)]
pub fn sandbox(spec: &PodSpec) -> api::LinuxSandboxSecurityContext {
    let pod_sc = spec.security_context.as_ref();
    api::LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options(spec)),
        selinux_options: pod_sc
            .and_then(|s| s.se_linux_options.as_ref())
            .map(selinux),
        run_as_user: pod_sc.and_then(|s| s.run_as_user).map(int64),
        run_as_group: pod_sc.and_then(|s| s.run_as_group).map(int64),
        readonly_rootfs: false,
        supplemental_groups: supplemental_groups(Some(spec)),
        privileged: has_privileged_container(spec),
        seccomp: security_profile(RUNTIME_DEFAULT),
        seccomp_profile_path: RUNTIME_DEFAULT.into(),
        ..Default::default()
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Pods for the security context tests, here and in the container config's.

    use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SecurityContext};

    use crate::pod::testing::pod;

    /// A pod `web` with container `c`, the pod's security context `pod_sc` and the
    /// container's `container_sc`.
    pub fn web(pod_sc: PodSecurityContext, container_sc: Option<SecurityContext>) -> Pod {
        let mut p = pod("web", &[("c", "busybox")]);
        let spec = p.spec.as_mut().unwrap();
        spec.security_context = Some(pod_sc);
        spec.containers[0].security_context = container_sc;
        p
    }

    pub fn first(p: &Pod) -> Container {
        p.spec.as_ref().unwrap().containers[0].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{first, web};
    use super::*;
    use k8s_openapi::api::core::v1::PodSecurityContext;

    const ROOT: &str = "/var/lib/rkubelet/seccomp";

    /// Describes every image as running as UID 1000, counting the calls.
    #[derive(Default)]
    struct Images(std::sync::atomic::AtomicUsize);

    impl Cri for Images {
        async fn image_status(
            &self,
            req: api::ImageStatusRequest,
        ) -> crate::cri::Result<api::ImageStatusResponse> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(api::ImageStatusResponse {
                image: Some(api::Image {
                    id: req.image.map(|i| i.image).unwrap_or_default(),
                    uid: Some(api::Int64Value { value: 1000 }),
                    ..Default::default()
                }),
                info: Default::default(),
            })
        }
    }

    #[tokio::test]
    async fn the_image_found_present_says_its_user_with_no_second_image_status() {
        let cri = Images::default();
        let present = api::Image {
            id: "sha256:1".into(),
            username: "nginx".into(),
            ..Default::default()
        };
        let user = image_user(&cri, Some(&present), "sha256:1").await.unwrap();
        assert_eq!(user.username, "nginx");
        assert_eq!(cri.0.load(std::sync::atomic::Ordering::SeqCst), 0);
        // A pulled image: the runtime is asked.
        let pulled = image_user(&cri, None, "sha256:2").await.unwrap();
        assert_eq!(pulled.uid, Some(1000));
        assert_eq!(cri.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    fn context_of(p: &Pod, user: &ImageUser) -> api::LinuxContainerSecurityContext {
        container(p, &first(p), user, Path::new(ROOT))
    }

    fn seccomp(kind: &str, localhost: Option<&str>) -> Option<SeccompProfile> {
        Some(SeccompProfile {
            type_: kind.into(),
            localhost_profile: localhost.map(Into::into),
        })
    }

    #[test]
    fn the_pods_user_and_group_reach_containers_and_the_containers_own_win() {
        let pod_sc = PodSecurityContext {
            run_as_user: Some(1000),
            run_as_group: Some(3000),
            fs_group: Some(2000),
            supplemental_groups: Some(vec![4000, 5000]),
            ..Default::default()
        };
        let p = web(pod_sc.clone(), None);
        let sc = context_of(&p, &ImageUser::default());
        assert_eq!(sc.run_as_user.map(|u| u.value), Some(1000));
        assert_eq!(sc.run_as_group.map(|g| g.value), Some(3000));
        assert_eq!(sc.supplemental_groups, [2000, 4000, 5000]);
        let own = SecurityContext {
            run_as_user: Some(1001),
            ..Default::default()
        };
        let p = web(pod_sc, Some(own));
        let sc = context_of(&p, &ImageUser::default());
        assert_eq!(sc.run_as_user.map(|u| u.value), Some(1001));
        assert_eq!(sc.run_as_group.map(|g| g.value), Some(3000));
    }

    #[test]
    fn without_a_user_the_image_user_is_named() {
        let p = web(PodSecurityContext::default(), None);
        let numeric = ImageUser {
            uid: Some(101),
            username: String::new(),
        };
        let sc = context_of(&p, &numeric);
        assert_eq!(
            (sc.run_as_user.map(|u| u.value), sc.run_as_username.as_str()),
            (Some(101), "")
        );
        let named = ImageUser {
            uid: None,
            username: "nginx".into(),
        };
        let sc = context_of(&p, &named);
        assert_eq!(
            (sc.run_as_user, sc.run_as_username.as_str()),
            (None, "nginx")
        );
        assert_eq!(ImageUser::of(None), ImageUser::default());
        let image = api::Image {
            username: "www".into(),
            ..Default::default()
        };
        assert_eq!(
            ImageUser::of(Some(&image)),
            ImageUser {
                uid: None,
                username: "www".into()
            }
        );
    }

    #[test]
    fn container_only_fields_are_passed_through() {
        let own = SecurityContext {
            privileged: Some(true),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into()]),
                drop: Some(vec!["CHOWN".into()]),
            }),
            se_linux_options: Some(SELinuxOptions {
                level: Some("s0:c1".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod_sc = PodSecurityContext {
            se_linux_options: Some(SELinuxOptions {
                level: Some("s0:c9".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let sc = context_of(&web(pod_sc, Some(own)), &ImageUser::default());
        assert!(sc.privileged && sc.readonly_rootfs && sc.no_new_privs);
        let caps = sc.capabilities.unwrap();
        assert_eq!(
            (caps.add_capabilities, caps.drop_capabilities),
            (vec!["NET_ADMIN".into()], vec!["CHOWN".into()])
        );
        assert_eq!(sc.selinux_options.unwrap().level, "s0:c1");
    }

    #[test]
    fn no_new_privs_only_when_escalation_is_refused() {
        let with = |allow: Option<bool>| {
            let own = SecurityContext {
                allow_privilege_escalation: allow,
                ..Default::default()
            };
            context_of(
                &web(PodSecurityContext::default(), Some(own)),
                &ImageUser::default(),
            )
            .no_new_privs
        };
        assert_eq!(
            (with(None), with(Some(true)), with(Some(false))),
            (false, false, true)
        );
    }

    #[test]
    fn proc_mount_default_masks_and_unmasked_does_not() {
        let with = |mount: Option<&str>| {
            let own = SecurityContext {
                proc_mount: mount.map(Into::into),
                ..Default::default()
            };
            context_of(
                &web(PodSecurityContext::default(), Some(own)),
                &ImageUser::default(),
            )
        };
        for sc in [with(None), with(Some("Default"))] {
            assert_eq!(sc.masked_paths, DEFAULT_MASKED_PATHS);
            assert_eq!(sc.readonly_paths, DEFAULT_READONLY_PATHS);
        }
        let unmasked = with(Some("Unmasked"));
        assert!(unmasked.masked_paths.is_empty() && unmasked.readonly_paths.is_empty());
    }

    #[test]
    fn seccomp_container_field_then_annotation_then_pod_field_then_annotation() {
        let path = |p: &Pod| seccomp_profile_path(p, &first(p), Path::new(ROOT));
        let mut p = web(PodSecurityContext::default(), None);
        assert_eq!(path(&p), "");
        p.metadata.annotations = Some(
            [(
                SECCOMP_POD_ANNOTATION.to_owned(),
                "localhost/a/b.json".to_owned(),
            )]
            .into(),
        );
        assert_eq!(path(&p), format!("localhost/{ROOT}/a/b.json"));
        p.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            seccomp_profile: seccomp("RuntimeDefault", None),
            ..Default::default()
        });
        assert_eq!(path(&p), "runtime/default");
        p.metadata.annotations.as_mut().unwrap().insert(
            format!("{SECCOMP_CONTAINER_ANNOTATION_PREFIX}c"),
            "unconfined".into(),
        );
        assert_eq!(path(&p), "unconfined");
        p.spec.as_mut().unwrap().containers[0].security_context = Some(SecurityContext {
            seccomp_profile: seccomp("Localhost", Some("x.json")),
            ..Default::default()
        });
        assert_eq!(path(&p), format!("localhost/{ROOT}/x.json"));
        let sc = context_of(&p, &ImageUser::default());
        let profile = sc.seccomp.unwrap();
        assert_eq!(
            profile.profile_type(),
            api::security_profile::ProfileType::Localhost
        );
        assert_eq!(profile.localhost_ref, format!("{ROOT}/x.json"));
    }

    #[test]
    fn seccomp_profiles_for_the_runtime() {
        use api::security_profile::ProfileType;
        let kind = |path: &str| security_profile(path).map(|p| p.profile_type());
        assert_eq!(kind(""), Some(ProfileType::Unconfined));
        assert_eq!(kind("unconfined"), Some(ProfileType::Unconfined));
        assert_eq!(kind("runtime/default"), Some(ProfileType::RuntimeDefault));
        assert_eq!(kind("docker/default"), Some(ProfileType::RuntimeDefault));
        assert_eq!(kind("bogus"), None);
        let field =
            |t: &str, l: Option<&str>| field_profile(&seccomp(t, l).unwrap(), Path::new(ROOT));
        assert_eq!(field("Localhost", None), "");
        assert_eq!(field("Unconfined", None), "unconfined");
    }

    #[test]
    fn run_as_non_root_is_verified_with_the_kubelets_messages() {
        let non_root = |user: Option<i64>| PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: user,
            ..Default::default()
        };
        let check = |p: &Pod, user: &ImageUser| {
            verify_run_as_non_root(p, &first(p), user).map_err(|e| e.to_string())
        };
        let root = ImageUser::default();
        let named = ImageUser {
            uid: None,
            username: "app".into(),
        };
        let p = web(non_root(None), None);
        assert_eq!(
            check(&p, &root),
            Err("container has runAsNonRoot and image will run as root (pod: \"web_default(uid-web)\", container: c)".into())
        );
        assert_eq!(
            check(&p, &named),
            Err("container has runAsNonRoot and image has non-numeric user (app), cannot verify user is non-root (pod: \"web_default(uid-web)\", container: c)".into())
        );
        assert_eq!(
            check(
                &p,
                &ImageUser {
                    uid: Some(1000),
                    username: String::new()
                }
            ),
            Ok(())
        );
        assert_eq!(
            check(&web(non_root(Some(0)), None), &named),
            Err("container's runAsUser breaks non-root policy (pod: \"web_default(uid-web)\", container: c)".into())
        );
        assert_eq!(check(&web(non_root(Some(1000)), None), &root), Ok(()));
        // The container may lift the pod's requirement, and a pod without it is not checked.
        let lifted = SecurityContext {
            run_as_non_root: Some(false),
            ..Default::default()
        };
        assert_eq!(check(&web(non_root(None), Some(lifted)), &root), Ok(()));
        assert_eq!(
            check(&web(PodSecurityContext::default(), None), &root),
            Ok(())
        );
    }

    #[test]
    fn the_sandbox_runs_as_the_pod_with_the_default_seccomp_profile() {
        let pod_sc = PodSecurityContext {
            run_as_user: Some(1000),
            run_as_group: Some(3000),
            fs_group: Some(2000),
            supplemental_groups: Some(vec![4000]),
            ..Default::default()
        };
        let mut p = web(pod_sc, None);
        let sc = sandbox(p.spec.as_ref().unwrap());
        assert_eq!(sc.run_as_user.map(|u| u.value), Some(1000));
        assert_eq!(sc.run_as_group.map(|g| g.value), Some(3000));
        assert_eq!(sc.supplemental_groups, [2000, 4000]);
        assert_eq!(
            sc.seccomp.unwrap().profile_type(),
            api::security_profile::ProfileType::RuntimeDefault
        );
        assert!(!sc.privileged && !sc.readonly_rootfs);
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers = Some(vec![Container {
            name: "i".into(),
            security_context: Some(SecurityContext {
                privileged: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        assert!(sandbox(spec).privileged);
    }

    #[test]
    fn containers_get_the_pods_namespaces_with_their_own_pid_namespace() {
        let mut p = web(PodSecurityContext::default(), None);
        let pid = |p: &Pod| {
            let options = context_of(p, &ImageUser::default())
                .namespace_options
                .unwrap();
            (options.pid, options.network)
        };
        let container = i32::from(api::NamespaceMode::Container);
        let in_pod = i32::from(api::NamespaceMode::Pod);
        assert_eq!(pid(&p), (container, in_pod));
        p.spec.as_mut().unwrap().share_process_namespace = Some(true);
        assert_eq!(pid(&p), (in_pod, in_pod));
    }
}
