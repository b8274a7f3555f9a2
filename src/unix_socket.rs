//! The Unix sockets the agent serves on its own node (the CNI shim's, the debug socket
//! of `rkubelet inspect`): bound with mode 0600 in a dir of mode 0700, a stale file of
//! an agent that died replaced, the file removed when the listener goes, and only peers
//! running as root or as the agent's user served.
//!
//! Knows no protocol spoken on the sockets nor who serves them.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};

/// A failure to bind an owner-only socket, with what was being done and where.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct BindError {
    /// What was being done.
    pub op: &'static str,
    /// The path it was done on.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

/// A bound owner-only socket; its file is removed when it is dropped.
#[derive(Debug)]
pub struct OwnerSocket {
    /// The listener.
    pub listener: UnixListener,
    /// The socket file.
    pub path: PathBuf,
}

/// Binds `socket` (mode 0600; missing parent dirs are made with mode 0700). A stale
/// socket file left by a previous agent is replaced. Call within a Tokio runtime.
///
/// # Errors
/// The path holds something else than a socket, another process still serves it
/// (`AddrInUse`), or binding fails.
pub fn bind(socket: &Path) -> Result<OwnerSocket, BindError> {
    let err = |op, path: &Path| {
        let path = path.to_owned();
        move |source| BindError { op, path, source }
    };
    if let Some(parent) = socket.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(err("creating the socket's dir", parent))?;
    }
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Err(err("another process serves the socket", socket)(
                    std::io::ErrorKind::AddrInUse.into(),
                ));
            }
            std::fs::remove_file(socket).map_err(err("removing the stale socket", socket))?;
        }
        Ok(_) => {
            return Err(err(
                "refusing to replace a non-socket with the socket",
                socket,
            )(std::io::ErrorKind::AlreadyExists.into()));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err("inspecting the socket path", socket)(e)),
    }
    let listener = UnixListener::bind(socket).map_err(err("binding the socket", socket))?;
    let bound = OwnerSocket {
        listener,
        path: socket.to_owned(),
    };
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(err("restricting the socket to its owner", socket))?;
    Ok(bound)
}

impl Drop for OwnerSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether the peer runs as root or as the agent's user; a refusal is logged with
/// `what` the socket is for.
#[must_use]
pub fn peer_allowed(stream: &UnixStream, what: &str) -> bool {
    let own_uid = nix::unistd::geteuid().as_raw();
    match stream.peer_cred() {
        Ok(cred) if cred.uid() == 0 || cred.uid() == own_uid => true,
        Ok(cred) => {
            tracing::warn!(uid = cred.uid(), pid = ?cred.pid(), "refusing a {what} request from an unprivileged peer");
            false
        }
        Err(e) => {
            tracing::warn!("refusing a {what} request: no peer credentials: {e}");
            false
        }
    }
}
