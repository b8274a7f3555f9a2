//! Registry credentials for image pulls, as the kubelet's `pkg/credentialprovider`: a
//! keyring built from a pod's image pull secrets (`kubernetes.io/dockerconfigjson` and the
//! legacy `kubernetes.io/dockercfg`), whose entries are matched to the repository being
//! pulled: host globs label by label, the same port, a path prefix, most specific entry
//! first, and `index.docker.io` for images of Docker Hub.
//! Knows no image manager, runtime or volume: Secrets come through `watch_manager::PodObjects`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use k8s_openapi::api::core::v1::{Pod, Secret};
use serde::Deserialize;

use crate::watch_manager::PodObjects;

/// The secret type holding a `~/.docker/config.json` under `.dockerconfigjson`.
pub const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
/// The legacy secret type holding a `~/.dockercfg` under `.dockercfg`.
pub const DOCKERCFG: &str = "kubernetes.io/dockercfg";

/// The registry Docker Hub images are looked up under (`https://index.docker.io/v1/`).
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// One credential for a registry, as the runtime gets it in `PullImage`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    /// The user name.
    pub username: String,
    /// The password.
    pub password: String,
}

/// A pull secret that cannot be read as a docker config.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// Its JSON does not parse.
    #[error("secret {secret:?}: {source}")]
    Json {
        /// The secret's name.
        secret: String,
        /// The parse error.
        source: serde_json::Error,
    },
    /// An entry's `auth` is not `base64(username:password)`.
    #[error("secret {secret:?}: entry {entry:?}: {reason}")]
    Auth {
        /// The secret's name.
        secret: String,
        /// The registry the entry is for.
        entry: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// One registry entry of a docker config file.
#[derive(Debug, Default, Deserialize)]
struct Entry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
}

/// A `~/.docker/config.json`: the entries are under `auths`.
#[derive(Debug, Deserialize)]
struct DockerConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

/// The credentials of the pull secrets, by registry key (`host[:port][/path]`).
#[derive(Debug, Default)]
pub struct Keyring {
    creds: HashMap<String, Vec<AuthConfig>>,
}

impl Keyring {
    /// The keyring of these secrets. Secrets of other types, and ones without their data
    /// key, add nothing (as the kubelet's `MakeDockerKeyring`).
    ///
    /// # Errors
    /// A docker config secret whose JSON or `auth` field is malformed: the kubelet fails
    /// the pull with it.
    pub fn from_secrets(secrets: &[Secret]) -> Result<Self, CredentialError> {
        let mut keyring = Self::default();
        for secret in secrets {
            let name = secret.metadata.name.clone().unwrap_or_default();
            let data = |key: &str| {
                secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .filter(|v| !v.0.is_empty())
            };
            let json_error = |source| CredentialError::Json {
                secret: name.clone(),
                source,
            };
            let entries = match secret.type_.as_deref() {
                Some(DOCKER_CONFIG_JSON) => match data(".dockerconfigjson") {
                    Some(bytes) => {
                        serde_json::from_slice::<DockerConfigJson>(&bytes.0)
                            .map_err(json_error)?
                            .auths
                    }
                    None => continue,
                },
                Some(DOCKERCFG) => match data(".dockercfg") {
                    Some(bytes) => serde_json::from_slice(&bytes.0).map_err(json_error)?,
                    None => continue,
                },
                _ => continue,
            };
            keyring.add(&name, entries)?;
        }
        Ok(keyring)
    }

    fn add(
        &mut self,
        secret: &str,
        entries: BTreeMap<String, Entry>,
    ) -> Result<(), CredentialError> {
        for (location, entry) in entries {
            let auth = if entry.auth.is_empty() {
                AuthConfig {
                    username: entry.username,
                    password: entry.password,
                }
            } else {
                decode_auth(&entry.auth).map_err(|reason| CredentialError::Auth {
                    secret: secret.to_owned(),
                    entry: location.clone(),
                    reason,
                })?
            };
            match registry_key(&location) {
                Some(key) => self.creds.entry(key).or_default().push(auth),
                None => {
                    tracing::warn!(secret, entry = %location, "invalid registry in pull secret, ignored")
                }
            }
        }
        Ok(())
    }

