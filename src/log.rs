//! The library's log and trace output through `tracing`: `MRCACHE_LOG` is a
//! `tracing-subscriber` `Targets` filter (a level, or `target=level` directives such as
//! `info,mrcache=trace`),
//! and its fmt layer writes the lines: as text, exactly the line (`mrcache[pid]: ...`), or
//! with `MRCACHE_LOG_FORMAT=json` one JSON object per line with the call's fields, for tools.
//! Hooks never come here: they push fixed records into the trace ring, and the writer thread
//! turns each into an event.
//!
//! Below `config` (which parses `MRCACHE_LOG` with `parse_filter` and re-exports
//! `LogLevel`): nothing here reads the configuration.

use crate::trace::{Record, format};
use std::io::Write;
use tracing::{Dispatch, Level};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::prelude::*;
use tracing_subscriber::{Registry, fmt};

/// `MRCACHE_LOG`: how much the library says on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Nothing.
    Off,
    /// Errors only.
    Error,
    /// Errors and warnings.
    Warn,
    /// The set-up line and what the library decided.
    Info,
    /// Details of decisions.
    Debug,
    /// Every interposed call, through the trace ring.
    Trace,
}

impl LogLevel {
    pub(crate) fn parse(v: &str) -> Option<LogLevel> {
        Some(match v.to_ascii_lowercase().as_str() {
            "off" | "0" => LogLevel::Off,
            "error" => LogLevel::Error,
            "warn" => LogLevel::Warn,
            "info" => LogLevel::Info,
            "debug" => LogLevel::Debug,
            "trace" => LogLevel::Trace,
            _ => return None,
        })
    }
}

/// `MRCACHE_LOG_FORMAT`: how lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Plain text lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    pub(crate) fn parse(v: &str) -> Option<LogFormat> {
        match v.to_ascii_lowercase().as_str() {
            "text" => Some(LogFormat::Text),
            "json" => Some(LogFormat::Json),
            _ => None,
        }
    }
}

/// `MRCACHE_LOG` as a `Targets` filter, and the most verbose level it enables for the
/// library's own events (targets `mrcache...`). A plain level (`trace`, `0` for off) is
/// accepted as before; in a list, each directive must name a level (a bare word would be a
/// target name, and a misspelt level would then silently log nothing). `Targets` rather
/// than `EnvFilter`, whose span and field filters no line of the library needs: its regular
/// expressions are most of the library's code, and every process loads them.
pub fn parse_filter(v: &str) -> Option<(Targets, LogLevel)> {
    let text = match LogLevel::parse(v.trim()) {
        Some(l) => level_name(l).to_string(),
        None => {
            // Spaces are kept: " mrcache=trace" would name the target " mrcache" and
            // "info " fail, so each directive goes to the parser trimmed.
            let directives: Vec<&str> = v
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .collect();
            if !directives.iter().all(|d| names_a_level(d)) {
                return None;
            }
            directives.join(",")
        }
    };
    let filter: Targets = text.parse().ok()?;
    Some((filter.clone(), mrcache_level(filter)))
}

/// Whether a directive is a level, or `target=LEVEL` with a level after the `=` (an empty
/// one, `mrcache=`, would mean trace) and no span or field filter (`[...]`), which `Targets`
/// would read as part of the target's name.
fn names_a_level(directive: &str) -> bool {
    if directive.contains(['[', ']', '{', '}']) {
        return false;
    }
    match directive.rfind('=') {
        Some(i) => {
            let level = &directive[i + 1..];
            i > 0
                && !level.is_empty()
                && level.parse::<tracing::level_filters::LevelFilter>().is_ok()
        }
        None => LogLevel::parse(directive).is_some(),
    }
}

fn level_name(l: LogLevel) -> &'static str {
    match l {
        LogLevel::Off => "off",
        LogLevel::Error => "error",
        LogLevel::Warn => "warn",
        LogLevel::Info => "info",
        LogLevel::Debug => "debug",
        LogLevel::Trace => "trace",
    }
}

/// The most verbose level `filter` lets through for the library's targets: `mrcache` (its
/// own lines) and `mrcache::call` (one per traced call).
fn mrcache_level(filter: Targets) -> LogLevel {
    let d = Dispatch::new(Registry::default().with(filter));
    tracing::dispatcher::with_default(&d, || {
        if tracing::enabled!(target: "mrcache", Level::TRACE)
            || tracing::enabled!(target: "mrcache::call", Level::TRACE)
        {
            LogLevel::Trace
        } else if tracing::enabled!(target: "mrcache", Level::DEBUG) {
            LogLevel::Debug
        } else if tracing::enabled!(target: "mrcache", Level::INFO) {
            LogLevel::Info
        } else if tracing::enabled!(target: "mrcache", Level::WARN) {
            LogLevel::Warn
        } else if tracing::enabled!(target: "mrcache", Level::ERROR) {
            LogLevel::Error
        } else {
            LogLevel::Off
        }
    })
}

/// Writes each formatted line through `sink` (the library's log file or stderr).
#[derive(Clone, Copy)]
struct Lines(fn(&str));

struct LineBuf {
    sink: fn(&str),
    buf: Vec<u8>,
}

impl Write for LineBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineBuf {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.buf);
        for line in text.lines() {
            (self.sink)(line);
        }
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = LineBuf;
    fn make_writer(&'a self) -> LineBuf {
        LineBuf {
            sink: self.0,
            buf: Vec::new(),
        }
    }
}

/// Where the library's events go: the filter and the fmt layer, writing through `sink`.
pub struct Logger {
    dispatch: Dispatch,
    format: LogFormat,
}

