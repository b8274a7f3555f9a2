//! The layout of the Kubernetes v1.20.2 Go types the kubelet's hashes see: for each type
//! reachable from `v1.Container` (Go's JSON: field order, names, `omitempty`, inline
//! embedding) and from the internal `core.Pod` (go-spew: field order and type names, and
//! the JSON name of the v1 field each is converted from). `layout-v1.20.2.json` is
//! printed by reflection over the vendored types (tests/data/kubelet-v1.20.2/README.md
//! says how); nothing here is written by hand.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde::Deserialize;

use super::GoApiError;

/// The kind of a Go type, as `reflect.Kind` groups them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A string or a named string type.
    String,
    /// A bool.
    Bool,
    /// A signed integer.
    Int,
    /// An unsigned integer.
    Uint,
    /// A pointer (`elem`).
    Ptr,
    /// A slice (`elem`).
    Slice,
    /// A map (`key`, `elem`).
    Map,
    /// A struct (`fields`).
    Struct,
    /// A type with its own JSON form and representation: `resource.Quantity`,
    /// `intstr.IntOrString`, `v1.Time`.
    Opaque,
}

/// One Go type.
#[derive(Debug, Deserialize)]
pub struct GoType {
    /// Its kind.
    pub kind: Kind,
    /// The element type of a pointer, slice or map.
    #[serde(default)]
    pub elem: String,
    /// The key type of a map.
    #[serde(default)]
    pub key: String,
    /// A struct's fields in declaration order.
    #[serde(default)]
    pub fields: Vec<Field>,
}

/// One struct field.
#[derive(Debug, Deserialize)]
pub struct Field {
    /// The Go name (an embedded field's is its type's).
    pub name: String,
    /// The Go type's name, as `reflect.Type.String()` and go-spew print it.
    #[serde(rename = "type")]
    pub type_name: String,
    /// Its JSON name (v1 types).
    #[serde(default)]
    pub json: String,
    /// `omitempty` (v1 types).
    #[serde(default)]
    pub omitempty: bool,
    /// Embedded with its fields in the parent's JSON object (v1 types).
    #[serde(default)]
    pub inline: bool,
    /// For an internal type's field: the JSON name of the v1 field it is converted from,
    /// `""` when that one is inline (the same object), `"-"` when it has no JSON.
    pub v1: Option<String>,
}

/// The two type tables.
#[derive(Debug, Deserialize)]
pub struct Layout {
    v1: HashMap<String, GoType>,
    core: HashMap<String, GoType>,
}

static LAYOUT: LazyLock<Layout> = LazyLock::new(|| {
    serde_json::from_str(include_str!("layout-v1.20.2.json"))
        .unwrap_or_else(|e| panic!("goapi/layout-v1.20.2.json is broken: {e}"))
});

/// The `v1` type `name` (reachable from `v1.Container`).
///
/// # Errors
/// No such type in the table.
pub fn v1(name: &str) -> Result<&'static GoType, GoApiError> {
    LAYOUT
        .v1
        .get(name)
        .ok_or_else(|| GoApiError::UnknownType(name.to_owned()))
}

/// The internal type `name` (reachable from `core.Pod`).
///
/// # Errors
/// No such type in the table.
pub fn core(name: &str) -> Result<&'static GoType, GoApiError> {
    LAYOUT
        .core
        .get(name)
        .ok_or_else(|| GoApiError::UnknownType(name.to_owned()))
}
