//! The TCP probe: a connect with the probe's timeout; connected is success. Failure
//! messages follow the kubelet's (Go's) dial errors, e.g.
//! `dial tcp 10.244.0.5:80: connect: connection refused`.

use std::time::Duration;

use tokio::net::TcpStream;

use super::{Outcome, ProbeResult};

/// Connects to `host`:`port` within `timeout` and closes the connection at once.
pub async fn connect(host: &str, port: u16, timeout: Duration) -> Outcome {
    match dial(&join_host_port(host, port), timeout).await {
        Ok(_) => Outcome::new(ProbeResult::Success, ""),
        Err(message) => Outcome::new(ProbeResult::Failure, message),
    }
}

/// `host:port`, with an IPv6 host in brackets (Go's `net.JoinHostPort`).
pub(super) fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Opens a TCP connection to `addr` (`host:port`) within `timeout`; the error is Go's dial
/// message.
pub(super) async fn dial(addr: &str, timeout: Duration) -> Result<TcpStream, String> {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(error)) => Err(format!(
            "dial tcp {addr}: connect: {}",
            crate::errno::go_text(&error)
        )),
        Err(_) => Err(format!("dial tcp {addr}: i/o timeout")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_listening_port_is_success_and_a_closed_one_failure() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let ok = connect("127.0.0.1", addr.port(), Duration::from_secs(1)).await;
        assert_eq!(ok.result, ProbeResult::Success);
        drop(listener);
        let refused = connect("127.0.0.1", addr.port(), Duration::from_secs(1)).await;
        assert_eq!(refused.result, ProbeResult::Failure);
        assert_eq!(
            refused.output,
            format!("dial tcp {addr}: connect: connection refused")
        );
    }

    #[test]
    fn ipv6_hosts_are_bracketed() {
        assert_eq!(join_host_port("::1", 80), "[::1]:80");
        assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
    }
}
