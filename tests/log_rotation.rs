//! Container log rotation on the real node (the kubelet's container log manager), with
//! `containerLogMaxSize: 1Mi` and `containerLogMaxFiles: 3` from a KubeletConfiguration
//! file: a container writes 100 MiB of numbered lines at full speed while the test samples
//! its log directory every 100 ms.
//!
//! The agent runs with the kubelet's 10 s monitor period (no test knob): between passes it
//! looks at a fast-growing log when it would reach the size, and at a container from its
//! start. Asserted: at most [`BOUND`] bytes of logs on disk (~3.5 MiB) at three samples in
//! four or more, and at most [`CEILING`] at every sample (each sample a consistent listing:
//! see [`look`]; the samples above the bound are printed), at most 3 files (and a `.tmp` while one is compressed), rotations of about
//! the size each. The figures seen (most on disk, largest
//! uncompressed file, the largest file a look found and a rotated file after its cut, the
//! rate, the rotations, the agent's CPU over the burst) and each sample above the bound with
//! the rotations just before it are printed before the assertions.
//!
//! Then: `pods/log?tailLines=10` gives the last 10 lines; the rotated files are gzip (the
//! older) and plain (the newest, unless the runtime overfilled it: then gzip too), named
//! `0.log.<YYYYmmdd-HHMMSS>[.<NNN>][.gz]`, and together with the current file hold
//! consecutive lines, none lost at a rotation; the log directory goes with the pod.

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
/// The bound ("~3 MiB"): `MAX_FILES × MAX_SIZE` and 0.5 MiB. On disk are the
/// current file (a fast writer's is rotated from 0.5 MiB on, before it would pass 1 MiB by
/// the next look), the file rotated last (about 1 MiB, plain as the kubelet keeps it;
/// compressed as soon as the runtime has closed it when the runtime wrote on into it past the
/// size while it reopened), the compressed one before (~70 KiB: the lines compress ~15×), and
/// while a file is compressed, its plain file and `.tmp`. The half MiB is what the writer
/// adds at ~25 MiB/s in ~20 ms of a look or cut that runs late.
///
/// Asserted at three samples in four: on this 2-core machine 1–8 of ~125 samples per run were
/// above it on a quiet machine (worst 4–7 MiB), 19 of 118 with a build and a 15 GB copy
/// beside it (worst 25.75 MiB), from `ReopenContainerLog` calls
/// of 50–140 ms during which the writer filled the renamed or the new file, and from an
/// overfilled file still being compressed when the next one came; every sample must hold
/// [`CEILING`].
const BOUND: u64 = MAX_FILES as u64 * MAX_SIZE + MAX_SIZE / 2;
/// 32 MiB: twice the worst seen (15.4 MiB); the kubelet's periodic pass alone held ~144 MiB
/// at the worst sample of this burst.
const CEILING: u64 = 32 * MAX_SIZE;
/// Numbered lines of 100 bytes: 100 MiB.
const LINES: u64 = 1 << 20;
/// A numbered line without its newline: `%08d ` and 90 `x`.
const LINE_LEN: usize = 99;

/// Writes [`LINES`] lines `%08d xxx…` (100 bytes each) as fast as busybox can, a marker,
/// then, once the burst's rest has been rotated, 20 short lines, and sleeps.
const SCRIPT: &str = "awk -v n=1048576 'BEGIN { pad = sprintf(\"%90s\", \"\"); gsub(/ /, \"x\", pad); \
     for (i = 1; i <= n; i++) printf \"%08d %s\\n\", i, pad }'; echo burst-done; sleep 8; \
     for i in $(seq 1 20); do echo final-$i; done; sleep 3600";

/// One look at the log directory: when, and each file with its size.
#[derive(Debug, Clone)]
struct Sample {
    at: Timestamp,
    files: Vec<(String, u64)>,
}

