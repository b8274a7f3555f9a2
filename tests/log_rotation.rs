//! Container log rotation on the real node (the kubelet's container log manager), with
//! `containerLogMaxSize: 1Mi` and `containerLogMaxFiles: 3` from a KubeletConfiguration
//! file: a container writes 100 MiB of numbered lines at full speed while the test samples
//! its log directory every 200 ms.
//!
//! Rotation is periodic (the kubelet checks every 10 s; this test shortens the period to
//! 1 s with the agent's hidden test knob `--container-log-monitor-period`), so between two
//! checks the current file grows by whatever the container writes. The bound asserted is
//! the honest one: with `L` the max size, `R` the fastest the current file grew between two
//! samples (no rotation between them), `P` the period, `D` the
//! longest rotation of the container (compressing the file before it, as the agent logs
//! it) and 0.5 s for scheduling, no uncompressed file exceeds `S = L + R·(P + D + 0.5 s)`;
//! on disk there are at most the current file, the file rotated last (still uncompressed,
//! as the kubelet leaves it for readers to finish) and the compressed one before it (or its
//! `.tmp` while it is written), so at most `3·S` at any sample. The figures seen are
//! printed.
//!
//! Then: `pods/log?tailLines=10` gives the last 10 lines; the rotated files are gzip (the
//! older) and plain (the newest), named `0.log.<YYYYmmdd-HHMMSS>[.gz]`, and together with
//! the current file hold consecutive lines, none lost at a rotation; the log directory
//! goes with the pod.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::case::{Case, delete_and_wait, running};
use common::pods::{pods_api, sleeper};
use common::{eventually, state_dir};
use k8s_openapi::jiff::Timestamp;
use kube::api::LogParams;

const MAX_SIZE: u64 = 1 << 20;
const MAX_FILES: usize = 3;
const PERIOD: Duration = Duration::from_secs(1);
/// Numbered lines of 100 bytes: 100 MiB.
const LINES: u64 = 1 << 20;

/// Writes [`LINES`] lines `%08d xxx…` (100 bytes each) as fast as busybox can, a marker,
/// then, once the burst's rest has been rotated, 20 short lines, and sleeps.
const SCRIPT: &str = "awk -v n=1048576 'BEGIN { pad = sprintf(\"%90s\", \"\"); gsub(/ /, \"x\", pad); \
     for (i = 1; i <= n; i++) printf \"%08d %s\\n\", i, pad }'; echo burst-done; sleep 8; \
     for i in $(seq 1 20); do echo final-$i; done; sleep 3600";

/// One look at the log directory.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    files: Vec<(String, u64)>,
}

impl Sample {
    fn size_of(&self, name: &str) -> Option<u64> {
        self.files.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }

    /// How fast the current file grew since `before`, in bytes per second, if no rotation
    /// came between.
    fn growth_since(&self, before: &Sample) -> Option<f64> {
        let names = |s: &Sample| s.files.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        let (from, to) = (before.size_of("0.log")?, self.size_of("0.log")?);
        let seconds = self.at.duration_since(before.at).as_secs_f64();
        (names(before) == names(self) && to > from && seconds > 0.0)
            .then(|| (to - from) as f64 / seconds)
    }

    fn total(&self) -> u64 {
        self.files.iter().map(|(_, size)| size).sum()
    }

    fn largest_plain(&self) -> u64 {
        self.files
            .iter()
            .filter(|(name, _)| !name.ends_with(".gz") && !name.ends_with(".tmp"))
            .map(|(_, size)| *size)
            .max()
            .unwrap_or(0)
    }
}

async fn look(dir: &Path) -> Option<Sample> {
    let mut entries = tokio::fs::read_dir(dir).await.ok()?;
    let mut files = Vec::new();
    while let Ok(Some(entry)) = entries.next_entry().await {
        // A file may go between the listing and the stat: it is not on disk then.
        if let Ok(meta) = entry.metadata().await {
            files.push((entry.file_name().to_string_lossy().into_owned(), meta.len()));
        }
    }
    files.sort();
    Some(Sample {
        at: Instant::now(),
        files,
    })
}

