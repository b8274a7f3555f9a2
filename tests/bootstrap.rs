//! TLS bootstrap and client certificate rotation against the real cluster, as `kubeadm
//! join` does it: a node with only the bootstrap kubeconfig (`cluster.sh bootstrap-token`)
//! gets its client certificate through a CSR that kube-controller-manager approves and
//! signs, and runs as `system:node:<name>`; a node started with a short-lived certificate
//! and `--rotate-certificates` renews it before it expires and keeps heartbeating after.
//! A join whose CSR waits for a person's approval survives the agent's restart (same key,
//! same CSR) and the API server's. Each test uses a node of its own, and removes it, its
//! Lease and its CSRs.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::agent::AgentProcess;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};

const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// The tests' agents share containerd and its CNI configuration (an agent that stops
/// removes its shim's conflist, and the other node's runtime network goes not ready):
/// they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A test node's directory, and the clean-up of everything the test made for it.
struct TestNode {
    name: String,
    dir: PathBuf,
}

impl TestNode {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("rk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("test dir");
        Self {
            name: name.to_owned(),
            dir,
        }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubelet.conf")
    }

    fn cert_dir(&self) -> PathBuf {
        self.dir.join("pki")
    }

    fn start(&self, extra: &[&str]) -> AgentProcess {
        let cert_dir = self.cert_dir().display().to_string();
        let mut args = vec!["--cert-dir", &cert_dir];
        args.extend_from_slice(extra);
        AgentProcess::start_with_kubeconfig(
            &self.name,
            self.dir.join("root"),
            &self.kubeconfig(),
            &args,
        )
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        let name = self.name.clone();
        common::cleanup_blocking(move || async move {
            let admin = common::kube_client("admin.kubeconfig").await;
            let dp = DeleteParams::default();
            for csr in node_csrs(&admin, &name).await {
                let _ = Api::<CertificateSigningRequest>::all(admin.clone())
                    .delete(&csr.metadata.name.unwrap_or_default(), &dp)
                    .await;
            }
            let _ = Api::<Node>::all(admin.clone()).delete(&name, &dp).await;
            let _ = Api::<Lease>::namespaced(admin, "kube-node-lease")
                .delete(&name, &dp)
                .await;
        });
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The CSRs whose request names `system:node:<node>`.
async fn node_csrs(admin: &kube::Client, node: &str) -> Vec<CertificateSigningRequest> {
    let cn = format!("system:node:{node}");
    let all = Api::<CertificateSigningRequest>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("list CSRs");
    all.items
        .into_iter()
        .filter(|csr| {
            let pem = String::from_utf8_lossy(&csr.spec.request.0).into_owned();
            rcgen::CertificateSigningRequestParams::from_pem(&pem)
                .is_ok_and(|req| format!("{:?}", req.params.distinguished_name).contains(&cn))
        })
        .collect()
}

fn approved_and_issued(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.clone().unwrap_or_default();
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Approved" && c.status == "True")
        && status.certificate.is_some_and(|c| !c.0.is_empty())
}

/// Waits for the node to be Ready, and its Lease renewed after `after`.
async fn ready_and_heartbeating(
    admin: &kube::Client,
    node: &str,
    after: Timestamp,
    agent: &AgentProcess,
) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let what = format!(
        "node {node} Ready, its lease renewed after {after}; agent log:\n{}",
        agent.log_tail()
    );
    common::eventually(&what, Duration::from_secs(90), || async {
        let ready = nodes
            .get_opt(node)
            .await
            .ok()??
            .status?
            .conditions?
            .into_iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let renewed = leases.get_opt(node).await.ok()??.spec?.renew_time?.0;
        (ready && renewed > after).then_some(())
    })
    .await;
}

/// The serial, subject and end of validity of the first certificate in a PEM file.
fn serial_and_expiry(pem: &Path) -> (Vec<u8>, String, Timestamp) {
    let text = std::fs::read(pem).expect("certificate file");
    let (_, block) = x509_parser::pem::parse_x509_pem(&text).expect("PEM");
    let cert = block.parse_x509().expect("X.509");
    let not_after = Timestamp::from_second(cert.validity().not_after.timestamp()).expect("time");
    (
        cert.raw_serial().to_vec(),
        cert.subject().to_string(),
        not_after,
    )
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_node_with_only_a_bootstrap_token_gets_its_certificate_through_a_csr() {
    let _turn = ONE_AT_A_TIME.lock().await;
    common::cluster(&["bootstrap-token"]).await;
    let pki = common::state_dir().join("pki");
    let token = std::fs::read_to_string(pki.join("bootstrap-token")).unwrap();
    let token_id = token.trim().split('.').next().unwrap().to_owned();
    let admin = common::kube_client("admin.kubeconfig").await;
    let node = TestNode::new("rk-bootstrap");
    let bootstrap = pki
        .join("bootstrap-kubelet.kubeconfig")
        .display()
        .to_string();
    let started = Timestamp::now();
    let agent = node.start(&["--bootstrap-kubeconfig", &bootstrap]);
    ready_and_heartbeating(&admin, &node.name, started, &agent).await;

    // One CSR, by the bootstrap token's user, for the kubelet client signer, approved by
    // the controller-manager and signed.
    let csrs = node_csrs(&admin, &node.name).await;
    assert_eq!(csrs.len(), 1, "{csrs:?}");
    let csr = &csrs[0];
    assert!(
        csr.metadata
            .name
            .as_deref()
            .unwrap()
            .starts_with("node-csr-")
    );
    assert_eq!(csr.spec.signer_name, CLIENT_SIGNER);
    assert_eq!(
        csr.spec.username.as_deref(),
        Some(format!("system:bootstrap:{token_id}").as_str())
    );
    assert!(
        csr.spec
            .groups
            .iter()
            .flatten()
            .any(|g| g == "system:bootstrappers:kubeadm:default-node-token")
    );
    assert!(approved_and_issued(csr), "{csr:?}");
    let approval = csr.status.as_ref().unwrap().conditions.as_ref().unwrap();
    assert_eq!(approval[0].reason.as_deref(), Some("AutoApproved"));

    // The kubeconfig points at the current pem; the pem holds the node's identity.
    let current = node.cert_dir().join("kubelet-client-current.pem");
    let target = std::fs::read_link(&current).unwrap();
    assert!(
        target.to_str().unwrap().starts_with("kubelet-client-2"),
        "{target:?}"
    );
    let kubeconfig = std::fs::read_to_string(node.kubeconfig()).unwrap();
    assert!(
        kubeconfig.contains(current.to_str().unwrap()),
        "{kubeconfig}"
    );
    assert!(
        !kubeconfig.contains(token.trim()),
        "the token is not copied"
    );
    let (_, subject, _) = serial_and_expiry(&current);
    assert!(
        subject.contains(&format!("system:node:{}", node.name)) && subject.contains("system:nodes"),
        "{subject}"
    );

    // A restart reuses the certificate: no second CSR.
    agent.stop();
    let restarted = Timestamp::now();
    let agent = node.start(&["--bootstrap-kubeconfig", &bootstrap]);
    ready_and_heartbeating(&admin, &node.name, restarted, &agent).await;
    assert_eq!(node_csrs(&admin, &node.name).await.len(), 1);
    assert!(
        std::fs::read_to_string(&agent.log)
            .unwrap()
            .contains("kubeconfig exists and is valid, skipping bootstrap")
    );
    agent.stop();
}

/// A client certificate for `node` signed by the cluster CA, valid for `lifetime`, and
/// a kubeconfig naming it (as files). Returns the certificate's path.
fn short_lived_identity(node: &TestNode, lifetime: Duration) -> PathBuf {
    let pki = common::state_dir().join("pki");
    let ca_cert = std::fs::read_to_string(pki.join("ca.crt")).expect("short-lived identity");
    let ca_key = rcgen::KeyPair::from_pem(
        &std::fs::read_to_string(pki.join("ca.key")).expect("short-lived identity"),
    )
    .expect("short-lived identity");
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_cert, ca_key).expect("short-lived identity");
    let key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("short-lived identity");
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rkubelet::certificate::csr::node_subject(&node.name);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let now = std::time::SystemTime::now();
    params.not_before = now.into();
    params.not_after = (now + lifetime).into();
    params.serial_number = Some(rcgen::SerialNumber::from(vec![0x42, 0x17]));
    let cert = params
        .signed_by(&key, &issuer)
        .expect("short-lived identity");
    let pem = node.dir.join("short-lived.pem");
    std::fs::write(&pem, format!("{}{}", cert.pem(), key.serialize_pem()))
        .expect("short-lived identity");
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: rk\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority: {ca}\nusers:\n- name: node\n  user:\n    client-certificate: {pem}\n    client-key: {pem}\ncontexts:\n- name: node@rk\n  context:\n    cluster: rk\n    user: node\ncurrent-context: node@rk\n",
        ca = pki.join("ca.crt").display(),
        pem = pem.display(),
    );
    std::fs::write(node.kubeconfig(), kubeconfig).expect("short-lived identity");
    pem
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_short_lived_client_certificate_is_rotated_before_it_expires() {
    let _turn = ONE_AT_A_TIME.lock().await;
    common::cluster(&["bootstrap-token"]).await;
    let admin = common::kube_client("admin.kubeconfig").await;
    let node = TestNode::new("rk-rotate");
    let initial = short_lived_identity(&node, Duration::from_secs(75));
    let (initial_serial, _, initial_expiry) = serial_and_expiry(&initial);
    let started = Timestamp::now();
    let agent = node.start(&["--rotate-certificates"]);
    ready_and_heartbeating(&admin, &node.name, started, &agent).await;

    // Between 70 % and 90 % of the lifetime, a CSR by the node itself, auto-approved.
    let current = node.cert_dir().join("kubelet-client-current.pem");
    let what = format!(
        "a rotated certificate before {initial_expiry}; agent log:\n{}",
        agent.log_tail()
    );
    common::eventually(&what, Duration::from_secs(80), || async {
        current.exists().then_some(())
    })
    .await;
    let rotated_at = Timestamp::now();
    assert!(
        rotated_at < initial_expiry,
        "rotated at {rotated_at}, the old one ends {initial_expiry}"
    );
    let (serial, _, expiry) = serial_and_expiry(&current);
    assert_ne!(serial, initial_serial);
    assert!(expiry > initial_expiry + Duration::from_secs(3600));
    let csrs = node_csrs(&admin, &node.name).await;
    assert_eq!(csrs.len(), 1, "{csrs:?}");
    assert_eq!(csrs[0].spec.signer_name, CLIENT_SIGNER);
    assert_eq!(
        csrs[0].spec.username.as_deref(),
        Some(format!("system:node:{}", node.name).as_str())
    );
    assert!(approved_and_issued(&csrs[0]));

    // Past the old certificate's end, the node still heartbeats: its connections use the
    // new certificate.
    let wait = initial_expiry
        .duration_since(Timestamp::now())
        .as_secs_f64()
        .max(0.0)
        + 2.0;
    tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    ready_and_heartbeating(&admin, &node.name, Timestamp::now(), &agent).await;
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert!(
        log.contains("client certificate rotated"),
        "{}",
        agent.log_tail()
    );
    agent.stop();
}

/// A bootstrap token of its own whose holders may file node CSRs but get none approved
/// automatically (no `nodeclient` binding): its CSRs wait until [`approve`]. Removed on
/// drop with its binding.
struct ManualToken {
    id: String,
    kubeconfig: PathBuf,
}

const MANUAL_GROUP: &str = "system:bootstrappers:rk-manual-approval";

impl ManualToken {
    async fn new(admin: &kube::Client, node: &TestNode) -> Self {
        common::cluster(&["bootstrap-token"]).await;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos();
        let id = format!("{:06x}", nanos & 0xff_ffff);
        let secret = format!("{:016x}", (nanos >> 8) ^ u128::from(std::process::id()));
        let secret = &secret[secret.len() - 16..];
        let data = [
            ("token-id", id.as_str()),
            ("token-secret", secret),
            ("usage-bootstrap-authentication", "true"),
            ("auth-extra-groups", MANUAL_GROUP),
        ];
        Api::<Secret>::namespaced(admin.clone(), "kube-system")
            .create(
                &PostParams::default(),
                &Secret {
                    metadata: ObjectMeta {
                        name: Some(format!("bootstrap-token-{id}")),
                        ..ObjectMeta::default()
                    },
                    type_: Some("bootstrap.kubernetes.io/token".into()),
                    string_data: Some(
                        data.iter()
                            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                            .collect(),
                    ),
                    ..Secret::default()
                },
            )
            .await
            .expect("bootstrap token secret");
        Api::<ClusterRoleBinding>::all(admin.clone())
            .create(
                &PostParams::default(),
                &ClusterRoleBinding {
                    metadata: ObjectMeta {
                        name: Some(format!("rk-manual-bootstrap-{id}")),
                        ..ObjectMeta::default()
                    },
                    role_ref: RoleRef {
                        api_group: "rbac.authorization.k8s.io".into(),
                        kind: "ClusterRole".into(),
                        name: "system:node-bootstrapper".into(),
                    },
                    subjects: Some(vec![Subject {
                        api_group: Some("rbac.authorization.k8s.io".into()),
                        kind: "Group".into(),
                        name: MANUAL_GROUP.into(),
                        namespace: None,
                    }]),
                },
            )
            .await
            .expect("bootstrap binding");
        // The cluster's bootstrap kubeconfig, with this token.
        let pki = common::state_dir().join("pki");
        let text = std::fs::read_to_string(pki.join("bootstrap-kubelet.kubeconfig"))
            .expect("bootstrap kubeconfig");
        let token = std::fs::read_to_string(pki.join("bootstrap-token")).expect("token");
        assert!(
            text.contains(token.trim()),
            "the token is in the kubeconfig"
        );
        let kubeconfig = node.dir.join("bootstrap-manual.kubeconfig");
        std::fs::write(
            &kubeconfig,
            text.replace(token.trim(), &format!("{id}.{secret}")),
        )
        .expect("bootstrap kubeconfig");
        Self { id, kubeconfig }
    }

