//! Image references as the kubelet reads them before it asks the runtime for an image
//! (`applyDefaultImageTag`, i.e. the Docker reference grammar's `ParseNormalizedNamed`):
//! a reference that does not parse never reaches the runtime, and the container waits
//! with `InvalidImageName` and the grammar's own error text. Shared vocabulary of the image
//! manager and the credential keyring (the kubelet's `pkg/util/parsers`): knows neither.

/// Longest repository name (domain and path), in characters.
const NAME_TOTAL_LENGTH_MAX: usize = 255;
/// Longest tag.
const TAG_LENGTH_MAX: usize = 128;

/// Checks `image` as `ParseNormalizedNamed` does.
///
/// # Errors
/// The grammar's error text (`invalid reference format`, `repository name must be
/// lowercase`, `invalid checksum digest length`, ...).
pub fn validate(image: &str) -> Result<(), String> {
    if image.len() == 64 && image.bytes().all(is_lower_hex) {
        return Err(format!(
            "invalid repository name ({image}), cannot specify 64-byte hexadecimal strings"
        ));
    }
    let (domain, remainder) = split_docker_domain(image);
    let remote_name = remainder.split(':').next().unwrap_or_default();
    if remote_name.to_lowercase() != remote_name {
        return Err("invalid reference format: repository name must be lowercase".into());
    }
    parse(&format!("{domain}/{remainder}"))
}

/// The pull policy the API gives a container that names none (`SetDefaults_Container`):
/// `Always` for `:latest` or no tag, `IfNotPresent` for another tag, a digest, or a
/// reference that does not parse.
#[must_use]
pub fn default_pull_policy(image: &str) -> &'static str {
    if validate(image).is_err() || image.contains('@') {
        return "IfNotPresent";
    }
    let name = image.rsplit('/').next().unwrap_or(image);
    match name.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// The domain of a reference and the rest (`splitDockerDomain`): the first component when
/// it looks like a host (a dot, a port, `localhost` or upper case), else Docker Hub's, with
/// `library/` for official images.
pub(crate) fn split_docker_domain(name: &str) -> (&str, String) {
    let (domain, remainder) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.to_lowercase() != first =>
        {
            (first, rest.to_owned())
        }
        _ => ("docker.io", name.to_owned()),
    };
    let domain = if domain == "index.docker.io" {
        "docker.io"
    } else {
        domain
    };
    if domain == "docker.io" && !remainder.contains('/') {
        return (domain, format!("library/{remainder}"));
    }
    (domain, remainder)
}

/// `reference.Parse`: the whole grammar, then the name's length, then the digest.
fn parse(s: &str) -> Result<(), String> {
    let Some(parts) = split_reference(s) else {
        if s.is_empty() {
            return Err("repository name must have at least one component".into());
        }
        if split_reference(&s.to_lowercase()).is_some() {
            return Err("repository name must be lowercase".into());
        }
        return Err("invalid reference format".into());
    };
    if parts.name.len() > NAME_TOTAL_LENGTH_MAX {
        return Err(format!(
            "repository name must not be more than {NAME_TOTAL_LENGTH_MAX} characters"
        ));
    }
    parts.digest.map_or(Ok(()), validate_digest)
}

/// A reference's name, tag and digest, when it matches the grammar.
struct Parts<'a> {
    name: &'a str,
    digest: Option<&'a str>,
}

/// `ReferenceRegexp`: `name[:tag][@digest]`.
fn split_reference(s: &str) -> Option<Parts<'_>> {
    let (rest, digest) = match s.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (s, None),
    };
    if digest.is_some_and(|d| !is_digest(d)) {
        return None;
    }
    // A tag has no `/` or `:`: it is what follows a colon after the last slash.
    let last_slash = rest.rfind('/').map_or(0, |at| at + 1);
    let (name, tag) = match rest[last_slash..].find(':') {
        Some(at) => (&rest[..last_slash + at], Some(&rest[last_slash + at + 1..])),
        None => (rest, None),
    };
    if tag.is_some_and(|t| !is_tag(t)) || !is_name(name) {
        return None;
    }
    Some(Parts { name, digest })
}

