//! Network interface counters of a network namespace, as cAdvisor reads them: the
//! `/proc/<pid>/net/dev` of a process in that namespace (a pod's: its sandbox's pause
//! process; the node's: PID 1), leaving out loopback, veth and docker devices.

/// Interfaces cAdvisor leaves out (`lo`, the host ends of pods' veth pairs, docker's).
const IGNORED_PREFIXES: &[&str] = &["lo", "veth", "docker"];

/// One interface's cumulative counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InterfaceCounters {
    /// The interface's name in its namespace.
    pub name: String,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Received packets dropped.
    pub rx_dropped: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Transmit errors.
    pub tx_errors: u64,
    /// Packets dropped while sending.
    pub tx_dropped: u64,
}

/// The interfaces of a `net/dev` file, in its order, without the ignored ones.
#[must_use]
pub fn parse_net_dev(text: &str) -> Vec<InterfaceCounters> {
    text.lines()
        .filter_map(|line| {
            let (name, counters) = line.split_once(':')?;
            let name = name.trim();
            if IGNORED_PREFIXES.iter().any(|p| name.starts_with(p)) {
                return None;
            }
            let v: Vec<u64> = counters
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            // Receive: bytes packets errs drop fifo frame compressed multicast; then
            // transmit: bytes packets errs drop fifo colls carrier compressed.
            (v.len() >= 16).then(|| InterfaceCounters {
                name: name.to_owned(),
                rx_bytes: v[0],
                rx_packets: v[1],
                rx_errors: v[2],
                rx_dropped: v[3],
                tx_bytes: v[8],
                tx_packets: v[9],
                tx_errors: v[10],
                tx_dropped: v[11],
            })
        })
        .collect()
}

/// The interfaces in the network namespace of process `pid` under the proc mount `proc`.
/// Blocking.
#[must_use]
pub fn read(proc: &std::path::Path, pid: u32) -> Option<Vec<InterfaceCounters>> {
    let text = crate::procfs::read_pseudo_file(&proc.join(pid.to_string()).join("net/dev")).ok()?;
    Some(parse_net_dev(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET_DEV: &str = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0
  eth0: 10485760    7000    1    2    0     0          0         0   400000    5000    3    4    0     0       0          0
vethab12: 5 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0
";

    #[test]
    fn net_dev_without_loopback_and_veths() {
        let interfaces = parse_net_dev(NET_DEV);
        assert_eq!(
            interfaces,
            vec![InterfaceCounters {
                name: "eth0".into(),
                rx_bytes: 10_485_760,
                rx_packets: 7000,
                rx_errors: 1,
                rx_dropped: 2,
                tx_bytes: 400_000,
                tx_packets: 5000,
                tx_errors: 3,
                tx_dropped: 4,
            }]
        );
        assert!(parse_net_dev("eth0: 1 2 3\n").is_empty());
    }
}