    /// The credentials for `repository` (`registry/path`, as [`repository`] gives it), to
    /// try in this order: the entries that match it, from the most specific key (reverse
    /// lexical order, as the kubelet sorts), else those of `index.docker.io` for a
    /// Docker Hub image. Empty: pull without credentials.
    #[must_use]
    pub fn lookup(&self, repository: &str) -> Vec<AuthConfig> {
        let keys: BTreeSet<&String> = self.creds.keys().collect();
        let found: Vec<AuthConfig> = keys
            .into_iter()
            .rev()
            .filter(|key| urls_match(key, repository))
            .flat_map(|key| self.creds[key.as_str()].iter().cloned())
            .collect();
        if found.is_empty() && is_default_registry(repository) {
            return self
                .creds
                .get(DEFAULT_REGISTRY_HOST)
                .cloned()
                .unwrap_or_default();
        }
        found
    }
}

/// The pod's image pull secrets that can be read (the kubelet's
/// `getPullSecretsForPod`): one that is missing or unreadable is logged and left out, and
/// the pull goes on without it.
pub async fn pod_pull_secrets<A: PodObjects>(api: &A, pod: &Pod) -> Vec<Secret> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let refs = pod
        .spec
        .as_ref()
        .and_then(|s| s.image_pull_secrets.as_ref());
    let mut secrets = Vec::new();
    for name in refs.into_iter().flatten().map(|r| r.name.as_str()) {
        if name.is_empty() {
            continue;
        }
        match api.get_secret(namespace, name).await {
            Ok(Some(secret)) => secrets.push(secret),
            Ok(None) => tracing::warn!(
                secret = %format!("{namespace}/{name}"),
                "Unable to retrieve pull secret: not found. The image pull may not succeed."
            ),
            Err(e) => tracing::warn!(
                secret = %format!("{namespace}/{name}"),
                error = %e,
                "Unable to retrieve pull secret. The image pull may not succeed."
            ),
        }
    }
    secrets
}

/// `base64(username:password)`, padded or not.
fn decode_auth(field: &str) -> Result<AuthConfig, &'static str> {
    let engine = if field.trim().ends_with('=') {
        &STANDARD
    } else {
        &STANDARD_NO_PAD
    };
    let bytes = engine
        .decode(field)
        .map_err(|_| "auth is not valid base64")?;
    let text = String::from_utf8(bytes).map_err(|_| "auth is not UTF-8")?;
    let (username, password) = text
        .split_once(':')
        .ok_or("unable to parse auth field, must be formatted as base64(username:password)")?;
    Ok(AuthConfig {
        username: username.to_owned(),
        password: password.to_owned(),
    })
}

/// A URL reduced to what keys are matched on.
struct Location<'a> {
    host: &'a str,
    path: &'a str,
}

impl<'a> Location<'a> {
    /// `[scheme://]host[:port][/path]`, without query or fragment; `None` when the port is
    /// not a number.
    fn parse(text: &'a str) -> Option<Self> {
        let rest = text
            .strip_prefix("https://")
            .or_else(|| text.strip_prefix("http://"))
            .unwrap_or(text);
        let rest = rest.split(['?', '#']).next().unwrap_or_default();
        let (host, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        let host = host.rsplit('@').next().unwrap_or(host);
        let (_, port) = split_host_port(host);
        port.chars()
            .all(|c| c.is_ascii_digit())
            .then_some(Self { host, path })
    }
}

/// `host:port` into its parts; no port (or an unbracketed IPv6 address) gives `""`.
fn split_host_port(host: &str) -> (&str, &str) {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once("]:") {
            Some((h, port)) => (h, port),
            None => (rest.trim_end_matches(']'), ""),
        };
    }
    match host.split_once(':') {
        Some((h, port)) if !port.contains(':') => (h, port),
        _ => (host, ""),
    }
}

