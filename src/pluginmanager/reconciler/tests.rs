use std::sync::Mutex;

use super::*;
use crate::pluginmanager::{CSI_PLUGIN, HandlerError};

/// A plugin behind a fake registration socket: its info, and the statuses it was told.
#[derive(Default)]
struct FakePlugins {
    infos: Mutex<BTreeMap<PathBuf, PluginInfo>>,
    told: Mutex<Vec<(PathBuf, RegistrationStatus)>>,
}

impl Registration for Arc<FakePlugins> {
    fn get_info<'a>(
        &'a self,
        socket: &'a Path,
    ) -> BoxFuture<'a, Result<PluginInfo, tonic::Status>> {
        let info = crate::lock::lock(&self.infos).get(socket).cloned();
        Box::pin(
            async move { info.ok_or_else(|| tonic::Status::unavailable("connection refused")) },
        )
    }

    fn notify<'a>(
        &'a self,
        socket: &'a Path,
        status: RegistrationStatus,
    ) -> BoxFuture<'a, Result<(), tonic::Status>> {
        crate::lock::lock(&self.told).push((socket.to_path_buf(), status));
        Box::pin(async { Ok(()) })
    }
}

/// A handler that records what it was asked, refusing names starting with `bad`, failing
/// registrations of names starting with `fail`.
#[derive(Default)]
struct FakeHandler {
    calls: Mutex<Vec<String>>,
}

impl PluginHandler for FakeHandler {
    fn validate_plugin(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        crate::lock::lock(&self.calls).push(format!("validate {name} {endpoint} {versions:?}"));
        if name.starts_with("bad") {
            return Err("no supported version".into());
        }
        Ok(())
    }

    fn register_plugin<'a>(
        &'a self,
        name: &'a str,
        _endpoint: &'a str,
        _versions: &'a [String],
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        crate::lock::lock(&self.calls).push(format!("register {name}"));
        Box::pin(async move {
            if name.starts_with("fail") {
                return Err("NodeGetInfo failed".into());
            }
            Ok(())
        })
    }

    fn deregister_plugin<'a>(&'a self, name: &'a str) -> BoxFuture<'a, ()> {
        crate::lock::lock(&self.calls).push(format!("deregister {name}"));
        Box::pin(async {})
    }
}

struct Setup {
    dir: PathBuf,
    plugins: Arc<FakePlugins>,
    handler: Arc<FakeHandler>,
    manager: PluginManager<Arc<FakePlugins>>,
    listeners: BTreeMap<String, std::os::unix::net::UnixListener>,
}

impl Setup {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("rkubelet-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let plugins = Arc::new(FakePlugins::default());
        let handler = Arc::new(FakeHandler::default());
        let handlers: Handlers = [(
            CSI_PLUGIN.to_owned(),
            handler.clone() as Arc<dyn PluginHandler>,
        )]
        .into();
        let manager = PluginManager::with_registration(dir.clone(), handlers, plugins.clone());
        Self {
            dir,
            plugins,
            handler,
            manager,
            listeners: BTreeMap::new(),
        }
    }

    /// A socket `<name>.sock` whose plugin answers `GetInfo` with `kind`, `name`, `endpoint`.
    fn plugin(&mut self, name: &str, kind: &str, endpoint: &str) -> PathBuf {
        let socket = self.dir.join(format!("{name}.sock"));
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        self.listeners.insert(name.to_owned(), listener);
        crate::lock::lock(&self.plugins.infos).insert(
            socket.clone(),
            PluginInfo {
                r#type: kind.into(),
                name: name.into(),
                endpoint: endpoint.into(),
                supported_versions: vec!["1.0.0".into()],
            },
        );
        socket
    }

    fn calls(&self) -> Vec<String> {
        std::mem::take(&mut *crate::lock::lock(&self.handler.calls))
    }

