//! `/logs/`: the node's `/var/log`, served as the kubelet serves it (`http.FileServer`
//! under `http.StripPrefix`, authorized as `nodes/log`): a directory as an HTML list of
//! its entries (a trailing `/` on directories), a file as its bytes.
//!
//! The path is percent-decoded and must be clean, as Go's `ServeMux` wants it: one with
//! `.` or `..` segments or empty ones is redirected to its cleaned form (which is then no
//! longer under `/logs/` when it climbed out), so nothing above `/var/log` is ever
//! named. A directory without its trailing slash, and a file with one, are redirected
//! as `FileServer` does. Files are streamed in chunks, whatever their size.

use std::path::{Path, PathBuf};

use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::{Response, StatusCode};
use tokio::io::AsyncReadExt;

use super::{Body, empty, full, text};

/// The directory served.
pub const ROOT: &str = "/var/log";
/// The prefix of the paths served.
const PREFIX: &str = "/logs/";
/// Files are sent in chunks of this size.
const CHUNK: usize = 64 * 1024;

/// What a `/logs` path asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Send the client to this (clean) path.
    Redirect(String),
    /// This path under the root (no `..`, no empty or `.` segments), and whether the
    /// request ended in `/`.
    Entry {
        /// Relative to the root.
        relative: String,
        /// The request's path ended in `/`.
        slash: bool,
    },
    /// Not a `/logs` path, or one that does not decode.
    NotFound,
}

/// Percent-decodes a URL path; `None` when it is not UTF-8 once decoded.
fn percent_decode(path: &str) -> Option<String> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(0));
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// Go's `path.Clean` of an absolute path: `.` and empty segments dropped, `..` removes
/// the segment before it and never climbs above `/`; a trailing slash is kept as
/// `ServeMux` keeps it.
fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let mut cleaned = format!("/{}", parts.join("/"));
    if path.ends_with('/') && cleaned != "/" {
        cleaned.push('/');
    }
    cleaned
}

/// Decides what the request path `path` (as received, percent-encoded) asks for.
#[must_use]
pub fn target(path: &str) -> Target {
    if path == PREFIX.trim_end_matches('/') {
        return Target::Redirect(PREFIX.to_owned());
    }
    let Some(decoded) = percent_decode(path) else {
        return Target::NotFound;
    };
    let cleaned = clean(&decoded);
    if cleaned != decoded {
        return Target::Redirect(cleaned);
    }
    match cleaned.strip_prefix(PREFIX) {
        Some(rest) => Target::Entry {
            relative: rest.trim_end_matches('/').to_owned(),
            slash: rest.is_empty() || rest.ends_with('/'),
        },
        None => Target::NotFound,
    }
}

fn redirect(location: &str) -> Response<Body> {
    Response::builder()
        .status(StatusCode::MOVED_PERMANENTLY)
        .header(hyper::header::LOCATION, location)
        .body(empty())
        .unwrap_or_else(|_| Response::new(empty()))
}

/// Escapes text for HTML, as Go's `htmlReplacer`.
fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a name for a relative link (Go's `url.URL{Path: name}.String()`).
fn href(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/!$&'()*+,;=:@".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    // A first segment with a colon would read as a scheme.
    if name
        .split('/')
        .next()
        .is_some_and(|first| first.contains(':'))
    {
        out.insert_str(0, "./");
    }
    out
}

/// The HTML listing of `entries` (name, is a directory), as `FileServer`'s `dirList`.
#[must_use]
pub fn listing(mut entries: Vec<(String, bool)>) -> String {
    entries.sort();
    let mut html = String::from("<pre>\n");
    for (name, dir) in entries {
        let name = if dir { format!("{name}/") } else { name };
        html.push_str(&format!(
            "<a href=\"{}\">{}</a>\n",
            href(&name),
            html_escape(&name)
        ));
    }
    html.push_str("</pre>\n");
    html
}

fn io_error(e: &std::io::Error) -> Response<Body> {
    match e.kind() {
        std::io::ErrorKind::NotFound => text(StatusCode::NOT_FOUND, "404 page not found"),
        std::io::ErrorKind::PermissionDenied => text(StatusCode::FORBIDDEN, "403 Forbidden"),
        _ => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "500 Internal Server Error",
        ),
    }
}

