//! The startup self-test's result (the test itself runs in libmrcache.so): for each way
//! memory can go away, whether the monitor reported it. One text per status, used by the
//! log line, `mrcache info`, the JSON report and the exit summary.

use std::fmt;

/// What the self-test saw for one way memory goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The monitor reported it.
    Caught,
    /// The monitor did not report it: a stale registration could follow.
    Missed,
    /// Not exercised; the text says why.
    NotRun(&'static str),
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Caught => f.write_str("caught"),
            Status::Missed => f.write_str("MISSED"),
            Status::NotRun(why) => write!(f, "not run: {why}"),
        }
    }
}

/// The self-test's result: each path with its status, and how long it took.
#[derive(Debug, Clone, Default)]
pub struct Coverage {
    /// Each path exercised, by name, with its status.
    pub results: Vec<(&'static str, Status)>,
    /// How long the self-test took.
    pub nanos: u64,
}

impl Coverage {
    /// The paths the monitor did not report.
    pub fn missed(&self) -> Vec<&'static str> {
        self.results
            .iter()
            .filter(|(_, s)| *s == Status::Missed)
            .map(|(n, _)| *n)
            .collect()
    }

    /// One line: "path: status; path: status".
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self
            .results
            .iter()
            .map(|(n, s)| format!("{n}: {s}"))
            .collect();
        parts.join("; ")
    }

    /// What ran and what was caught, e.g. "10 of 10 run paths caught; not run: brk/sbrk
    /// shrink" (see [`headline`]).
    pub fn headline(&self) -> String {
        let texts: Vec<(&str, String)> = self
            .results
            .iter()
            .map(|(n, s)| (*n, s.to_string()))
            .collect();
        headline(texts.iter().map(|(n, s)| (*n, s.as_str())))
    }

    /// The headline, then one path a line, and the time taken (`mrcache info`).
    pub fn lines(&self) -> String {
        let mut out = format!("{}\n", self.headline());
        for (path, status) in &self.results {
            out.push_str(&format!("{path}: {status}\n"));
        }
        out.push_str(&format!("(self-test took {} us)\n", self.nanos / 1000));
        out
    }
}

/// The self-test counted by what it ran, from each path's status text (as [`Status`] prints
/// it, and as the JSON report carries it): "N of M run paths caught", then the paths not run
/// ("; not run: a, b") and the ones missed ("; MISSED: c"). A path that was not exercised
/// (brk/sbrk at start-up) is neither caught nor missed, so a healthy start reads "M of M".
pub fn headline<'a>(results: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let (mut caught, mut run) = (0, 0);
    let (mut not_run, mut missed) = (Vec::new(), Vec::new());
    for (path, status) in results {
        if status.starts_with("not run") {
            not_run.push(path);
            continue;
        }
        run += 1;
        if status == "caught" {
            caught += 1;
        } else {
            missed.push(path);
        }
    }
    let mut out = format!("{caught} of {run} run paths caught");
    if !not_run.is_empty() {
        out.push_str(&format!("; not run: {}", not_run.join(", ")));
    }
    if !missed.is_empty() {
        out.push_str(&format!("; MISSED: {}", missed.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts() {
        let c = Coverage {
            results: vec![
                ("munmap", Status::Caught),
                ("free()", Status::Missed),
                ("shm", Status::NotRun("unavailable")),
            ],
            nanos: 12_000,
        };
        assert_eq!(c.missed(), vec!["free()"]);
        assert_eq!(
            c.summary(),
            "munmap: caught; free(): MISSED; shm: not run: unavailable"
        );
        assert_eq!(
            c.headline(),
            "1 of 2 run paths caught; not run: shm; MISSED: free()"
        );
        assert!(c.lines().starts_with("1 of 2 run paths caught;"));
        assert!(
            c.lines()
                .ends_with("shm: not run: unavailable\n(self-test took 12 us)\n")
        );
    }
}
