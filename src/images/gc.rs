//! The image garbage collector (the kubelet's `image_gc_manager.go`), run every five
//! minutes: when the image filesystem is used at `--image-gc-high-threshold` percent or
//! more, unused images are removed, least recently used first (then first detected first),
//! until usage is down to `--image-gc-low-threshold`. An image used by any container
//! (running or not) or a sandbox (pause) image — `--pod-infra-container-image` and the
//! runtime's own — is never removed, nor one first seen less than
//! `--minimum-image-ttl-duration` ago: the images present at the agent's first successful
//! look count as seen long ago, every later one from when it was first seen.
//! [`ImageGc::delete_unused_images`] is what an eviction manager calls to reclaim disk.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::Mutex;

use crate::cri::{Cri, CriError, api};
use crate::node::{ContainerRuntime, FsStats, LinuxMachine, MachineInfo};

/// How often the collector runs (the kubelet's `ImageGCPeriod`).
pub const IMAGE_GC_PERIOD: Duration = Duration::from_secs(300);

/// The kubelet v1.20's default `--pod-infra-container-image`.
pub const DEFAULT_POD_SANDBOX_IMAGE: &str = "k8s.gcr.io/pause:3.2";

/// Why image garbage collection failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    /// The policy's flags are out of range.
    #[error("invalid configuration: {0}")]
    InvalidPolicy(String),
    /// A runtime call failed.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// The runtime reported no image filesystem.
    #[error("the runtime reported no image filesystem")]
    NoImageFs,
    /// The runtime's verbose status does not name its sandbox image.
    #[error("the runtime's status names no sandbox image: {0}")]
    NoSandboxImage(String),
    /// The image filesystem could not be measured.
    #[error("image filesystem: {0}")]
    Statvfs(#[from] crate::node::MachineError),
    /// The task measuring it did not finish.
    #[error("image filesystem: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The image filesystem has no size.
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    /// Not enough unused images to reach the low threshold (event `FreeDiskSpaceFailed`).
    #[error(
        "failed to garbage collect required amount of images. Wanted to free {wanted} bytes, but freed {freed} bytes"
    )]
    FreeDiskSpaceFailed {
        /// Bytes to free.
        wanted: u64,
        /// Bytes freed.
        freed: u64,
    },
    /// Some removals failed.
    #[error(
        "wanted to free {wanted} bytes, but freed {freed} bytes space with errors in image deletion: {errors}"
    )]
    Deletion {
        /// Bytes to free.
        wanted: u64,
        /// Bytes freed.
        freed: u64,
        /// The runtime's errors.
        errors: String,
    },
}

/// When to collect, and what is too young to collect (the kubelet's `ImageGCPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// Usage (percent) at which collection starts; 100 disables it.
    pub high_threshold_percent: u8,
    /// Usage (percent) collection brings the filesystem down to.
    pub low_threshold_percent: u8,
    /// An image first seen less than this ago is kept.
    pub min_age: Duration,
}

impl ImageGcPolicy {
    /// The policy from the flags, checked as the kubelet checks its configuration.
    ///
    /// # Errors
    /// A threshold outside 0–100, or low above high, with the kubelet's message.
    pub fn new(high: i32, low: i32, min_age: Duration) -> Result<Self, ImageGcError> {
        let percent = |value: i32, field: &str, flag: &str| {
            u8::try_from(value)
                .ok()
                .filter(|v| *v <= 100)
                .ok_or_else(|| {
                    ImageGcError::InvalidPolicy(format!(
                        "{field} (--{flag}) {value} must be between 0 and 100, inclusive"
                    ))
                })
        };
        let high_threshold_percent = percent(
            high,
            "imageGCHighThresholdPercent",
            "image-gc-high-threshold",
        )?;
        let low_threshold_percent =
            percent(low, "imageGCLowThresholdPercent", "image-gc-low-threshold")?;
        if low_threshold_percent > high_threshold_percent {
            return Err(ImageGcError::InvalidPolicy(format!(
                "imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {high}"
            )));
        }
        Ok(Self {
            high_threshold_percent,
            low_threshold_percent,
            min_age,
        })
    }