/// The key of a docker config entry: its host and port, and its path unless that is
/// empty or only `/v1/` or `/v2/` (`https://index.docker.io/v1/` is `index.docker.io`).
fn registry_key(location: &str) -> Option<String> {
    let parsed = Location::parse(location)?;
    let path = if parsed.path.starts_with("/v1/") || parsed.path.starts_with("/v2/") {
        &parsed.path[3..]
    } else {
        parsed.path
    };
    Some(if path.is_empty() || path == "/" {
        parsed.host.to_owned()
    } else {
        format!("{}{path}", parsed.host)
    })
}

/// Whether a key (a host glob, port and path prefix) matches a repository: the same port,
/// as many host labels with each matched by its glob, and the key's path a prefix of
/// the repository's.
fn urls_match(glob: &str, target: &str) -> bool {
    let (Some(glob), Some(target)) = (Location::parse(glob), Location::parse(target)) else {
        return false;
    };
    let (glob_host, glob_port) = split_host_port(glob.host);
    let (target_host, target_port) = split_host_port(target.host);
    if glob_port != target_port || !target.path.starts_with(glob.path) {
        return false;
    }
    let globs: Vec<&str> = glob_host.split('.').collect();
    let labels: Vec<&str> = target_host.split('.').collect();
    globs.len() == labels.len()
        && globs.iter().zip(&labels).all(|(g, l)| {
            glob_match(
                &g.chars().collect::<Vec<_>>(),
                &l.chars().collect::<Vec<_>>(),
            )
        })
}

/// Shell pattern matching of one host label (Go's `filepath.Match`): `*`, `?`, `[...]`
/// classes with ranges and `^` negation, `\` escapes. A malformed pattern matches nothing.
fn glob_match(pattern: &[char], text: &[char]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some(('*', rest)) => (0..=text.len()).any(|skip| glob_match(rest, &text[skip..])),
        Some((first, rest)) => {
            let Some((c, text_rest)) = text.split_first() else {
                return false;
            };
            let (matched, rest) = match first {
                '?' => (true, rest),
                '[' => match class_match(rest, *c) {
                    Some(found) => found,
                    None => return false,
                },
                '\\' => match rest.split_first() {
                    Some((escaped, rest)) => (escaped == c, rest),
                    None => return false,
                },
                _ => (first == c, rest),
            };
            matched && glob_match(rest, text_rest)
        }
    }
}

/// Matches `c` against a `[...]` class whose text follows the `[`: whether it matched,
/// and the pattern after the `]`; `None` when the class is not closed.
fn class_match(class: &[char], c: char) -> Option<(bool, &[char])> {
    let (negated, mut rest) = match class.split_first() {
        Some(('^', rest)) => (true, rest),
        _ => (false, class),
    };
    let mut matched = false;
    let mut first = true;
    loop {
        let (&lo, after) = rest.split_first()?;
        if lo == ']' && !first {
            return Some((matched != negated, after));
        }
        first = false;
        let (lo, after) = if lo == '\\' {
            let (&e, after) = after.split_first()?;
            (e, after)
        } else {
            (lo, after)
        };
        match after {
            ['-', hi, tail @ ..] if *hi != ']' => {
                matched |= (lo..=*hi).contains(&c);
                rest = tail;
            }
            _ => {
                matched |= lo == c;
                rest = after;
            }
        }
    }
}

/// Whether a repository is on Docker Hub: no registry part, or `docker.io` /
/// `index.docker.io`, or a first part that names no host (neither `.` nor `:`).
fn is_default_registry(repository: &str) -> bool {
    let Some((first, _)) = repository.split_once('/') else {
        return !repository.is_empty();
    };
    !first.is_empty()
        && (first == "docker.io" || first == DEFAULT_REGISTRY_HOST || !first.contains(['.', ':']))
}

