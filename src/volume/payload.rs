//! What a secret, configMap, downwardAPI or projected volume holds: relative paths to file
//! contents and modes, built from the volume's `items` the way the kubelet's `MakePayload`
//! does.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use k8s_openapi::api::core::v1::KeyToPath;

/// One file of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FileProjection {
    pub(super) data: Vec<u8>,
    pub(super) mode: u32,
}

/// A volume's files by relative path.
pub(super) type Payload = BTreeMap<String, FileProjection>;

/// The mode of files without one of their own, when the volume sets no `defaultMode`.
pub(super) const DEFAULT_MODE: u32 = 0o644;

/// A file mode from the API (`0..=0777`).
pub(super) fn file_mode(mode: i32) -> Result<u32, String> {
    u32::try_from(mode)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("file mode {mode} is not within 0..=0777"))
}

/// The `defaultMode` of a volume, or [`DEFAULT_MODE`].
pub(super) fn default_mode(mode: Option<i32>) -> Result<u32, String> {
    mode.map_or(Ok(DEFAULT_MODE), file_mode)
}

/// Checks a payload path as the kubelet's atomic writer does: relative, no `..` element,
/// not starting with `..` (those names are the writer's own), bounded lengths.
pub(super) fn validate_path(path: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("item path {path:?} {why}"));
    if path.is_empty() {
        return bad("is empty");
    }
    if path.len() > 4096 {
        return bad("is longer than 4096 bytes");
    }
    if path.starts_with("..") {
        return bad("starts with '..'");
    }
    let p = Path::new(path);
    if p.is_absolute() {
        return bad("is absolute");
    }
    for component in p.components() {
        match component {
            Component::ParentDir => return bad("contains '..'"),
            Component::Normal(name) if name.len() > 255 => {
                return bad("has an element longer than 255 bytes");
            }
            _ => {}
        }
    }
    if p.components().all(|c| c == Component::CurDir) {
        return bad("names no file");
    }
    Ok(())
}

/// Why a payload could not be built from a secret's or config map's keys.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum KeyPayloadError {
    /// An item names a key the object does not have.
    MissingKey(String),
    /// An item's path or mode is invalid.
    Invalid(String),
}

/// The files of a secret or config map (`data` holds its keys): every key under its own
/// name with `default_mode` when `items` is empty, else each item's key at the item's path
/// and mode. A missing key is an error unless the source is `optional`.
pub(super) fn key_payload(
    data: &BTreeMap<&str, &[u8]>,
    items: &[KeyToPath],
    default_mode: u32,
    optional: bool,
) -> Result<Payload, KeyPayloadError> {
    let mut payload = Payload::new();
    if items.is_empty() {
        for (key, value) in data {
            validate_path(key).map_err(KeyPayloadError::Invalid)?;
            payload.insert(
                (*key).to_owned(),
                FileProjection {
                    data: value.to_vec(),
                    mode: default_mode,
                },
            );
        }
        return Ok(payload);
    }
    for item in items {
        let Some(value) = data.get(item.key.as_str()) else {
            if optional {
                continue;
            }
            return Err(KeyPayloadError::MissingKey(item.key.clone()));
        };
        validate_path(&item.path).map_err(KeyPayloadError::Invalid)?;
        let mode = item
            .mode
            .map_or(Ok(default_mode), file_mode)
            .map_err(KeyPayloadError::Invalid)?;
        payload.insert(
            item.path.clone(),
            FileProjection {
                data: value.to_vec(),
                mode,
            },
        );
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> BTreeMap<&'static str, &'static [u8]> {
        [
            ("user", b"admin".as_slice()),
            ("pass", b"s3cret".as_slice()),
        ]
        .into_iter()
        .collect()
    }

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
        }
    }

    #[test]
    fn without_items_every_key_gets_the_default_mode() {
        let payload = key_payload(&data(), &[], 0o600, false).expect("payload");
        assert_eq!(payload.len(), 2);
        assert_eq!(payload["user"].data, b"admin");
        assert_eq!(payload["user"].mode, 0o600);
        assert_eq!(payload["pass"].mode, 0o600);
    }

    #[test]
    fn items_choose_keys_paths_and_modes() {
        let items = [
            item("user", "conf/username", Some(0o400)),
            item("pass", "password", None),
        ];
        let payload = key_payload(&data(), &items, 0o644, false).expect("payload");
        assert_eq!(
            payload.keys().collect::<Vec<_>>(),
            ["conf/username", "password"]
        );
        assert_eq!(payload["conf/username"].mode, 0o400);
        assert_eq!(payload["password"].mode, 0o644);
        assert_eq!(payload["password"].data, b"s3cret");
    }

    #[test]
    fn a_missing_key_fails_unless_optional() {
        let items = [item("user", "u", None), item("token", "t", None)];
        assert_eq!(
            key_payload(&data(), &items, 0o644, false),
            Err(KeyPayloadError::MissingKey("token".into()))
        );
        let payload = key_payload(&data(), &items, 0o644, true).expect("optional");
        assert_eq!(payload.keys().collect::<Vec<_>>(), ["u"]);
    }

    #[test]
    fn bad_paths_and_modes_are_rejected() {
        for path in [
            "../etc/passwd",
            "a/../../b",
            "/abs",
            "..data",
            "",
            ".",
            "a/..",
        ] {
            assert!(validate_path(path).is_err(), "{path:?} accepted");
        }
        for path in ["a", "a/b/c", "..."] {
            // "..." starts with "..": the writer's own names do, so the kubelet refuses it too.
            assert_eq!(validate_path(path).is_ok(), path != "...", "{path:?}");
        }
        assert!(file_mode(0o1777).is_err());
        assert!(file_mode(-1).is_err());
        assert_eq!(default_mode(None), Ok(0o644));
        assert_eq!(default_mode(Some(0o440)), Ok(0o440));
        let bad_mode = [item("user", "u", Some(0o4755))];
        assert!(matches!(
            key_payload(&data(), &bad_mode, 0o644, false),
            Err(KeyPayloadError::Invalid(_))
        ));
    }
}
