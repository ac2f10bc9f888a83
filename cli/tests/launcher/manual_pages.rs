//! The manual pages, completions and configuration reference agree with the code: the
//! launcher's `__generate` writes a page for `mrcache` and each of its subcommands (every
//! option `--help` shows is on the page), `mrcache-config(7)` lists exactly the table
//! `config::VARIABLES` with its defaults and allowed values, docs/configuration.md's table
//! has the same variables with the same defaults and allowed values (its backticks aside),
//! and `mrcache info` prints the same table.

use mrcache::config::VARIABLES;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn mrcache() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mrcache"));
    c.env_remove("LD_PRELOAD");
    for (k, _) in std::env::vars() {
        if k.starts_with("MRCACHE_") {
            c.env_remove(k);
        }
    }
    c
}

fn stdout(args: &[&str]) -> String {
    let out = mrcache().args(args).output().unwrap();
    assert!(out.status.success(), "mrcache {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `mrcache __generate` into a directory of the test's own (tests run in parallel).
fn generated(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("manual_pages")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    stdout(&["__generate", dir.to_str().unwrap()]);
    dir
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The subcommands `mrcache --help` lists (not `help`).
fn subcommands() -> Vec<String> {
    let help = stdout(&["--help"]);
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(String::from)
        .collect()
}

/// The long options a `--help` text shows.
fn long_options(help: &str) -> BTreeSet<String> {
    help.split_whitespace()
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w.trim_end_matches([',', '.', ')']).to_string())
        .filter(|w| w != "--help" && w != "--version")
        .collect()
}

#[test]
fn a_page_per_subcommand_with_every_option() {
    let dir = generated("pages");
    let subs = subcommands();
    assert!(subs.contains(&"run".to_string()), "{subs:?}");
    let mut pages = vec![("mrcache.1".to_string(), stdout(&["--help"]))];
    for s in &subs {
        pages.push((format!("mrcache-{s}.1"), stdout(&[s, "--help"])));
    }
    for (page, help) in pages {
        let text = read(&dir.join("man1").join(&page)).replace("\\-", "-");
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page}");
        for opt in long_options(&help) {
            assert!(text.contains(&opt), "{page} lacks {opt} (shown by --help)");
        }
    }
    let installed: BTreeSet<String> = std::fs::read_dir(dir.join("man1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let want: BTreeSet<String> = std::iter::once("mrcache.1".to_string())
        .chain(subs.iter().map(|s| format!("mrcache-{s}.1")))
        .collect();
    assert_eq!(installed, want, "pages written vs subcommands shown");
    for (file, words) in [
        ("mrcache.bash", ["run", "info", "--max-bytes"]),
        ("_mrcache", ["run", "info", "--max-bytes"]),
        ("mrcache.fish", ["run", "info", "max-bytes"]),
    ] {
        let text = read(&dir.join("completions").join(file));
        for w in words {
            assert!(text.contains(w), "completions/{file} lacks {w}");
        }
        for hidden in ["__selftest", "__generate"] {
            assert!(
                !text.contains(hidden),
                "completions/{file} offers the hidden {hidden}"
            );
        }
    }
}

type Row = (String, String, String);

fn table() -> Vec<Row> {
    VARIABLES
        .iter()
        .map(|v| (v.name.into(), v.default.into(), v.allowed.into()))
        .collect()
}

/// roff text as a reader sees it: the escapes the page uses (`\&`, `\-`, `\e`) undone.
fn roff_plain(text: &str) -> String {
    text.replace("\\&", "")
        .replace("\\-", "-")
        .replace("\\e", "\\")
}

/// The variables the installed page lists, with their defaults and allowed values, read
/// from its roff (this reading, not the launcher's writer: the page as a reader gets it).
fn variables_in_page(page: &str) -> Vec<Row> {
    let lines: Vec<&str> = page.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if let Some(name) = l.strip_prefix(".B MRCACHE_") {
            let find = |prefix: &str| {
                lines[i..]
                    .iter()
                    .find_map(|l| l.strip_prefix(prefix))
                    .map(roff_plain)
                    .unwrap_or_default()
            };
            out.push((
                format!("MRCACHE_{name}"),
                find("Default: "),
                find("Allowed: "),
            ));
        }
    }
    out
}

#[test]
fn config_page_is_the_table() {
    let page = read(&generated("config").join("man7/mrcache-config.7"));
    assert_eq!(variables_in_page(&page), table());
    let plain = roff_plain(&page);
    for v in VARIABLES {
        assert!(
            plain.contains(v.about),
            "mrcache-config(7) lacks what {} does",
            v.name
        );
    }
}

/// docs/configuration.md's reference table (the one headed "| variable | default |"):
/// (variable, default, allowed values) per row, backticks (Markdown code marks) removed.
fn doc_rows(doc: &str) -> Vec<Row> {
    doc.lines()
        .skip_while(|l| !l.starts_with("| variable | default |"))
        .take_while(|l| l.starts_with('|'))
        .filter(|l| l.starts_with("| `MRCACHE_"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let name = cells[0].trim_start_matches("| ").trim_matches('`');
            (
                name.to_string(),
                cells[1].replace('`', ""),
                cells[2].replace('`', ""),
            )
        })
        .collect()
}

#[test]
fn configuration_md_is_the_table() {
    let doc = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md"));
    let rows = doc_rows(&doc);
    let names: BTreeSet<&str> = rows.iter().map(|(n, _, _)| n.as_str()).collect();
    let want: BTreeSet<&str> = VARIABLES.iter().map(|v| v.name).collect();
    assert_eq!(
        names, want,
        "docs/configuration.md's table vs config::VARIABLES"
    );
    assert_eq!(rows.len(), VARIABLES.len(), "a variable has two rows");
    let mut wrong = Vec::new();
    for (name, default, allowed) in &rows {
        let v = VARIABLES.iter().find(|v| v.name == name).unwrap();
        if default != v.default {
            wrong.push(format!(
                "{name}: docs/configuration.md's default '{default}', the code's '{}'",
                v.default
            ));
        }
        if allowed != v.allowed {
            wrong.push(format!(
                "{name}: docs/configuration.md's allowed values '{allowed}', the code's '{}'",
                v.allowed
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn info_prints_the_table() {
    let info = stdout(&["info"]);
    let rows: Vec<(String, String)> = info
        .lines()
        .filter(|l| l.starts_with("  MRCACHE_") && l.ends_with(" (default)"))
        .map(|l| {
            let l = l.trim().trim_end_matches(" (default)");
            let (name, value) = l.split_once(' ').unwrap();
            (name.to_string(), value.trim().to_string())
        })
        .collect();
    let want: Vec<(String, String)> = VARIABLES
        .iter()
        .map(|v| (v.name.to_string(), v.default.to_string()))
        .collect();
    assert_eq!(rows, want, "mrcache info's configuration table");
}
