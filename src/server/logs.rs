//! Container logs, as `kubectl logs` reads them through the kubelet API: the CRI log file of
//! the container (`<pod-log-dir>/<container>/<restart>.log`, one line
//! `<RFC3339Nano> <stdout|stderr> <P|F> <text>` per write, `P` for a partial line continued
//! by the next), with partial lines joined, and the kubelet's options: `tailLines`,
//! `sinceSeconds`/`sinceTime`, `limitBytes`, `timestamps`, `previous` (the container before
//! the current one) and `follow` (new lines until the client goes away or the container
//! has exited and its log is read to the end). A followed log that the container log
//! manager rotates is read to its end, then the new file from its start (the kubelet
//! reopens the path on fsnotify's rename event). Without `follow`, only the current file is
//! read, as by the kubelet v1.20: `tailLines` does not reach into rotated files.
//!
//! `tailLines` counts joined lines: the file is read twice from its start, once to count
//! its lines and once to write the last ones, so memory does not grow with `tailLines` or
//! the size of the log. Memory is bounded per line too: a file line longer than
//! [`MAX_RECORD`] (the runtime splits longer writes unless told not to) is read in pieces
//! that continue as partial lines, and a joined line longer than [`MAX_LINE`] is written in
//! pieces (the kubelet never joins: it writes each partial record as it reads it).

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Bytes, Frame};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::mpsc;

use super::Query;
use crate::cri::{Cri, CriError, api};
pub use crate::kuberuntime::logs::MAX_LINE;
use crate::kuberuntime::logs::{Joiner, LogLine, parse_cri_line};
use k8s_openapi::api::core::v1::PodStatus;

/// How often a followed log is checked for new lines.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// How often a followed container is checked for having exited.
const STATE_POLL: Duration = Duration::from_secs(1);
/// Output is sent in chunks of about this size.
const CHUNK: usize = 32 * 1024;
/// The longest file line read at once; longer ones are read as partial pieces.
pub const MAX_RECORD: usize = 1024 * 1024;

/// Log request failures.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A query parameter is malformed: 400.
    #[error("invalid log options: {0}")]
    Options(String),
    /// The container (or its previous instance) does not exist: 400, as for the kubelet.
    #[error("{0}")]
    NoContainer(String),
    /// The runtime could not be asked: 500.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// The log file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The log file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The kubelet's `PodLogOptions`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Stream new lines.
    pub follow: bool,
    /// The previous instance of the container.
    pub previous: bool,
    /// Prefix each line with its timestamp.
    pub timestamps: bool,
    /// Only lines at or after this time.
    pub since: Option<Timestamp>,
    /// Only the last this many lines.
    pub tail_lines: Option<u64>,
    /// At most this many bytes.
    pub limit_bytes: Option<u64>,
}

/// Go's `strconv.ParseBool`, which the API's query decoding uses.
pub fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

impl LogOptions {
    /// Options from the query of a `/containerLogs` request, with `now` for `sinceSeconds`.
    ///
    /// # Errors
    /// A malformed or out-of-range value.
    pub fn from_query(query: &Query, now: Timestamp) -> Result<Self, LogError> {
        let bad = |k: &str, v: &str| LogError::Options(format!("{k}={v:?}"));
        let flag = |k: &str| match query.get(k) {
            None | Some("") => Ok(false),
            Some(v) => parse_bool(v).ok_or_else(|| bad(k, v)),
        };
        let positive = |k: &str, min: i64| -> Result<Option<i64>, LogError> {
            match query.get(k) {
                None | Some("") => Ok(None),
                Some(v) => match v.parse::<i64>() {
                    Ok(n) if n >= min => Ok(Some(n)),
                    _ => Err(bad(k, v)),
                },
            }
        };
        let since_seconds = positive("sinceSeconds", 1)?;
        let since_time = match query.get("sinceTime") {
            None | Some("") => None,
            Some(v) => Some(v.parse::<Timestamp>().map_err(|_| bad("sinceTime", v))?),
        };
        if since_seconds.is_some() && since_time.is_some() {
            return Err(LogError::Options(
                "at most one of sinceTime or sinceSeconds may be specified".into(),
            ));
        }
        let since = since_time.or_else(|| {
            since_seconds.map(|s| {
                now.checked_sub(SignedDuration::from_secs(s))
                    .unwrap_or(Timestamp::MIN)
            })
        });
        let to_u64 = |v: Option<i64>| v.map(|n| u64::try_from(n).unwrap_or(0));
        Ok(Self {
            follow: flag("follow")?,
            previous: flag("previous")?,
            timestamps: flag("timestamps")?,
            since,
            tail_lines: to_u64(positive("tailLines", 0)?),
            limit_bytes: to_u64(positive("limitBytes", 1)?),
        })
    }
}

/// Writes lines to the client: `since` filtering, timestamps, the byte limit, chunking.
#[derive(Debug)]
pub struct LogWriter {
    since: Option<Timestamp>,
    timestamps: bool,
    remaining: Option<u64>,
    buf: Vec<u8>,
}