/// The repository an image is pulled from, as the kubelet's `ParseImageName` normalises
/// it: without tag or digest, with its registry (`docker.io` when it names none) and, on
/// Docker Hub, `library/` for a one-part name. `busybox:1.35` is
/// `docker.io/library/busybox`.
#[must_use]
pub fn repository(image: &str) -> String {
    let name = image.split('@').next().unwrap_or(image);
    let name = match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    };
    let (domain, path) = crate::image_reference::split_docker_domain(name);
    format!("{domain}/{path}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(name: &str, type_: &str, key: &str, json: &serde_json::Value) -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            type_: Some(type_.into()),
            data: Some(
                [(key.to_owned(), ByteString(json.to_string().into_bytes()))]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn keyring(entries: &[(&str, &str)]) -> Keyring {
        let auths: serde_json::Map<String, serde_json::Value> = entries
            .iter()
            .map(|(k, user)| {
                (
                    (*k).to_owned(),
                    serde_json::json!({"username": user, "password": "p"}),
                )
            })
            .collect();
        let s = secret(
            "s",
            DOCKER_CONFIG_JSON,
            ".dockerconfigjson",
            &serde_json::json!({ "auths": auths }),
        );
        Keyring::from_secrets(&[s]).unwrap()
    }

    fn users(keyring: &Keyring, image: &str) -> Vec<String> {
        keyring
            .lookup(&repository(image))
            .into_iter()
            .map(|a| a.username)
            .collect()
    }

    #[test]
    fn repositories_are_normalised_like_docker_references() {
        assert_eq!(repository("busybox"), "docker.io/library/busybox");
        assert_eq!(repository("busybox:1.35"), "docker.io/library/busybox");
        assert_eq!(repository("user/app@sha256:ab"), "docker.io/user/app");
        assert_eq!(repository("index.docker.io/user/app"), "docker.io/user/app");
        assert_eq!(
            repository("127.0.0.1:5001/private/busybox:1.35"),
            "127.0.0.1:5001/private/busybox"
        );
        assert_eq!(repository("localhost/x"), "localhost/x");
        assert_eq!(repository("gcr.io/p/i:v1"), "gcr.io/p/i");
    }

    #[test]
    fn keys_drop_scheme_and_v1_v2_but_keep_other_paths() {
        assert_eq!(
            registry_key("https://index.docker.io/v1/").unwrap(),
            "index.docker.io"
        );
        assert_eq!(
            registry_key("http://reg.test:5000").unwrap(),
            "reg.test:5000"
        );
        assert_eq!(registry_key("reg.test/v2/team").unwrap(), "reg.test/team");
        assert_eq!(registry_key("reg.test/team/").unwrap(), "reg.test/team/");
        assert!(registry_key("reg.test:http").is_none());
    }

    #[test]
    fn host_globs_match_label_by_label() {
        let k = keyring(&[("*.example.test", "glob"), ("reg.?.test", "one")]);
        assert_eq!(users(&k, "a.example.test/x"), ["glob"]);
        assert!(
            users(&k, "a.b.example.test/x").is_empty(),
            "* stays in one label"
        );
        assert!(users(&k, "example.test/x").is_empty());
        assert!(
            users(&k, "reg.b.test/x").is_empty(),
            "`?` starts a URL query, as in the kubelet's parsing: the key is `reg.`"
        );
        let mid = keyring(&[("reg.*-east.test:5000", "mid")]);
        assert_eq!(users(&mid, "reg.us-east.test:5000/x"), ["mid"]);
        let classes = keyring(&[("reg[0-9].test", "class"), ("reg[^0-9a].test", "neg")]);
        assert_eq!(users(&classes, "reg7.test/x"), ["class"]);
        assert_eq!(users(&classes, "regb.test/x"), ["neg"]);
        assert!(users(&classes, "rega.test/x").is_empty());
    }

    #[test]
    fn ports_must_be_equal() {
        let k = keyring(&[("127.0.0.1:5001", "auth")]);
        assert_eq!(users(&k, "127.0.0.1:5001/private/busybox:1.35"), ["auth"]);
        assert!(users(&k, "127.0.0.1:5000/private/busybox").is_empty());
        assert!(users(&k, "127.0.0.1/private/busybox").is_empty());
    }

    #[test]
    fn the_most_specific_key_comes_first_and_paths_are_prefixes() {
        let k = keyring(&[
            ("reg.test", "host"),
            ("https://reg.test/team", "team"),
            ("reg.test/team/app", "app"),
            ("reg.test/other", "other"),
        ]);
        assert_eq!(users(&k, "reg.test/team/app:1"), ["app", "team", "host"]);
        assert_eq!(
            users(&k, "reg.test/teamster/x"),
            ["team", "host"],
            "a plain string prefix, as the kubelet"
        );
        assert_eq!(users(&k, "reg.test/x"), ["host"]);
    }

    #[test]
    fn docker_hub_images_use_index_docker_io() {
        let k = keyring(&[("https://index.docker.io/v1/", "hub")]);
        assert_eq!(users(&k, "busybox"), ["hub"]);
        assert_eq!(users(&k, "docker.io/user/app"), ["hub"]);
        assert_eq!(users(&k, "index.docker.io/user/app:1"), ["hub"]);
        assert!(users(&k, "quay.io/user/app").is_empty());
        let direct = keyring(&[("docker.io", "docker.io")]);
        assert_eq!(users(&direct, "busybox"), ["docker.io"]);
    }

    #[test]
    fn legacy_dockercfg_and_auth_fields_are_read() {
        let auth = STANDARD.encode("alice:s3:cret");
        let cfg = secret(
            "old",
            DOCKERCFG,
            ".dockercfg",
            &serde_json::json!({"reg.test": {"auth": auth, "email": "a@b"}}),
        );
        let unpadded = STANDARD_NO_PAD.encode("bob:pw");
        let json = secret(
            "new",
            DOCKER_CONFIG_JSON,
            ".dockerconfigjson",
            &serde_json::json!({"auths": {"reg.test": {"auth": unpadded}}}),
        );
        let k = Keyring::from_secrets(&[cfg, json]).unwrap();
        let found = k.lookup("reg.test/x");
        assert_eq!(
            found,
            [
                AuthConfig {
                    username: "alice".into(),
                    password: "s3:cret".into()
                },
                AuthConfig {
                    username: "bob".into(),
                    password: "pw".into()
                }
            ]
        );
    }

    #[tokio::test]
    async fn missing_and_forbidden_pull_secrets_are_left_out() {
        use crate::watch_manager::testing::FakeApi;
        let api = FakeApi::default()
            .with_secret("ns", "present", &[("k", "v")])
            .with_secret("other", "elsewhere", &[("k", "v")])
            .forbid("denied");
        let mut pod = crate::pod::testing::pod("p", &[("c", "busybox")]);
        pod.metadata.namespace = Some("ns".into());
        let refs = ["missing", "present", "denied", "", "elsewhere"]
            .map(|n| k8s_openapi::api::core::v1::LocalObjectReference { name: n.into() });
        pod.spec.as_mut().unwrap().image_pull_secrets = Some(refs.to_vec());
        let found = pod_pull_secrets(&api, &pod).await;
        let names: Vec<_> = found
            .iter()
            .filter_map(|s| s.metadata.name.as_deref())
            .collect();
        assert_eq!(
            names,
            ["present"],
            "only the pod's namespace, only what can be read"
        );
    }

    #[test]
    fn other_secrets_add_nothing_and_broken_ones_fail() {
        let opaque = secret("o", "Opaque", ".dockerconfigjson", &serde_json::json!({}));
        let wrong_key = secret(
            "w",
            DOCKERCFG,
            ".dockerconfigjson",
            &serde_json::json!({"reg.test": {}}),
        );
        let k = Keyring::from_secrets(&[opaque, wrong_key]).unwrap();
        assert!(k.lookup("reg.test/x").is_empty());
        let mut broken = secret(
            "b",
            DOCKER_CONFIG_JSON,
            ".dockerconfigjson",
            &serde_json::json!({}),
        );
        broken
            .data
            .as_mut()
            .unwrap()
            .insert(".dockerconfigjson".into(), ByteString(b"{".to_vec()));
        assert!(matches!(
            Keyring::from_secrets(&[broken]),
            Err(CredentialError::Json { .. })
        ));
        let bad_auth = secret(
            "a",
            DOCKERCFG,
            ".dockercfg",
            &serde_json::json!({"reg.test": {"auth": STANDARD.encode("nocolon")}}),
        );
        assert!(matches!(
            Keyring::from_secrets(&[bad_auth]),
            Err(CredentialError::Auth { .. })
        ));
    }
}
