//! Each pod's volumes as last set up (the kubelet's actual state of the world): they are
//! set up again when what they show changed or the last set-up is old (token refresh), and
//! once set up they stay in use when a later set-up fails. The kubelet's
//! `WaitForAttachAndMount` passes for volumes already mounted while their remount fails,
//! so the runtime sync (restarting crashed containers) goes on while the API server is
//! away; only a pod whose volumes were never set up waits for them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{PodVolumes, VolumeError};
use crate::pod::state::ForgetPod;

/// The last set-up of each pod's volumes, keyed by pod UID; `K` is what the volumes show
/// of the pod (compared to decide whether they must be set up again).
pub struct SetUps<K> {
    resync: Duration,
    pods: Mutex<HashMap<String, SetUp<K>>>,
}

struct SetUp<K> {
    /// When the volumes were last set up, or a set-up last failed.
    at: Instant,
    key: K,
    volumes: PodVolumes,
}

/// A pod's volumes for a sync.
pub struct Mounted {
    /// The volumes to give the containers.
    pub volumes: PodVolumes,
    /// Why setting them up again failed, when `volumes` are those of an earlier set-up.
    pub refresh_error: Option<VolumeError>,
}

impl<K: PartialEq> SetUps<K> {
    /// Volumes are set up again once their last set-up is `resync` old.
    #[must_use]
    pub fn new(resync: Duration) -> Self {
        Self {
            resync,
            pods: Mutex::default(),
        }
    }

    fn pods(&self) -> std::sync::MutexGuard<'_, HashMap<String, SetUp<K>>> {
        crate::lock::lock(&self.pods)
    }

    /// The volumes of pod `uid` as last set up (the kubelet's `GetMountedVolumesForPod`).
    #[must_use]
    pub fn mounted(&self, uid: &str) -> Option<PodVolumes> {
        self.pods().get(uid).map(|s| s.volumes.clone())
    }

    /// The volumes of pod `uid` showing `key`: as last set up when that is recent and
    /// showed the same key, else from `set_up`. When `set_up` fails for a pod set up
    /// before, its earlier volumes come back with the error, and the set-up is tried again
    /// after the resync period (or sooner when the key changes again).
    ///
    /// # Errors
    /// The error of `set_up` for a pod whose volumes were never set up.
    pub async fn get_or_set_up<F>(
        &self,
        uid: &str,
        key: K,
        set_up: F,
    ) -> Result<Mounted, VolumeError>
    where
        F: Future<Output = Result<PodVolumes, VolumeError>>,
    {
        let fresh = self
            .pods()
            .get(uid)
            .filter(|s| s.at.elapsed() < self.resync && s.key == key)
            .map(|s| s.volumes.clone());
        if let Some(volumes) = fresh {
            return Ok(Mounted {
                volumes,
                refresh_error: None,
            });
        }
        let result = set_up.await;
        let mut pods = self.pods();
        match result {
            Ok(volumes) => {
                let at = Instant::now();
                let set_up = SetUp {
                    at,
                    key,
                    volumes: volumes.clone(),
                };
                pods.insert(uid.to_owned(), set_up);
                Ok(Mounted {
                    volumes,
                    refresh_error: None,
                })
            }
            Err(error) => match pods.get_mut(uid) {
                Some(previous) => {
                    previous.at = Instant::now();
                    previous.key = key;
                    Ok(Mounted {
                        volumes: previous.volumes.clone(),
                        refresh_error: Some(error),
                    })
                }
                None => Err(error),
            },
        }
    }
}

/// The pod's last set-up (its volumes are torn down by then).
impl<K: PartialEq + Send> ForgetPod for SetUps<K> {
    fn name(&self) -> &'static str {
        "volume set-ups"
    }

    fn holds(&self, uid: &str) -> bool {
        self.pods().contains_key(uid)
    }

    fn forget(&self, uid: &str) {
        self.pods().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn not_found() -> VolumeError {
        VolumeError::NotFound {
            pod: "default/web".into(),
            volume: "config".into(),
            kind: "configmap",
            name: "web".into(),
        }
    }

    /// A set-up that counts its calls and fails when told.
    struct FakeSetUp(AtomicUsize);

    impl FakeSetUp {
        async fn run(&self, fail: bool) -> Result<PodVolumes, VolumeError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            if fail {
                Err(not_found())
            } else {
                Ok(PodVolumes::default())
            }
        }
        fn calls(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn a_pod_never_set_up_waits_for_its_volumes() {
        let set_ups = SetUps::new(Duration::from_secs(30));
        let fake = FakeSetUp(AtomicUsize::new(0));
        let got = set_ups.get_or_set_up("u1", 1, fake.run(true)).await;
        assert!(matches!(got, Err(VolumeError::NotFound { .. })));
    }

    /// An API outage after the volumes were set up: the refresh fails, the sync goes on
    /// with the mounted volumes (and says why the refresh failed), and the refresh is not
    /// tried again on every sync.
    #[tokio::test]
    async fn volumes_once_set_up_stay_in_use_when_setting_them_up_again_fails() {
        let set_ups = SetUps::new(Duration::from_secs(30));
        let fake = FakeSetUp(AtomicUsize::new(0));
        let first = set_ups.get_or_set_up("u1", 1, fake.run(false)).await;
        assert!(first.is_ok_and(|m| m.refresh_error.is_none()));
        // What the volumes show changed (a ConfigMap), and the API server is gone.
        let refreshed = set_ups
            .get_or_set_up("u1", 2, fake.run(true))
            .await
            .expect("the earlier volumes stay in use");
        assert!(matches!(
            refreshed.refresh_error,
            Some(VolumeError::NotFound { .. })
        ));
        assert_eq!(fake.calls(), 2);
        let next = set_ups
            .get_or_set_up("u1", 2, fake.run(true))
            .await
            .expect("still in use");
        assert!(next.refresh_error.is_none());
        assert_eq!(
            fake.calls(),
            2,
            "the failed refresh waits for the resync period"
        );
        // Another pod is not helped by them.
        assert!(
            set_ups
                .get_or_set_up("u2", 2, fake.run(true))
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn volumes_are_set_up_again_when_old_or_changed_and_not_after_forget() {
        let set_ups = SetUps::new(Duration::ZERO);
        let fake = FakeSetUp(AtomicUsize::new(0));
        for _ in 0..3 {
            assert!(
                set_ups
                    .get_or_set_up("u1", 1, fake.run(false))
                    .await
                    .is_ok()
            );
        }
        assert_eq!(fake.calls(), 3, "old set-ups are redone");
        let cached = SetUps::new(Duration::from_secs(30));
        assert!(cached.get_or_set_up("u1", 1, fake.run(false)).await.is_ok());
        assert!(cached.get_or_set_up("u1", 1, fake.run(false)).await.is_ok());
        assert_eq!(
            fake.calls(),
            4,
            "a recent set-up showing the same key is reused"
        );
        assert!(cached.get_or_set_up("u1", 5, fake.run(false)).await.is_ok());
        assert_eq!(fake.calls(), 5, "a changed key is set up again");
        cached.forget("u1");
        assert!(cached.get_or_set_up("u1", 5, fake.run(true)).await.is_err());
    }
}
