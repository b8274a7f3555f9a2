//! Reading a KubeletConfiguration file: YAML or JSON (JSON is YAML), checked for the
//! kubelet's group, version and kind, with the kubelet's error wording
//! (`failed to load Kubelet config file <path>, error …`).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// The API version the kubelet v1.20 reads.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The kind the kubelet reads.
pub const KIND: &str = "KubeletConfiguration";

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("failed to load Kubelet config file {}, error {reason}", path.display())]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong, as the kubelet words it.
    pub reason: String,
}

/// A decoded KubeletConfiguration.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigFile {
    /// The file it came from.
    pub path: PathBuf,
    /// Its fields (`apiVersion` and `kind` included), as written.
    pub fields: Map<String, Value>,
}

impl ConfigFile {
    /// Reads and decodes `path`. Blocking: called while the command line is parsed, before
    /// the async runtime starts.
    ///
    /// # Errors
    /// The file cannot be read, is empty, or is not a v1beta1 KubeletConfiguration.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let data = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_owned(),
            reason: format!(
                "failed to read kubelet config file {:?}, error: {e}",
                path.display().to_string()
            ),
        })?;
        Self::decode(path, &data)
    }

    /// Decodes the text of `path`.
    ///
    /// # Errors
    /// Empty, not YAML or JSON, not a mapping, or not a v1beta1 KubeletConfiguration.
    pub fn decode(path: &Path, data: &str) -> Result<Self, ConfigError> {
        let fail = |reason: String| ConfigError {
            path: path.to_owned(),
            reason,
        };
        if data.trim().is_empty() {
            return Err(fail(format!(
                "kubelet config file {:?} was empty",
                path.display().to_string()
            )));
        }
        let value: Value = serde_yaml_ng::from_str(data)
            .map_err(|e| fail(format!("failed to decode, error: {e}")))?;
        let Value::Object(fields) = value else {
            return Err(fail(format!(
                "failed to decode, error: the document is not a mapping: {value}"
            )));
        };
        let text = |name: &str| fields.get(name).and_then(Value::as_str).unwrap_or("");
        let (version, kind) = (text("apiVersion"), text("kind"));
        let whole = || Value::Object(fields.clone()).to_string();
        if kind.is_empty() {
            return Err(fail(format!(
                "failed to decode, error: Object 'Kind' is missing in '{}'",
                whole()
            )));
        }
        if version.is_empty() {
            return Err(fail(format!(
                "failed to decode, error: Object 'apiVersion' is missing in '{}'",
                whole()
            )));
        }
        if version != API_VERSION || kind != KIND {
            return Err(fail(format!(
                "failed to decode, error: no kind {kind:?} is registered for version \
                 {version:?} in scheme \"pkg/kubelet/apis/config/scheme\" (rkubelet reads \
                 {KIND} of {API_VERSION})"
            )));
        }
        Ok(Self {
            path: path.to_owned(),
            fields,
        })
    }

    /// The directory relative paths in the file are resolved against (the kubelet's
    /// `resolveRelativePaths`).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or_else(|| Path::new("."))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(data: &str) -> Result<ConfigFile, String> {
        ConfigFile::decode(Path::new("/etc/k/config.yaml"), data).map_err(|e| e.to_string())
    }

    #[test]
    fn yaml_and_json_decode_alike() {
        let yaml = decode(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 12\n",
        )
        .unwrap();
        let json = decode(
            r#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","maxPods":12}"#,
        )
        .unwrap();
        assert_eq!(yaml, json);
        assert_eq!(yaml.fields["maxPods"], 12);
        assert_eq!(yaml.dir(), Path::new("/etc/k"));
    }

    #[test]
    fn errors_use_the_kubelets_wording() {
        let empty = decode("  \n").unwrap_err();
        assert_eq!(
            empty,
            "failed to load Kubelet config file /etc/k/config.yaml, error kubelet config file \
             \"/etc/k/config.yaml\" was empty"
        );
        let no_kind = decode("apiVersion: kubelet.config.k8s.io/v1beta1\n").unwrap_err();
        assert!(
            no_kind.ends_with(
                "error failed to decode, error: Object 'Kind' is missing in \
                 '{\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\"}'"
            ),
            "{no_kind}"
        );
        let no_version = decode("kind: KubeletConfiguration\n").unwrap_err();
        assert!(
            no_version.contains("Object 'apiVersion' is missing"),
            "{no_version}"
        );
        let wrong = decode("apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n")
            .unwrap_err();
        assert!(
            wrong.contains(
                "no kind \"KubeletConfiguration\" is registered for version \
                 \"kubelet.config.k8s.io/v1\""
            ),
            "{wrong}"
        );
        let kubeproxy =
            decode("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n")
                .unwrap_err();
        assert!(
            kubeproxy.contains("no kind \"KubeProxyConfiguration\""),
            "{kubeproxy}"
        );
        let list = decode("- a\n- b\n").unwrap_err();
        assert!(list.contains("not a mapping"), "{list}");
        let bad = decode("maxPods: [\n").unwrap_err();
        assert!(bad.contains("error failed to decode, error: "), "{bad}");
    }

    #[test]
    fn a_missing_file_says_it_could_not_be_read() {
        let err = ConfigFile::load(Path::new("/nonexistent/kubelet.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "failed to load Kubelet config file /nonexistent/kubelet.yaml, error failed to \
                 read kubelet config file \"/nonexistent/kubelet.yaml\", error: "
            ),
            "{err}"
        );
    }
}
