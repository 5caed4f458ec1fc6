//! Known failures: scenarios a host profile expects to fail, each with its reason and a link.
//! A matching failure is `xfail` (reported with its evidence, not failing the run); a matching
//! pass is `xpass` (the entry is stale), which `--strict` turns into a failure.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::input::{located, parse_yaml, InputError};
use super::result::{ScenarioResult, Verdict};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KnownFailure {
    /// Scenario names this entry covers; `*` matches any run of characters.
    pub scenario: String,
    pub reason: String,
    #[serde(default)]
    pub link: Option<String>,
}

impl KnownFailure {
    pub fn matches(&self, name: &str) -> bool {
        glob(&self.scenario, name)
    }

    fn why(&self) -> String {
        match &self.link {
            Some(l) => format!("{} ({l})", self.reason),
            None => self.reason.clone(),
        }
    }
}

/// `*` matches any run of characters; everything else matches itself.
fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Read a known-failures file: a YAML list of entries.
pub fn load(path: &Path) -> Result<Vec<KnownFailure>, InputError> {
    let text = crate::model::input::read_text(path)?;
    let entries: Vec<Spanned<KnownFailure>> = parse_yaml(path, &text)?;
    for e in &entries {
        check(&e.value).map_err(|why| located(path, &e.referenced, why))?;
    }
    Ok(entries.into_iter().map(|e| e.value).collect())
}

pub fn check(k: &KnownFailure) -> Result<(), String> {
    if k.scenario.trim().is_empty() {
        return Err("a known failure needs a scenario name or pattern".into());
    }
    if k.reason.trim().is_empty() {
        return Err(format!(
            "known failure `{}` needs a reason (what fails, and why it is accepted)",
            k.scenario
        ));
    }
    Ok(())
}

/// Turn a result for a known failure into `xfail` or `xpass` (a failure under `strict`).
pub fn apply(result: &mut ScenarioResult, known: &[KnownFailure], strict: bool) {
    let Some(k) = known.iter().find(|k| k.matches(&result.name)) else {
        return;
    };
    match result.verdict {
        Verdict::Fail => {
            result.verdict = Verdict::Xfail;
            result.reason = Some(format!(
                "known failure: {}; it failed with: {}",
                k.why(),
                result.reason.as_deref().unwrap_or("no reason given")
            ));
        }
        Verdict::Pass => {
            let why = format!("listed as a known failure ({}), but it passed", k.why());
            if strict {
                result.verdict = Verdict::Fail;
                result.reason = Some(format!("xpass under --strict: {why}"));
            } else {
                result.verdict = Verdict::Xpass;
                result.reason = Some(why);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(p: &str) -> KnownFailure {
        KnownFailure {
            scenario: p.into(),
            reason: "hangs after the server dies".into(),
            link: Some("https://example.org/issue/1".into()),
        }
    }

    #[test]
    fn patterns_match_whole_names_with_stars_for_any_run() {
        assert!(entry("ucx-server-death").matches("ucx-server-death"));
        assert!(!entry("ucx-server-death").matches("ucx-server-death-2"));
        assert!(entry("ucx-*").matches("ucx-server-death"));
        assert!(entry("*-death").matches("libfabric-rdm-server-death"));
        assert!(entry("libfabric-*-death").matches("libfabric-rdm-server-death"));
        assert!(!entry("libfabric-*-death").matches("libfabric-pingpong-msg"));
        assert!(!entry("a*a").matches("a"));
    }

    fn result(v: Verdict) -> ScenarioResult {
        ScenarioResult::not_run(
            "ucx-server-death",
            Path::new("s.yaml"),
            v,
            "the client never exited".into(),
        )
    }

    #[test]
    fn a_known_failure_is_xfail_and_keeps_its_evidence() {
        let mut r = result(Verdict::Fail);
        apply(&mut r, &[entry("ucx-*")], false);
        assert_eq!(r.verdict, Verdict::Xfail);
        let why = r.reason.unwrap();
        assert!(why.contains("hangs after the server dies (https://example.org/issue/1)"));
        assert!(why.ends_with("it failed with: the client never exited"));
    }

    #[test]
    fn a_known_failure_that_passes_is_xpass_and_fails_under_strict() {
        let mut r = result(Verdict::Pass);
        apply(&mut r, &[entry("ucx-*")], false);
        assert_eq!(r.verdict, Verdict::Xpass);
        let mut r = result(Verdict::Pass);
        apply(&mut r, &[entry("ucx-*")], true);
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(r.reason.unwrap().starts_with("xpass under --strict"));
        // Skips and unlisted scenarios are left alone.
        let mut r = result(Verdict::Skip);
        apply(&mut r, &[entry("ucx-*")], true);
        assert_eq!(r.verdict, Verdict::Skip);
        let mut r = result(Verdict::Fail);
        apply(&mut r, &[entry("gloo-*")], false);
        assert_eq!(r.verdict, Verdict::Fail);
    }

    #[test]
    fn an_entry_without_a_reason_is_a_located_error() {
        let dir = std::env::temp_dir().join(format!("wringer-known-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("known.yaml");
        std::fs::write(
            &f,
            "- scenario: a\n  reason: fine\n- scenario: b\n  reason: \"\"\n",
        )
        .unwrap();
        let e = load(&f).unwrap_err().to_string();
        assert!(e.contains("known.yaml:3:"), "{e}");
        assert!(e.contains("needs a reason"), "{e}");
        std::fs::write(&f, "- scenario: a\n  reasn: typo\n").unwrap();
        assert!(load(&f).unwrap_err().to_string().contains("known.yaml:2:"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
