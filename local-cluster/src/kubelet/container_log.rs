//! Container logs as kubelet keeps them through the CRI: one file per container
//! instance, each line `<RFC 3339 time> <stdout|stderr> <F|P> <text>`, copied from
//! the container's stdout and stderr pipes as they come; and the reading side:
//! `tailLines`, `sinceSeconds`/`sinceTime`, `timestamps` and `limitBytes`, as
//! `kubectl logs` asks for them.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// One instance's log file, being written while the instance runs.
#[derive(Debug, Clone)]
pub struct LogFile {
    pub path: PathBuf,
    /// Pipes still open (0: the instance's output is complete).
    open: Arc<AtomicUsize>,
}

impl LogFile {
    /// Copies `stdout` and `stderr` into a new file at `path`, line by line.
    pub fn capture(
        path: PathBuf,
        stdout: impl Read + Send + 'static,
        stderr: impl Read + Send + 'static,
    ) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = Arc::new(Mutex::new(
            File::create(&path).with_context(|| format!("creating {}", path.display()))?,
        ));
        let open = Arc::new(AtomicUsize::new(2));
        for (stream, reader) in [
            ("stdout", Box::new(stdout) as Box<dyn Read + Send>),
            ("stderr", Box::new(stderr)),
        ] {
            let (file, open) = (file.clone(), open.clone());
            std::thread::spawn(move || {
                copy_lines(stream, reader, &file);
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
        Ok(LogFile { path, open })
    }

    /// Whether the instance's output is complete (both pipes closed).
    pub fn finished(&self) -> bool {
        self.open.load(Ordering::SeqCst) == 0
    }

    /// The text as the container wrote it (no timestamps or stream names).
    pub fn text(&self) -> String {
        let raw = std::fs::read_to_string(&self.path).unwrap_or_default();
        render(&parse(&raw), &LogOptions::default())
    }
}

fn copy_lines(stream: &str, reader: Box<dyn Read + Send>, file: &Mutex<File>) {
    let mut reader = BufReader::new(reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let full = line.last() == Some(&b'\n');
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches('\n');
        let now = OffsetDateTime::now_utc()
            .format(&Rfc3339)
            .unwrap_or_default();
        let tag = if full { "F" } else { "P" };
        if let Ok(mut f) = file.lock() {
            let _ = writeln!(f, "{now} {stream} {tag} {text}");
        }
    }
}

/// One line of a CRI log.
#[derive(Debug, Clone, PartialEq)]
pub struct LogLine {
    pub time: OffsetDateTime,
    pub text: String,
    /// The line ends here (`F`), or continues in the next entry (`P`).
    pub full: bool,
}

/// The entries of a CRI log file; malformed lines are skipped.
pub fn parse(raw: &str) -> Vec<LogLine> {
    raw.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(4, ' ');
            let time = OffsetDateTime::parse(parts.next()?, &Rfc3339).ok()?;
            let _stream = parts.next()?;
            let full = parts.next()? == "F";
            Some(LogLine {
                time,
                text: parts.next().unwrap_or_default().to_owned(),
                full,
            })
        })
        .collect()
}

/// What `kubectl logs` may ask for (PodLogOptions).
#[derive(Debug, Default, Clone)]
pub struct LogOptions {
    pub tail_lines: Option<usize>,
    /// Only lines written at or after this time (`sinceSeconds`, `sinceTime`).
    pub since: Option<OffsetDateTime>,
    pub timestamps: bool,
    pub limit_bytes: Option<usize>,
}

/// The lines `options` select, as text.
pub fn render(lines: &[LogLine], options: &LogOptions) -> String {
    let selected: Vec<&LogLine> = lines
        .iter()
        .filter(|l| options.since.is_none_or(|since| l.time >= since))
        .collect();
    let skip = options
        .tail_lines
        .map_or(0, |n| selected.len().saturating_sub(n));
    let mut out = String::new();
    for line in &selected[skip..] {
        if options.timestamps {
            let ts = line.time.format(&Rfc3339).unwrap_or_default();
            out.push_str(&ts);
            out.push(' ');
        }
        out.push_str(&line.text);
        if line.full {
            out.push('\n');
        }
    }
    if let Some(limit) = options.limit_bytes {
        truncate_at_char(&mut out, limit);
    }
    out
}

fn truncate_at_char(s: &mut String, limit: usize) {
    if s.len() > limit {
        let mut at = limit;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
}

/// Where a kubelet keeps the log of a container's instance `restart`.
pub fn instance_path(dir: &Path, restart: u32) -> PathBuf {
    dir.join(format!("{restart}.log"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(secs: i64, text: &str) -> LogLine {
        LogLine {
            time: OffsetDateTime::from_unix_timestamp(1_800_000_000 + secs).unwrap(),
            text: text.into(),
            full: true,
        }
    }

    #[test]
    fn options_select_and_shape_the_lines() {
        let lines = [line(0, "a"), line(10, "b"), line(20, "c")];
        assert_eq!(render(&lines, &LogOptions::default()), "a\nb\nc\n");
        let tail = LogOptions {
            tail_lines: Some(2),
            ..LogOptions::default()
        };
        assert_eq!(render(&lines, &tail), "b\nc\n");
        let since = LogOptions {
            since: Some(lines[1].time),
            ..LogOptions::default()
        };
        assert_eq!(render(&lines, &since), "b\nc\n");
        let limit = LogOptions {
            limit_bytes: Some(3),
            ..LogOptions::default()
        };
        assert_eq!(render(&lines, &limit), "a\nb");
        let ts = LogOptions {
            timestamps: true,
            tail_lines: Some(1),
            ..LogOptions::default()
        };
        assert_eq!(render(&lines, &ts), "2027-01-15T08:00:20Z c\n");
    }

    #[test]
    fn captured_pipes_become_cri_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = LogFile::capture(
            dir.path().join("0.log"),
            &b"out one\nout two"[..],
            &b"err\n"[..],
        )
        .unwrap();
        while !log.finished() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let raw = std::fs::read_to_string(&log.path).unwrap();
        assert!(
            raw.lines().any(|l| l.ends_with(" stdout F out one")),
            "{raw}"
        );
        assert!(
            raw.lines().any(|l| l.ends_with(" stdout P out two")),
            "{raw}"
        );
        assert!(raw.lines().any(|l| l.ends_with(" stderr F err")), "{raw}");
        let text = log.text();
        assert!(
            text.contains("out one\n") && text.contains("err\n"),
            "{text}"
        );
        assert_eq!(parse("garbage\n"), vec![]);
    }
}