    /// Collection runs unless the high threshold is 100.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.high_threshold_percent < 100
    }

    /// The bytes to free for `fs` (`GarbageCollect`): `None` below the high threshold.
    ///
    /// # Errors
    /// [`ImageGcError::InvalidCapacity`] for a filesystem of size 0.
    pub fn to_free(&self, fs: &FsStats) -> Result<Option<u64>, ImageGcError> {
        let capacity = u128::from(fs.capacity_bytes);
        if capacity == 0 {
            return Err(ImageGcError::InvalidCapacity);
        }
        let available = u128::from(fs.available_bytes).min(capacity);
        let usage = 100 - available * 100 / capacity;
        if usage < u128::from(self.high_threshold_percent) {
            return Ok(None);
        }
        let target = capacity * u128::from(100 - self.low_threshold_percent) / 100;
        let wanted = u64::try_from(target.saturating_sub(available)).unwrap_or(u64::MAX);
        tracing::info!(
            usage_percent = %usage,
            high = self.high_threshold_percent,
            low = self.low_threshold_percent,
            bytes = wanted,
            "Disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
        );
        Ok(Some(wanted))
    }
}

impl Default for ImageGcPolicy {
    /// The kubelet's defaults: 85 %, 80 %, two minutes.
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
        }
    }
}

/// What the collector knows of an image (`imageRecord`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    /// When first seen; the epoch for the images there at the first detection.
    first_detected: SystemTime,
    /// When last seen in use; the epoch for never.
    last_used: SystemTime,
    size: u64,
}

/// The unused images to remove, in order, to free `wanted` bytes at `now`
/// (`freeSpace`): least recently used first, then first detected first; none younger
/// than `min_age`; at least one image is taken whenever one is eligible.
fn select_images(
    records: &HashMap<String, Record>,
    in_use: &HashSet<String>,
    min_age: Duration,
    now: SystemTime,
    wanted: u64,
) -> Vec<(String, u64)> {
    let mut candidates: Vec<(&String, &Record)> = records
        .iter()
        .filter(|(id, r)| {
            !in_use.contains(*id)
                && r.last_used < now
                && now.duration_since(r.first_detected).unwrap_or_default() >= min_age
        })
        .collect();
    candidates.sort_by_key(|(id, r)| (r.last_used, r.first_detected, *id));
    let mut chosen = Vec::new();
    let mut freed = 0u64;
    for (id, r) in candidates {
        chosen.push((id.clone(), r.size));
        freed = freed.saturating_add(r.size);
        if freed >= wanted {
            break;
        }
    }
    chosen
}

/// The image filesystem's usage (the kubelet's `ImageFsStats`).
pub trait ImageFs: Send + Sync + 'static {
    /// Capacity and available bytes of the filesystem holding the runtime's images.
    fn usage(&self) -> impl Future<Output = Result<FsStats, ImageGcError>> + Send;
}

/// The runtime's image filesystem: the mount point CRI `ImageFsInfo` names, measured by
/// `statvfs`.
pub struct RuntimeImageFs<C> {
    cri: Arc<C>,
}

impl<C> RuntimeImageFs<C> {
    /// The image filesystem of the runtime behind `cri`.
    pub fn new(cri: Arc<C>) -> Self {
        Self { cri }
    }
}

impl<C: Cri> ImageFs for RuntimeImageFs<C> {
    async fn usage(&self) -> Result<FsStats, ImageGcError> {
        let mountpoint = ContainerRuntime::image_fs_mountpoint(&*self.cri)
            .await?
            .ok_or(ImageGcError::NoImageFs)?;
        Ok(tokio::task::spawn_blocking(move || LinuxMachine.fs_stats(&mountpoint)).await??)
    }
}

/// Under disk pressure the eviction manager frees what image GC can before it evicts pods
/// (the kubelet's `DeleteUnusedImages` as a node-level reclaim function).
impl<C: Cri, F: ImageFs> crate::eviction::NodeReclaimer for Arc<ImageGc<C, F>> {
    async fn reclaim(&self, signal: crate::eviction::Signal) {
        match self.delete_unused_images().await {
            Ok(freed) => tracing::info!(freed, signal = signal.name(), "image GC freed disk"),
            Err(e) => {
                tracing::warn!(error = %e, signal = signal.name(), "image GC could not free disk");
            }
        }
    }
}

/// The collector: its records of images survive between runs.
pub struct ImageGc<C, F> {
    cri: Arc<C>,
    fs: F,
    policy: ImageGcPolicy,
    /// `--pod-infra-container-image`.
    sandbox_image: String,
    records: Mutex<HashMap<String, Record>>,
    /// Whether a detection has succeeded (the kubelet's `initialized`).
    initialized: AtomicBool,
}

