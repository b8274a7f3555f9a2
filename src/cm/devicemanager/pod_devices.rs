//! Which devices each pod's containers hold, with the plugin's `Allocate` answer (the
//! kubelet's `pod_devices.go`): the allocated set, reuse of init containers' devices, the
//! checkpoint entries, and the run options a container gets from its answers.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;

use super::api;
use super::checkpoint::{DevicesPerNuma, PodDevicesEntry};
use crate::cri::api as cri;

/// Device IDs of one resource.
pub type DeviceSet = BTreeSet<String>;

/// One container's devices of one resource; the answer is `None` between admission,
/// which chooses the devices, and the container's first creation, which asks the plugin.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Allocation {
    pub devices: DevicesPerNuma,
    pub answer: Option<api::ContainerAllocateResponse>,
}

impl Allocation {
    pub fn ids(&self) -> DeviceSet {
        self.devices.values().flatten().cloned().collect()
    }
}

/// Resource → allocation.
type Resources = BTreeMap<String, Allocation>;

/// Pod UID → container → resource → allocation.
#[derive(Debug, Default)]
pub(super) struct PodDevices {
    pods: BTreeMap<String, BTreeMap<String, Resources>>,
}

/// What a container gets from its devices' `Allocate` answers (the kubelet's
/// `DeviceRunContainerOptions`), in CRI form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceRunOptions {
    /// Environment variables, before the container's own.
    pub envs: Vec<cri::KeyValue>,
    /// Mounts, before the container's volumes.
    pub mounts: Vec<cri::Mount>,
    /// Host devices.
    pub devices: Vec<cri::Device>,
    /// Container annotations.
    pub annotations: Vec<(String, String)>,
}

impl DeviceRunOptions {
    /// Adds these options to a container's config: envs and mounts first (the
    /// container's own come after, as the kubelet appends them), devices, annotations.
    pub fn apply(self, config: &mut cri::ContainerConfig) {
        let envs = std::mem::take(&mut config.envs);
        config.envs = self.envs.into_iter().chain(envs).collect();
        let mounts = std::mem::take(&mut config.mounts);
        config.mounts = self.mounts.into_iter().chain(mounts).collect();
        config.devices.extend(self.devices);
        for (k, v) in self.annotations {
            config.annotations.entry(k).or_insert(v);
        }
    }
}

impl PodDevices {
    pub fn pods(&self) -> BTreeSet<String> {
        self.pods.keys().cloned().collect()
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    pub fn insert(&mut self, uid: &str, container: &str, resource: &str, allocation: Allocation) {
        self.pods
            .entry(uid.to_owned())
            .or_default()
            .entry(container.to_owned())
            .or_default()
            .insert(resource.to_owned(), allocation);
    }

    /// Forgets the pods in `uids`.
    pub fn delete<'a>(&mut self, uids: impl IntoIterator<Item = &'a String>) {
        for uid in uids {
            self.pods.remove(uid);
        }
    }

    pub fn get(&self, uid: &str, container: &str, resource: &str) -> Option<&Allocation> {
        self.pods.get(uid)?.get(container)?.get(resource)
    }

    pub fn get_mut(
        &mut self,
        uid: &str,
        container: &str,
        resource: &str,
    ) -> Option<&mut Allocation> {
        self.pods
            .get_mut(uid)?
            .get_mut(container)?
            .get_mut(resource)
    }

    /// The devices of a container, by resource.
    fn container(&self, uid: &str, container: &str) -> Option<&Resources> {
        self.pods.get(uid)?.get(container)
    }

    /// Adds a container's devices to `reusable` (an init container's, for those after it).
    pub fn add_reusable(
        &self,
        uid: &str,
        container: &str,
        reusable: &mut BTreeMap<String, DeviceSet>,
    ) {
        for (resource, a) in self.container(uid, container).into_iter().flatten() {
            reusable
                .entry(resource.clone())
                .or_default()
                .extend(a.ids());
        }
    }

    /// Takes an app container's devices out of `reusable`: app containers run together.
    pub fn remove_reusable(
        &self,
        uid: &str,
        container: &str,
        reusable: &mut BTreeMap<String, DeviceSet>,
    ) {
        for (resource, a) in self.container(uid, container).into_iter().flatten() {
            if let Some(set) = reusable.get_mut(resource) {
                set.retain(|d| !a.ids().contains(d));
            }
        }
    }

    /// Every device held, by resource.
    pub fn devices(&self) -> BTreeMap<String, DeviceSet> {
        let mut out: BTreeMap<String, DeviceSet> = BTreeMap::new();
        for resources in self.pods.values().flat_map(BTreeMap::values) {
            for (resource, a) in resources {
                out.entry(resource.clone()).or_default().extend(a.ids());
            }
        }
        out
    }

    /// The checkpoint entries: allocations the plugin answered (the others are chosen
    /// again when their pod is admitted after a restart).
    pub fn to_entries(&self) -> Vec<PodDevicesEntry> {
        let mut out = Vec::new();
        for (uid, containers) in &self.pods {
            for (name, resources) in containers {
                for (resource, a) in resources {
                    let Some(answer) = &a.answer else { continue };
                    out.push(PodDevicesEntry {
                        pod_uid: uid.clone(),
                        container_name: name.clone(),
                        resource_name: resource.clone(),
                        device_ids: a.devices.clone(),
                        alloc_resp: answer.encode_to_vec(),
                    });
                }
            }
        }
        out
    }