impl LogWriter {
    /// A writer for these options.
    #[must_use]
    pub fn new(opts: &LogOptions) -> Self {
        Self {
            since: opts.since,
            timestamps: opts.timestamps,
            remaining: opts.limit_bytes,
            buf: Vec::with_capacity(CHUNK),
        }
    }

    /// Adds a line; false once the byte limit is reached (nothing more is to be written).
    pub fn write(&mut self, line: &LogLine) -> bool {
        if self.remaining == Some(0) {
            return false;
        }
        if self.since.is_some_and(|since| line.time < since) {
            return true;
        }
        let start = self.buf.len();
        if self.timestamps {
            self.buf.extend_from_slice(line.timestamp.as_bytes());
            self.buf.push(b' ');
        }
        self.buf.extend_from_slice(&line.content);
        if let Some(remaining) = self.remaining.as_mut() {
            let written = u64::try_from(self.buf.len() - start).unwrap_or(u64::MAX);
            if written >= *remaining {
                self.buf
                    .truncate(start + usize::try_from(*remaining).unwrap_or(usize::MAX));
                *remaining = 0;
                return false;
            }
            *remaining -= written;
        }
        true
    }

    /// Whether a chunk is ready to send.
    #[must_use]
    pub fn full(&self) -> bool {
        self.buf.len() >= CHUNK
    }

    /// Takes what is buffered.
    pub fn take(&mut self) -> Option<Bytes> {
        (!self.buf.is_empty()).then(|| Bytes::from(std::mem::take(&mut self.buf)))
    }
}

/// The container whose log is asked for, and its log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSource {
    /// The runtime's container id.
    pub container_id: String,
    /// Its CRI log file.
    pub path: PathBuf,
}

/// The runtime id of the container whose log is asked for, chosen from the pod's status as
/// the kubelet's `validateContainerLogStatus` chooses: with `previous`, the last
/// termination; else the running or terminated container, or while a new one waits (a
/// crash loop's back-off), the last one that ended.
///
/// # Errors
/// [`LogError::NoContainer`] with the kubelet's message when there is no such container.
pub fn container_for_logs(
    status: &PodStatus,
    pod_name: &str,
    container: &str,
    previous: bool,
) -> Result<String, LogError> {
    let no = |what: &str| {
        LogError::NoContainer(format!(
            "container {container:?} in pod {pod_name:?} {what}"
        ))
    };
    let found = [
        &status.container_statuses,
        &status.init_container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .find(|c| c.name == container)
    .ok_or_else(|| no("is not available"))?;
    let last_terminated = found
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref());
    let last = last_terminated
        .and_then(|t| t.container_id.as_deref())
        .filter(|id| !id.is_empty());
    let state = found.state.clone().unwrap_or_default();
    let id = if previous {
        last.ok_or_else(|| {
            LogError::NoContainer(format!(
                "previous terminated container {container:?} in pod {pod_name:?} not found"
            ))
        })?
    } else if state.running.is_some() {
        found.container_id.as_deref().unwrap_or_default()
    } else if let Some(terminated) = &state.terminated {
        terminated
            .container_id
            .as_deref()
            .filter(|id| !id.is_empty())
            .or(last)
            .ok_or_else(|| no("is terminated"))?
    } else if last_terminated.is_some() {
        last.ok_or_else(|| no("is terminated"))?
    } else if let Some(waiting) = &state.waiting {
        let why = match waiting.reason.as_deref().unwrap_or_default() {
            "ErrImagePull" => "image can't be pulled",
            "ImagePullBackOff" => "trying and failing to pull image",
            other => other,
        };
        return Err(no(&format!("is waiting to start: {why}")));
    } else {
        return Err(no("is waiting to start - no logs yet"));
    };
    // `containerd://<id>`: the runtime's id is after the scheme.
    Ok(id.split_once("://").map_or(id, |(_, id)| id).to_owned())
}

/// The log file of a container of the pod, by its runtime id.
///
/// # Errors
/// [`LogError::NoContainer`] when the runtime has no log file for it, or a failed CRI call.
pub async fn log_source<C: Cri>(
    cri: &C,
    container_id: String,
    container: &str,
    pod_name: &str,
) -> Result<LogSource, LogError> {
    let status = cri
        .container_status(api::ContainerStatusRequest {
            container_id: container_id.clone(),
            verbose: false,
        })
        .await?
        .status
        .ok_or_else(|| LogError::NoContainer(format!("container {container:?} has no status")))?;
    if status.log_path.is_empty() {
        return Err(LogError::NoContainer(format!(
            "container {container:?} in pod {pod_name:?} has no log file"
        )));
    }
    Ok(LogSource {
        container_id,
        path: status.log_path.into(),
    })
}

async fn is_running<C: Cri>(cri: &C, id: &str) -> bool {
    let status = cri
        .container_status(api::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        })
        .await;
    match status {
        Ok(resp) => resp
            .status
            .is_some_and(|s| s.state() == api::ContainerState::ContainerRunning),
        // Gone: nothing more will be written.
        Err(e) if e.is_not_found() => false,
        // The runtime is slow or restarting: keep following.
        Err(_) => true,
    }
}

