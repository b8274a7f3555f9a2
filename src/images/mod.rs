//! The image manager: makes sure a container's image is present before it is created,
//! honouring `imagePullPolicy`, with a back-off per pod and image after failed pulls, and
//! one pull at a time per image (pods that need the same image wait for the same pull).
//! A pull uses the pod's image pull secrets: each credential that matches the image's
//! repository is tried in turn (the kubelet's `PullImage`), else the pull is anonymous.
//! A reference that does not parse ([`crate::image_reference`]) never reaches the runtime.
//! Knows no pod worker, runtime manager (`kuberuntime`), volume or API cache.

pub mod gc;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Secret};

use crate::backoff::Backoff;
use crate::credentialprovider::{Keyring, repository};
use crate::cri::{Cri, api};
use crate::events::{EventRecorder, Involved};
use crate::pod::PodId;

/// Why an image is not there (the kubelet's waiting reasons).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    /// The pull failed just now: the runtime's error.
    #[error("{0}")]
    Pull(String),
    /// A pull failed before and the back-off has not passed.
    #[error("Back-off pulling image {0:?}")]
    BackOff(String),
    /// The policy is Never and the image is absent.
    #[error("Container image {0:?} is not present with pull policy of Never")]
    NeverPull(String),
    /// The container has no image.
    #[error("container has no image")]
    Missing,
    /// The reference does not parse: the kubelet's whole message.
    #[error("{0}")]
    InvalidName(String),
}

impl ImageError {
    /// The waiting reason shown in the container's status.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Pull(_) => "ErrImagePull",
            Self::BackOff(_) => "ImagePullBackOff",
            Self::NeverPull(_) => "ErrImageNeverPull",
            Self::Missing | Self::InvalidName(_) => "InvalidImageName",
        }
    }
}

/// The pull policy of a container: the spec's, else the API default (Always for `:latest`
/// or no tag, IfNotPresent otherwise).
#[must_use]
pub fn pull_policy(container: &Container) -> &str {
    if let Some(policy) = container.image_pull_policy.as_deref() {
        return policy;
    }
    crate::image_reference::default_pull_policy(container.image.as_deref().unwrap_or_default())
}

/// Pulls images for containers.
#[derive(Debug, Default)]
pub struct ImageManager {
    backoff: Mutex<HashMap<(String, String), Backoff>>,
    in_flight: crate::lock::KeyedTurns<String>,
}

