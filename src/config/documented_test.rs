//! docs/configuration.md names only variables the library knows.

use super::*;

/// Every MRCACHE_* name the reference documents is one the library
/// knows (else setting it as documented prints "unknown variable ... ignored").
#[test]
fn every_documented_variable_is_known() {
    let doc = include_str!("../../docs/configuration.md");
    let mut unknown = Vec::new();
    for (i, _) in doc.match_indices("`MRCACHE_") {
        let name: String = doc[i + 1..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        let known =
            VARIABLES.iter().any(|v| v.name == name) || OTHER_KNOWN.contains(&name.as_str());
        if !known && !name.ends_with('_') && !unknown.contains(&name) {
            unknown.push(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "documented but unknown to the library: {unknown:?}"
    );
}