/// Reads file lines; a last line without its line feed is held back while following
/// (the runtime may be writing it). A line longer than the maximum record comes in
/// pieces: each but the last tagged partial (`P`) under the line's timestamp and stream.
struct LineReader {
    reader: BufReader<tokio::fs::File>,
    path: PathBuf,
    /// The inode of the file open, to notice the path naming another one (a rotation).
    inode: u64,
    pending: Vec<u8>,
    max_record: usize,
    /// Bytes left to read when the read stops at a fixed length (`None`: follow the file).
    remaining: Option<u64>,
    /// The `<timestamp> <stream> ` and tag of a long line being read in pieces (empty
    /// for a line that is not in the CRI format: its pieces are given out as they are).
    split: Option<(Vec<u8>, Vec<u8>)>,
}

impl LineReader {
    /// Opens the log at `path`; with `length`, reads only its first `length` bytes.
    async fn open(path: &Path, max_record: usize, length: Option<u64>) -> Result<Self, LogError> {
        let io = |source| LogError::Io {
            path: path.to_owned(),
            source,
        };
        let file = tokio::fs::File::open(path).await.map_err(io)?;
        let inode = std::os::unix::fs::MetadataExt::ino(&file.metadata().await.map_err(io)?);
        Ok(Self {
            reader: BufReader::with_capacity(64 * 1024, file),
            path: path.to_owned(),
            inode,
            pending: Vec::new(),
            max_record,
            remaining: length,
            split: None,
        })
    }

    /// Whether the path now names another file than the one open: the log was rotated and
    /// the runtime writes the new one (while the path names no file, the rotation is under
    /// way: not yet).
    async fn replaced(&self) -> bool {
        tokio::fs::metadata(&self.path)
            .await
            .is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) != self.inode)
    }

    /// The next complete line (without its line feed); `None` at the end for now. At the
    /// real end (`at_end`), a last unterminated line is returned too.
    async fn next(&mut self, at_end: bool) -> Result<Option<Vec<u8>>, LogError> {
        let room = self.max_record.saturating_sub(self.pending.len()).max(1) as u64;
        let room = self.remaining.map_or(room, |left| left.min(room));
        let read = (&mut self.reader)
            .take(room)
            .read_until(b'\n', &mut self.pending)
            .await
            .map_err(|source| LogError::Io {
                path: self.path.clone(),
                source,
            })?;
        if let Some(left) = &mut self.remaining {
            *left = left.saturating_sub(read as u64);
        }
        if self.pending.last() == Some(&b'\n') {
            self.pending.pop();
            return Ok(Some(self.piece(true)));
        }
        if self.pending.len() >= self.max_record {
            return Ok(Some(self.piece(false)));
        }
        // No line feed: the end of the file. Final only when the writer is done.
        if at_end && !self.pending.is_empty() {
            return Ok(Some(self.piece(true)));
        }
        Ok(None)
    }

    /// What is pending as a line: the whole line (`last`), or a piece of a long one.
    fn piece(&mut self, last: bool) -> Vec<u8> {
        let pending = std::mem::take(&mut self.pending);
        let (prefix, tag, content) = match self.split.take() {
            Some((prefix, tag)) => (prefix, tag, pending),
            None if last => return pending,
            None => match cri_header(&pending) {
                Some((prefix_len, tag_end)) => (
                    pending[..prefix_len].to_vec(),
                    pending[prefix_len..tag_end].to_vec(),
                    pending[(tag_end + 1).min(pending.len())..].to_vec(),
                ),
                None => (Vec::new(), Vec::new(), pending),
            },
        };
        if prefix.is_empty() {
            if !last {
                self.split = Some((prefix, tag));
            }
            return content;
        }
        let mut line = prefix.clone();
        line.extend_from_slice(if last { &tag } else { b"P" });
        line.push(b' ');
        line.extend_from_slice(&content);
        if !last {
            self.split = Some((prefix, tag));
        }
        line
    }
}

/// Where the tag of a CRI log line starts (after `<timestamp> <stream> `) and ends.
fn cri_header(line: &[u8]) -> Option<(usize, usize)> {
    let parsed = parse_cri_line(line).ok()?;
    let prefix = parsed.timestamp.len() + 1 + parsed.stream.len() + 1;
    let tag_end = line[prefix..]
        .iter()
        .position(|b| *b == b' ')
        .map_or(line.len(), |i| prefix + i);
    Some((prefix, tag_end))
}

/// How many lines (joined) the log at `path` holds now; a last unfinished one counts at
/// the real end (`final_end`).
async fn count_lines(path: &Path, length: u64, final_end: bool) -> Result<u64, LogError> {
    let mut reader = LineReader::open(path, MAX_RECORD, Some(length)).await?;
    let mut joiner = Joiner::default();
    let mut lines = 0u64;
    while let Some(raw) = reader.next(final_end).await? {
        if joined(&mut joiner, &raw, path).is_some() {
            lines += 1;
        }
    }
    if final_end {
        lines += joiner.finish().len() as u64;
    }
    Ok(lines)
}

