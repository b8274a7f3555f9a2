//! `$(VAR)` expansion with the kubelet's rules (its `third_party/forked/golang/expansion`):
//! used for container environment values, command and args, and volume `subPathExpr`.
//! Shared vocabulary: knows no container, volume or pod.

/// Expands `$(VAR)` references with the kubelet's rules: a defined variable is replaced,
/// an undefined one is left as written, and `$$` stands for a literal `$`.
#[must_use]
pub fn expand(input: &str, mut lookup: impl FnMut(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match lookup(name) {
                Some(value) => out.push_str(&value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn expansion_follows_the_kubelet_rules() {
        let vars = HashMap::from([("A", "x")]);
        let lookup = |n: &str| vars.get(n).map(|v| (*v).to_owned());
        assert_eq!(expand("$(A)-$(B)-$$(A)-$-$(", lookup), "x-$(B)-$(A)-$-$(");
        assert_eq!(expand("plain", lookup), "plain");
    }
}
