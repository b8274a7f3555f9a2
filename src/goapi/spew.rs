//! go-spew's `%#v` rendering, with the configuration of the kubelet's
//! `hash.DeepHashObject` (sorted keys, no `String()` methods): every field of every
//! struct with its type in parentheses, nil pointers, slices and maps as `<nil>`,
//! elements and map entries without their type, strings unquoted. The internal types are
//! rendered from the v1 object's JSON they are converted from, as decoded: the quantities
//! of each `ResourceList` rounded up to milli units, as the API's defaulting leaves them.

use std::fmt::Write as _;

use serde_json::Value;

use super::quantity::GoQuantity;
use super::schema::{self, Kind};
use super::{GoApiError, RESOURCE_LIST_CORE};

/// `([]uint8)[1 2 3]`: a byte slice, each byte in decimal.
pub fn bytes(out: &mut String, bytes: &[u8]) {
    out.push_str("([]uint8)");
    list(out, bytes);
}

/// `[a b c]`: slice elements, each in its `Display` form.
pub fn list<T: std::fmt::Display>(out: &mut String, items: &[T]) {
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let _ = write!(out, "{item}");
    }
    out.push(']');
}

/// `%#v` of the internal type `type_name` (e.g. `*core.Pod`) converted from `value`, the
/// v1 object's JSON.
///
/// # Errors
/// A value of the wrong shape, a quantity that does not parse, or a set time (not
/// modelled).
pub fn render(value: &Value, type_name: &str) -> Result<String, GoApiError> {
    let mut out = String::new();
    Spew { out: &mut out }.value(Some(value), type_name, true, false)?;
    Ok(out)
}

struct Spew<'a> {
    out: &'a mut String,
}

fn shape(type_name: &str, value: &Value) -> GoApiError {
    GoApiError::Shape {
        type_name: type_name.to_owned(),
        value: value.to_string(),
    }
}

impl Spew<'_> {
    fn value(
        &mut self,
        value: Option<&Value>,
        type_name: &str,
        with_type: bool,
        in_resource_list: bool,
    ) -> Result<(), GoApiError> {
        let ty = schema::core(type_name)?;
        if with_type {
            let _ = write!(self.out, "({type_name})");
        }
        let value = value.filter(|v| !v.is_null());
        match ty.kind {
            Kind::String => match value {
                None => {}
                Some(Value::String(s)) => self.out.push_str(s),
                Some(v) => return Err(shape(type_name, v)),
            },
            Kind::Bool => match value {
                None => self.out.push_str("false"),
                Some(Value::Bool(b)) => {
                    let _ = write!(self.out, "{b}");
                }
                Some(v) => return Err(shape(type_name, v)),
            },
            Kind::Int | Kind::Uint => match value {
                None => self.out.push('0'),
                Some(Value::Number(n)) if n.is_i64() || n.is_u64() => {
                    let _ = write!(self.out, "{n}");
                }
                Some(v) => return Err(shape(type_name, v)),
            },
            Kind::Ptr => match value {
                None => self.out.push_str("<nil>"),
                Some(v) => self.value(Some(v), &ty.elem, false, false)?,
            },
            Kind::Slice => match value {
                None => self.out.push_str("<nil>"),
                Some(Value::Array(items)) => {
                    self.out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            self.out.push(' ');
                        }
                        self.value(Some(item), &ty.elem, false, false)?;
                    }
                    self.out.push(']');
                }
                Some(v) => return Err(shape(type_name, v)),
            },
            Kind::Map => match value {
                None => self.out.push_str("<nil>"),
                Some(Value::Object(entries)) => {
                    let mut keys: Vec<&String> = entries.keys().collect();
                    keys.sort();
                    self.out.push_str("map[");
                    for (i, key) in keys.into_iter().enumerate() {
                        if i > 0 {
                            self.out.push(' ');
                        }
                        let _ = write!(self.out, "{key}:");
                        self.value(
                            entries.get(key),
                            &ty.elem,
                            false,
                            type_name == RESOURCE_LIST_CORE,
                        )?;
                    }
                    self.out.push(']');
                }
                Some(v) => return Err(shape(type_name, v)),
            },
            Kind::Struct => {
                let object = match value {
                    None => None,
                    Some(Value::Object(o)) => Some(o),
                    Some(v) => return Err(shape(type_name, v)),
                };
                self.out.push('{');
                for (i, field) in ty.fields.iter().enumerate() {
                    if i > 0 {
                        self.out.push(' ');
                    }
                    let _ = write!(self.out, "{}:", field.name);
                    let child = match field.v1.as_deref() {
                        // Inline in the v1 object: the same object.
                        Some("") => value,
                        // A field with a JSON form of its own (`FieldsV1`).
                        Some("-") | None => match object {
                            Some(o) => {
                                return Err(GoApiError::Unsupported(format!(
                                    "{type_name} {}",
                                    Value::Object(o.clone())
                                )));
                            }
                            None => None,
                        },
                        Some(json) => object.and_then(|o| o.get(json)),
                    };
                    self.value(child, &field.type_name, true, false)?;
                }
                self.out.push('}');
            }
            Kind::Opaque => self.opaque(value, type_name, in_resource_list)?,
        }
        Ok(())
    }

    fn opaque(
        &mut self,
        value: Option<&Value>,
        type_name: &str,
        in_resource_list: bool,
    ) -> Result<(), GoApiError> {
        match (type_name, value) {
            ("resource.Quantity", None) => GoQuantity::zero().spew(self.out),
            ("resource.Quantity", Some(Value::String(s))) => {
                let q = GoQuantity::parse(s.trim())?;
                let q = if in_resource_list {
                    q.rounded_up_to_milli()
                } else {
                    q
                };
                q.spew(self.out);
            }
            ("intstr.IntOrString", None) => self.int_or_string(0, 0, ""),
            ("intstr.IntOrString", Some(Value::Number(n))) => {
                let n = n
                    .as_i64()
                    .ok_or_else(|| shape(type_name, &Value::Number(n.clone())))?;
                self.int_or_string(0, n, "");
            }
            ("intstr.IntOrString", Some(Value::String(s))) => self.int_or_string(1, 0, s),
            ("v1.Time", None) => self.out.push_str(
                "{Time:(time.Time){wall:(uint64)0 ext:(int64)0 loc:(*time.Location)<nil>}}",
            ),
            (_, Some(v)) => return Err(GoApiError::Unsupported(format!("{type_name} {v}"))),
            (_, None) => return Err(GoApiError::Unsupported(type_name.to_owned())),
        }
        Ok(())
    }

    fn int_or_string(&mut self, kind: u8, int: i64, string: &str) {
        let _ = write!(
            self.out,
            "{{Type:(intstr.Type){kind} IntVal:(int32){int} StrVal:(string){string}}}"
        );
    }
}
