//! The start-up timeline of each pod: every step of its sync, with its start counted from
//! the moment the agent saw the pod and its duration, up to the status patch that reported
//! the pod Ready and that the API acknowledged.
//!
//! It is recorded from the pod workers' own tracing spans, not by a second bookkeeping
//! path: [`TimelineLayer`] sees every span; one that carries a `pod_uid` field, or whose
//! parent is a step of a pod, is a step of that pod. The `pod` span a worker opens when
//! it first sees a pod starts the timeline (it is the root of the pod's span tree); a
//! `status_patch` span whose `ready` field is `true` and whose `outcome` is `ok` ends it,
//! and steps that start later are not kept. [`Timelines`] keeps the most recent pods, a
//! bounded number of steps each; the kubelet API serves them at `/debug/timeline` and
//! `rkubelet inspect timeline` shows and draws them.
//!
//! Knows no pod worker or server: it reads spans' names and fields only.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The name of the span a pod worker opens when it first sees its pod: the root of the
/// pod's span tree.
pub const POD_SPAN: &str = "pod";
/// The name of the span around a pod status patch.
pub const STATUS_PATCH_SPAN: &str = "status_patch";
/// The name of the span of a pod worker waiting for its next sync; a wait still under
/// way when Ready is acknowledged is cut there (what follows is no longer start-up).
pub const WAIT_SPAN: &str = "wait";
/// How many pods' timelines are kept: the oldest goes first.
const MAX_PODS: usize = 256;
/// How many timelines of pods whose worker ended (gone from the node) are kept: the
/// oldest goes first.
const MAX_GONE: usize = 32;
/// How many steps a timeline keeps; later ones are counted, not kept.
const MAX_STEPS: usize = 400;

/// One step of a pod's sync.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// The span's name: `sync_pod`, `mount_volumes`, `run_pod_sandbox`, `cri`, ...
    pub name: String,
    /// The span's other fields: `rpc`, `container`, `plugin`, `command`, ...
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, String>,
    /// When it started, in milliseconds after the pod was seen.
    pub start_ms: f64,
    /// How long it took, in milliseconds.
    pub duration_ms: f64,
    /// How deep in the pod's span tree: 0 for a sync, a status patch or a probe.
    pub depth: u16,
}

impl Step {
    /// The step's name with the values of its fields, ids cut to 12 characters as
    /// `crictl` shows them, and a flag as its name (`not` before a false one):
    /// `cri RunPodSandbox`, `status_patch ok Running ready`.
    #[must_use]
    pub fn label(&self) -> String {
        self.fields
            .iter()
            .fold(self.name.clone(), |mut label, (k, v)| {
                label.push(' ');
                let is_id = v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit());
                match v.as_str() {
                    "true" => label.push_str(k),
                    "false" => label.push_str(&format!("not {k}")),
                    _ if is_id => label.push_str(&v[..12]),
                    _ => label.push_str(v),
                }
                label
            })
    }

    /// When it ended, in milliseconds after the pod was seen.
    #[must_use]
    pub fn end_ms(&self) -> f64 {
        self.start_ms + self.duration_ms
    }
}

/// The start-up timeline of one pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodTimeline {
    /// The pod's UID.
    pub uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// When the agent first saw the pod (RFC 3339): the origin of every offset.
    pub seen: String,
    /// The steps, in the order they started.
    pub steps: Vec<Step>,
    /// When the API acknowledged the status that first reported the pod Ready, in
    /// milliseconds after it was seen; none while it has not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_ms: Option<f64>,
    /// Steps not kept because the timeline was full.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped_steps: u32,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Separates a kept step's fields (`key=value`), a character no field holds.
const FIELD_SEPARATOR: char = '\u{1f}';

/// A step as kept: small, since every pod of the node keeps up to [`MAX_STEPS`].
#[derive(Clone)]
struct Kept {
    name: &'static str,
    /// `key=value` pairs, separated by [`FIELD_SEPARATOR`]; none: no fields.
    fields: Option<Box<str>>,
    start_ms: f32,
    duration_ms: f32,
    depth: u16,
}

impl Kept {
    fn step(&self) -> Step {
        Step {
            name: self.name.to_owned(),
            fields: self
                .fields
                .iter()
                .flat_map(|f| f.split(FIELD_SEPARATOR))
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            start_ms: f64::from(self.start_ms),
            duration_ms: f64::from(self.duration_ms),
            depth: self.depth,
        }
    }
}

