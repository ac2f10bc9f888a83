//! `mrcache`: the launcher. `mrcache run -- PROGRAM ARGS` runs PROGRAM with libmrcache.so
//! preloaded, keeping any LD_PRELOAD the user already set.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str = "\
mrcache: a transparent memory-registration cache for RDMA verbs applications

Usage:
  mrcache run [--lib PATH] -- PROGRAM [ARGS...]   run PROGRAM with libmrcache.so preloaded
  mrcache lib                                     print the path of libmrcache.so
  mrcache --version | --help

libmrcache.so is looked for next to this executable, in ../lib/ and ../lib/mrcache/
relative to it; --lib or MRCACHE_LIB overrides.";

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("mrcache: {msg}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[OsString]) -> Result<ExitCode, String> {
    let first = args.first().and_then(|a| a.to_str());
    match first {
        None | Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        Some("-V" | "--version") => {
            println!("mrcache {}", mrcache::VERSION);
            Ok(ExitCode::SUCCESS)
        }
        Some("lib") => {
            println!("{}", find_library(None)?.display());
            Ok(ExitCode::SUCCESS)
        }
        Some("run") => launch(&args[1..]),
        Some(other) => Err(format!(
            "unknown command '{other}'; expected run, lib, --version or --help"
        )),
    }
}

fn launch(args: &[OsString]) -> Result<ExitCode, String> {
    let mut lib = None;
    let mut rest = args;
    while let Some(a) = rest.first() {
        match a.to_str() {
            Some("--") => {
                rest = &rest[1..];
                break;
            }
            Some("--lib") => {
                let p = rest.get(1).ok_or("--lib needs a path")?;
                lib = Some(PathBuf::from(p));
                rest = &rest[2..];
            }
            Some(opt) if opt.starts_with('-') => {
                return Err(format!(
                    "unknown option '{opt}' for run; expected --lib PATH or --"
                ));
            }
            _ => break,
        }
    }
    let (program, program_args) = rest
        .split_first()
        .ok_or("run needs a program: mrcache run -- PROGRAM [ARGS...]")?;
    let lib = find_library(lib)?;
    let preload = compose_preload(&lib, std::env::var_os("LD_PRELOAD"));
    let err = Command::new(program)
        .args(program_args)
        .env("LD_PRELOAD", preload)
        .exec();
    Err(format!(
        "cannot run {}: {err}",
        Path::new(program).display()
    ))
}

/// Prepend our library to an existing LD_PRELOAD so the user's own preloads still load,
/// without adding it twice.
fn compose_preload(lib: &Path, existing: Option<OsString>) -> OsString {
    let mut out = OsString::from(lib.as_os_str());
    if let Some(existing) = existing {
        let kept: Vec<&str> = existing
            .to_str()
            .unwrap_or_default()
            .split([' ', ':'])
            .filter(|p| !p.is_empty() && Path::new(p) != lib)
            .collect();
        if !kept.is_empty() {
            out.push(":");
            out.push(kept.join(":"));
        }
    }
    out
}

fn find_library(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    let explicit = explicit.or_else(|| std::env::var_os("MRCACHE_LIB").map(PathBuf::from));
    if let Some(p) = explicit {
        return if p.is_file() {
            std::fs::canonicalize(&p).map_err(|e| format!("{}: {e}", p.display()))
        } else {
            Err(format!("libmrcache.so not found at {}", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate myself: {e}"))?;
    let dir = exe.parent().ok_or("executable has no directory")?;
    let candidates = [
        dir.join("libmrcache.so"),
        dir.join("../lib/libmrcache.so"),
        dir.join("../lib/mrcache/libmrcache.so"),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            format!(
                "libmrcache.so not found next to {} or in ../lib; build it (cargo build --release) or set MRCACHE_LIB",
                exe.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_is_prepended_and_not_duplicated() {
        let lib = Path::new("/opt/mrcache/lib/libmrcache.so");
        assert_eq!(
            compose_preload(lib, None),
            OsString::from("/opt/mrcache/lib/libmrcache.so")
        );
        assert_eq!(
            compose_preload(lib, Some("libjemalloc.so.2 /x/y.so".into())),
            OsString::from("/opt/mrcache/lib/libmrcache.so:libjemalloc.so.2:/x/y.so")
        );
        assert_eq!(
            compose_preload(lib, Some("/opt/mrcache/lib/libmrcache.so:a.so".into())),
            OsString::from("/opt/mrcache/lib/libmrcache.so:a.so")
        );
    }
}
