//! Suppressions, as valgrind's and ThreadSanitizer's users know them: a file of entries, each
//! naming the audit finding it silences, where (the program, a call site or library), and
//! why. A suppressed finding does not fail the run; the report counts it under its entry.
//!
//! ```yaml
//! - check: leak                       # the finding's name, as the report prints it
//!   program: "*/node"                 # optional: the program's path ( * matches any run)
//!   site: "uv_loop_init"              # optional: a function, file:line or library the
//!                                     # finding names (matched anywhere in its text)
//!   reason: node keeps its event loop's epoll descriptor for its whole life
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::input::{located, parse_yaml, read_text, FileKind, InputError};
use super::invalid::Invalid;
use super::known::glob;

/// The findings the audits report, by the name each is printed with.
pub const FINDINGS: &[&str] = &[
    "close while in use",
    "close before the receiver is done",
    "use after close",
    "double close",
    "leak",
    "wait without a bound",
    "lock order",
    "wait under a lock",
    "deadlock",
];

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Suppression {
    pub check: String,
    #[serde(default)]
    pub program: Option<String>,
    #[serde(default)]
    pub site: Option<String>,
    pub reason: String,
}

/// The most entries a file may hold: each is a finding someone read and explained.
pub const MAX_ENTRIES: usize = 1000;

impl Suppression {
    /// Whether this entry silences a `check` finding in `program` (when known) whose text
    /// (with its call sites named) is `text`. An entry naming a program never matches a
    /// finding whose program is unknown.
    pub fn matches(&self, check: &str, program: Option<&str>, text: &str) -> bool {
        if self.check != check {
            return false;
        }
        if let Some(p) = &self.program {
            let Some(program) = program else {
                return false;
            };
            let name = Path::new(program)
                .file_name()
                .map_or(program.into(), |n| n.to_string_lossy());
            if !glob(p, program) && !glob(p, &name) {
                return false;
            }
        }
        match &self.site {
            Some(site) => glob(&format!("*{site}*"), text),
            None => true,
        }
    }

    /// How the report names it: `leak in */node (reason)`.
    pub fn label(&self) -> String {
        let mut s = self.check.clone();
        if let Some(p) = &self.program {
            s.push_str(&format!(" in {p}"));
        }
        if let Some(site) = &self.site {
            s.push_str(&format!(" at {site}"));
        }
        format!("{s} ({})", self.reason)
    }
}

pub fn check(s: &Suppression) -> Result<(), Invalid> {
    if !FINDINGS.contains(&s.check.as_str()) {
        return Err(format!(
            "`check: {}` names no finding: it is one of {}",
            s.check,
            FINDINGS
                .iter()
                .map(|f| format!("`{f}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
        .into());
    }
    if s.reason.trim().is_empty() {
        return Err(format!(
            "the suppression of `{}` needs a reason (why the finding is not a bug)",
            s.check
        )
        .into());
    }
    let everywhere = |p: &Option<String>| p.as_deref().is_none_or(|p| p.chars().all(|c| c == '*'));
    if everywhere(&s.program) && everywhere(&s.site) {
        return Err(format!(
            "the suppression of `{}` names neither a program nor a site, so it would silence every such finding anywhere: name the program (`program: \"*/node\"`) or the call site (`site: uv_loop_init`)",
            s.check
        )
        .into());
    }
    Ok(())
}

/// Read a suppressions file: a YAML list of entries, each checked where it stands.
pub fn load(path: &Path) -> Result<Vec<Suppression>, InputError> {
    let text = read_text(path, FileKind::Suppressions)?;
    let entries: Vec<Spanned<Suppression>> = parse_yaml(path, &text)?;
    for e in &entries {
        check(&e.value).map_err(|why| located(path, &e.referenced, why.0))?;
    }
    if entries.len() > MAX_ENTRIES {
        return Err(InputError::plain(
            path,
            format!(
                "{} suppressions, more than the {MAX_ENTRIES} a file may hold",
                entries.len()
            ),
        ));
    }
    Ok(entries.into_iter().map(|e| e.value).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(program: Option<&str>, site: Option<&str>) -> Suppression {
        Suppression {
            check: "leak".into(),
            program: program.map(Into::into),
            site: site.map(Into::into),
            reason: "kept for the program's life".into(),
        }
    }

    #[test]
    fn an_entry_matches_its_check_program_and_site_only() {
        let text = "fd 5, made by process 7's program (line 3), was still open (uv_loop_init at core.c:12)";
        let by_program = entry(Some("node"), None);
        assert!(by_program.matches("leak", Some("/usr/bin/node"), text));
        assert!(!by_program.matches("leak", Some("/usr/bin/python3"), text));
        assert!(!by_program.matches("leak", None, text), "unknown program");
        assert!(!by_program.matches("double close", Some("/usr/bin/node"), text));
        let by_site = entry(None, Some("core.c:12"));
        assert!(by_site.matches("leak", None, text));
        assert!(!entry(None, Some("core.c:13")).matches("leak", None, text));
        assert!(entry(Some("*/bin/n*"), Some("uv_*init")).matches(
            "leak",
            Some("/usr/bin/node"),
            text
        ));
    }

    #[test]
    fn a_bad_entry_is_refused_where_it_stands() {
        let dir = std::env::temp_dir().join(format!("wringer-supp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("s.yaml");
        let cases = [
            (
                "- check: leek\n  program: x\n  reason: r\n",
                "names no finding",
            ),
            (
                "- check: leak\n  reason: r\n",
                "neither a program nor a site",
            ),
            (
                "- check: leak\n  program: \"*\"\n  reason: r\n",
                "neither a program nor a site",
            ),
            (
                "- check: leak\n  program: x\n  reason: \" \"\n",
                "needs a reason",
            ),
            (
                "- check: leak\n  program: x\n  reason: r\n  pid: 3\n",
                "pid",
            ),
        ];
        for (text, says) in cases {
            std::fs::write(&file, text).unwrap();
            let e = load(&file).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
            assert!(e.contains("s.yaml:"), "{text:?}: no location in {e}");
        }
        std::fs::write(&file, "- check: leak\n  program: node\n  reason: r\n").unwrap();
        assert_eq!(
            load(&file).unwrap(),
            vec![entry(Some("node"), None).with_reason("r")]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    impl Suppression {
        fn with_reason(mut self, r: &str) -> Self {
            self.reason = r.into();
            self
        }
    }
}
