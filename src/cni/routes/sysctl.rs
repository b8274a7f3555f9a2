//! The kernel settings pod networking needs on a node (those the kubelet's kubenet sets):
//! `net.ipv4.ip_forward=1`, so that the node forwards between its pods and the other
//! nodes, and `net.bridge.bridge-nf-call-iptables=1` where the bridge netfilter module is
//! loaded, so that bridged pod traffic passes through iptables (Service rules, portmap).
//! Both are per network namespace on recent kernels.

use std::path::Path;

use super::RoutesError;

/// The settings, as paths under `/proc/sys`, each with the directory that must exist for
/// it to apply.
const SETTINGS: [(&str, &str); 2] = [
    ("net/ipv4/ip_forward", "net/ipv4"),
    ("net/bridge/bridge-nf-call-iptables", "net/bridge"),
];

/// Sets each setting under `proc_sys` (normally `/proc/sys`) to 1 where it is not; returns
/// the names of those changed, with their value before. A setting whose directory is
/// missing is skipped.
///
/// # Errors
/// [`RoutesError::File`] when a setting cannot be read or written.
pub async fn enable_forwarding(proc_sys: &Path) -> Result<Vec<(String, String)>, RoutesError> {
    let mut changed = Vec::new();
    for (key, dir) in SETTINGS {
        if tokio::fs::metadata(proc_sys.join(dir)).await.is_err() {
            tracing::debug!(setting = key, "not available here; skipped");
            continue;
        }
        let path = proc_sys.join(key);
        let file = |op| {
            let path = path.clone();
            move |source| RoutesError::File { op, path, source }
        };
        let before = tokio::fs::read_to_string(&path)
            .await
            .map_err(file("reading"))?;
        let before = before.trim().to_owned();
        if before != "1" {
            tokio::fs::write(&path, "1")
                .await
                .map_err(file("writing"))?;
            let name = key.replace('/', ".");
            tracing::info!(setting = %name, from = %before, to = "1", "kernel setting changed for pod networking");
            changed.push((name, before));
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::testutil::TempDir;

    #[tokio::test]
    async fn turns_on_what_is_off_and_skips_what_is_missing() {
        let root = TempDir::new("sysctl");
        let ipv4 = root.path().join("net/ipv4");
        std::fs::create_dir_all(&ipv4).unwrap();
        std::fs::write(ipv4.join("ip_forward"), "0\n").unwrap();
        let changed = enable_forwarding(root.path()).await.unwrap();
        assert_eq!(
            changed,
            [("net.ipv4.ip_forward".to_owned(), "0".to_owned())]
        );
        assert_eq!(
            std::fs::read_to_string(ipv4.join("ip_forward")).unwrap(),
            "1"
        );
        let bridge = root.path().join("net/bridge");
        std::fs::create_dir_all(&bridge).unwrap();
        std::fs::write(bridge.join("bridge-nf-call-iptables"), "0").unwrap();
        let changed = enable_forwarding(root.path()).await.unwrap();
        assert_eq!(
            changed.len(),
            1,
            "only the bridge setting was off: {changed:?}"
        );
        assert!(enable_forwarding(root.path()).await.unwrap().is_empty());
    }
}
