//! `cluster.sh up` on a machine that already routes the local cluster's ranges (another
//! cluster's bridge on 10.244.0.0/16, as flannel's and kind's default, or a route into the
//! node range 198.18.0.0/15) stops at once with a message naming what is in the way,
//! instead of tests failing later with "No route to host". The check `up` runs is
//! `cluster.sh check-ranges`; here it runs inside a network namespace of the test's own,
//! set up as such a machine, so the host is never touched.

use std::path::Path;
use std::process::{Command, Output};

/// A network namespace of the test's own, removed on drop.
struct Netns(String);

impl Netns {
    fn new(name: &str) -> Self {
        let _ = Command::new("ip").args(["netns", "delete", name]).output();
        run(Command::new("ip").args(["netns", "add", name]));
        Self(name.to_owned())
    }

    /// Runs `sh -c script` inside the namespace; it must succeed.
    fn sh(&self, script: &str) {
        run(Command::new("ip").args(["netns", "exec", &self.0, "sh", "-ec", script]));
    }

    /// `cluster.sh check-ranges` inside the namespace.
    fn check_ranges(&self) -> Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster.sh");
        Command::new("ip")
            .args(["netns", "exec", &self.0, "bash"])
            .arg(script)
            .arg("check-ranges")
            .output()
            .expect("run cluster.sh")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .output();
    }
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
#[ignore = "needs root: run scripts/test.sh"]
fn up_refuses_a_machine_whose_routes_capture_the_pod_or_node_range_and_names_them() {
    let ns = Netns::new("rk-test-ranges");
    // A machine with only broader routes (a default route, a VPN's 10.0.0.0/8): the
    // cluster's own, more specific routes win over them.
    ns.sh("ip link add name rkr0 type veth peer name rkr1
         ip link set rkr0 up; ip link set rkr1 up
         ip addr add 192.0.2.1/24 dev rkr0
         ip route add default via 192.0.2.254
         ip route add 10.0.0.0/8 dev rkr0");
    let free = ns.check_ranges();
    assert!(
        free.status.success(),
        "broader routes do not capture: {}",
        String::from_utf8_lossy(&free.stderr)
    );

    // Another cluster's bridge on the pod range, a route into the node range, and a
    // rule of its firewall.
    ns.sh("ip link add name cni0 type bridge; ip link set cni0 up
         ip addr add 10.244.0.1/24 dev cni0
         ip route add 198.18.7.0/24 dev rkr0
         iptables -w 5 -A FORWARD -s 10.244.0.0/16 -j ACCEPT");
    let taken = ns.check_ranges();
    let stderr = String::from_utf8_lossy(&taken.stderr);
    assert!(!taken.status.success(), "must refuse:\n{stderr}");
    for expected in [
        "interface cni0 holds 10.244.0.1/24",
        "route '10.244.0.0/24 dev cni0",
        "node addresses 198.18.0.0/15: route '198.18.7.0/24 dev rkr0",
        "iptables rule '-A FORWARD -s 10.244.0.0/16 -j ACCEPT'",
        "stop it or remove what is listed",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in:\n{stderr}");
    }
    assert!(
        !stderr.contains("10.0.0.0/8") && !stderr.contains("default"),
        "broader routes are not named:\n{stderr}"
    );
}