fn joined(joiner: &mut Joiner, raw: &[u8], path: &Path) -> Option<LogLine> {
    match parse_cri_line(raw) {
        Ok(line) => joiner.push(&line),
        Err(e) => {
            tracing::debug!(log = %path.display(), error = %e, "skipping a malformed log line");
            None
        }
    }
}

/// The response body of a log: the chunks [`stream`] sends, each flushed to the client
/// before the next frame (or the end of the body) is asked for, as the kubelet's
/// `flushwriter` flushes every write of a log. Without that, a short log and the chunked
/// body's terminating `0\r\n\r\n` leave in one write, Go's chunked reader returns the log
/// together with `io.EOF`, and the kube-apiserver v1.20's copy of a log into WebSocket
/// messages (`wsstream` `messageCopy`) drops data returned with `io.EOF`: `kubectl logs`
/// over WebSocket would get nothing.
pub struct LogBody {
    chunks: mpsc::Receiver<Bytes>,
    /// A chunk was handed to the connection and not yet flushed.
    unflushed: bool,
}

impl LogBody {
    /// The body of the chunks `chunks` receives, ended when its sender is dropped.
    #[must_use]
    pub fn new(chunks: mpsc::Receiver<Bytes>) -> Self {
        Self {
            chunks,
            unflushed: false,
        }
    }
}

impl hyper::body::Body for LogBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if std::mem::take(&mut self.unflushed) {
            // One turn of "not yet": hyper's connection flushes what it has buffered
            // whenever the body is pending, and polls again at once.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.chunks.poll_recv(cx).map(|chunk| {
            chunk.map(|c| {
                self.unflushed = true;
                Ok(Frame::data(c))
            })
        })
    }
}

