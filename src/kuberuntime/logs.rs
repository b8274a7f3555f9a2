//! The CRI log format, as the kubelet's `kuberuntime/logs` parses it: one line
//! `<RFC3339Nano> <stdout|stderr> <P|F> <text>` per write ([`parse_cri_line`]), `P` for a
//! partial line continued by the next, joined per stream ([`Joiner`]). Runtime vocabulary:
//! the termination message's log tail and the kubelet API's `/containerLogs` read it; it
//! knows neither.

use k8s_openapi::jiff::Timestamp;

/// The longest joined line held; a longer one is written in pieces.
pub const MAX_LINE: usize = 1024 * 1024;

/// One line of a CRI log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriLine<'a> {
    /// The timestamp as written.
    pub timestamp: &'a str,
    /// The timestamp.
    pub time: Timestamp,
    /// `stdout` or `stderr`.
    pub stream: &'a str,
    /// `P`: the text continues in the next line.
    pub partial: bool,
    /// The text, without the line feed.
    pub content: &'a [u8],
}

/// Parses one line of a CRI log file (without its line feed).
///
/// # Errors
/// A line that is not in the CRI format (the text of the error says why).
pub fn parse_cri_line(line: &[u8]) -> Result<CriLine<'_>, String> {
    let mut fields = line.splitn(4, |b| *b == b' ');
    let mut next = |what: &str| {
        fields
            .next()
            .ok_or_else(|| format!("no {what} in log line"))
    };
    let timestamp =
        std::str::from_utf8(next("timestamp")?).map_err(|_| "timestamp is not UTF-8".to_owned())?;
    let time = timestamp
        .parse::<Timestamp>()
        .map_err(|e| format!("bad timestamp {timestamp:?}: {e}"))?;
    let stream = match next("stream")? {
        b"stdout" => "stdout",
        b"stderr" => "stderr",
        other => {
            return Err(format!(
                "unknown stream {:?}",
                String::from_utf8_lossy(other)
            ));
        }
    };
    let tags = next("tag")?;
    let partial = tags.split(|b| *b == b':').next() == Some(b"P");
    let content = fields.next().unwrap_or_default();
    Ok(CriLine {
        timestamp,
        time,
        stream,
        partial,
        content,
    })
}

/// One line as the user wrote it: partial lines joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// The timestamp of its first part, as written.
    pub timestamp: String,
    /// That timestamp.
    pub time: Timestamp,
    /// The text, with its line feed when the line is complete.
    pub content: Vec<u8>,
}

/// Joins partial lines per stream (stdout and stderr interleave), each up to a maximum
/// length ([`MAX_LINE`]) beyond which what is joined so far is given out as a piece.
#[derive(Debug)]
pub struct Joiner {
    pending: [Option<LogLine>; 2],
    max_line: usize,
}

impl Default for Joiner {
    fn default() -> Self {
        Self::with_max_line(MAX_LINE)
    }
}

impl Joiner {
    /// A joiner that holds at most `max_line` bytes of a line.
    #[must_use]
    pub fn with_max_line(max_line: usize) -> Self {
        Self {
            pending: [None, None],
            max_line,
        }
    }

    /// Adds one file line; returns the joined line when it is complete (or, without its
    /// line feed, the part joined so far once it reaches the maximum length).
    pub fn push(&mut self, line: &CriLine<'_>) -> Option<LogLine> {
        let slot = &mut self.pending[usize::from(line.stream == "stderr")];
        let joined = slot.get_or_insert_with(|| LogLine {
            timestamp: line.timestamp.to_owned(),
            time: line.time,
            content: Vec::new(),
        });
        joined.content.extend_from_slice(line.content);
        if line.partial {
            if joined.content.len() >= self.max_line {
                return slot.take();
            }
            None
        } else {
            joined.content.push(b'\n');
            slot.take()
        }
    }

    /// The incomplete lines left at the end of the log, oldest first.
    pub fn finish(&mut self) -> Vec<LogLine> {
        let mut rest: Vec<LogLine> = self.pending.iter_mut().filter_map(Option::take).collect();
        rest.sort_by_key(|l| l.time);
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cri_lines() {
        let line = parse_cri_line(b"2016-10-06T00:17:09.669794202Z stdout F hello world").unwrap();
        assert_eq!(line.timestamp, "2016-10-06T00:17:09.669794202Z");
        assert_eq!(line.stream, "stdout");
        assert!(!line.partial);
        assert_eq!(line.content, b"hello world");
        let partial = parse_cri_line(b"2016-10-06T00:17:09.669794202Z stderr P part").unwrap();
        assert!(partial.partial);
        let empty = parse_cri_line(b"2016-10-06T00:17:09Z stdout F ").unwrap();
        assert_eq!(empty.content, b"");
        let bare = parse_cri_line(b"2016-10-06T00:17:09Z stdout F").unwrap();
        assert_eq!(bare.content, b"");
        assert!(parse_cri_line(b"garbage").is_err());
        assert!(parse_cri_line(b"2016-10-06T00:17:09Z stdin F x").is_err());
    }

    #[test]
    fn partial_lines_are_joined_per_stream() {
        let mut j = Joiner::default();
        let lines = [
            "2024-01-01T00:00:01Z stdout P hel",
            "2024-01-01T00:00:02Z stderr F err",
            "2024-01-01T00:00:03Z stdout F lo",
            "2024-01-01T00:00:04Z stdout P tail",
        ];
        let out: Vec<LogLine> = lines
            .iter()
            .filter_map(|l| j.push(&parse_cri_line(l.as_bytes()).unwrap()))
            .collect();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].content, b"err\n");
        assert_eq!(out[1].content, b"hello\n");
        assert_eq!(
            out[1].timestamp, "2024-01-01T00:00:01Z",
            "the first part's time"
        );
        let rest = j.finish();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].content, b"tail", "incomplete: no line feed");
    }
}
