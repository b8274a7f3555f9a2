//! Events about pods, as the kubelet emits them (Pulling, Pulled, Created, Started,
//! Killing, Failed, BackOff, FailedCreatePodSandBox, ...).
//!
//! Recording never blocks a pod worker: events go into a bounded channel (the kubelet's
//! broadcaster queues at most 1,000; more are dropped), and one task publishes them as
//! core/v1 Events, counting repeats as the kubelet's event correlator does (which remembers
//! at most 4,096 events). A pod that is gone can have no repeats: what is remembered of its
//! events is dropped then, so that churning pods do not keep the memory full.
//!
//! Knows no pod worker or kubelet decision: callers say what happened; it publishes.

use crate::lock::lock;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;

use crate::pod::PodId;
use crate::pod::state::ForgetPod;

/// One event about a pod or one of its containers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodEvent {
    /// The pod.
    pub pod: PodId,
    /// `spec.containers{name}` for a container's event, as the kubelet's `fieldPath`.
    pub field_path: Option<String>,
    /// Warning (true) or Normal.
    pub warning: bool,
    /// The kubelet's reason, e.g. `Pulled` (or made, e.g. `OutOfhugepages-2Mi`).
    pub reason: Cow<'static, str>,
    /// The human message.
    pub message: String,
}

/// What in a pod an event is about: the pod itself, or one of its containers, named by
/// the kubelet's `fieldPath` (`spec.containers{name}`, `spec.initContainers{name}`,
/// `spec.ephemeralContainers{name}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Involved<'a> {
    /// The pod.
    Pod,
    /// An app container, by name.
    Container(&'a str),
    /// An init container, by name.
    InitContainer(&'a str),
    /// An ephemeral container, by name.
    EphemeralContainer(&'a str),
}

impl Involved<'_> {
    fn field_path(self) -> Option<String> {
        match self {
            Self::Pod => None,
            Self::Container(name) => Some(format!("spec.containers{{{name}}}")),
            Self::InitContainer(name) => Some(format!("spec.initContainers{{{name}}}")),
            Self::EphemeralContainer(name) => Some(format!("spec.ephemeralContainers{{{name}}}")),
        }
    }
}

/// `None` is the pod, `Some(name)` an app container.
impl<'a> From<Option<&'a str>> for Involved<'a> {
    fn from(container: Option<&'a str>) -> Self {
        container.map_or(Self::Pod, Self::Container)
    }
}

/// How many events wait to be published at most (the kubelet's `maxQueuedEvents`);
/// events recorded while the queue is full are dropped.
pub const MAX_QUEUED_EVENTS: usize = 1000;
/// How many published events are remembered for aggregation at most (the kubelet's
/// correlator cache, `maxLruCacheEntries`).
const MAX_REMEMBERED_EVENTS: usize = 4096;

/// What goes through a recorder's queue: an event, or word that a pod (by UID) is gone,
/// after its last events.
#[derive(Debug)]
enum Message {
    Event(PodEvent),
    PodGone(String),
}

/// The receiving end of a recorder's queue.
#[derive(Debug)]
pub struct EventReceiver(mpsc::Receiver<Message>);

impl EventReceiver {
    /// The next event, waiting for it; `None` once every recorder is gone.
    pub async fn recv(&mut self) -> Option<PodEvent> {
        loop {
            if let Message::Event(ev) = self.0.recv().await? {
                return Some(ev);
            }
        }
    }

    /// The next event if one is queued.
    ///
    /// # Errors
    /// The queue holds no event (or every recorder is gone).
    pub fn try_recv(&mut self) -> Result<PodEvent, mpsc::error::TryRecvError> {
        loop {
            if let Message::Event(ev) = self.0.try_recv()? {
                return Ok(ev);
            }
        }
    }
}

/// Where pod workers send events. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EventRecorder {
    tx: mpsc::Sender<Message>,
    /// The pods whose events went to the publisher, which remembers them for aggregation
    /// until it is told that the pod is gone.
    pods: Arc<Mutex<HashSet<String>>>,
}

impl EventRecorder {
    /// A recorder and the receiving end of its queue; the caller publishes from it with
    /// [`publish`] or inspects it in tests.
    #[must_use]
    pub fn channel() -> (Self, EventReceiver) {
        let (tx, rx) = mpsc::channel(MAX_QUEUED_EVENTS);
        let pods = Arc::default();
        (Self { tx, pods }, EventReceiver(rx))
    }

    fn send(
        &self,
        pod: &PodId,
        involved: Involved<'_>,
        warning: bool,
        reason: Cow<'static, str>,
        message: String,
    ) {
        let field_path = involved.field_path();
        tracing::debug!(pod = %pod, field_path, %reason, %message, "event");
        {
            let mut pods = lock(&self.pods);
            if !pods.contains(&pod.uid) {
                pods.insert(pod.uid.clone());
            }
        }
        let event = PodEvent {
            pod: pod.clone(),
            field_path,
            warning,
            reason,
            message,
        };
        // The receiver only goes away at shutdown; an event lost then is harmless.
        if let Err(mpsc::error::TrySendError::Full(Message::Event(event))) =
            self.tx.try_send(Message::Event(event))
        {
            tracing::warn!(pod = %event.pod, reason = %event.reason, "event queue full; event dropped");
        }
    }