fn read_listing(dir: &Path) -> std::io::Result<Vec<(String, bool)>> {
    std::fs::read_dir(dir)?
        .map(|entry| {
            let entry = entry?;
            // As `os.File.Readdir`: the entry itself, a symlink is not followed.
            let dir = entry.file_type()?.is_dir();
            Ok((entry.file_name().to_string_lossy().into_owned(), dir))
        })
        .collect()
}

/// Serves the `/logs` request path `path` from `root`.
pub async fn serve(root: &Path, path: &str) -> Response<Body> {
    let (relative, slash) = match target(path) {
        Target::Redirect(location) => return redirect(&location),
        Target::NotFound => return text(StatusCode::NOT_FOUND, "404 page not found"),
        Target::Entry { relative, slash } => (relative, slash),
    };
    let full_path = match inside(root, &root.join(&relative)).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            tracing::warn!(
                path,
                "a /logs path leads out of the logs root through a link"
            );
            return text(StatusCode::NOT_FOUND, "404 page not found");
        }
        Err(e) => return io_error(&e),
    };
    let meta = match tokio::fs::metadata(&full_path).await {
        Ok(m) => m,
        Err(e) => return io_error(&e),
    };
    let base = path.rsplit('/').find(|s| !s.is_empty()).unwrap_or("");
    if meta.is_dir() {
        if !slash {
            return redirect(&format!("{base}/"));
        }
        let index = full_path.join("index.html");
        if tokio::fs::metadata(&index).await.is_ok_and(|m| m.is_file()) {
            return file(&index).await;
        }
        let listed = tokio::task::spawn_blocking(move || read_listing(&full_path)).await;
        return match listed {
            Ok(Ok(entries)) => Response::builder()
                .header("content-type", "text/html; charset=utf-8")
                .body(full(listing(entries)))
                .unwrap_or_else(|_| Response::new(empty())),
            Ok(Err(e)) => io_error(&e),
            Err(_) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "500 Internal Server Error",
            ),
        };
    }
    if slash {
        return redirect(&format!("../{base}"));
    }
    file(&full_path).await
}

/// `path` with every link resolved, if it stays under `root` (also resolved). Unlike the
/// kubelet's `http.Dir`, a link out of the root is not followed: a pod that can write
/// under `/var/log` through a hostPath must not make the node's other files readable to
/// whoever may read its logs.
async fn inside(root: &Path, path: &Path) -> std::io::Result<Option<PathBuf>> {
    let root = tokio::fs::canonicalize(root).await?;
    let resolved = tokio::fs::canonicalize(path).await?;
    Ok(resolved.starts_with(&root).then_some(resolved))
}

/// A file's bytes, streamed.
async fn file(path: &Path) -> Response<Body> {
    let file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) => return io_error(&e),
    };
    let length = file.metadata().await.map(|m| m.len()).ok();
    // Read by a task of its own: the body holds only the receiving end.
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    tokio::spawn(async move {
        let mut file = file;
        loop {
            let mut buf = vec![0u8; CHUNK];
            let read = file.read(&mut buf).await;
            let chunk = match read {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    Ok(Bytes::from(buf))
                }
                Err(e) => Err(e),
            };
            let failed = chunk.is_err();
            if tx.send(chunk).await.is_err() || failed {
                return;
            }
        }
    });
    let chunks = super::tokio_stream_from(rx).map(|chunk| chunk.map(Frame::data));
    let mut response = Response::builder().header("content-type", content_type(path));
    if let Some(length) = length.filter(|l| *l > 0) {
        response = response.header(hyper::header::CONTENT_LENGTH, length);
    }
    response
        .body(BodyExt::boxed(StreamBody::new(chunks)))
        .unwrap_or_else(|_| Response::new(empty()))
}