    fn arg(&self) -> String {
        self.kubeconfig.display().to_string()
    }
}

impl Drop for ManualToken {
    fn drop(&mut self) {
        let id = self.id.clone();
        common::cleanup_blocking(move || async move {
            let admin = common::kube_client("admin.kubeconfig").await;
            let dp = DeleteParams::default();
            let _ = Api::<Secret>::namespaced(admin.clone(), "kube-system")
                .delete(&format!("bootstrap-token-{id}"), &dp)
                .await;
            let _ = Api::<ClusterRoleBinding>::all(admin)
                .delete(&format!("rk-manual-bootstrap-{id}"), &dp)
                .await;
        });
    }
}

/// Approves the CSR `name` as `kubectl certificate approve` does, and waits until
/// kube-controller-manager has signed it.
async fn approve(admin: &kube::Client, name: &str) {
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let mut csr = csrs.get(name).await.expect("the CSR");
    csr.status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new)
        .push(CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some("RkTestApprove".into()),
            message: Some("approved by tests/bootstrap.rs".into()),
            ..CertificateSigningRequestCondition::default()
        });
    csrs.replace_subresource("approval", name, &PostParams::default(), &csr)
        .await
        .expect("approve the CSR");
    common::eventually(
        &format!("CSR {name} signed"),
        Duration::from_secs(30),
        || async { csrs.get(name).await.ok().filter(approved_and_issued) },
    )
    .await;
}