#[derive(Clone)]
struct Entry {
    namespace: Box<str>,
    name: Box<str>,
    seen: Instant,
    seen_wall: SystemTime,
    steps: Vec<Kept>,
    ready_ms: Option<f64>,
    dropped_steps: u32,
    /// Set once Ready was acknowledged: later spans of the pod are not recorded at all.
    done: Arc<AtomicBool>,
}

impl Entry {
    /// The public form, steps in the order they started (call without the store's lock).
    fn timeline(self, uid: &str) -> PodTimeline {
        let mut steps: Vec<Step> = self.steps.iter().map(Kept::step).collect();
        steps.sort_by(|a, b| {
            a.start_ms
                .total_cmp(&b.start_ms)
                .then(a.depth.cmp(&b.depth))
        });
        PodTimeline {
            uid: uid.to_owned(),
            namespace: self.namespace.into(),
            name: self.name.into(),
            seen: k8s_openapi::jiff::Timestamp::try_from(self.seen_wall)
                .map(|t| t.to_string())
                .unwrap_or_default(),
            steps,
            ready_ms: self.ready_ms,
            dropped_steps: self.dropped_steps,
        }
    }

    fn offset_ms(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.seen).as_secs_f64() * 1000.0
    }
}

#[derive(Default)]
struct State {
    pods: HashMap<Arc<str>, Entry>,
    /// The UIDs in the order they were first seen.
    order: VecDeque<Arc<str>>,
    /// The UIDs of pods gone from the node, in the order they went.
    gone: VecDeque<Arc<str>>,
}

/// The timelines of the most recent pods.
#[derive(Default)]
pub struct Timelines {
    state: Mutex<State>,
}

impl Timelines {
    /// An empty store, shared by the layer that fills it and the server that reads it.
    #[must_use]
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::lock::lock(&self.state)
    }

    /// A pod seen for the first time (`pod` is `namespace/name`) starts its timeline; a
    /// pod already known keeps the one it has. The timeline's done flag.
    fn seen(&self, uid: &Arc<str>, pod: &str, at: Instant) -> Arc<AtomicBool> {
        let mut state = self.lock();
        if let Some(entry) = state.pods.get(uid) {
            return entry.done.clone();
        }
        if state.order.len() >= MAX_PODS
            && let Some(oldest) = state.order.pop_front()
        {
            state.pods.remove(&oldest);
            state.gone.retain(|u| *u != oldest);
        }
        let (namespace, name) = pod.split_once('/').unwrap_or(("", pod));
        let done = Arc::new(AtomicBool::new(false));
        state.pods.insert(
            uid.clone(),
            Entry {
                namespace: namespace.into(),
                name: name.into(),
                seen: at,
                seen_wall: SystemTime::now(),
                steps: Vec::new(),
                ready_ms: None,
                dropped_steps: 0,
                done: done.clone(),
            },
        );
        state.order.push_back(uid.clone());
        done
    }

    /// The done flag of a pod whose timeline is still being recorded.
    fn recording(&self, uid: &str) -> Option<Arc<AtomicBool>> {
        self.lock()
            .pods
            .get(uid)
            .map(|e| e.done.clone())
            .filter(|done| !done.load(Ordering::Relaxed))
    }

    /// A step that ended at `end`.
    fn record(&self, uid: &str, name: &'static str, rec: Rec, end: Instant) {
        let mut state = self.lock();
        let Some(entry) = state.pods.get_mut(uid) else {
            return;
        };
        let start_ms = entry.offset_ms(rec.start);
        if entry.ready_ms.is_some_and(|ready| start_ms > ready) {
            return;
        }
        let mut end_ms = entry.offset_ms(end);
        let field = |key: &str| {
            rec.fields
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.as_str())
        };
        if name == STATUS_PATCH_SPAN
            && entry.ready_ms.is_none()
            && field("ready") == Some("true")
            && field("outcome") == Some("ok")
        {
            entry.ready_ms = Some(end_ms);
            entry.done.store(true, Ordering::Relaxed);
            entry.steps.shrink_to_fit();
        } else if name == WAIT_SPAN
            && let Some(ready) = entry.ready_ms
        {
            end_ms = end_ms.min(ready);
        }
        if entry.steps.len() >= MAX_STEPS {
            entry.dropped_steps = entry.dropped_steps.saturating_add(1);
            return;
        }
        #[allow(clippy::cast_possible_truncation)] // milliseconds: f32 is plenty
        entry.steps.push(Kept {
            name,
            fields: (!rec.fields.is_empty()).then(|| {
                let pairs: Vec<String> = rec
                    .fields
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.replace(FIELD_SEPARATOR, " ")))
                    .collect();
                pairs.join(&FIELD_SEPARATOR.to_string()).into_boxed_str()
            }),
            start_ms: start_ms as f32,
            duration_ms: (end_ms - start_ms) as f32,
            depth: rec.depth,
        });
    }

    /// The timeline of the pod `namespace/name` seen last.
    #[must_use]
    pub fn get(&self, namespace: &str, name: &str) -> Option<PodTimeline> {
        let found = {
            let state = self.lock();
            state.order.iter().rev().find_map(|uid| {
                state
                    .pods
                    .get(uid)
                    .filter(|e| &*e.namespace == namespace && &*e.name == name)
                    .map(|e| (uid.clone(), e.clone()))
            })
        };
        found.map(|(uid, e)| e.timeline(&uid))
    }

    /// A pod's worker ended: its timeline is kept among the [`MAX_GONE`] last gone.
    fn gone(&self, uid: &str) {
        let mut state = self.lock();
        let State { pods, order, gone } = &mut *state;
        if !pods.contains_key(uid) || gone.iter().any(|g| &**g == uid) {
            return;
        }
        if let Some(kept) = order.iter().find(|u| &***u == uid) {
            gone.push_back(kept.clone());
        }
        while gone.len() > MAX_GONE {
            if let Some(oldest) = gone.pop_front() {
                pods.remove(&oldest);
                order.retain(|u| *u != oldest);
            }
        }
    }

    /// Every timeline kept, oldest first.
    #[must_use]
    pub fn all(&self) -> Vec<PodTimeline> {
        let kept: Vec<(Arc<str>, Entry)> = {
            let state = self.lock();
            state
                .order
                .iter()
                .filter_map(|uid| state.pods.get(uid).map(|e| (uid.clone(), e.clone())))
                .collect()
        };
        kept.into_iter().map(|(uid, e)| e.timeline(&uid)).collect()
    }
}