/// Samples `dir` every 200 ms until `stop`.
fn sample_every_200ms(dir: PathBuf, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<Sample>> {
    tokio::spawn(async move {
        let mut samples = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            if let Some(sample) = look(&dir).await {
                samples.push(sample);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        samples
    })
}

/// The text of a log file, uncompressed.
fn read_log(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if path.extension().is_some_and(|e| e == "gz") {
        let mut text = String::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut text)
            .unwrap_or_else(|e| panic!("{} is not gzip: {e}", path.display()));
        text
    } else {
        String::from_utf8(bytes).expect("utf-8 log")
    }
}

/// `(runtime timestamp, text)` of each CRI log line.
fn records(text: &str) -> Vec<(Timestamp, &str)> {
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(4, ' ');
            let ts = parts.next().and_then(|t| t.parse().ok());
            let (_stream, tag, msg) = (parts.next(), parts.next(), parts.next());
            assert_eq!(tag, Some("F"), "whole lines only: {line}");
            (ts.expect("a timestamp"), msg.expect("a message"))
        })
        .collect()
}

fn is_rotated_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("0.log.") else {
        return false;
    };
    let ts = rest.strip_suffix(".gz").unwrap_or(rest);
    ts.len() == 15
        && ts.bytes().enumerate().all(|(i, b)| {
            if i == 8 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        })
}