    /// Loads checkpoint entries; one whose answer does not decode is skipped (logged).
    pub fn load(&mut self, entries: &[PodDevicesEntry]) {
        for e in entries {
            match api::ContainerAllocateResponse::decode(e.alloc_resp.as_slice()) {
                Ok(answer) => self.insert(
                    &e.pod_uid,
                    &e.container_name,
                    &e.resource_name,
                    Allocation {
                        devices: e.device_ids.clone(),
                        answer: Some(answer),
                    },
                ),
                Err(error) => tracing::error!(
                    pod = %e.pod_uid, container = %e.container_name, resource = %e.resource_name, %error,
                    "cannot decode the allocation response in the checkpoint"
                ),
            }
        }
    }

    /// A container's run options from all its answers; the first setting of an env,
    /// device path, mount path or annotation wins, as in the kubelet.
    pub fn run_options(&self, uid: &str, container: &str) -> DeviceRunOptions {
        let mut opts = DeviceRunOptions::default();
        let mut seen: [BTreeSet<String>; 4] = Default::default();
        let answers = self
            .container(uid, container)
            .into_iter()
            .flat_map(BTreeMap::values)
            .filter_map(|a| a.answer.as_ref());
        for answer in answers {
            for (k, v) in &answer.envs {
                if seen[0].insert(k.clone()) {
                    opts.envs.push(cri::KeyValue {
                        key: k.clone(),
                        value: v.clone(),
                    });
                }
            }
            for d in &answer.devices {
                if seen[1].insert(d.container_path.clone()) {
                    opts.devices.push(cri::Device {
                        container_path: d.container_path.clone(),
                        host_path: d.host_path.clone(),
                        permissions: d.permissions.clone(),
                    });
                }
            }
            for m in &answer.mounts {
                if seen[2].insert(m.container_path.clone()) {
                    opts.mounts.push(cri::Mount {
                        container_path: m.container_path.clone(),
                        host_path: m.host_path.clone(),
                        readonly: m.read_only,
                        ..Default::default()
                    });
                }
            }
            for (k, v) in &answer.annotations {
                if seen[3].insert(k.clone()) {
                    opts.annotations.push((k.clone(), v.clone()));
                }
            }
        }
        opts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(env: &str, path: &str) -> api::ContainerAllocateResponse {
        api::ContainerAllocateResponse {
            envs: BTreeMap::from([("DEV".into(), env.into())]),
            devices: vec![api::DeviceSpec {
                container_path: path.into(),
                host_path: format!("/host{path}"),
                permissions: "rw".into(),
            }],
            mounts: vec![api::Mount {
                container_path: "/data".into(),
                host_path: "/srv/data".into(),
                read_only: true,
            }],
            annotations: BTreeMap::from([("a".into(), "1".into())]),
        }
    }

    fn allocation(ids: &[&str], answer: Option<api::ContainerAllocateResponse>) -> Allocation {
        Allocation {
            devices: BTreeMap::from([(0, ids.iter().map(|s| (*s).to_owned()).collect())]),
            answer,
        }
    }

    #[test]
    fn run_options_merge_answers_first_setting_wins() {
        let mut pd = PodDevices::default();
        pd.insert(
            "u",
            "c",
            "a.com/x",
            allocation(&["x0"], Some(answer("x", "/dev/x"))),
        );
        pd.insert(
            "u",
            "c",
            "b.com/y",
            allocation(&["y0"], Some(answer("y", "/dev/y"))),
        );
        let opts = pd.run_options("u", "c");
        assert_eq!(opts.envs.len(), 1);
        assert_eq!(opts.envs[0].value, "x", "the first resource's env wins");
        assert_eq!(opts.devices.len(), 2);
        assert_eq!(opts.mounts.len(), 1);
        assert!(opts.mounts[0].readonly);
        let mut config = cri::ContainerConfig {
            envs: vec![cri::KeyValue {
                key: "OWN".into(),
                value: "1".into(),
            }],
            ..Default::default()
        };
        opts.apply(&mut config);
        assert_eq!(config.envs[0].key, "DEV");
        assert_eq!(config.envs[1].key, "OWN");
        assert_eq!(config.devices[1].host_path, "/host/dev/y");
        assert_eq!(config.annotations["a"], "1");
    }

    #[test]
    fn only_answered_allocations_are_checkpointed_and_load_back() {
        let mut pd = PodDevices::default();
        pd.insert(
            "u",
            "init",
            "a.com/x",
            allocation(&["x0", "x1"], Some(answer("x", "/dev/x"))),
        );
        pd.insert("u", "app", "a.com/x", allocation(&["x2"], None));
        assert_eq!(
            pd.devices()["a.com/x"].len(),
            3,
            "chosen devices count as held"
        );
        let entries = pd.to_entries();
        assert_eq!(entries.len(), 1);
        let mut back = PodDevices::default();
        back.load(&entries);
        assert_eq!(
            back.get("u", "init", "a.com/x"),
            pd.get("u", "init", "a.com/x")
        );
        back.delete(&["u".to_owned()]);
        assert!(back.pods().is_empty());
    }

    #[test]
    fn init_devices_are_reusable_until_an_app_container_takes_them() {
        let mut pd = PodDevices::default();
        pd.insert("u", "init", "a.com/x", allocation(&["x0", "x1"], None));
        pd.insert("u", "app", "a.com/x", allocation(&["x0"], None));
        let mut reusable = BTreeMap::new();
        pd.add_reusable("u", "init", &mut reusable);
        assert_eq!(reusable["a.com/x"].len(), 2);
        pd.remove_reusable("u", "app", &mut reusable);
        assert_eq!(reusable["a.com/x"], DeviceSet::from(["x1".to_owned()]));
    }
}