    fn told(&self) -> Vec<(PathBuf, RegistrationStatus)> {
        std::mem::take(&mut *crate::lock::lock(&self.plugins.told))
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ok() -> RegistrationStatus {
    RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    }
}

#[tokio::test]
async fn a_new_socket_is_validated_registered_and_told_then_deregistered_when_it_goes() {
    let mut s = Setup::new("plugins-flow");
    let socket = s.plugin("hostpath.csi.k8s.io", CSI_PLUGIN, "/run/csi.sock");
    s.manager.reconcile().await.unwrap();
    assert_eq!(
        s.calls(),
        vec![
            "validate hostpath.csi.k8s.io /run/csi.sock [\"1.0.0\"]".to_owned(),
            "register hostpath.csi.k8s.io".into()
        ]
    );
    assert_eq!(s.told(), vec![(socket.clone(), ok())]);
    assert_eq!(
        s.manager.registered(),
        [(socket.clone(), "hostpath.csi.k8s.io".to_owned())].into()
    );
    // Nothing new: nothing asked.
    s.manager.reconcile().await.unwrap();
    assert!(s.calls().is_empty() && s.told().is_empty());
    std::fs::remove_file(&socket).unwrap();
    s.manager.reconcile().await.unwrap();
    assert_eq!(s.calls(), vec!["deregister hostpath.csi.k8s.io".to_owned()]);
    assert!(s.manager.registered().is_empty());
}

#[tokio::test]
async fn without_an_endpoint_the_registration_socket_is_the_endpoint() {
    let mut s = Setup::new("plugins-endpoint");
    let socket = s.plugin("d", CSI_PLUGIN, "");
    s.manager.reconcile().await.unwrap();
    assert_eq!(
        s.calls()[0],
        format!("validate d {} [\"1.0.0\"]", socket.display())
    );
}

#[tokio::test]
async fn refused_and_unknown_plugins_are_told_why_and_not_registered() {
    let mut s = Setup::new("plugins-refused");
    let unknown = s.plugin("gpu", "Gadget", "");
    let bad = s.plugin("bad-driver", CSI_PLUGIN, "");
    s.manager.reconcile().await.unwrap();
    let mut told = s.told();
    told.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        told,
        vec![
            (
                bad.clone(),
                RegistrationStatus {
                    plugin_registered: false,
                    error: "RegisterPlugin error -- plugin validation failed with err: no supported version".into()
                }
            ),
            (
                unknown.clone(),
                RegistrationStatus {
                    plugin_registered: false,
                    error: format!(
                        "RegisterPlugin error -- no handler registered for plugin type: Gadget at socket {}",
                        unknown.display()
                    )
                }
            ),
        ]
    );
    assert!(s.manager.registered().is_empty());
    // Retried on the next pass, as the kubelet's reconciler does.
    s.manager.reconcile().await.unwrap();
    assert_eq!(s.told().len(), 2);
}

#[tokio::test]
async fn a_failed_registration_is_told_and_deregistered_when_its_socket_goes() {
    let mut s = Setup::new("plugins-failed");
    let socket = s.plugin("fail-driver", CSI_PLUGIN, "");
    s.manager.reconcile().await.unwrap();
    assert_eq!(
        s.told(),
        vec![(
            socket.clone(),
            RegistrationStatus {
                plugin_registered: false,
                error: "RegisterPlugin error -- plugin registration failed with err: NodeGetInfo failed".into()
            }
        )]
    );
    // As the kubelet: the plugin stays known (not asked again) until its socket goes.
    s.calls();
    s.manager.reconcile().await.unwrap();
    assert!(s.calls().is_empty());
    s.listeners.clear();
    std::fs::remove_file(&socket).unwrap();
    s.manager.reconcile().await.unwrap();
    assert_eq!(s.calls(), vec!["deregister fail-driver".to_owned()]);
}

#[tokio::test]
async fn a_socket_made_anew_is_deregistered_and_registered_again() {
    let mut s = Setup::new("plugins-anew");
    let socket = s.plugin("d", CSI_PLUGIN, "");
    s.manager.reconcile().await.unwrap();
    s.calls();
    s.listeners.clear();
    std::fs::remove_file(&socket).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    s.plugin("d", CSI_PLUGIN, "");
    s.manager.reconcile().await.unwrap();
    assert_eq!(
        s.calls(),
        vec![
            "deregister d".to_owned(),
            format!("validate d {} [\"1.0.0\"]", socket.display()),
            "register d".into()
        ]
    );
}