impl std::fmt::Debug for Timelines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timelines")
            .field("pods", &self.lock().pods.len())
            .finish()
    }
}

/// What the layer keeps on a span of a pod.
struct Rec {
    uid: Arc<str>,
    /// Fields other than the pod's UID and name.
    fields: Vec<(&'static str, String)>,
    start: Instant,
    depth: u16,
    /// False for the pod's root span, which is not a step.
    step: bool,
    /// The pod's timeline is complete: its later spans are not recorded.
    done: Arc<AtomicBool>,
}

/// The longest field value kept (an error text can be long).
const MAX_VALUE: usize = 200;

/// The fields of a span.
#[derive(Default)]
struct Fields {
    pod_uid: Option<String>,
    pod: Option<String>,
    others: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "pod_uid" => self.pod_uid = Some(value.to_owned()),
            "pod" => self.pod = Some(value.to_owned()),
            name => {
                let mut end = value.len().min(MAX_VALUE);
                while !value.is_char_boundary(end) {
                    end -= 1;
                }
                let value = value[..end].to_owned();
                match self.others.iter_mut().find(|(k, _)| *k == name) {
                    Some(slot) => slot.1 = value,
                    None => self.others.push((name, value)),
                }
            }
        }
    }
}

/// Fills [`Timelines`] from the spans of pods.
pub struct TimelineLayer {
    timelines: Arc<Timelines>,
}

impl TimelineLayer {
    /// A layer that records into `timelines`.
    #[must_use]
    pub fn new(timelines: Arc<Timelines>) -> Self {
        Self { timelines }
    }
}

