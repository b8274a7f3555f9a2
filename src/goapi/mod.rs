//! The Go forms of Kubernetes objects that the kubelet v1.20.2 hashes, so that this agent
//! computes the same sums over the same specs: Go's `encoding/json` of the v1 types
//! ([`json`]), go-spew's `%#v` (the kubelet's `hash.DeepHashObject`, [`spew`]),
//! `resource.Quantity` as Go holds it ([`quantity`]), and FNV-32a. The types' layout comes
//! from reflection over the vendored v1.20.2 types ([`schema`]), not from k8s-openapi's
//! Rust types: a sum depends on the spec, not on this crate's dependencies.
//! Knows no other module of the agent: vocabulary only.

pub mod json;
pub mod quantity;
pub mod schema;
pub mod spew;

/// The internal `ResourceList` type, whose quantities the API's defaulting has rounded up
/// to milli units in a decoded object.
const RESOURCE_LIST_CORE: &str = "core.ResourceList";

/// Why an object has no Go form here.
#[derive(Debug, thiserror::Error)]
pub enum GoApiError {
    /// A type the layout does not have (a broken table).
    #[error("no Go type {0} in the v1.20.2 layout")]
    UnknownType(String),
    /// A JSON value that is not of the Go type's shape.
    #[error("{value} is not a {type_name}")]
    Shape {
        /// The Go type.
        type_name: String,
        /// The value found.
        value: String,
    },
    /// A quantity Go would not parse, or beyond the modelled range.
    #[error(transparent)]
    Quantity(#[from] quantity::QuantityError),
    /// A value whose Go representation is not modelled (a set time, managed fields).
    #[error("the Go form of {0} is not modelled")]
    Unsupported(String),
}

/// FNV-32a, as Go's `hash/fnv` `New32a`.
#[must_use]
pub fn fnv32a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// The kubelet's `hash.DeepHashObject` of a `[]byte` with FNV-32a: the sum over go-spew's
/// `([]uint8)[...]` rendering of `bytes`.
#[must_use]
pub fn deep_hash_bytes(bytes: &[u8]) -> u32 {
    let mut text = String::with_capacity(bytes.len() * 4 + 12);
    spew::bytes(&mut text, bytes);
    fnv32a(text.as_bytes())
}