impl ImageManager {
    /// The policy's verdict on the image already on the machine: the image as the runtime
    /// describes it (its reference is its id; its user is what the container runs as
    /// unless the pod names one) when it can be used as it is, `None` when it must be
    /// pulled ([`Self::pull`]).
    ///
    /// # Errors
    /// The waiting reason when the image cannot be used (no image; Never and absent).
    pub async fn present<C: Cri>(
        &self,
        cri: &C,
        pod: &PodId,
        (container, name): (&Container, Involved<'_>),
        events: &EventRecorder,
    ) -> Result<Option<api::Image>, ImageError> {
        let image = image_of(container)?;
        if let Err(e) = crate::image_reference::validate(&image) {
            let message = format!(
                "Failed to apply default image tag {image:?}: couldn't parse image reference {image:?}: {e}"
            );
            events.warning(pod, name, "InspectFailed", message.clone());
            return Err(ImageError::InvalidName(message));
        }
        let policy = pull_policy(container);
        if policy == "Always" {
            return Ok(None);
        }
        if let Some(present) = image_status(cri, &image).await {
            events.normal(
                pod,
                name,
                "Pulled",
                format!("Container image {image:?} already present on machine"),
            );
            return Ok(Some(present));
        }
        if policy == "Never" {
            events.warning(
                pod,
                name,
                "ErrImageNeverPull",
                format!("Container image {image:?} is not present with pull policy of Never"),
            );
            return Err(ImageError::NeverPull(image));
        }
        Ok(None)
    }

    /// Pulls the container's image with the pod's pull secrets, unless a failed pull
    /// backs off; returns the runtime's image reference. One pull per image at a time:
    /// with IfNotPresent, pods that waited for another pod's pull use the image it
    /// brought.
    ///
    /// # Errors
    /// The waiting reason when the image is not there.
    pub async fn pull<C: Cri>(
        &self,
        cri: &C,
        pod: &PodId,
        (container, name): (&Container, Involved<'_>),
        pull_secrets: &[Secret],
        events: &EventRecorder,
    ) -> Result<String, ImageError> {
        let image = image_of(container)?;
        let key = (pod.uid.clone(), image.clone());
        if self
            .lock_backoff()
            .get(&key)
            .is_some_and(|b| b.waiting(Instant::now()))
        {
            events.normal(
                pod,
                name,
                "BackOff",
                format!("Back-off pulling image {image:?}"),
            );
            return Err(ImageError::BackOff(image));
        }
        self.one_at_a_time(&image, async {
            if let Some(present) = self.present(cri, pod, (container, name), events).await? {
                return Ok(present.id);
            }
            events.normal(pod, name, "Pulling", format!("Pulling image {image:?}"));
            let started = Instant::now();
            match pull_with_secrets(cri, &image, pull_secrets).await {
                Ok(image_ref) => {
                    self.lock_backoff().remove(&key);
                    events.normal(
                        pod,
                        name,
                        "Pulled",
                        format!(
                            "Successfully pulled image {image:?} in {:.3}s",
                            started.elapsed().as_secs_f64()
                        ),
                    );
                    Ok(image_ref)
                }
                Err(error) => {
                    self.lock_backoff()
                        .entry(key)
                        .or_insert_with(|| Backoff::new(IMAGE_BACKOFF.0, IMAGE_BACKOFF.1))
                        .failed(Instant::now());
                    let message = format!("Failed to pull image {image:?}: {error}");
                    events.warning(pod, name, "Failed", message);
                    Err(ImageError::Pull(error))
                }
            }
        })
        .await
    }

    /// Runs `pull` when no other pull of `image` runs; the image's turn is forgotten with
    /// its last pull (images come and go: a missing image per pod would otherwise keep a
    /// turn each).
    async fn one_at_a_time<T>(&self, image: &str, pull: impl Future<Output = T>) -> T {
        let _turn = self.in_flight.acquire(image.to_owned()).await;
        pull.await
    }

    /// Forgets the back-off state of a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        self.lock_backoff().retain(|(pod, _), _| pod != uid);
    }

    /// Whether a back-off of the pod is kept.
    #[must_use]
    pub fn holds_pod(&self, uid: &str) -> bool {
        self.lock_backoff().keys().any(|(pod, _)| pod == uid)
    }

    fn lock_backoff(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Backoff>> {
        crate::lock::lock(&self.backoff)
    }
}

/// The kubelet's `PullImage`: without credentials when none matches the image's
/// repository, else with each matching one in turn until a pull succeeds. The error is
/// the runtime's, or the errors of every try (Go's aggregate: `[a, b]`, repeats left out).
async fn pull_with_secrets<C: Cri>(
    cri: &C,
    image: &str,
    pull_secrets: &[Secret],
) -> Result<String, String> {
    let keyring = Keyring::from_secrets(pull_secrets).map_err(|e| e.to_string())?;
    let creds = keyring.lookup(&repository(image));
    let pull = |auth: Option<api::AuthConfig>| {
        cri.pull_image(api::PullImageRequest {
            image: Some(image_spec(image)),
            auth,
            sandbox_config: None,
        })
    };
    if creds.is_empty() {
        tracing::debug!(image, "pulling image without credentials");
        return pull(None)
            .await
            .map(|r| r.image_ref)
            .map_err(|e| e.grpc_error());
    }
    let mut errors: Vec<String> = Vec::new();
    for cred in creds {
        let auth = api::AuthConfig {
            username: cred.username,
            password: cred.password,
            ..Default::default()
        };
        match pull(Some(auth)).await {
            Ok(resp) => return Ok(resp.image_ref),
            Err(e) => {
                let message = e.grpc_error();
                if !errors.contains(&message) {
                    errors.push(message);
                }
            }
        }
    }
    Err(match errors.as_slice() {
        [one] => one.clone(),
        all => format!("[{}]", all.join(", ")),
    })
}

fn image_of(container: &Container) -> Result<String, ImageError> {
    container
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .ok_or(ImageError::Missing)
}

fn image_spec(image: &str) -> api::ImageSpec {
    api::ImageSpec {
        image: image.to_owned(),
        ..Default::default()
    }
}

/// The image as the runtime has it, if it has it.
async fn image_status<C: Cri>(cri: &C, image: &str) -> Option<api::Image> {
    cri.image_status(api::ImageStatusRequest {
        image: Some(image_spec(image)),
        verbose: false,
    })
    .await
    .ok()
    .and_then(|s| s.image)
}

/// How long a failed pull waits at first, and at most (the kubelet's 10 s and 300 s).
pub const IMAGE_BACKOFF: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(300));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::{CriError, Result as CriResult};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct FakeImages {
        present: Mutex<Vec<String>>,
        fail: bool,
        pulls: AtomicUsize,
        /// When set, a pull needs this password.
        password: Option<&'static str>,
        /// The user names of the pulls, in order (`""` without credentials).
        users: Mutex<Vec<String>>,
    }

