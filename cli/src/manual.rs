//! The `mrcache-config(7)` manual page, written from [`mrcache::config::VARIABLES`]: the same table
//! `mrcache info` prints and docs/configuration.md is checked against (cli/tests/launcher/manual_pages.rs), so
//! the page, the launcher and the reference cannot disagree. The launcher writes it with its
//! other pages (`mrcache __generate DIR`, used by `make install` and ci/package).

use mrcache::config::VARIABLES;

/// Text made safe for roff: backslashes escaped, hyphens literal, and a line that would start
/// with a control character (`.` or `'`) guarded.
pub fn roff_escape(text: &str) -> String {
    let s = text.replace('\\', "\\e").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}

/// The inverse of [`roff_escape`] (for the checks).
#[cfg(test)]
fn roff_unescape(text: &str) -> String {
    text.trim_start_matches("\\&")
        .replace("\\-", "-")
        .replace("\\e", "\\")
}

/// The page, in man(7) roff.
pub fn config_page() -> String {
    let mut p = String::new();
    p.push_str(&format!(
        ".TH MRCACHE\\-CONFIG 7 \"\" \"mrcache {}\" \"mrcache manual\"\n",
        roff_escape(mrcache::VERSION)
    ));
    p.push_str(
        ".SH NAME\nmrcache\\-config \\- the MRCACHE_* environment variables of libmrcache.so\n",
    );
    p.push_str(
        ".SH DESCRIPTION\n\
         libmrcache.so, preloaded by \\fBmrcache\\-run\\fR(1) or through \\fBLD_PRELOAD\\fR, is \
         configured only through environment variables. A bad value prints one line naming the \
         variable, the value and what is allowed, and the process runs on with the cache off. \
         An unknown MRCACHE_* name is reported and ignored. \\fBmrcache\\-info\\fR(1) prints each \
         variable with its value here and where it comes from.\n",
    );
    p.push_str(".SH ENVIRONMENT\n");
    for v in VARIABLES {
        p.push_str(&format!(".TP\n.B {}\n", v.name));
        p.push_str(&format!("{}\n", roff_escape(v.about)));
        p.push_str(&format!(".RS\n.PP\nDefault: {}\n", roff_escape(v.default)));
        p.push_str(&format!(".br\nAllowed: {}\n.RE\n", roff_escape(v.allowed)));
    }
    p.push_str(&format!(
        ".PP\nThe node\\-local rank count that divides the default byte cap is read from the \
         launcher's variables: {}.\n",
        roff_escape(&mrcache::node::LAUNCHER_VARIABLES.join(", "))
    ));
    p.push_str(
        ".SH EXAMPLES\n.nf\nMRCACHE_MAX_BYTES=4G MRCACHE_MAX_ENTRIES=4096 mrcache run \\-\\- ./app\n\
         MRCACHE_ENABLE=0 mrcache run \\-\\- ./app\n.fi\n",
    );
    p.push_str(
        ".SH SEE ALSO\n\\fBmrcache\\fR(1), \\fBmrcache\\-run\\fR(1), \\fBmrcache\\-info\\fR(1)\n",
    );
    p
}

/// The variables a page lists, with their defaults and allowed values, read back from its
/// roff (for the checks).
#[cfg(test)]
fn variables_in_page(page: &str) -> Vec<(String, String, String)> {
    let lines: Vec<&str> = page.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if let Some(name) = l.strip_prefix(".B MRCACHE_") {
            let find = |prefix: &str| {
                lines[i..]
                    .iter()
                    .find_map(|l| l.strip_prefix(prefix))
                    .map(roff_unescape)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_round_trips() {
        for t in [".x-y", "'q", "a\\b-c", "plain"] {
            assert_eq!(roff_unescape(&roff_escape(t)), t);
        }
        assert_eq!(roff_escape(".a-b"), "\\&.a\\-b");
    }

    #[test]
    fn page_lists_the_table() {
        let got = variables_in_page(&config_page());
        let want: Vec<(String, String, String)> = VARIABLES
            .iter()
            .map(|v| (v.name.into(), v.default.into(), v.allowed.into()))
            .collect();
        assert_eq!(got, want);
    }
}