impl<C: Cri, F: ImageFs> ImageGc<C, F> {
    /// A collector applying `policy` to the images of `cri` on `fs`, never removing
    /// `sandbox_image` (`--pod-infra-container-image`) nor the runtime's own sandbox image.
    pub fn new(cri: Arc<C>, fs: F, policy: ImageGcPolicy, sandbox_image: String) -> Self {
        Self {
            cri,
            fs,
            policy,
            sandbox_image,
            records: Mutex::new(HashMap::new()),
            initialized: AtomicBool::new(false),
        }
    }

    /// The sandbox image the runtime itself uses, from its verbose status (containerd's
    /// `config.sandboxImage`).
    async fn runtime_sandbox_image(&self) -> Result<String, ImageGcError> {
        let status = self
            .cri
            .status(api::StatusRequest { verbose: true })
            .await?;
        let config = status
            .info
            .get("config")
            .ok_or_else(|| ImageGcError::NoSandboxImage("no \"config\" in its info".into()))?;
        let config: serde_json::Value = serde_json::from_str(config)
            .map_err(|e| ImageGcError::NoSandboxImage(format!("\"config\" is not JSON: {e}")))?;
        config
            .get("sandboxImage")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| ImageGcError::NoSandboxImage("no \"sandboxImage\" in its config".into()))
    }

    /// The ids of the sandbox images present, counted as in use (the kubelet's
    /// `GetImageRef(sandboxImage)`): `--pod-infra-container-image` by name, and the
    /// runtime's own (a runtime that does not name it is logged, the configured one is
    /// still kept).
    async fn sandbox_image_ids(&self) -> Vec<String> {
        let mut names = vec![self.sandbox_image.clone()];
        match self.runtime_sandbox_image().await {
            Ok(name) => names.push(name),
            Err(e) => tracing::warn!(
                error = %e,
                image = %self.sandbox_image,
                "image GC protects only --pod-infra-container-image"
            ),
        }
        let mut ids = Vec::new();
        for image in names {
            let req = api::ImageStatusRequest {
                image: Some(api::ImageSpec {
                    image,
                    ..Default::default()
                }),
                verbose: false,
            };
            if let Ok(Some(found)) = self.cri.image_status(req).await.map(|r| r.image) {
                ids.push(found.id);
            }
        }
        ids
    }

    /// The kubelet's image monitoring (`Start`, every [`IMAGE_GC_PERIOD`]): the first
    /// detection that succeeds takes the images present as first seen at an unknown time
    /// long ago (the epoch), every later one takes new images as first seen now.
    async fn monitor(&self) {
        let now = SystemTime::now();
        let first_detected = if self.initialized.load(Ordering::Acquire) {
            now
        } else {
            SystemTime::UNIX_EPOCH
        };
        match self.detect(now, first_detected).await {
            Ok(_) => self.initialized.store(true, Ordering::Release),
            Err(e) => tracing::warn!(error = %e, "Failed to monitor images"),
        }
    }

    /// Updates the records from the runtime at `now` (`detectImages`), new images taken as
    /// first seen at `first_detected`; answers the ids of the images in use.
    async fn detect(
        &self,
        now: SystemTime,
        first_detected: SystemTime,
    ) -> Result<HashSet<String>, ImageGcError> {
        let images = self
            .cri
            .list_images(api::ListImagesRequest { filter: None })
            .await?;
        let containers = self
            .cri
            .list_containers(api::ListContainersRequest { filter: None })
            .await?;
        let mut in_use: HashSet<String> = containers
            .containers
            .into_iter()
            .map(|c| c.image_ref)
            .collect();
        in_use.extend(self.sandbox_image_ids().await);
        let mut records = self.records.lock().await;
        let present: HashSet<&str> = images.images.iter().map(|i| i.id.as_str()).collect();
        records.retain(|id, _| present.contains(id.as_str()));
        for image in &images.images {
            let record = records.entry(image.id.clone()).or_insert(Record {
                first_detected,
                last_used: SystemTime::UNIX_EPOCH,
                size: 0,
            });
            record.size = image.size;
            if in_use.contains(&image.id) {
                record.last_used = now;
            }
        }
        Ok(in_use)
    }

    /// Removes unused images until `wanted` bytes are freed (`freeSpace`); answers the
    /// bytes freed.
    ///
    /// # Errors
    /// The runtime could not be read, or a removal failed.
    async fn free_space(&self, wanted: u64) -> Result<u64, ImageGcError> {
        let now = SystemTime::now();
        let in_use = self.detect(now, now).await?;
        let chosen = {
            let records = self.records.lock().await;
            select_images(&records, &in_use, self.policy.min_age, now, wanted)
        };
        let mut freed = 0u64;
        let mut errors = Vec::new();
        for (id, size) in chosen {
            tracing::info!(image = %id, bytes = size, "Removing image to free bytes");
            let req = api::RemoveImageRequest {
                image: Some(api::ImageSpec {
                    image: id.clone(),
                    ..Default::default()
                }),
            };
            match self.cri.remove_image(req).await {
                Ok(_) => {
                    self.records.lock().await.remove(&id);
                    freed = freed.saturating_add(size);
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        if errors.is_empty() {
            Ok(freed)
        } else {
            Err(ImageGcError::Deletion {
                wanted,
                freed,
                errors: errors.join(", "),
            })
        }
    }

    /// One collection (`GarbageCollect`).
    ///
    /// # Errors
    /// The filesystem or runtime could not be read, a removal failed, or not enough was
    /// freed ([`ImageGcError::FreeDiskSpaceFailed`]).
    pub async fn garbage_collect(&self) -> Result<(), ImageGcError> {
        let fs = self.fs.usage().await?;
        let Some(wanted) = self.policy.to_free(&fs)? else {
            return Ok(());
        };
        let freed = self.free_space(wanted).await?;
        if freed < wanted {
            return Err(ImageGcError::FreeDiskSpaceFailed { wanted, freed });
        }
        Ok(())
    }

    /// Removes every unused image old enough (`DeleteUnusedImages`), for the eviction
    /// manager to reclaim disk; answers the bytes freed.
    ///
    /// # Errors
    /// As [`Self::garbage_collect`].
    pub async fn delete_unused_images(&self) -> Result<u64, ImageGcError> {
        tracing::info!("attempting to delete unused images");
        self.free_space(u64::MAX).await
    }

    /// Notes the images present now, then, every [`IMAGE_GC_PERIOD`] until `cancel`,
    /// notes them again and collects, unless the policy disables collection.
    pub async fn run(self: Arc<Self>, cancel: tokio_util::sync::CancellationToken) {
        self.monitor().await;
        if !self.policy.enabled() {
            tracing::info!("ImageGCHighThresholdPercent is set 100, Disable image GC");
            return;
        }
        run_periodically(
            "Image",
            IMAGE_GC_PERIOD,
            &cancel,
            |repeated| {
                if repeated {
                    " multiple times in a row"
                } else {
                    " once. Stats initialization may not have completed yet"
                }
            },
            || async {
                self.monitor().await;
                self.garbage_collect().await
            },
        )
        .await;
    }
}

/// Runs `collect` now and every `period` until `cancel`, logging as the kubelet's
/// garbage collection loops do: an error for each failure (`"<what> garbage collection
/// failed"` and `failure(repeated)`), the first success after a failure at info level,
/// the others at debug level. The image and the container garbage collectors both run in it.
pub async fn run_periodically<F, Fut, E>(
    what: &str,
    period: Duration,
    cancel: &tokio_util::sync::CancellationToken,
    failure: fn(bool) -> &'static str,
    mut collect: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut ticker = tokio::time::interval(period);
    let mut failed = false;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        match collect().await {
            Err(e) => {
                tracing::error!(error = %e, "{what} garbage collection failed{}", failure(failed));
                failed = true;
            }
            Ok(()) if failed => {
                tracing::info!("{what} garbage collection succeeded");
                failed = false;
            }
            Ok(()) => tracing::debug!("{what} garbage collection succeeded"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use super::*;

    const GIB: u64 = 1 << 30;

    fn epoch(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn record(first: u64, used: u64, size: u64) -> Record {
        Record {
            first_detected: epoch(first),
            last_used: epoch(used),
            size,
        }
    }

    fn fs(capacity: u64, available: u64) -> FsStats {
        FsStats {
            capacity_bytes: capacity,
            available_bytes: available,
            inodes: 0,
            inodes_free: 0,
        }
    }

    #[test]
    fn the_flags_are_checked_with_the_kubelets_messages() {
        let err = ImageGcPolicy::new(101, 80, Duration::ZERO)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid configuration: imageGCHighThresholdPercent (--image-gc-high-threshold) 101 must be between 0 and 100, inclusive"
        );
        let err = ImageGcPolicy::new(85, -1, Duration::ZERO)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "imageGCLowThresholdPercent (--image-gc-low-threshold) -1 must be between 0 and 100"
            ),
            "{err}"
        );
        let err = ImageGcPolicy::new(50, 60, Duration::ZERO)
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with(
                "60 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 50"
            ),
            "{err}"
        );
        assert!(
            !ImageGcPolicy::new(100, 80, Duration::ZERO)
                .unwrap()
                .enabled()
        );
        assert!(ImageGcPolicy::default().enabled());
    }

    #[test]
    fn collection_starts_at_the_high_threshold_and_aims_at_the_low_one() {
        let policy = ImageGcPolicy::default();
        // 84 % used: nothing to do.
        assert_eq!(policy.to_free(&fs(100 * GIB, 16 * GIB)).unwrap(), None);
        // 90 % used: down to 80 % frees 10 GiB.
        assert_eq!(
            policy.to_free(&fs(100 * GIB, 10 * GIB)).unwrap(),
            Some(10 * GIB)
        );
        assert!(matches!(
            policy.to_free(&fs(0, 0)),
            Err(ImageGcError::InvalidCapacity)
        ));
    }

    #[test]
    fn least_recently_used_first_then_first_detected_until_enough_is_freed() {
        let records = HashMap::from([
            ("recent".to_owned(), record(0, 50, 10)),
            ("old-second".to_owned(), record(5, 20, 10)),
            ("old-first".to_owned(), record(1, 20, 10)),
            ("never".to_owned(), record(0, 0, 10)),
        ]);
        let ids = |wanted| -> Vec<String> {
            select_images(
                &records,
                &HashSet::new(),
                Duration::ZERO,
                epoch(100),
                wanted,
            )
            .into_iter()
            .map(|(id, _)| id)
            .collect()
        };
        assert_eq!(ids(25), ["never", "old-first", "old-second"]);
        assert_eq!(
            ids(u64::MAX),
            ["never", "old-first", "old-second", "recent"]
        );
        // Nothing wanted still takes one image, as the kubelet's loop does.
        assert_eq!(ids(0), ["never"]);
    }

    #[test]
    fn images_in_use_or_younger_than_the_minimum_age_are_never_chosen() {
        let records = HashMap::from([
            ("in-use".to_owned(), record(0, 0, 10)),
            ("young".to_owned(), record(90, 0, 10)),
            ("old".to_owned(), record(10, 0, 10)),
        ]);
        let in_use = HashSet::from(["in-use".to_owned()]);
        let chosen = select_images(
            &records,
            &in_use,
            Duration::from_secs(30),
            epoch(100),
            u64::MAX,
        );
        assert_eq!(chosen, [("old".to_owned(), 10)]);
    }

    /// A runtime with images and containers that records removals; its status carries
    /// `config` (as containerd's, which names its sandbox image) when given.
    #[derive(Default)]
    struct Runtime {
        images: StdMutex<Vec<api::Image>>,
        containers: Vec<api::Container>,
        config: Option<&'static str>,
        removed: StdMutex<Vec<String>>,
    }

    /// containerd's `config`, naming `pause:1` its sandbox image.
    const CONTAINERD_CONFIG: Option<&str> = Some(r#"{"sandboxImage":"pause:1"}"#);

    fn image(id: &str, size: u64) -> api::Image {
        api::Image {
            id: id.into(),
            size,
            ..Default::default()
        }
    }

    impl Cri for Runtime {
        async fn list_images(
            &self,
            _: api::ListImagesRequest,
        ) -> crate::cri::Result<api::ListImagesResponse> {
            Ok(api::ListImagesResponse {
                images: self.images.lock().unwrap().clone(),
            })
        }
        async fn list_containers(
            &self,
            _: api::ListContainersRequest,
        ) -> crate::cri::Result<api::ListContainersResponse> {
            Ok(api::ListContainersResponse {
                containers: self.containers.clone(),
            })
        }
        async fn status(&self, _: api::StatusRequest) -> crate::cri::Result<api::StatusResponse> {
            Ok(api::StatusResponse {
                status: None,
                info: self
                    .config
                    .map(|c| ("config".to_owned(), c.to_owned()))
                    .into_iter()
                    .collect(),
            })
        }
        async fn image_status(
            &self,
            req: api::ImageStatusRequest,
        ) -> crate::cri::Result<api::ImageStatusResponse> {
            let name = req.image.map(|i| i.image).unwrap_or_default();
            Ok(api::ImageStatusResponse {
                image: (name == "pause:1").then(|| image("sha256:pause", 1)),
                info: HashMap::new(),
            })
        }
        async fn remove_image(
            &self,
            req: api::RemoveImageRequest,
        ) -> crate::cri::Result<api::RemoveImageResponse> {
            self.removed
                .lock()
                .unwrap()
                .push(req.image.map(|i| i.image).unwrap_or_default());
            Ok(api::RemoveImageResponse {})
        }
    }

    struct Full(FsStats);

    impl ImageFs for Full {
        async fn usage(&self) -> Result<FsStats, ImageGcError> {
            Ok(self.0)
        }
    }

    /// A collector of `runtime`'s images on an empty filesystem, configured with the
    /// pause image `pause:1`.
    fn collector(runtime: &Arc<Runtime>, policy: ImageGcPolicy) -> ImageGc<Runtime, Full> {
        ImageGc::new(
            runtime.clone(),
            Full(fs(100, 100)),
            policy,
            "pause:1".into(),
        )
    }

    #[tokio::test]
    async fn a_run_over_the_threshold_spares_the_sandbox_image_and_images_of_dead_containers() {
        let runtime = Arc::new(Runtime {
            images: StdMutex::new(vec![
                image("sha256:pause", 1),
                image("sha256:used", 5),
                image("sha256:unused", 7),
            ]),
            containers: vec![api::Container {
                image_ref: "sha256:used".into(),
                state: api::ContainerState::ContainerExited as i32,
                ..Default::default()
            }],
            config: CONTAINERD_CONFIG,
            ..Default::default()
        });
        let policy = ImageGcPolicy::new(50, 40, Duration::ZERO).unwrap();
        // The configured pause image is not there: the runtime's own is kept.
        let gc = ImageGc::new(
            runtime.clone(),
            Full(fs(100, 10)),
            policy,
            "registry.k8s.io/pause:3.2".into(),
        );
        // 90 % used, down to 40 % wants 50 bytes: only 7 can go.
        let err = gc.garbage_collect().await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "failed to garbage collect required amount of images. Wanted to free 50 bytes, but freed 7 bytes"
        );
        assert_eq!(*runtime.removed.lock().unwrap(), ["sha256:unused"]);
    }

    #[tokio::test]
    async fn images_present_at_start_count_as_old_and_new_ones_wait_for_the_minimum_age() {
        let runtime = Arc::new(Runtime {
            images: StdMutex::new(vec![image("sha256:old", 5)]),
            ..Default::default()
        });
        let gc = collector(&runtime, ImageGcPolicy::default());
        gc.monitor().await;
        runtime.images.lock().unwrap().push(image("sha256:new", 5));
        assert_eq!(gc.delete_unused_images().await.unwrap(), 5);
        assert_eq!(*runtime.removed.lock().unwrap(), ["sha256:old"]);
    }

    #[tokio::test]
    async fn on_a_node_that_started_without_images_a_new_image_waits_for_the_minimum_age() {
        let runtime = Arc::new(Runtime::default());
        let gc = collector(&runtime, ImageGcPolicy::default());
        // The first detection finds nothing; an image is pulled after it.
        gc.monitor().await;
        runtime.images.lock().unwrap().push(image("sha256:new", 5));
        assert_eq!(gc.delete_unused_images().await.unwrap(), 0);
        // A periodic detection sees it as new too.
        gc.monitor().await;
        assert_eq!(gc.delete_unused_images().await.unwrap(), 0);
        assert!(runtime.removed.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_configured_pause_image_is_kept_when_the_runtime_does_not_name_one() {
        for config in [None, Some("not json"), Some(r#"{"other":1}"#)] {
            let runtime = Arc::new(Runtime {
                images: StdMutex::new(vec![image("sha256:pause", 1), image("sha256:unused", 7)]),
                config,
                ..Default::default()
            });
            let gc = collector(
                &runtime,
                ImageGcPolicy::new(50, 40, Duration::ZERO).unwrap(),
            );
            let err = gc.runtime_sandbox_image().await.unwrap_err();
            assert!(matches!(err, ImageGcError::NoSandboxImage(_)), "{err}");
            gc.monitor().await;
            assert_eq!(gc.delete_unused_images().await.unwrap(), 7);
            assert_eq!(*runtime.removed.lock().unwrap(), ["sha256:unused"]);
        }
    }
}
