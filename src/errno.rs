//! Operating-system errors as Go prints them (`syscall.Errno`: lower case, without Rust's
//! "(os error N)"), for messages that must read as the kubelet's.
//!
//! Knows no other module of the agent.

/// The errno text Go prints for `error`.
#[must_use]
pub fn go_text(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        std::io::ErrorKind::HostUnreachable => "no route to host".to_owned(),
        std::io::ErrorKind::NetworkUnreachable => "network is unreachable".to_owned(),
        _ => {
            let text = error.to_string();
            match text.find(" (os error") {
                Some(at) => text[..at].to_lowercase(),
                None => text,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_texts_read_as_go_prints_them() {
        let too_long = std::io::Error::from_raw_os_error(nix::libc::ENAMETOOLONG);
        assert_eq!(go_text(&too_long), "file name too long");
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(go_text(&refused), "connection refused");
        let other = std::io::Error::other("custom");
        assert_eq!(go_text(&other), "custom");
    }
}