/// Streams the log of `source` to `tx` with `opts`. Returns when the log is read (to its
/// end, or to the byte limit), or — when following — once the container is no longer
/// running and its log is read to the end, or the client has gone (`tx` closed).
///
/// # Errors
/// The log file cannot be read.
pub async fn stream<C: Cri>(
    cri: C,
    source: LogSource,
    opts: LogOptions,
    tx: mpsc::Sender<Bytes>,
) -> Result<(), LogError> {
    let path = &source.path;
    let final_end = !opts.follow;
    // What is in the file now: lines written while it is read are not counted in a tail,
    // and without following they are not sent (a tail of 2 is 2 lines).
    let length = tokio::fs::metadata(path)
        .await
        .map_err(|source| LogError::Io {
            path: path.clone(),
            source,
        })?
        .len();
    // With a tail, the lines before the last `tailLines` of that.
    let mut skip = match opts.tail_lines {
        Some(tail) => count_lines(path, length, final_end)
            .await?
            .saturating_sub(tail),
        None => 0,
    };
    let mut reader = LineReader::open(path, MAX_RECORD, final_end.then_some(length)).await?;
    let mut joiner = Joiner::default();
    let mut out = LogWriter::new(&opts);
    let send = |out: &mut LogWriter| {
        let chunk = out.take();
        let tx = tx.clone();
        async move {
            match chunk {
                Some(c) => tx.send(c).await.is_ok(),
                None => !tx.is_closed(),
            }
        }
    };

    while let Some(raw) = reader.next(final_end).await? {
        let Some(line) = joined(&mut joiner, &raw, path) else {
            continue;
        };
        if skip > 0 {
            skip -= 1;
            continue;
        }
        let more = out.write(&line);
        if (!more || out.full()) && !send(&mut out).await {
            return Ok(());
        }
        if !more {
            return Ok(());
        }
    }
    // Without following, a last line with no end (the container exited mid-line) counts
    // as a line; a followed one may still be completed.
    if final_end {
        for line in joiner.finish() {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            if !out.write(&line) {
                send(&mut out).await;
                return Ok(());
            }
        }
    }
    if !opts.follow {
        send(&mut out).await;
        return Ok(());
    }

    // Following: poll for new lines; check now and then whether the container still runs.
    let mut last_check = tokio::time::Instant::now();
    let mut running = true;
    // The file the log was rotated to is read to its end once more before this one.
    let mut rotated_to: Option<LineReader> = None;
    loop {
        if !send(&mut out).await {
            tracing::debug!(log = %path.display(), "log follower gone");
            return Ok(());
        }
        let mut read_any = false;
        while let Some(raw) = reader.next(!running).await? {
            read_any = true;
            if let Some(line) = joined(&mut joiner, &raw, path) {
                if !out.write(&line) {
                    send(&mut out).await;
                    return Ok(());
                }
                if out.full() && !send(&mut out).await {
                    return Ok(());
                }
            }
        }
        if !running {
            // The container had exited before this last read: its log is complete.
            tracing::debug!(log = %path.display(), "followed container exited; log complete");
            for line in joiner.finish() {
                if !out.write(&line) {
                    break;
                }
            }
            send(&mut out).await;
            return Ok(());
        }
        if read_any {
            continue;
        }
        if let Some(next) = rotated_to.take() {
            tracing::debug!(log = %path.display(), "followed log rotated; reading the new file");
            reader = next;
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep(FOLLOW_POLL) => {}
            () = tx.closed() => {
                tracing::debug!(log = %path.display(), "log follower gone");
                return Ok(());
            }
        }
        if last_check.elapsed() >= STATE_POLL {
            last_check = tokio::time::Instant::now();
            running = is_running(&cri, &source.container_id).await;
            if reader.replaced().await {
                rotated_to = Some(LineReader::open(path, MAX_RECORD, None).await?);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection's client side: it has sent `request`, then waits; what the server
    /// wrote, one entry per flush.
    struct Recorded {
        request: &'static [u8],
        pending: Vec<u8>,
        flushes: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    }

    impl tokio::io::AsyncRead for Recorded {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if self.request.is_empty() {
                return Poll::Pending;
            }
            let n = self.request.len().min(buf.remaining());
            buf.put_slice(&self.request[..n]);
            self.request = &self.request[n..];
            Poll::Ready(Ok(()))
        }
    }

    impl tokio::io::AsyncWrite for Recorded {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.pending.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            let written = std::mem::take(&mut self.pending);
            if !written.is_empty() {
                self.flushes.lock().unwrap().push(written);
            }
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            self.poll_flush(cx)
        }
    }

    /// A short log whose chunks and end are all ready at once (a finished container's)
    /// leaves in two flushes: the head with the log, then the end of the chunked body.
    #[tokio::test]
    async fn a_logs_last_chunk_is_flushed_before_the_end_of_the_body() {
        let flushes = std::sync::Arc::default();
        let io = Recorded {
            request: b"GET /containerLogs/ns/p/c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            pending: Vec::new(),
            flushes: std::sync::Arc::clone(&flushes),
        };
        let service = hyper::service::service_fn(|_| async {
            let (tx, rx) = mpsc::channel(4);
            tx.send(Bytes::from_static(b"container is alive\n"))
                .await
                .unwrap();
            drop(tx);
            Ok::<_, std::convert::Infallible>(hyper::Response::new(LogBody::new(rx)))
        });
        tokio::time::timeout(
            Duration::from_secs(5),
            hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(io), service),
        )
        .await
        .expect("the connection ends")
        .expect("served");
        let flushes: Vec<String> = flushes
            .lock()
            .unwrap()
            .iter()
            .map(|f| String::from_utf8_lossy(f).into_owned())
            .collect();
        assert_eq!(flushes.len(), 2, "{flushes:?}");
        assert!(
            flushes[0].starts_with("HTTP/1.1 200 OK\r\n")
                && flushes[0].ends_with("\r\n13\r\ncontainer is alive\n\r\n"),
            "{flushes:?}"
        );
        assert_eq!(flushes[1], "0\r\n\r\n");
    }

    fn query(pairs: &[(&str, &str)]) -> Query {
        Query::from_pairs(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        )
    }

    fn now() -> Timestamp {
        "2024-05-01T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn options_as_the_apiserver_sends_them() {
        let opts = LogOptions::from_query(
            &query(&[
                ("follow", "true"),
                ("previous", "1"),
                ("timestamps", "true"),
                ("sinceSeconds", "30"),
                ("tailLines", "3"),
                ("limitBytes", "100"),
            ]),
            now(),
        )
        .unwrap();
        assert_eq!(
            opts,
            LogOptions {
                follow: true,
                previous: true,
                timestamps: true,
                since: Some("2024-05-01T11:59:30Z".parse().unwrap()),
                tail_lines: Some(3),
                limit_bytes: Some(100),
            }
        );
        let opts = LogOptions::from_query(&query(&[("sinceTime", "2024-05-01T10:00:00Z")]), now())
            .unwrap();
        assert_eq!(opts.since, Some("2024-05-01T10:00:00Z".parse().unwrap()));
        assert_eq!(
            LogOptions::from_query(&query(&[]), now()).unwrap(),
            LogOptions::default()
        );
        for bad in [
            ("tailLines", "-1"),
            ("limitBytes", "0"),
            ("sinceSeconds", "x"),
            ("follow", "yes"),
            ("sinceTime", "yesterday"),
        ] {
            assert!(
                LogOptions::from_query(&query(&[bad]), now()).is_err(),
                "{bad:?}"
            );
        }
        assert!(
            LogOptions::from_query(
                &query(&[("sinceSeconds", "1"), ("sinceTime", "2024-05-01T10:00:00Z")]),
                now()
            )
            .is_err()
        );
    }

    fn line(ts: &str, text: &str) -> LogLine {
        LogLine {
            timestamp: ts.into(),
            time: ts.parse().unwrap(),
            content: format!("{text}\n").into_bytes(),
        }
    }

    #[test]
    fn writer_applies_since_timestamps_and_the_byte_limit() {
        let opts = LogOptions {
            timestamps: true,
            since: Some("2024-01-01T00:00:02Z".parse().unwrap()),
            limit_bytes: Some(30),
            ..LogOptions::default()
        };
        let mut w = LogWriter::new(&opts);
        assert!(w.write(&line("2024-01-01T00:00:01Z", "old")));
        assert!(w.write(&line("2024-01-01T00:00:02Z", "a")));
        assert!(!w.write(&line("2024-01-01T00:00:03Z", "bcdef")));
        let out = w.take().unwrap();
        assert_eq!(&out[..], b"2024-01-01T00:00:02Z a\n2024-01");
        assert_eq!(out.len(), 30);
        assert!(!w.write(&line("2024-01-01T00:00:04Z", "more")));
        assert!(w.take().is_none());
    }

    struct NoRuntime;
    impl Cri for NoRuntime {}

    async fn read_all(content: &str, opts: LogOptions) -> String {
        let dir = std::env::temp_dir().join(format!(
            "rkubelet-logs-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("0.log");
        std::fs::write(&path, content).unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let source = LogSource {
            container_id: "c".into(),
            path,
        };
        let task = tokio::spawn(stream(NoRuntime, source, opts, tx));
        let mut out = Vec::new();
        while let Some(chunk) = rx.recv().await {
            out.extend_from_slice(&chunk);
        }
        task.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        String::from_utf8(out).unwrap()
    }

    const LOG: &str = "2024-01-01T00:00:01Z stdout F one\n\
                       2024-01-01T00:00:02Z stdout P tw\n\
                       2024-01-01T00:00:02.5Z stdout F o\n\
                       not a cri line\n\
                       2024-01-01T00:00:03Z stderr F three\n\
                       2024-01-01T00:00:04Z stdout F four";

    #[tokio::test]
    async fn reads_a_whole_log_with_tail_and_limit() {
        assert_eq!(
            read_all(LOG, LogOptions::default()).await,
            "one\ntwo\nthree\nfour\n"
        );
        let tail = LogOptions {
            tail_lines: Some(2),
            ..LogOptions::default()
        };
        assert_eq!(read_all(LOG, tail).await, "three\nfour\n");
        let unfinished = format!("{LOG}\n2024-01-01T00:00:05Z stdout P no end");
        let last = LogOptions {
            tail_lines: Some(1),
            ..LogOptions::default()
        };
        assert_eq!(read_all(&unfinished, last).await, "no end");
        let none = LogOptions {
            tail_lines: Some(0),
            ..LogOptions::default()
        };
        assert_eq!(read_all(LOG, none).await, "");
        let limited = LogOptions {
            limit_bytes: Some(6),
            ..LogOptions::default()
        };
        assert_eq!(read_all(LOG, limited).await, "one\ntw");
        let stamped = LogOptions {
            timestamps: true,
            tail_lines: Some(3),
            since: Some("2024-01-01T00:00:03Z".parse().unwrap()),
            ..LogOptions::default()
        };
        assert_eq!(
            read_all(LOG, stamped).await,
            "2024-01-01T00:00:03Z three\n2024-01-01T00:00:04Z four\n"
        );
    }

    /// Follows the log at `path` of container `c` of `cri`: the task and its chunks.
    fn follow<C: Cri>(
        cri: C,
        path: &Path,
    ) -> (
        tokio::task::JoinHandle<Result<(), LogError>>,
        mpsc::Receiver<Bytes>,
    ) {
        let (tx, rx) = mpsc::channel(8);
        let opts = LogOptions {
            follow: true,
            ..LogOptions::default()
        };
        let source = LogSource {
            container_id: "c".into(),
            path: path.to_owned(),
        };
        (tokio::spawn(stream(cri, source, opts, tx)), rx)
    }

    #[tokio::test]
    async fn follow_ends_when_the_container_is_gone_and_the_log_is_read() {
        // The fake runtime answers Unimplemented: treated as "still running" for a
        // transient error, so use one that says NotFound.
        struct Gone;
        impl Cri for Gone {
            async fn container_status(
                &self,
                _: api::ContainerStatusRequest,
            ) -> crate::cri::Result<api::ContainerStatusResponse> {
                Err(CriError::Rpc {
                    rpc: "ContainerStatus",
                    code: tonic::Code::NotFound,
                    message: "gone".into(),
                })
            }
        }
        let dir = std::env::temp_dir().join(format!("rkubelet-follow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("0.log");
        std::fs::write(
            &path,
            "2024-01-01T00:00:01Z stdout F one\n2024-01-01T00:00:02Z stdout F par",
        )
        .unwrap();
        let (task, mut rx) = follow(Gone, &path);
        assert_eq!(&rx.recv().await.unwrap()[..], b"one\n");
        // The rest of the half-written line arrives, then the container is found gone.
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            f.write_all(b"t\n2024-01-01T00:00:03Z stdout F two\n")
                .unwrap();
        }
        let mut rest = Vec::new();
        while let Some(chunk) = rx.recv().await {
            rest.extend_from_slice(&chunk);
        }
        assert_eq!(String::from_utf8(rest).unwrap(), "part\ntwo\n");
        task.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A runtime whose container runs until told otherwise.
    struct Running(std::sync::atomic::AtomicBool);

    impl Cri for std::sync::Arc<Running> {
        async fn container_status(
            &self,
            _: api::ContainerStatusRequest,
        ) -> crate::cri::Result<api::ContainerStatusResponse> {
            let running = self.0.load(std::sync::atomic::Ordering::SeqCst);
            Ok(api::ContainerStatusResponse {
                status: Some(api::ContainerStatus {
                    state: if running {
                        api::ContainerState::ContainerRunning
                    } else {
                        api::ContainerState::ContainerExited
                    }
                    .into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
        }
    }

    async fn collect(rx: &mut mpsc::Receiver<Bytes>, until: &str) -> String {
        let mut got = String::new();
        while !got.ends_with(until) {
            let chunk = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("no log line within 10s")
                .expect("the stream ended");
            got.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        got
    }

    #[tokio::test]
    async fn a_followed_log_is_read_across_a_rotation() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("rkubelet-rotated-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("0.log");
        std::fs::write(&path, "2024-01-01T00:00:01Z stdout F one\n").unwrap();
        let runtime = std::sync::Arc::new(Running(true.into()));
        let (task, mut rx) = follow(runtime.clone(), &path);
        assert_eq!(collect(&mut rx, "one\n").await, "one\n");
        // The runtime writes a last line before the rotation renames the file, then the
        // new file: both are read, in order.
        let mut old = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        old.write_all(b"2024-01-01T00:00:02Z stdout F two\n")
            .unwrap();
        std::fs::rename(&path, dir.join("0.log.20240101-000002")).unwrap();
        old.write_all(b"2024-01-01T00:00:03Z stdout F three\n")
            .unwrap();
        std::fs::write(&path, "2024-01-01T00:00:04Z stdout F four\n").unwrap();
        assert_eq!(collect(&mut rx, "four\n").await, "two\nthree\nfour\n");
        runtime.0.store(false, std::sync::atomic::Ordering::SeqCst);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"2024-01-01T00:00:05Z stdout F five\n")
            .unwrap();
        assert_eq!(collect(&mut rx, "five\n").await, "five\n");
        assert!(
            rx.recv().await.is_none(),
            "the exited container's log ended"
        );
        task.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Without following, only the current file is read (the kubelet v1.20's `ReadLogs`):
    /// a tail longer than it does not reach into the rotated files.
    #[tokio::test]
    async fn a_tail_reads_the_current_file_only() {
        let dir = std::env::temp_dir().join(format!("rkubelet-tail-rot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("0.log.20240101-000002"),
            "2024-01-01T00:00:01Z stdout F one\n2024-01-01T00:00:02Z stdout F two\n",
        )
        .unwrap();
        let path = dir.join("0.log");
        std::fs::write(&path, "2024-01-01T00:00:03Z stdout F three\n").unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let opts = LogOptions {
            tail_lines: Some(10),
            ..LogOptions::default()
        };
        let source = LogSource {
            container_id: "c".into(),
            path,
        };
        stream(std::sync::Arc::new(Running(true.into())), source, opts, tx)
            .await
            .unwrap();
        let mut got = Vec::new();
        while let Some(chunk) = rx.recv().await {
            got.extend_from_slice(&chunk);
        }
        assert_eq!(String::from_utf8(got).unwrap(), "three\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A read bounded to the length the log had when the request came stops there: lines
    /// written since (by a container still logging) are not part of a `--tail` answer.
    #[tokio::test]
    async fn a_bounded_read_stops_at_the_length_it_was_given() {
        let dir = std::env::temp_dir().join(format!("rkubelet-bounded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("0.log");
        let first = "2024-01-01T00:00:01Z stdout F one\n2024-01-01T00:00:02Z stdout F two\n";
        std::fs::write(
            &path,
            format!("{first}2024-01-01T00:00:03Z stdout F three\n"),
        )
        .unwrap();
        let mut reader = LineReader::open(&path, MAX_RECORD, Some(first.len() as u64))
            .await
            .unwrap();
        let mut lines = Vec::new();
        while let Some(raw) = reader.next(true).await.unwrap() {
            lines.push(String::from_utf8(raw).unwrap());
        }
        assert_eq!(
            lines,
            [
                "2024-01-01T00:00:01Z stdout F one",
                "2024-01-01T00:00:02Z stdout F two"
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A line of 100 bytes in a file read 48 bytes at most at once: read in pieces of at
    /// most 48 bytes of content (each a partial line under the line's timestamp), joined back
    /// into the line, or given out in pieces when longer than the joiner's maximum.
    #[tokio::test]
    async fn long_lines_are_read_and_joined_with_bounded_memory() {
        let dir = std::env::temp_dir().join(format!("rkubelet-longline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("0.log");
        let text = "x".repeat(100);
        std::fs::write(
            &path,
            format!("2024-01-01T00:00:01Z stdout F {text}\n2024-01-01T00:00:02Z stderr F short\n"),
        )
        .unwrap();
        let mut reader = LineReader::open(&path, 48, None).await.unwrap();
        let mut pieces = Vec::new();
        while let Some(raw) = reader.next(true).await.unwrap() {
            pieces.push(raw);
        }
        let longest = pieces.iter().map(|p| p.len()).max().unwrap();
        assert!(pieces.len() > 3, "{pieces:?}");
        assert!(
            longest <= 48 + "2024-01-01T00:00:01Z stdout P ".len(),
            "{longest}"
        );
        let mut whole = Joiner::with_max_line(1000);
        let lines: Vec<LogLine> = pieces
            .iter()
            .filter_map(|raw| whole.push(&parse_cri_line(raw).unwrap()))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].content, format!("{text}\n").into_bytes());
        assert_eq!(lines[0].timestamp, "2024-01-01T00:00:01Z");
        assert_eq!(lines[1].content, b"short\n");
        let mut bounded = Joiner::with_max_line(40);
        let parts: Vec<LogLine> = pieces
            .iter()
            .filter_map(|raw| bounded.push(&parse_cri_line(raw).unwrap()))
            .collect();
        assert!(parts.len() > 2, "{parts:?}");
        assert!(parts.iter().all(|p| p.content.len() < 40 + 48), "{parts:?}");
        let rejoined: Vec<u8> = parts.iter().flat_map(|p| p.content.clone()).collect();
        assert_eq!(
            rejoined,
            format!("{text}\nshort\n").into_bytes(),
            "nothing lost"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A tail longer than the log is the whole log (nothing is kept per requested line).
    #[tokio::test]
    async fn a_huge_tail_is_the_whole_log() {
        let huge = LogOptions {
            tail_lines: Some(1_000_000_000),
            ..LogOptions::default()
        };
        assert_eq!(read_all(LOG, huge).await, "one\ntwo\nthree\nfour\n");
    }

    fn container_status(
        name: &str,
        state: serde_json::Value,
        last: serde_json::Value,
    ) -> serde_json::Value {
        serde_json::json!({
            "name": name, "image": "busybox", "imageID": "", "ready": false,
            "restartCount": 1, "state": state, "lastState": last,
            "containerID": state.get("running").map(|_| "containerd://current"),
        })
    }

    fn pod_status(app: serde_json::Value, init: Option<serde_json::Value>) -> PodStatus {
        serde_json::from_value(serde_json::json!({
            "containerStatuses": [app],
            "initContainerStatuses": init.into_iter().collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    fn choose(status: &PodStatus, container: &str, previous: bool) -> Result<String, String> {
        container_for_logs(status, "web", container, previous).map_err(|e| e.to_string())
    }

    #[test]
    fn the_container_for_logs_is_chosen_from_the_pod_status_as_the_kubelet_does() {
        let ended =
            serde_json::json!({"terminated": {"exitCode": 1, "containerID": "containerd://ended"}});
        // A crash loop's back-off: both the current and the previous log are the last one.
        let backoff = pod_status(
            container_status(
                "app",
                serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}}),
                ended.clone(),
            ),
            None,
        );
        assert_eq!(choose(&backoff, "app", false), Ok("ended".to_owned()));
        assert_eq!(choose(&backoff, "app", true), Ok("ended".to_owned()));
        // Running again: the current one, and the one before.
        let running = pod_status(
            container_status("app", serde_json::json!({"running": {}}), ended.clone()),
            Some(container_status(
                "init",
                ended.clone(),
                serde_json::json!({}),
            )),
        );
        assert_eq!(choose(&running, "app", false), Ok("current".to_owned()));
        assert_eq!(choose(&running, "app", true), Ok("ended".to_owned()));
        assert_eq!(choose(&running, "init", false), Ok("ended".to_owned()));
        assert_eq!(
            choose(&running, "init", true),
            Err("previous terminated container \"init\" in pod \"web\" not found".to_owned())
        );
        assert_eq!(
            choose(&running, "sidecar", false),
            Err("container \"sidecar\" in pod \"web\" is not available".to_owned())
        );
        // Ended without a container id, nothing before it.
        let failed = pod_status(
            container_status(
                "app",
                serde_json::json!({"terminated": {"exitCode": 128}}),
                serde_json::json!({}),
            ),
            None,
        );
        assert_eq!(
            choose(&failed, "app", false),
            Err("container \"app\" in pod \"web\" is terminated".to_owned())
        );
        for (reason, why) in [
            ("ImagePullBackOff", "trying and failing to pull image"),
            ("ErrImagePull", "image can't be pulled"),
            ("ContainerCreating", "ContainerCreating"),
        ] {
            let waiting = pod_status(
                container_status(
                    "app",
                    serde_json::json!({"waiting": {"reason": reason}}),
                    serde_json::json!({}),
                ),
                None,
            );
            assert_eq!(
                choose(&waiting, "app", false),
                Err(format!(
                    "container \"app\" in pod \"web\" is waiting to start: {why}"
                ))
            );
        }
        let unknown = pod_status(
            container_status("app", serde_json::json!({}), serde_json::json!({})),
            None,
        );
        assert_eq!(
            choose(&unknown, "app", false),
            Err("container \"app\" in pod \"web\" is waiting to start - no logs yet".to_owned())
        );
    }
}