impl<S> Layer<S> for TimelineLayer
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let parent = span.parent().and_then(|p| {
            p.extensions().get::<Rec>().map(|r| {
                let depth = if r.step { r.depth + 1 } else { 0 };
                (r.uid.clone(), depth, r.done.clone())
            })
        });
        // Most spans are of no pod, or of a pod whose start-up is recorded already: their
        // fields are not even formatted.
        let unrelated = match &parent {
            Some((_, _, done)) => done.load(Ordering::Relaxed),
            None => attrs.metadata().fields().field("pod_uid").is_none(),
        };
        if unrelated {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let start = Instant::now();
        let step = span.name() != POD_SPAN;
        let (uid, depth, done): (Arc<str>, u16, Arc<AtomicBool>) = match (fields.pod_uid, parent) {
            (_, Some((uid, depth, done))) => (uid, depth, done),
            (Some(uid), None) => {
                let uid: Arc<str> = uid.into();
                let done = if step {
                    // A step of its own (a status patch, a CNI ADD, a probe): only while
                    // the pod's start-up is still being recorded.
                    match self.timelines.recording(&uid) {
                        Some(done) => done,
                        None => return,
                    }
                } else {
                    self.timelines
                        .seen(&uid, fields.pod.as_deref().unwrap_or_default(), start)
                };
                (uid, 0, done)
            }
            (None, None) => return,
        };
        if done.load(Ordering::Relaxed) {
            return;
        }
        span.extensions_mut().insert(Rec {
            uid,
            fields: fields.others,
            start,
            depth,
            step,
            done,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        let Some(rec) = extensions.get_mut::<Rec>() else {
            return;
        };
        let mut fields = Fields {
            others: std::mem::take(&mut rec.fields),
            ..Fields::default()
        };
        values.record(&mut fields);
        rec.fields = fields.others;
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(rec) = span.extensions_mut().remove::<Rec>() else {
            return;
        };
        let uid = rec.uid.clone();
        if rec.step {
            self.timelines
                .record(&uid, span.name(), rec, Instant::now());
        } else {
            // The pod's root span ends with its worker: the pod is gone from the node.
            self.timelines.gone(&uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Instrument;
    use tracing_subscriber::layer::SubscriberExt;

    fn recorded<F: Future<Output = ()>>(f: impl FnOnce() -> F) -> Arc<Timelines> {
        let timelines = Timelines::new();
        let subscriber = tracing_subscriber::registry().with(TimelineLayer::new(timelines.clone()));
        let _guard = tracing::subscriber::set_default(subscriber);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(f());
        timelines
    }

    async fn sleep_ms(ms: u64) {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }

    async fn status_patch(ready: bool, ok: bool) {
        let span = tracing::info_span!(
            "status_patch",
            pod_uid = "u1",
            ready,
            outcome = tracing::field::Empty
        );
        sleep_ms(2).instrument(span.clone()).await;
        span.record("outcome", if ok { "ok" } else { "error" });
    }

    #[test]
    fn steps_of_a_pod_tree_with_offsets_depths_and_fields() {
        let timelines = recorded(|| async {
            let pod = tracing::info_span!("pod", pod_uid = "u1", pod = "ns/web");
            sleep_ms(5).await;
            let sync = tracing::info_span!(parent: &pod, "sync_pod", pod_uid = "u1");
            async {
                sleep_ms(1).await;
                async {
                    sleep_ms(3)
                        .instrument(tracing::info_span!("cri", rpc = "RunPodSandbox"))
                        .await;
                }
                .instrument(tracing::info_span!("run_pod_sandbox", attempt = 1))
                .await;
            }
            .instrument(sync)
            .await;
            // Spans of no pod are not steps.
            sleep_ms(1)
                .instrument(tracing::info_span!("node_status"))
                .await;
            status_patch(false, true).await;
            status_patch(true, false).await;
            // A wait under way when Ready is acknowledged ends there.
            let wait = tracing::info_span!(parent: &pod, "wait");
            status_patch(true, true).await;
            // After Ready was acknowledged: not a start-up step any more.
            sleep_ms(1)
                .instrument(tracing::info_span!(parent: &pod, "sync_pod", pod_uid = "u1"))
                .await;
            drop(wait);
        });
        let t = timelines.get("ns", "web").expect("a timeline");
        assert_eq!(t.uid, "u1");
        let labels: Vec<_> = t.steps.iter().map(|s| (s.label(), s.depth)).collect();
        assert_eq!(
            labels,
            [
                ("sync_pod".to_owned(), 0),
                ("run_pod_sandbox 1".to_owned(), 1),
                ("cri RunPodSandbox".to_owned(), 2),
                ("status_patch ok not ready".to_owned(), 0),
                ("status_patch error ready".to_owned(), 0),
                ("wait".to_owned(), 0),
                ("status_patch ok ready".to_owned(), 0),
            ]
        );
        let sync = &t.steps[0];
        assert!(sync.start_ms >= 5.0, "offset from the pod span: {sync:?}");
        assert!(sync.duration_ms >= 4.0, "{sync:?}");
        let cri = &t.steps[2];
        assert!(cri.start_ms >= sync.start_ms && cri.end_ms() <= sync.end_ms());
        let last = t.steps.last().expect("steps");
        let ready = t.ready_ms.expect("Ready acknowledged");
        assert!((ready - last.end_ms()).abs() < 0.01, "{ready} vs {last:?}");
        let wait = &t.steps[t.steps.len() - 2];
        assert!(
            (wait.end_ms() - ready).abs() < 0.01,
            "cut at Ready: {wait:?}"
        );
        assert!(timelines.get("ns", "other").is_none());
    }

    #[test]
    fn kept_pods_and_steps_are_bounded() {
        let timelines = recorded(|| async {
            // Pods still on the node (their workers' root spans open).
            let mut live = Vec::new();
            for i in 0..MAX_PODS + 3 {
                let uid = format!("u{i}");
                live.push(tracing::info_span!("pod", pod_uid = %uid, pod = %format!("ns/p{i}")));
            }
            let pod = tracing::info_span!("pod", pod_uid = "many", pod = "ns/many");
            for _ in 0..MAX_STEPS + 5 {
                drop(tracing::info_span!(parent: &pod, "probe"));
            }
            // A full timeline still learns that the pod became Ready, and stops there.
            let long = "x".repeat(1000);
            drop(
                tracing::info_span!("status_patch", pod_uid = "many", ready = true, outcome = "ok", error = %long),
            );
            drop(tracing::info_span!(parent: &pod, "sync_pod"));
            // Still on the node when the store is read.
            std::mem::forget((live, pod));
        });
        let all = timelines.all();
        assert_eq!(all.len(), MAX_PODS);
        assert_eq!(all[0].name, "p4", "the oldest went first");
        let many = timelines.get("ns", "many").expect("kept");
        assert_eq!(many.steps.len(), MAX_STEPS);
        assert_eq!(many.dropped_steps, 6, "the Ready patch counted, not kept");
        assert!(many.ready_ms.is_some());
        assert!(timelines.get("ns", "p0").is_none());
    }

    #[test]
    fn only_the_last_gone_pods_are_kept() {
        let timelines = recorded(|| async {
            let live = tracing::info_span!("pod", pod_uid = "live", pod = "ns/live");
            for i in 0..MAX_GONE + 5 {
                let uid = format!("g{i}");
                let gone = tracing::info_span!("pod", pod_uid = %uid, pod = %format!("ns/g{i}"));
                drop(tracing::info_span!(parent: &gone, "sync_pod"));
            }
            drop(live);
        });
        let all = timelines.all();
        assert_eq!(
            all.len(),
            MAX_GONE,
            "the live pod went last, then counts as gone"
        );
        assert!(timelines.get("ns", "live").is_some());
        assert!(
            timelines.get("ns", "g5").is_none(),
            "the oldest gone went first"
        );
        assert!(timelines.get("ns", &format!("g{}", MAX_GONE + 4)).is_some());
    }

    #[test]
    fn timelines_serialize_with_camel_case_and_parse_back() {
        let timelines = recorded(|| async {
            let pod = tracing::info_span!("pod", pod_uid = "u1", pod = "ns/web");
            drop(
                tracing::info_span!(parent: &pod, "cni_plugin", plugin = "bridge", command = "ADD"),
            );
        });
        let json = serde_json::to_value(timelines.all()).expect("json");
        let step = &json[0]["steps"][0];
        assert_eq!(step["fields"]["plugin"], "bridge");
        assert!(step["startMs"].is_f64() && step["durationMs"].is_f64());
        assert!(json[0]["seen"].as_str().is_some_and(|s| s.ends_with('Z')));
        let back: Vec<PodTimeline> = serde_json::from_value(json).expect("parses");
        assert_eq!(back, timelines.all());
    }
}