#[tokio::test]
#[ignore = "needs root and the local cluster: run scripts/test.sh"]
async fn a_chatty_container_keeps_max_files_of_about_max_size() {
    let dir = state_dir().join("test-agents").join("log-rotation");
    std::fs::create_dir_all(&dir).expect("config dir");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\n",
    )
    .expect("config");
    let config = config.display().to_string();
    let case = Case::with_agent(
        "logrot",
        &["--config", &config, "--container-log-monitor-period=1s"],
    )
    .await;
    let name = case
        .create(
            "chatty",
            sleeper(serde_json::json!({
                "containers": [{ "name": "main", "image": "busybox", "command": ["sh", "-c", SCRIPT] }]
            })),
        )
        .await;
    let pod = running(&name).await;
    let uid = pod.metadata.uid.expect("uid");
    let log = case.log_of(&name, &uid, "main");
    let log_dir = log.parent().expect("log dir").to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_every_200ms(log_dir.clone(), stop.clone());

    let api = pods_api().await;
    let tail = LogParams {
        container: Some("main".into()),
        tail_lines: Some(10),
        ..LogParams::default()
    };
    let started = Instant::now();
    let last10 = eventually("the final lines", Duration::from_secs(240), || async {
        let out = api.logs(&name, &tail).await.ok()?;
        out.contains("final-20").then_some(out)
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let samples = sampler.await.expect("sampler");
    let expected: String = (11..=20).map(|i| format!("final-{i}\n")).collect();
    assert_eq!(last10, expected, "tailLines=10 is the last 10 lines");

    // What is left, once a compression under way has ended: the current file, the newest
    // rotated one plain, the one before gzip.
    let end = eventually(
        "the last rotation done",
        Duration::from_secs(30),
        || async {
            look(&log_dir)
                .await
                .filter(|s| !s.files.iter().any(|(n, _)| n.ends_with(".tmp")))
        },
    )
    .await;
    let names: Vec<&str> = end.files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), MAX_FILES, "{names:?}");
    assert_eq!(names[0], "0.log");
    assert!(
        is_rotated_name(names[1]) && names[1].ends_with(".gz"),
        "{names:?}"
    );
    assert!(
        is_rotated_name(names[2]) && !names[2].ends_with(".gz"),
        "{names:?}"
    );
    assert!(names[1].trim_end_matches(".gz") < names[2], "{names:?}");
    // Oldest to newest, the files hold consecutive lines up to the last, then the marker
    // and the final lines: nothing lost at a rotation.
    let texts: Vec<String> = [names[1], names[2], names[0]]
        .iter()
        .map(|n| read_log(&log_dir.join(n)))
        .collect();
    let all: Vec<(Timestamp, &str)> = texts.iter().flat_map(|t| records(t)).collect();
    let done = all
        .iter()
        .position(|(_, m)| *m == "burst-done")
        .expect("the burst's end is in the files kept");
    let numbers: Vec<u64> = all[..done]
        .iter()
        .map(|(_, m)| m[..8].parse().expect("a numbered line"))
        .collect();
    assert!(!numbers.is_empty());
    assert_eq!(*numbers.last().expect("a line"), LINES);
    for pair in numbers.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "consecutive lines across the files");
    }
    let finals: Vec<&str> = all[done + 1..].iter().map(|(_, m)| *m).collect();
    let expected: Vec<String> = (1..=20).map(|i| format!("final-{i}")).collect();
    assert_eq!(finals, expected);

    // The bound, from the fastest growth seen.
    let rates: Vec<f64> = samples
        .windows(2)
        .filter_map(|w| w[1].growth_since(&w[0]))
        .collect();
    assert!(rates.len() >= 3, "growth seen between samples");
    let rate = rates.iter().copied().fold(0.0, f64::max);
    let mean_rate = rates.iter().sum::<f64>() / rates.len() as f64;
    // The longest rotation of this container (compressing the file before, renaming and
    // reopening), as the agent logged it: the current file grows meanwhile too.
    let agent_log = std::fs::read_to_string(&case.agent().log).expect("agent log");
    let took: Vec<u64> = agent_log
        .lines()
        .filter(|l| l.contains("rotated container log") && l.contains(&uid))
        .filter_map(|l| l.split("took_ms=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert!(took.len() >= 3, "rotations logged: {took:?}");
    let longest = Duration::from_millis(took.iter().copied().max().unwrap_or(0));
    let per_file = MAX_SIZE as f64 + rate * (PERIOD + longest).as_secs_f64() + rate * 0.5;
    let bound = 3.0 * per_file;
    let max_total = samples.iter().map(Sample::total).max().unwrap_or(0);
    let max_plain = samples.iter().map(Sample::largest_plain).max().unwrap_or(0);
    let max_files = samples.iter().map(|s| s.files.len()).max().unwrap_or(0);
    let mib = |b: f64| b / f64::from(1 << 20);
    eprintln!(
        "log rotation: {} samples over {:.1} s; the log grew at {:.1} MiB/s (mean) and \
         {:.1} MiB/s (fastest); largest uncompressed file {:.2} MiB (bound {:.2}); most on disk \
         {:.2} MiB (bound {:.2}); most files {max_files}; {} rotations, the longest \
         {longest:?}",
        samples.len(),
        started.elapsed().as_secs_f64(),
        mib(mean_rate),
        mib(rate),
        mib(max_plain as f64),
        mib(per_file),
        mib(max_total as f64),
        mib(bound),
        took.len(),
    );
    assert!(samples.len() > 10, "sampled through the burst");
    assert!(
        (max_plain as f64) <= per_file,
        "an uncompressed log of {max_plain} B exceeds L + R(P + D + 0.5 s) = {per_file:.0} B"
    );
    assert!(
        (max_total as f64) <= bound,
        "{max_total} B of logs on disk exceeds 3(L + R(P + D + 0.5 s)) = {bound:.0} B"
    );
    assert!(max_files <= MAX_FILES + 1, "at most max files and a .tmp");
    assert!(
        !agent_log.contains("Failed to rotate"),
        "{}",
        case.agent().log_tail()
    );

    // The log directory goes with the pod (after its deletion from the API, as the
    // kubelet's).
    delete_and_wait(&name).await;
    eventually(
        "the pod's log directory gone",
        Duration::from_secs(30),
        || async { (!log_dir.exists()).then_some(()) },
    )
    .await;
    std::fs::remove_dir_all(dir).expect("clean up");
}
