//! `mrcache __generate DIR` writes the manual pages and shell completions, all from the code,
//! so they cannot drift from it:
//!
//!   DIR/man1/mrcache.1, DIR/man1/mrcache-<subcommand>.1   clap's definitions (clap_mangen)
//!   DIR/man7/mrcache-config.7                             config::VARIABLES (manual.rs)
//!   DIR/completions/{mrcache.bash,_mrcache,mrcache.fish}  clap_complete
//!
//! `make install` and ci/package install them; cli/tests/launcher/manual_pages.rs checks them.

use clap::CommandFactory;
use std::path::Path;

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// One page for `cmd` (named `name`), with a SEE ALSO section pointing at the others.
fn page(cmd: clap::Command, name: &str, see_also: &str) -> Result<Vec<u8>, String> {
    // The synopsis reads "mrcache run ...", the page's name "mrcache-run".
    let bin: &'static str = Box::leak(name.replacen('-', " ", 1).into_boxed_str());
    let mut out = Vec::new();
    // clap takes names as &'static str; this process writes a few pages and exits.
    let name: &'static str = Box::leak(name.to_string().into_boxed_str());
    clap_mangen::Man::new(cmd.name(name).bin_name(bin))
        .section("1")
        .manual("mrcache manual")
        .source(format!("mrcache {}", mrcache::VERSION))
        .render(&mut out)
        .map_err(|e| e.to_string())?;
    out.extend_from_slice(format!(".SH \"SEE ALSO\"\n{see_also}\n").as_bytes());
    Ok(out)
}

pub fn generate(dir: &Path) -> Result<(), String> {
    let cli = crate::Cli::command();
    let subs: Vec<clap::Command> = cli
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    let refs = |skip: &str| {
        let mut r: Vec<String> = std::iter::once("mrcache".to_string())
            .chain(subs.iter().map(|s| format!("mrcache-{}", s.get_name())))
            .filter(|n| n != skip)
            .map(|n| format!("\\fB{}\\fR(1)", n.replace('-', "\\-")))
            .collect();
        r.push("\\fBmrcache\\-config\\fR(7)".into());
        r.join(", ")
    };
    write(
        &dir.join("man1/mrcache.1"),
        &page(cli.clone(), "mrcache", &refs("mrcache"))?,
    )?;
    for s in &subs {
        let name = format!("mrcache-{}", s.get_name());
        write(
            &dir.join(format!("man1/{name}.1")),
            &page(s.clone(), &name, &refs(&name))?,
        )?;
    }
    write(
        &dir.join("man7/mrcache-config.7"),
        crate::manual::config_page().as_bytes(),
    )?;
    // Completions offer the visible subcommands only (clap_complete lists hidden ones too).
    let mut visible = clap::Command::new("mrcache")
        .version(mrcache::VERSION)
        .subcommands(subs.iter().cloned());
    if let Some(about) = cli.get_about() {
        visible = visible.about(about.clone());
    }
    use clap_complete::Shell;
    for (shell, file) in [
        (Shell::Bash, "mrcache.bash"),
        (Shell::Zsh, "_mrcache"),
        (Shell::Fish, "mrcache.fish"),
    ] {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut visible.clone(), "mrcache", &mut out);
        write(&dir.join("completions").join(file), &out)?;
    }
    Ok(())
}