    impl Cri for FakeImages {
        async fn image_status(
            &self,
            req: api::ImageStatusRequest,
        ) -> CriResult<api::ImageStatusResponse> {
            let name = req.image.unwrap().image;
            let present = self.present.lock().unwrap().contains(&name);
            Ok(api::ImageStatusResponse {
                image: present.then(|| api::Image {
                    id: format!("sha256:{name}"),
                    ..Default::default()
                }),
                info: HashMap::new(),
            })
        }

        async fn pull_image(
            &self,
            req: api::PullImageRequest,
        ) -> CriResult<api::PullImageResponse> {
            self.pulls.fetch_add(1, Ordering::SeqCst);
            // A pull takes time: other pods' syncs run meanwhile.
            tokio::time::sleep(Duration::from_millis(10)).await;
            let name = req.image.unwrap().image;
            let auth = req.auth.unwrap_or_default();
            self.users.lock().unwrap().push(auth.username);
            if let Some(password) = self.password
                && auth.password != password
            {
                return Err(CriError::Rpc {
                    rpc: "PullImage",
                    code: tonic::Code::Unknown,
                    message: "401 Unauthorized".into(),
                });
            }
            if self.fail {
                return Err(CriError::Rpc {
                    rpc: "PullImage",
                    code: tonic::Code::NotFound,
                    message: "not found".into(),
                });
            }
            self.present.lock().unwrap().push(name.clone());
            Ok(api::PullImageResponse {
                image_ref: format!("sha256:{name}"),
            })
        }
    }

