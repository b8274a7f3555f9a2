//! Go's `encoding/json` (`json.Marshal`) of the v1 types, byte for byte: fields in Go's
//! declaration order, `omitempty` as Go reads it (a struct is never empty), nil slices,
//! maps and pointers as `null`, map keys sorted, strings escaped as Go escapes them (`<`,
//! `>`, `&`, U+2028 and U+2029 too), quantities in their Go form. The value is the object's
//! JSON as serde writes it; only the fields the v1.20.2 types have are read, so a field a
//! later API added does not change the result.

use serde_json::Value;

use super::GoApiError;
use super::quantity::GoQuantity;
use super::schema::{self, Kind};

/// `json.Marshal` of `value` as the v1 type `type_name` (e.g. `v1.Container`).
///
/// # Errors
/// A value of the wrong shape, or a quantity that does not parse.
pub fn marshal(value: &Value, type_name: &str) -> Result<String, GoApiError> {
    let mut out = String::new();
    encode(&mut out, Some(value), type_name)?;
    Ok(out)
}

/// A JSON string as Go writes it.
pub fn quote(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' | '\0'..='\u{1f}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn shape(type_name: &str, value: &Value) -> GoApiError {
    GoApiError::Shape {
        type_name: type_name.to_owned(),
        value: value.to_string(),
    }
}

/// Go's `isEmptyValue`, for `omitempty`.
fn is_empty(value: Option<&Value>, kind: Kind) -> bool {
    match (kind, value) {
        (Kind::Struct | Kind::Opaque, _) => false,
        (_, None | Some(Value::Null)) => true,
        (Kind::String, Some(Value::String(s))) => s.is_empty(),
        (Kind::Bool, Some(Value::Bool(b))) => !b,
        (Kind::Int | Kind::Uint, Some(Value::Number(n))) => n.as_f64() == Some(0.0),
        (Kind::Slice, Some(Value::Array(a))) => a.is_empty(),
        (Kind::Map, Some(Value::Object(m))) => m.is_empty(),
        _ => false,
    }
}

fn encode(out: &mut String, value: Option<&Value>, type_name: &str) -> Result<(), GoApiError> {
    let ty = schema::v1(type_name)?;
    let value = value.filter(|v| !v.is_null());
    match ty.kind {
        Kind::String => match value {
            None => quote(out, ""),
            Some(Value::String(s)) => quote(out, s),
            Some(v) => return Err(shape(type_name, v)),
        },
        Kind::Bool => match value {
            None => out.push_str("false"),
            Some(Value::Bool(b)) => out.push_str(if *b { "true" } else { "false" }),
            Some(v) => return Err(shape(type_name, v)),
        },
        Kind::Int | Kind::Uint => match value {
            None => out.push('0'),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => out.push_str(&n.to_string()),
            Some(v) => return Err(shape(type_name, v)),
        },
        Kind::Ptr => match value {
            None => out.push_str("null"),
            Some(v) => encode(out, Some(v), &ty.elem)?,
        },
        Kind::Slice => match value {
            None => out.push_str("null"),
            Some(Value::Array(items)) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    encode(out, Some(item), &ty.elem)?;
                }
                out.push(']');
            }
            Some(v) => return Err(shape(type_name, v)),
        },
        Kind::Map => match value {
            None => out.push_str("null"),
            Some(Value::Object(entries)) => {
                let mut keys: Vec<&String> = entries.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    quote(out, key);
                    out.push(':');
                    encode(out, entries.get(key), &ty.elem)?;
                }
                out.push('}');
            }
            Some(v) => return Err(shape(type_name, v)),
        },
        Kind::Struct => {
            out.push('{');
            let mut first = true;
            fields(out, value, type_name, &mut first)?;
            out.push('}');
        }
        Kind::Opaque => opaque(out, value, type_name)?,
    }
    Ok(())
}

/// The fields of the struct `type_name` into the object being written, inline ones' too.
fn fields(
    out: &mut String,
    value: Option<&Value>,
    type_name: &str,
    first: &mut bool,
) -> Result<(), GoApiError> {
    let object = match value {
        None => None,
        Some(Value::Object(o)) => Some(o),
        Some(v) => return Err(shape(type_name, v)),
    };
    for field in &schema::v1(type_name)?.fields {
        if field.json == "-" {
            continue;
        }
        if field.inline {
            fields(out, value, &field.type_name, first)?;
            continue;
        }
        let child = object.and_then(|o| o.get(&field.json));
        if field.omitempty && is_empty(child, schema::v1(&field.type_name)?.kind) {
            continue;
        }
        if !*first {
            out.push(',');
        }
        *first = false;
        quote(out, &field.json);
        out.push(':');
        encode(out, child, &field.type_name)?;
    }
    Ok(())
}

/// The types with their own `MarshalJSON`.
fn opaque(out: &mut String, value: Option<&Value>, type_name: &str) -> Result<(), GoApiError> {
    match (type_name, value) {
        ("resource.Quantity", None) => quote(out, &GoQuantity::zero().marshal()),
        ("resource.Quantity", Some(Value::String(s))) => {
            quote(out, &GoQuantity::parse(s.trim())?.marshal());
        }
        ("intstr.IntOrString", None) => out.push('0'),
        ("intstr.IntOrString", Some(Value::Number(n))) if n.is_i64() => {
            out.push_str(&n.to_string());
        }
        ("intstr.IntOrString", Some(Value::String(s))) => quote(out, s),
        (_, Some(v)) => return Err(shape(type_name, v)),
        (_, None) => return Err(GoApiError::Unsupported(type_name.to_owned())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's `json.Marshal` of each container of the reference vectors, byte for byte
    /// (tests/data/kubelet-v1.20.2: `containers.jsonl` in, the kubelet's own bytes in
    /// `container-hashes.jsonl`).
    #[test]
    fn containers_are_marshalled_as_go_marshals_them() {
        let inputs = include_str!("../../tests/data/kubelet-v1.20.2/containers.jsonl");
        let outputs = include_str!("../../tests/data/kubelet-v1.20.2/container-hashes.jsonl");
        let mut n = 0;
        for (input, output) in inputs.lines().zip(outputs.lines()) {
            let value: Value = serde_json::from_str(input).unwrap();
            let expected: Value = serde_json::from_str(output).unwrap();
            assert_eq!(
                marshal(&value, "v1.Container").unwrap(),
                expected["json"],
                "{input}"
            );
            n += 1;
        }
        assert_eq!(n, inputs.lines().count());
        assert!(n > 150);
    }

    #[test]
    fn strings_are_escaped_as_go_escapes_them() {
        let mut out = String::new();
        quote(&mut out, "<a>&\"\\\n\r\t\u{1}\u{7f}\u{2028}\u{2029}é");
        assert_eq!(
            out,
            r#""\u003ca\u003e\u0026\"\\\n\r\t\u0001\u007f\u2028\u2029é""#
                .replace("\\u007f", "\u{7f}")
        );
    }
}