/// The content type `FileServer` gives the usual files of `/var/log`.
fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("gz") => "application/gzip",
        Some("json") => "application/json",
        _ => "text/plain; charset=utf-8",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(relative: &str, slash: bool) -> Target {
        Target::Entry {
            relative: relative.into(),
            slash,
        }
    }

    #[test]
    fn paths_are_decoded_and_unclean_ones_redirected_never_above_the_root() {
        assert_eq!(target("/logs"), Target::Redirect("/logs/".into()));
        assert_eq!(target("/logs/"), entry("", true));
        assert_eq!(target("/logs/syslog"), entry("syslog", false));
        assert_eq!(target("/logs/pods/"), entry("pods", true));
        assert_eq!(target("/logs/a%20b"), entry("a b", false));
        for (tricky, cleaned) in [
            ("/logs/../../../etc/passwd", "/etc/passwd"),
            ("/logs/..%2F..%2F..%2Fetc%2Fpasswd", "/etc/passwd"),
            ("/logs/%2e%2e/%2E%2E/etc/passwd", "/etc/passwd"),
            ("/logs/pods/../../etc/shadow", "/etc/shadow"),
            ("/logs/./syslog", "/logs/syslog"),
            ("/logs//syslog", "/logs/syslog"),
            ("/logs/pods/..", "/logs"),
        ] {
            assert_eq!(target(tricky), Target::Redirect(cleaned.into()), "{tricky}");
        }
        // Cleaned and still outside: nothing.
        assert_eq!(target("/logsx/a"), Target::NotFound);
        assert_eq!(target("/logs/%ff"), Target::NotFound);
    }

    #[test]
    fn directories_list_as_go_lists_them() {
        assert_eq!(
            listing(vec![
                ("syslog".into(), false),
                ("pods".into(), true),
                ("a<b>&\"c'".into(), false),
                ("x:y".into(), false),
            ]),
            "<pre>\n<a href=\"a%3Cb%3E&%22c'\">a&lt;b&gt;&amp;&#34;c&#39;</a>\n\
             <a href=\"pods/\">pods/</a>\n<a href=\"syslog\">syslog</a>\n\
             <a href=\"./x:y\">x:y</a>\n</pre>\n"
        );
    }

    async fn body(response: Response<Body>) -> (StatusCode, Option<String>, String) {
        let status = response.status();
        let location = response
            .headers()
            .get(hyper::header::LOCATION)
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            location,
            String::from_utf8_lossy(&bytes).into_owned(),
        )
    }

    #[tokio::test]
    async fn files_and_directories_are_served_from_the_root_only() {
        let dir = std::env::temp_dir().join(format!("rkubelet-syslogs-{}", std::process::id()));
        let root = dir.join("log");
        std::fs::create_dir_all(root.join("pods")).unwrap();
        std::fs::write(root.join("syslog"), "line 1\nline 2\n").unwrap();
        std::fs::write(dir.join("secret"), "outside").unwrap();
        let big = "x".repeat(3 * CHUNK + 5);
        std::fs::write(root.join("pods/big.log"), &big).unwrap();

        let (status, _, text) = body(serve(&root, "/logs/syslog").await).await;
        assert_eq!(
            (status, text.as_str()),
            (StatusCode::OK, "line 1\nline 2\n")
        );
        let (_, _, text) = body(serve(&root, "/logs/pods/big.log").await).await;
        assert_eq!(text, big);
        let (status, _, text) = body(serve(&root, "/logs/").await).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            text,
            "<pre>\n<a href=\"pods/\">pods/</a>\n<a href=\"syslog\">syslog</a>\n</pre>\n"
        );
        let (status, location, _) = body(serve(&root, "/logs/pods").await).await;
        assert_eq!(
            (status, location.as_deref()),
            (StatusCode::MOVED_PERMANENTLY, Some("pods/"))
        );
        let (status, location, _) = body(serve(&root, "/logs/syslog/").await).await;
        assert_eq!(
            (status, location.as_deref()),
            (StatusCode::MOVED_PERMANENTLY, Some("../syslog"))
        );
        let (status, location, text) = body(serve(&root, "/logs/../secret").await).await;
        assert_eq!(
            (status, location.as_deref()),
            (StatusCode::MOVED_PERMANENTLY, Some("/secret"))
        );
        assert!(!text.contains("outside"));
        let (status, _, _) = body(serve(&root, "/logs/missing").await).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        // A link out of the root is not followed; one inside it is.
        std::os::unix::fs::symlink(dir.join("secret"), root.join("escape")).unwrap();
        std::os::unix::fs::symlink(root.join("syslog"), root.join("pods/syslog")).unwrap();
        let (status, _, text) = body(serve(&root, "/logs/escape").await).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(!text.contains("outside"));
        let (status, _, text) = body(serve(&root, "/logs/pods/syslog").await).await;
        assert_eq!(
            (status, text.as_str()),
            (StatusCode::OK, "line 1\nline 2\n")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