    fn container(image: &str, policy: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(Into::into),
            ..Default::default()
        }
    }

    /// What the runtime manager does: the present image, else a pull.
    async fn ensure(
        images: &ImageManager,
        cri: &FakeImages,
        container: &Container,
        events: &EventRecorder,
    ) -> Result<String, ImageError> {
        match images
            .present(
                cri,
                &pod(),
                (container, Involved::Container(&container.name)),
                events,
            )
            .await?
        {
            Some(found) => Ok(found.id),
            None => {
                images
                    .pull(
                        cri,
                        &pod(),
                        (container, Involved::Container(&container.name)),
                        &[],
                        events,
                    )
                    .await
            }
        }
    }

    fn pod() -> PodId {
        PodId {
            uid: "u".into(),
            namespace: "default".into(),
            name: "p".into(),
        }
    }

    #[test]
    fn default_policies_follow_the_tag() {
        assert_eq!(pull_policy(&container("nginx", None)), "Always");
        assert_eq!(pull_policy(&container("nginx:latest", None)), "Always");
        assert_eq!(
            pull_policy(&container("127.0.0.1:5000/x/nginx:1.22", None)),
            "IfNotPresent"
        );
        assert_eq!(
            pull_policy(&container("127.0.0.1:5000/nginx", None)),
            "Always"
        );
        assert_eq!(
            pull_policy(&container("nginx@sha256:ab", None)),
            "IfNotPresent"
        );
        assert_eq!(pull_policy(&container("nginx", Some("Never"))), "Never");
    }

    #[tokio::test]
    async fn a_reference_that_does_not_parse_never_reaches_the_runtime() {
        let cri = FakeImages::default();
        let (events, mut rx) = EventRecorder::channel();
        let images = ImageManager::default();
        let got = ensure(&images, &cri, &container("Busybox:1", None), &events).await;
        let message = "Failed to apply default image tag \"Busybox:1\": couldn't parse image reference \"Busybox:1\": invalid reference format: repository name must be lowercase";
        assert_eq!(got, Err(ImageError::InvalidName(message.into())));
        assert_eq!(got.unwrap_err().reason(), "InvalidImageName");
        assert_eq!(cri.pulls.load(Ordering::SeqCst), 0);
        let event = rx.recv().await.unwrap();
        assert_eq!(event.reason, "InspectFailed");
        assert_eq!(event.message, message);
    }

    #[tokio::test]
    async fn if_not_present_skips_the_pull_and_always_pulls() {
        let cri = FakeImages::default();
        cri.present.lock().unwrap().push("nginx:1".into());
        let (events, mut rx) = EventRecorder::channel();
        let images = ImageManager::default();
        let id = ensure(&images, &cri, &container("nginx:1", None), &events)
            .await
            .unwrap();
        assert_eq!(id, "sha256:nginx:1");
        assert_eq!(cri.pulls.load(Ordering::SeqCst), 0);
        assert_eq!(rx.recv().await.unwrap().reason, "Pulled");
        ensure(
            &images,
            &cri,
            &container("nginx:1", Some("Always")),
            &events,
        )
        .await
        .unwrap();
        assert_eq!(cri.pulls.load(Ordering::SeqCst), 1);
        let reasons: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e.reason)
            .collect();
        assert_eq!(reasons, ["Pulling", "Pulled"]);
    }

    #[tokio::test]
    async fn pods_waiting_for_the_same_pull_use_its_image() {
        let cri = FakeImages::default();
        let (events, mut rx) = EventRecorder::channel();
        let images = ImageManager::default();
        let c = container("busybox:1", None);
        let all = futures::future::join_all((0..5).map(|_| ensure(&images, &cri, &c, &events)));
        for id in all.await {
            assert_eq!(id.unwrap(), "sha256:busybox:1");
        }
        assert_eq!(
            cri.pulls.load(Ordering::SeqCst),
            1,
            "one pull for five pods"
        );
        let reasons: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e.reason)
            .collect();
        assert_eq!(reasons.iter().filter(|r| **r == "Pulling").count(), 1);
        assert_eq!(reasons.iter().filter(|r| **r == "Pulled").count(), 5);
        assert!(
            images.in_flight.is_empty(),
            "the image's gate goes with its last pull"
        );
    }

    fn pull_secret(name: &str, registry: &str, user: &str, password: &str) -> Secret {
        let config =
            serde_json::json!({"auths": {registry: {"username": user, "password": password}}});
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            type_: Some(crate::credentialprovider::DOCKER_CONFIG_JSON.into()),
            data: Some(
                [(
                    ".dockerconfigjson".to_owned(),
                    k8s_openapi::ByteString(config.to_string().into_bytes()),
                )]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn pull_secrets_are_tried_in_turn_and_all_failures_are_reported() {
        let cri = FakeImages {
            password: Some("right"),
            ..Default::default()
        };
        let (events, _rx) = EventRecorder::channel();
        let images = ImageManager::default();
        let c = container("127.0.0.1:5001/private/busybox:1.35", None);
        let secrets = [
            pull_secret("a", "127.0.0.1:5001/private", "first", "wrong"),
            pull_secret("b", "127.0.0.1:5001", "second", "right"),
            pull_secret("other", "127.0.0.1:5000", "third", "right"),
        ];
        let pulled = images
            .pull(
                &cri,
                &pod(),
                (&c, Involved::Container("c")),
                &secrets,
                &events,
            )
            .await;
        assert_eq!(
            pulled.unwrap(),
            "sha256:127.0.0.1:5001/private/busybox:1.35"
        );
        assert_eq!(*cri.users.lock().unwrap(), ["first", "second"]);

        let cri = FakeImages {
            password: Some("right"),
            ..Default::default()
        };
        let wrong = [
            pull_secret("a", "127.0.0.1:5001/private", "first", "wrong"),
            pull_secret("b", "127.0.0.1:5001", "second", "wrong"),
        ];
        let failed = images
            .pull(
                &cri,
                &pod(),
                (&c, Involved::Container("c")),
                &wrong,
                &events,
            )
            .await
            .unwrap_err();
        assert_eq!(failed.reason(), "ErrImagePull");
        assert_eq!(
            failed.to_string(),
            "rpc error: code = Unknown desc = 401 Unauthorized",
            "one message for the same error twice, as Go's aggregate"
        );
        let anonymous = FakeImages::default();
        images
            .pull(
                &anonymous,
                &pod(),
                (&container("busybox:1", None), Involved::Container("c")),
                &wrong,
                &events,
            )
            .await
            .unwrap();
        assert_eq!(
            *anonymous.users.lock().unwrap(),
            [""],
            "no secret matches docker.io"
        );
    }

    #[tokio::test]
    async fn a_failed_pull_backs_off_then_never_pull_is_refused() {
        let cri = FakeImages {
            fail: true,
            ..Default::default()
        };
        let (events, mut rx) = EventRecorder::channel();
        let images = ImageManager::default();
        let first = ensure(&images, &cri, &container("missing:1", None), &events)
            .await
            .unwrap_err();
        assert_eq!(first.reason(), "ErrImagePull");
        let second = ensure(&images, &cri, &container("missing:1", None), &events)
            .await
            .unwrap_err();
        assert_eq!(second.reason(), "ImagePullBackOff");
        assert_eq!(
            cri.pulls.load(Ordering::SeqCst),
            1,
            "no second pull during back-off"
        );
        let reasons: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| (e.reason.into_owned(), e.warning))
            .collect();
        assert_eq!(
            reasons,
            [
                ("Pulling".to_owned(), false),
                ("Failed".to_owned(), true),
                ("BackOff".to_owned(), false)
            ]
        );
        let never = ensure(
            &images,
            &cri,
            &container("missing:2", Some("Never")),
            &events,
        )
        .await
        .unwrap_err();
        assert_eq!(never.reason(), "ErrImageNeverPull");
        images.forget_pod("u");
        assert!(images.lock_backoff().is_empty());
        assert!(images.in_flight.is_empty(), "no gate per missing image");
    }
}