/// A join with a [`ManualToken`]: the agent started as node `name`, once it has filed its
/// CSR (not approved), whose name comes last.
struct ManualJoin {
    admin: kube::Client,
    agent: AgentProcess,
    token: ManualToken,
    node: TestNode,
    csr: String,
}

impl ManualJoin {
    async fn start(name: &str) -> Self {
        let admin = common::kube_client("admin.kubeconfig").await;
        let node = TestNode::new(name);
        let token = ManualToken::new(&admin, &node).await;
        let agent = node.start(&["--bootstrap-kubeconfig", &token.arg()]);
        let csr = filed_csr(&admin, &node, &agent).await;
        Self {
            admin,
            agent,
            token,
            node,
            csr,
        }
    }
}

/// Waits for the node's one CSR, filed by the agent and not approved; returns its name.
async fn filed_csr(admin: &kube::Client, node: &TestNode, agent: &AgentProcess) -> String {
    let what = format!("a CSR for {}; agent log:\n{}", node.name, agent.log_tail());
    let csr = common::eventually(&what, Duration::from_secs(60), || async {
        node_csrs(admin, &node.name).await.into_iter().next()
    })
    .await;
    assert!(!approved_and_issued(&csr), "nobody approves it: {csr:?}");
    csr.metadata.name.expect("named")
}