    /// A Normal event about the pod or a container (`None`/`Some(name)` for an app
    /// container, or an [`Involved`]).
    pub fn normal<'a>(
        &self,
        pod: &PodId,
        involved: impl Into<Involved<'a>>,
        reason: impl Into<Cow<'static, str>>,
        message: String,
    ) {
        self.send(pod, involved.into(), false, reason.into(), message);
    }

    /// A Warning event; see [`Self::normal`].
    pub fn warning<'a>(
        &self,
        pod: &PodId,
        involved: impl Into<Involved<'a>>,
        reason: impl Into<Cow<'static, str>>,
        message: String,
    ) {
        self.send(pod, involved.into(), true, reason.into(), message);
    }
}

/// The pod is gone and records no more events: the publisher forgets what it remembers
/// of its events for aggregation. Queued after the pod's last events; lost when the queue
/// is full (the memory stays bounded by its size and age limits then).
impl ForgetPod for EventRecorder {
    fn name(&self) -> &'static str {
        "events kept for aggregation"
    }

    fn holds(&self, uid: &str) -> bool {
        lock(&self.pods).contains(uid)
    }

    fn forget(&self, uid: &str) {
        lock(&self.pods).remove(uid);
        if self.tx.try_send(Message::PodGone(uid.to_owned())).is_err() {
            tracing::debug!(
                pod_uid = uid,
                "event queue full; the pod's events are forgotten later"
            );
        }
    }
}

/// How long a published event is remembered for aggregation (the kubelet's event
/// correlator counts repeats of the same event instead of creating new ones).
const AGGREGATE_FOR: std::time::Duration = std::time::Duration::from_secs(600);

/// Published events by what they say: the Event's name, its count, when last published.
type Seen = HashMap<PodEvent, (String, i32, Instant)>;

/// Forgets events published longer than [`AGGREGATE_FOR`] ago.
fn forget_old(seen: &mut Seen) {
    seen.retain(|_, (_, _, at)| at.elapsed() < AGGREGATE_FOR);
}

/// Remembers a published event, forgetting the least recently published one when
/// [`MAX_REMEMBERED_EVENTS`] are remembered.
fn remember(seen: &mut Seen, event: PodEvent, name: String) {
    if seen.len() >= MAX_REMEMBERED_EVENTS {
        let oldest = seen
            .iter()
            .min_by_key(|(_, (_, _, at))| *at)
            .map(|(e, _)| e.clone());
        if let Some(oldest) = oldest {
            seen.remove(&oldest);
        }
    }
    seen.insert(event, (name, 1, Instant::now()));
}

/// Forgets the events of a pod that is gone.
fn forget_pod(seen: &mut Seen, uid: &str) {
    seen.retain(|ev, _| ev.pod.uid != uid);
}

/// A new core/v1 Event about `involved`, in `namespace`, from the kubelet on `node_name`,
/// named as the kubelet names them (`<object>.<nanoseconds, hex>`).
fn core_event(
    involved: ObjectReference,
    namespace: &str,
    warning: bool,
    reason: &str,
    message: &str,
    node_name: &str,
) -> CoreEvent {
    let now = Time(Timestamp::now());
    let object = involved.name.clone().unwrap_or_default();
    CoreEvent {
        metadata: ObjectMeta {
            name: Some(format!("{object}.{:x}", Timestamp::now().as_nanosecond())),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        involved_object: involved,
        reason: Some(reason.to_owned()),
        message: Some(message.chars().take(1024).collect()),
        type_: Some(if warning { "Warning" } else { "Normal" }.into()),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node_name.to_owned()),
        }),
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node_name.to_owned()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Default::default()
    }
}

/// Publishes a Warning about the Node `node` (another node than `node_name`, which
/// reports it), in the `default` namespace as the kubelet's recorder puts the events of
/// cluster-scoped objects. Best effort: a failure is logged.
pub async fn warn_about_node(
    client: kube::Client,
    node_name: String,
    node: &k8s_openapi::api::core::v1::Node,
    reason: &str,
    message: &str,
) {
    let involved = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: node.metadata.name.clone(),
        uid: node.metadata.uid.clone(),
        ..Default::default()
    };
    let event = core_event(involved, "default", true, reason, message, &node_name);
    let api: Api<CoreEvent> = Api::namespaced(client, "default");
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        tracing::warn!(node = ?node.metadata.name, reason, error = %e, "could not publish event");
    }
}