/// `(domain/)?component(/component)*`.
fn is_name(name: &str) -> bool {
    let components: Vec<&str> = name.split('/').collect();
    let (first, rest) = components.split_first().unwrap_or((&"", &[]));
    rest.iter().all(|c| is_path_component(c))
        && (is_path_component(first) || (!rest.is_empty() && is_domain(first)))
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn is_path_component(c: &str) -> bool {
    let bytes = c.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut i = 0;
    loop {
        let start = i;
        while bytes.get(i).is_some_and(alnum) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == bytes.len() {
            return true;
        }
        let sep_start = i;
        while bytes
            .get(i)
            .is_some_and(|b| matches!(b, b'.' | b'_' | b'-'))
        {
            i += 1;
        }
        let separator = &c[sep_start..i];
        let valid = matches!(separator, "." | "_" | "__") || separator.bytes().all(|b| b == b'-');
        if !valid {
            return false;
        }
    }
}

/// `component(\.component)*(:[0-9]+)?`, a component being letters, digits and inner dashes.
fn is_domain(domain: &str) -> bool {
    let (host, port) = match domain.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (domain, None),
    };
    let component = |c: &str| {
        !c.is_empty()
            && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !c.starts_with('-')
            && !c.ends_with('-')
    };
    host.split('.').all(component)
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `[\w][\w.-]{0,127}`.
fn is_tag(tag: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    tag.len() <= TAG_LENGTH_MAX
        && tag.bytes().next().is_some_and(word)
        && tag.bytes().all(|b| word(b) || b == b'.' || b == b'-')
}

/// `[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}`.
fn is_digest(digest: &str) -> bool {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return false;
    };
    let algorithm_ok = algorithm.split(['-', '_', '+', '.']).all(|part| {
        part.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
            && part.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    algorithm_ok && hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `digest.Parse`'s checks, on a digest the grammar accepted.
fn validate_digest(digest: &str) -> Result<(), String> {
    let (algorithm, encoded) = digest.split_once(':').unwrap_or((digest, ""));
    let lower_alnum = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    if !algorithm.split(['.', '+', '_', '-']).all(lower_alnum) {
        return Err("invalid checksum digest format".into());
    }
    let size = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Err("unsupported digest algorithm".into()),
    };
    if encoded.len() != size {
        return Err("invalid checksum digest length".into());
    }
    if !encoded.bytes().all(is_lower_hex) {
        return Err("invalid checksum digest format".into());
    }
    Ok(())
}

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_the_grammar_accepts() {
        let sha = "a".repeat(64);
        for image in [
            "busybox",
            "busybox:1.36",
            "library/busybox:latest",
            "localhost:5000/busybox",
            "localhost/busybox",
            "127.0.0.1:5000/a/b-c__d.e:v1_2.3-x",
            "registry.example.com:443/team/app",
            "localhost:5000",
            "a--b",
            "Registry.Example.com/app",
            &format!("busybox@sha256:{sha}"),
            &format!("localhost:5000/busybox:1@sha256:{sha}"),
        ] {
            assert_eq!(validate(image), Ok(()), "{image}");
        }
    }

    #[test]
    fn references_the_grammar_refuses_with_its_texts() {
        let format = "invalid reference format";
        let cases: Vec<(String, &str)> = vec![
            ("busybox:".into(), format),
            ("busybox::1".into(), format),
            ("-busybox".into(), format),
            ("busy..box".into(), format),
            ("busy___box".into(), format),
            ("busybox/".into(), format),
            ("busybox:-x".into(), format),
            ("busybox@sha256:abc".into(), format),
            ("localhost:port/x".into(), format),
            (format!("busybox:{}", "t".repeat(129)), format),
            (
                "Busybox".into(),
                "invalid reference format: repository name must be lowercase",
            ),
            (
                "localhost:5000/Busy".into(),
                "invalid reference format: repository name must be lowercase",
            ),
            (
                format!("busybox@sha256:{}", "a".repeat(40)),
                "invalid checksum digest length",
            ),
            (
                format!("busybox@md5:{}", "a".repeat(32)),
                "unsupported digest algorithm",
            ),
            // The repository part runs up to the first colon, the algorithm included.
            (
                format!("busybox@MD5:{}", "a".repeat(32)),
                "invalid reference format: repository name must be lowercase",
            ),
            (
                format!("busybox@sha256:{}", "A".repeat(64)),
                "invalid checksum digest format",
            ),
            (
                format!("a/{}", "b".repeat(250)),
                "repository name must not be more than 255 characters",
            ),
        ];
        for (image, want) in cases {
            assert_eq!(validate(&image), Err(want.to_owned()), "{image}");
        }
        let id = "0123456789abcdef".repeat(4);
        assert_eq!(
            validate(&id),
            Err(format!(
                "invalid repository name ({id}), cannot specify 64-byte hexadecimal strings"
            ))
        );
    }
}