/// The subject public key info of the first certificate in a PEM file.
fn certificate_key(pem: &Path) -> Vec<u8> {
    let text = std::fs::read(pem).expect("certificate file");
    let (_, block) = x509_parser::pem::parse_x509_pem(&text).expect("PEM");
    block.parse_x509().expect("X.509").public_key().raw.to_vec()
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_restarted_join_reuses_its_key_and_picks_up_the_csr_approved_meanwhile() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ManualJoin {
        admin,
        node,
        token,
        agent,
        csr: name,
    } = ManualJoin::start("rk-bootstrap-restart").await;

    // The key waits under the cert dir, readable by the owner only.
    let key_file = node.cert_dir().join("kubelet-client.key.tmp");
    let key_pem = std::fs::read_to_string(&key_file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; agent log:\n{}",
            key_file.display(),
            agent.log_tail()
        )
    });
    let mode = std::fs::metadata(&key_file)
        .expect("key file")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    let key = rcgen::KeyPair::from_pem(&key_pem).expect("a private key");

    // Stopped before approval; approved while it is down.
    agent.stop();
    approve(&admin, &name).await;

    let restarted = Timestamp::now();
    let agent = node.start(&["--bootstrap-kubeconfig", &token.arg()]);
    ready_and_heartbeating(&admin, &node.name, restarted, &agent).await;
    let csrs = node_csrs(&admin, &node.name).await;
    assert_eq!(
        csrs.iter()
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect::<Vec<_>>(),
        [name],
        "the same CSR, no second one"
    );
    let current = node.cert_dir().join("kubelet-client-current.pem");
    assert_eq!(
        certificate_key(&current),
        rcgen::PublicKeyData::subject_public_key_info(&key),
        "the certificate is for the kept key"
    );
    assert!(!key_file.exists(), "the waiting key is removed once stored");
    agent.stop();
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn an_api_server_restart_during_the_wait_does_not_end_the_join() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ManualJoin {
        admin,
        node,
        token: _token,
        mut agent,
        csr: name,
    } = ManualJoin::start("rk-bootstrap-outage").await;

    common::cluster(&["stop", "kube-apiserver"]).await;
    // Long enough for the agent's watch to break and a few reads to fail.
    let outage = agent.exited(Duration::from_secs(5)).await;
    common::cluster(&["start", "kube-apiserver"]).await;
    assert!(
        outage.is_none(),
        "the agent ended ({outage:?}) while the API server was down; log:\n{}",
        agent.log_tail()
    );

    let approved = Timestamp::now();
    approve(&admin, &name).await;
    ready_and_heartbeating(&admin, &node.name, approved, &agent).await;
    assert_eq!(node_csrs(&admin, &node.name).await.len(), 1);
    let log = std::fs::read_to_string(&agent.log).expect("agent log");
    assert!(
        log.contains("waiting for the certificate signing request; retrying"),
        "the outage was seen and ridden out:\n{}",
        agent.log_tail()
    );
    agent.stop();
}