impl Sample {
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

/// The names in `dir`, sorted; `None` when it cannot be listed (gone with the pod).
async fn names_in(dir: &Path) -> Option<Vec<String>> {
    let mut entries = tokio::fs::read_dir(dir).await.ok()?;
    let mut names = Vec::new();
    while let Ok(Some(entry)) = entries.next_entry().await {
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Some(names)
}

/// A consistent look at `dir`: the names, each file's size, and the names again; taken again
/// while a rotation changed the names meanwhile (a file renamed or removed between the
/// listing and its `stat` would otherwise be missed or counted under the new file's size),
/// so every sample counts every file on disk at one moment of the rotations.
async fn look(dir: &Path) -> Option<Sample> {
    loop {
        let at = Timestamp::now();
        let names = names_in(dir).await?;
        let mut files = Vec::with_capacity(names.len());
        for name in &names {
            match tokio::fs::symlink_metadata(dir.join(name)).await {
                Ok(meta) => files.push((name.clone(), meta.len())),
                Err(_) => break,
            }
        }
        if files.len() == names.len() && names_in(dir).await? == names {
            return Some(Sample { at, files });
        }
    }
}

/// Samples `dir` every 100 ms until `stop`.
fn sample_every_100ms(dir: PathBuf, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<Sample>> {
    tokio::spawn(async move {
        let mut samples = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            if let Some(sample) = look(&dir).await {
                samples.push(sample);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
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

/// `(runtime timestamp, text)` of each line in CRI log records, oldest first: a partial
/// record (`P`, the runtime cut the line) is joined to the records that complete it, also
/// across files.
fn lines_of<'a>(texts: impl IntoIterator<Item = &'a str>) -> Vec<(Timestamp, String)> {
    let mut lines = Vec::new();
    let mut partial = String::new();
    for record in texts.into_iter().flat_map(str::lines) {
        let mut parts = record.splitn(4, ' ');
        let ts: Timestamp = parts
            .next()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("a timestamp: {record}"));
        let (_stream, tag, msg) = (parts.next(), parts.next(), parts.next());
        partial.push_str(msg.unwrap_or_else(|| panic!("a message: {record}")));
        match tag {
            Some("F") => lines.push((ts, std::mem::take(&mut partial))),
            Some("P") => {}
            other => panic!("tag {other:?}: {record}"),
        }
    }
    assert!(partial.is_empty(), "a partial line at the end: {partial}");
    lines
}

/// `0.log.<YYYYmmdd-HHMMSS>[.<NNN>][.gz]`: the kubelet's name, with the sequence number of a
/// second rotation within one second.
fn is_rotated_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("0.log.") else {
        return false;
    };
    let rest = rest.strip_suffix(".gz").unwrap_or(rest);
    let ts = match rest.split_once('.') {
        Some((ts, n)) if n.len() == 3 && n.bytes().all(|b| b.is_ascii_digit()) => ts,
        Some(_) => return false,
        None => rest,
    };
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
    let case = Case::with_agent("logrot", &["--config", &config]).await;
    let name = case
        .create(
            "chatty",
            sleeper(serde_json::json!({
                "containers": [{ "name": "main", "image": "busybox", "command": ["sh", "-c", SCRIPT] }]
            })),
        )
        .await;
    let pod = running(&name).await;
    let uid = pod.metadata.uid.clone().expect("uid");
    let container_started = pod
        .status
        .and_then(|s| {
            s.container_statuses?
                .into_iter()
                .next()?
                .state?
                .running?
                .started_at
        })
        .expect("the container's start")
        .0;
    let log = case.log_of(&name, &uid, "main");
    let log_dir = log.parent().expect("log dir").to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_every_100ms(log_dir.clone(), stop.clone());

    let api = pods_api().await;
    let tail = LogParams {
        container: Some("main".into()),
        tail_lines: Some(10),
        ..LogParams::default()
    };
    let started = Instant::now();
    let cpu_before = case.agent().cpu_seconds();
    let last10 = eventually("the final lines", Duration::from_secs(240), || async {
        let out = api.logs(&name, &tail).await.ok()?;
        out.contains("final-20").then_some(out)
    })
    .await;
    let cpu = case.agent().cpu_seconds() - cpu_before;
    let burst = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let samples = sampler.await.expect("sampler");
    // What is left, once a compression under way has ended: the current file, the newest
    // rotated one plain, the one before gzip; oldest first, by name without `.gz` (a
    // sequence number sorts after the plain second).
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
    let mut names: Vec<&str> = end.files.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_by_key(|n| n.trim_end_matches(".gz"));
    let texts: Vec<String> = names
        .iter()
        .skip(1)
        .chain(names.first())
        .map(|n| read_log(&log_dir.join(n)))
        .collect();
    let records = texts.iter().map(|t| t.lines().count()).sum::<usize>();
    let all = lines_of(texts.iter().map(String::as_str));
    let done = all
        .iter()
        .position(|(_, m)| m == "burst-done")
        .expect("the burst's end is in the files kept");

    // The figures first.
    let bytes_per_record = texts.iter().map(String::len).sum::<usize>() as f64 / records as f64;
    let written = bytes_per_record * LINES as f64;
    let burst_seconds = all[done].0.duration_since(container_started).as_secs_f64();
    // This run's lines only: the node's agent log file holds the earlier test files' runs too
    // (one of them kills containerd, which its agent logs as failed passes).
    let agent_log = case.agent().this_runs_log().expect("agent log");
    let took: Vec<u64> = agent_log
        .lines()
        .filter(|l| l.contains(": rotated container log") && l.contains(&uid))
        .filter_map(|l| l.split("took_ms=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split(&format!("{name}="))
            .nth(1)?
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let rotations: Vec<&str> = agent_log
        .lines()
        .filter(|l| l.contains(": rotated container log") && l.contains(&uid))
        .collect();
    let most = |name: &str| {
        rotations
            .iter()
            .filter_map(|l| field(l, name))
            .max()
            .unwrap_or(0)
    };
    let mib = |b: f64| b / f64::from(1 << 20);
    eprintln!(
        "log rotation: largest file seen at a look {} B, largest rotated file after its cut {} B, latest look {} ms",
        most("seen_bytes"),
        most("rotated_bytes"),
        most("late_ms"),
    );
    // Each sample above the bound, with the rotations of that log in the half second
    // before it (when each rotation ended, relative to the sample: how long its cut took,
    // how late its look ran, the size it saw, the rotated file after the cut).
    let above: Vec<&Sample> = samples.iter().filter(|s| s.total() > BOUND).collect();
    let at_of = |line: &str| line.split(' ').next()?.parse::<Timestamp>().ok();
    for sample in &above {
        eprintln!(
            "log rotation: above the bound at {}: {:.2} MiB in {:?}",
            sample.at,
            mib(sample.total() as f64),
            sample.files
        );
        for line in &rotations {
            let Some(at) = at_of(line) else { continue };
            let before = sample.at.duration_since(at).as_secs_f64();
            if (-0.1..0.5).contains(&before) {
                eprintln!(
                    "    rotation {:.0} ms before: took_ms={:?} (renamed at {:?}) late_ms={:?} seen_bytes={:?} rotated_bytes={:?}",
                    before * 1000.0,
                    field(line, "took_ms"),
                    field(line, "renamed_ms"),
                    field(line, "late_ms"),
                    field(line, "seen_bytes"),
                    field(line, "rotated_bytes"),
                );
            }
        }
    }
    let mut sorted = took.clone();
    sorted.sort_unstable();
    let max_total = samples.iter().map(Sample::total).max().unwrap_or(0);
    let max_plain = samples.iter().map(Sample::largest_plain).max().unwrap_or(0);
    let max_files = samples.iter().map(|s| s.files.len()).max().unwrap_or(0);
    eprintln!(
        "log rotation: {} samples over {:.1} s; {:.1} MiB written on disk in {burst_seconds:.1} s \
         ({:.1} MiB/s); most on disk {:.2} MiB (bound {:.2}), {} samples above; largest \
         uncompressed file {:.2} MiB; most files {max_files}; {} rotations, cut in {} ms \
         (median), {} ms (90th percentile), {} ms at most; agent CPU {cpu:.2} s from the pod's \
         start to the end",
        samples.len(),
        burst.as_secs_f64(),
        mib(written),
        mib(written) / burst_seconds,
        mib(max_total as f64),
        mib(BOUND as f64),
        above.len(),
        mib(max_plain as f64),
        took.len(),
        sorted.get(sorted.len() / 2).unwrap_or(&0),
        sorted.get(sorted.len() * 9 / 10).unwrap_or(&0),
        sorted.last().unwrap_or(&0),
    );

    let expected: String = (11..=20).map(|i| format!("final-{i}\n")).collect();
    assert_eq!(last10, expected, "tailLines=10 is the last 10 lines");
    assert_eq!(names.len(), MAX_FILES, "{names:?}");
    assert_eq!(names[0], "0.log");
    assert!(
        is_rotated_name(names[1]) && names[1].ends_with(".gz"),
        "{names:?}"
    );
    // The newest rotated file: plain as the kubelet keeps it, or compressed when it held
    // more than the size (the runtime wrote on into it while it reopened).
    assert!(is_rotated_name(names[2]), "{names:?}");
    assert!(
        !names[2].ends_with(".gz") || texts[1].len() as u64 > MAX_SIZE,
        "{names:?}: the newest rotated file compressed with {} B",
        texts[1].len()
    );
    // Oldest to newest, the files hold consecutive lines up to the last, then the marker
    // and the final lines: nothing lost at a rotation.
    // The oldest file kept may start with the end of a line the runtime cut (`P`) into a
    // file removed since: not a whole line.
    let numbered = match all[..done].split_first() {
        Some(((_, first), rest)) if first.len() != LINE_LEN => rest,
        _ => &all[..done],
    };
    let numbers: Vec<u64> = numbered
        .iter()
        .map(|(_, m)| {
            assert_eq!(m.len(), LINE_LEN, "a whole line: {m}");
            m[..8].parse().expect("a numbered line")
        })
        .collect();
    assert!(!numbers.is_empty());
    assert_eq!(*numbers.last().expect("a line"), LINES);
    for pair in numbers.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "consecutive lines across the files");
    }
    let finals: Vec<&str> = all[done + 1..].iter().map(|(_, m)| m.as_str()).collect();
    let expected: Vec<String> = (1..=20).map(|i| format!("final-{i}")).collect();
    assert_eq!(finals, expected);

    // The README's claim: the bound at three samples in four or more (93–100 % seen on a
    // quiet machine, 84 % with a build beside it), and
    // the ceiling at every sample (the samples above the bound are printed above: see
    // [`BOUND`]).
    assert!(samples.len() > 10, "sampled through the burst");
    assert!(
        above.len() * 4 <= samples.len(),
        "{} of {} samples above {BOUND} B",
        above.len(),
        samples.len()
    );
    assert!(
        max_total <= CEILING,
        "{max_total} B on disk at a sample, above {CEILING} B"
    );
    // The bytes written went through rotations of about the size each.
    assert!(
        took.len() as f64 >= written / (4.0 * MAX_SIZE as f64),
        "{} rotations for {written} B",
        took.len()
    );
    assert!(max_files <= MAX_FILES + 1, "at most max files and a .tmp");
    let failed: Vec<&str> = agent_log
        .lines()
        .filter(|l| l.contains("Failed to rotate"))
        .collect();
    assert!(
        failed.is_empty(),
        "the agent failed to rotate:\n{}",
        failed.join("\n")
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