impl Logger {
    /// A logger for events `filter` passes, formatted as `format`, each line given to `sink`.
    pub fn new(filter: Targets, format: LogFormat, sink: fn(&str)) -> Logger {
        let layer = fmt::layer().with_writer(Lines(sink)).with_ansi(false);
        let dispatch = match format {
            LogFormat::Text => Dispatch::new(
                Registry::default()
                    .with(filter)
                    .with(layer.without_time().with_level(false).with_target(false)),
            ),
            LogFormat::Json => Dispatch::new(
                Registry::default()
                    .with(filter)
                    .with(layer.json().flatten_event(true)),
            ),
        };
        Logger { dispatch, format }
    }

    /// One of the library's lines (`mrcache[pid]: ...`) at `level`.
    pub fn line(&self, level: LogLevel, line: &str) {
        tracing::dispatcher::with_default(&self.dispatch, || match level {
            LogLevel::Off => {}
            LogLevel::Error => tracing::error!(target: "mrcache", "{line}"),
            LogLevel::Warn => tracing::warn!(target: "mrcache", "{line}"),
            LogLevel::Info => tracing::info!(target: "mrcache", "{line}"),
            LogLevel::Debug => tracing::debug!(target: "mrcache", "{line}"),
            LogLevel::Trace => tracing::trace!(target: "mrcache", "{line}"),
        });
    }

    /// One traced call of process `pid`: its line as the message, and in JSON its parts as
    /// fields too (text is exactly the line).
    pub fn record(&self, pid: u32, r: &Record) {
        let line = format!("mrcache[{pid}]: {}", format(r));
        tracing::dispatcher::with_default(&self.dispatch, || match self.format {
            LogFormat::Text => tracing::trace!(target: "mrcache::call", "{line}"),
            LogFormat::Json => tracing::trace!(
                target: "mrcache::call",
                pid,
                tid = r.tid,
                call = r.call.name(),
                outcome = r.outcome.name(),
                at_ns = r.at_ns,
                dur_ns = r.dur_ns,
                result = r.result,
                "{line}"
            ),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Call, Outcome};
    use std::sync::Mutex;

    static OUT: Mutex<Vec<String>> = Mutex::new(Vec::new());

    fn sink(line: &str) {
        OUT.lock().unwrap().push(line.to_string());
    }

    #[test]
    fn directives_are_trimmed_and_each_names_a_level() {
        // Spaces around a directive are not part of it: `warn, mrcache=trace` is valid,
        // and `info ,other=debug` keeps the global level info (not a target "info ").
        assert_eq!(
            parse_filter("warn, mrcache=trace").map(|f| f.1),
            Some(LogLevel::Trace)
        );
        assert_eq!(
            parse_filter("info ,other=debug").map(|f| f.1),
            Some(LogLevel::Info)
        );
        // An empty or missing level after a target would silently mean something else.
        for bad in ["debug=", "mrcache=", "mrcache[{a=1}]", "=info"] {
            assert!(parse_filter(bad).is_none(), "{bad}");
        }
        // Span and field filters are not taken: the value is refused, not half applied.
        for spans in ["mrcache[{a=1}]=debug", "mrcache::call[span]=trace"] {
            assert!(parse_filter(spans).is_none(), "{spans}");
        }
    }

    #[test]
    fn filters_and_formats() {
        assert_eq!(parse_filter("trace").map(|f| f.1), Some(LogLevel::Trace));
        assert_eq!(parse_filter("0").map(|f| f.1), Some(LogLevel::Off));
        assert_eq!(
            parse_filter("warn,mrcache=trace").map(|f| f.1),
            Some(LogLevel::Trace)
        );
        assert_eq!(
            parse_filter("info,other=trace").map(|f| f.1),
            Some(LogLevel::Info)
        );
        assert_eq!(
            parse_filter("mrcache::call=trace").map(|f| f.1),
            Some(LogLevel::Trace)
        );
        assert_eq!(
            parse_filter("other=debug").map(|f| f.1),
            Some(LogLevel::Off)
        );
        for bad in ["chatty", "loud", "mrcache=chatty", "info,chatty"] {
            assert!(parse_filter(bad).is_none(), "{bad}");
        }

        let r = Record {
            at_ns: 1_500_000,
            dur_ns: 42,
            call: Call::DeregMr,
            outcome: Outcome::Kept,
            tid: 7,
            args: [0x1000, 0, 0, 0, 0],
            result: 0,
        };
        let (filter, _) = parse_filter("info,mrcache::call=trace").unwrap();
        let text = Logger::new(filter, LogFormat::Text, sink);
        text.line(LogLevel::Info, "mrcache[9]: shown");
        text.line(LogLevel::Debug, "mrcache[9]: filtered out");
        text.record(9, &r);
        let (filter, _) = parse_filter("warn,mrcache=trace").unwrap();
        let json = Logger::new(filter, LogFormat::Json, sink);
        json.record(9, &r);
        let out = std::mem::take(&mut *OUT.lock().unwrap());
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(out[0], "mrcache[9]: shown");
        assert_eq!(out[1], format!("mrcache[9]: {}", format(&r)));
        let v: serde_json::Value = serde_json::from_str(&out[2]).unwrap();
        assert_eq!(v["call"], "ibv_dereg_mr");
        assert_eq!(v["outcome"], "kept");
        assert_eq!(v["tid"], 7);
        assert_eq!(v["message"], format!("mrcache[9]: {}", format(&r)));
    }
}