/// Publishes events from the channel as core/v1 Events, like the kubelet's recorder (the
/// Node authorizer of v1.20 allows nodes only core events). A repeat of the same event
/// within ten minutes increments the first one's `count` instead of creating another.
/// Failures are logged, never retried forever: events are best effort.
pub async fn publish(client: kube::Client, node_name: String, mut rx: EventReceiver) {
    let mut seen: Seen = HashMap::new();
    while let Some(message) = rx.0.recv().await {
        forget_old(&mut seen);
        let ev = match message {
            Message::Event(ev) => ev,
            Message::PodGone(uid) => {
                forget_pod(&mut seen, &uid);
                continue;
            }
        };
        let api: Api<CoreEvent> = Api::namespaced(client.clone(), &ev.pod.namespace);
        let now = Time(Timestamp::now());
        let result = if let Some((name, count, at)) = seen.get_mut(&ev) {
            *count += 1;
            *at = Instant::now();
            let patch = serde_json::json!({ "count": *count, "lastTimestamp": now });
            api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map(drop)
        } else {
            let involved = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(ev.pod.name.clone()),
                namespace: Some(ev.pod.namespace.clone()),
                uid: Some(ev.pod.uid.clone()),
                field_path: ev.field_path.clone(),
                ..Default::default()
            };
            let event = core_event(
                involved,
                &ev.pod.namespace,
                ev.warning,
                &ev.reason,
                &ev.message,
                &node_name,
            );
            let name = event.metadata.name.clone().unwrap_or_default();
            let created = api.create(&PostParams::default(), &event).await.map(drop);
            if created.is_ok() {
                remember(&mut seen, ev.clone(), name);
            }
            created
        };
        if let Err(e) = result {
            tracing::warn!(pod = %ev.pod, reason = %ev.reason, error = %e, "could not publish event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodId {
        PodId {
            namespace: "default".into(),
            name: "web".into(),
            uid: "u1".into(),
        }
    }

    /// A flood of events while the API server is slow or away: the queue holds at most
    /// [`MAX_QUEUED_EVENTS`] and recording never blocks.
    #[test]
    fn the_event_queue_is_bounded_and_drops_when_full() {
        let (events, mut rx) = EventRecorder::channel();
        for i in 0..MAX_QUEUED_EVENTS + 50 {
            events.warning(&pod(), None, "BackOff", format!("event {i}"));
        }
        let mut queued = 0;
        while let Ok(ev) = rx.try_recv() {
            assert_eq!(ev.message, format!("event {queued}"), "the oldest are kept");
            queued += 1;
        }
        assert_eq!(queued, MAX_QUEUED_EVENTS);
        events.normal(&pod(), None, "Pulled", "room again".into());
        assert_eq!(rx.try_recv().unwrap().message, "room again");
    }

    /// Churn: every pod that is gone takes what is remembered of its events with it, and
    /// word of it reaches the publisher after the pod's last events.
    #[test]
    fn a_gone_pods_events_are_forgotten() {
        let mut seen = Seen::new();
        let event = |uid: &str, i: usize| PodEvent {
            pod: PodId {
                uid: uid.into(),
                ..pod()
            },
            field_path: None,
            warning: false,
            reason: "Started".into(),
            message: format!("event {i}"),
        };
        for i in 0..3 {
            remember(&mut seen, event("u1", i), format!("web.{i}"));
            remember(&mut seen, event("u2", i), format!("web.{i}"));
        }
        forget_pod(&mut seen, "u1");
        assert_eq!(seen.len(), 3);
        assert!(seen.keys().all(|e| e.pod.uid == "u2"));
        forget_pod(&mut seen, "u2");
        assert!(seen.is_empty());

        let (events, mut rx) = EventRecorder::channel();
        events.normal(&pod(), None, "Killing", "last".into());
        assert!(events.holds("u1"));
        events.forget("u1");
        assert!(!events.holds("u1"));
        assert!(matches!(rx.0.try_recv(), Ok(Message::Event(e)) if e.message == "last"));
        assert!(matches!(rx.0.try_recv(), Ok(Message::PodGone(uid)) if uid == "u1"));
        events.forget("u1");
        events.normal(&pod(), None, "Pulled", "next".into());
        assert_eq!(
            rx.try_recv().unwrap().message,
            "next",
            "receivers skip the word"
        );
    }

    #[test]
    fn the_aggregation_memory_is_bounded() {
        let mut seen = Seen::new();
        let event = |i: usize| PodEvent {
            pod: pod(),
            field_path: None,
            warning: false,
            reason: "Pulled".into(),
            message: format!("event {i}"),
        };
        for i in 0..MAX_REMEMBERED_EVENTS + 10 {
            remember(&mut seen, event(i), format!("web.{i}"));
        }
        assert_eq!(seen.len(), MAX_REMEMBERED_EVENTS);
        assert!(
            seen.contains_key(&event(MAX_REMEMBERED_EVENTS + 9)),
            "the newest stays"
        );
        forget_old(&mut seen);
        assert_eq!(seen.len(), MAX_REMEMBERED_EVENTS, "recent ones are kept");
    }
}
