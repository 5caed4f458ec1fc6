//! Known failures: scenarios a host profile expects to fail, each with the kind of failure it
//! covers, its reason and a link. A failure of a listed scenario whose every failure is of a
//! listed kind (and matches the `failure:` pattern, when there is one) is `xfail`: reported with
//! its evidence, not failing the run. Any other failure of it still fails. A matching pass is
//! `xpass` (the entry is stale), which `--strict` turns into a failure.

use crate::model::invalid::Invalid;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::failure::{Failed, FailureKind};
use super::input::{located, parse_yaml, InputError};
use super::result::{ScenarioResult, Verdict};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KnownFailure {
    /// Scenario names this entry covers; `*` matches any run of characters.
    pub scenario: String,
    /// The kinds of failure the entry covers (`kind: reconcile-disagreement`, or a list): a
    /// failure of another kind is not this known failure.
    #[serde(default, deserialize_with = "one_or_many")]
    pub kind: Vec<FailureKind>,
    pub reason: String,
    #[serde(default)]
    pub link: Option<String>,
    /// A regex that every failure of the scenario must also match for the entry to cover it
    /// (the survivors' detection over its bound, say). Without it, any failure of the listed
    /// kinds is covered.
    #[serde(default)]
    pub failure: Option<String>,
    /// A pattern that matches every scenario (`*`) is refused unless this says it is meant;
    /// even then every run warns, since it turns any failure anywhere into an `xfail`.
    #[serde(default)]
    pub match_all: bool,
}

/// The most entries a known-failures list may hold: each is a failure someone measured and
/// explained, so thousands are a generated file, not a list.
pub const MAX_ENTRIES: usize = 1000;

/// Refuse a list longer than [`MAX_ENTRIES`]; warn for each entry that matches everything.
pub fn check_list<'a>(
    entries: impl ExactSizeIterator<Item = &'a KnownFailure>,
) -> Result<(), Invalid> {
    if entries.len() > MAX_ENTRIES {
        return Err(format!(
            "{} known failures, more than the {MAX_ENTRIES} a list may hold: list the failures you measured, with a reason each",
            entries.len()
        ).into());
    }
    for k in entries.filter(|k| k.match_all) {
        eprintln!(
            "warning: known failure `{}` has match_all: true: every failing scenario of this profile is reported as xfail",
            k.scenario
        );
    }
    Ok(())
}

impl KnownFailure {
    pub fn matches(&self, name: &str) -> bool {
        glob(&self.scenario, name)
    }

    /// The failures this entry does not cover: another kind, or text its pattern does not
    /// match.
    fn uncovered<'a>(&self, failures: &'a [Failed]) -> Vec<&'a Failed> {
        // Checked when the file was read; a pattern that does not compile covers nothing.
        let re = self.failure.as_deref().map(regex::Regex::new);
        failures
            .iter()
            .filter(|f| {
                let text = f.failure.to_string();
                let kind_ok = self.kind.contains(&f.failure.kind());
                let text_ok = match &re {
                    None => true,
                    Some(Ok(re)) => re.is_match(&text),
                    Some(Err(_)) => false,
                };
                !(kind_ok && text_ok)
            })
            .collect()
    }

    fn covers(&self) -> String {
        let kinds: Vec<&str> = self.kind.iter().map(|k| k.as_str()).collect();
        match &self.failure {
            Some(p) => format!("{} matching `{p}`", kinds.join(" or ")),
            None => kinds.join(" or "),
        }
    }

    fn why(&self) -> String {
        match &self.link {
            Some(l) => format!("{} ({l})", self.reason),
            None => self.reason.clone(),
        }
    }
}

/// `*` matches any run of characters; everything else matches itself.
pub fn glob(pattern: &str, name: &str) -> bool {
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
    let text = crate::model::input::read_text(path, crate::model::input::FileKind::KnownFailures)?;
    let entries: Vec<Spanned<KnownFailure>> = parse_yaml(path, &text)?;
    for e in &entries {
        check(&e.value).map_err(|why| located(path, &e.referenced, why.0))?;
    }
    check_list(entries.iter().map(|e| &e.value)).map_err(|why| InputError::plain(path, why))?;
    Ok(entries.into_iter().map(|e| e.value).collect())
}

/// `kind: bound` or `kind: [bound, step-error]`.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<FailureKind>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(FailureKind),
        Many(Vec<FailureKind>),
    }
    // Untagged enums hide the inner error; name the kinds a typo could have meant.
    match OneOrMany::deserialize(d) {
        Ok(OneOrMany::One(k)) => Ok(vec![k]),
        Ok(OneOrMany::Many(v)) => Ok(v),
        Err(_) => Err(serde::de::Error::custom(format!(
            "`kind` is one of {} (or a list of them)",
            kinds_list()
        ))),
    }
}

fn kinds_list() -> String {
    FailureKind::ALL
        .iter()
        .filter(|k| **k != FailureKind::Recorded)
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn check(k: &KnownFailure) -> Result<(), Invalid> {
    if k.scenario.trim().is_empty() {
        return Err("a known failure needs a scenario name or pattern".into());
    }
    if k.kind.is_empty() {
        return Err(format!(
            "known failure `{}` needs `kind:`, the kind of failure it covers ({}), so that the scenario failing any other way still fails",
            k.scenario,
            kinds_list()
        ).into());
    }
    let every = k.scenario.chars().all(|c| c == '*');
    if every && !k.match_all {
        return Err(format!(
            "known failure `{}` matches every scenario, so any failure anywhere would pass as xfail: name the scenarios (`ucx-*`), or set `match_all: true` if you mean it",
            k.scenario
        ).into());
    }
    if let Some(p) = &k.failure {
        regex::Regex::new(p)
            .map_err(|e| format!("known failure `{}`: bad regex `{p}`: {e}", k.scenario))?;
    }
    if k.reason.trim().is_empty() {
        return Err(format!(
            "known failure `{}` needs a reason (what fails, and why it is accepted)",
            k.scenario
        )
        .into());
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
            let failures = &result.evidence.failures;
            let other = k.uncovered(failures);
            if failures.is_empty() || !other.is_empty() {
                let other: Vec<String> = other
                    .iter()
                    .map(|f| format!("{} ({})", f, f.failure.kind()))
                    .collect();
                result.reason = Some(format!(
                    "{} (a known failure is listed for this scenario, covering {}, but this is another: {})",
                    result.reason.as_deref().unwrap_or("failed"),
                    k.covers(),
                    if other.is_empty() { "no failure was recorded".into() } else { other.join("; ") }
                ));
                return;
            }
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
    use crate::model::failure::Failure;

    fn entry(p: &str) -> KnownFailure {
        KnownFailure {
            scenario: p.into(),
            kind: vec![FailureKind::ReconcileDisagreement],
            reason: "hangs after the server dies".into(),
            link: Some("https://example.org/issue/1".into()),
            failure: None,
            match_all: false,
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

    fn disagreement(detail: &str) -> Failure {
        Failure::ReconcileDisagreement {
            step: 0,
            detail: detail.into(),
        }
    }

    fn failed(failures: Vec<Failure>) -> ScenarioResult {
        let mut r = result(Verdict::Fail);
        r.evidence.failures = failures
            .into_iter()
            .map(|failure| Failed {
                repeat: Some(0),
                failure,
            })
            .collect();
        r
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
        let mut r = failed(vec![disagreement("the client never exited")]);
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
        let mut r = failed(vec![disagreement("the client never exited")]);
        apply(&mut r, &[entry("gloo-*")], false);
        assert_eq!(r.verdict, Verdict::Fail);
    }

    #[test]
    fn a_listed_scenario_failing_with_another_kind_fails() {
        // The entry covers the client that never exits; a hang, a step error or a broken
        // bound of the same scenario is a new failure.
        let others = [
            Failure::Watchdog {
                summary: "rank 1 hung".into(),
            },
            Failure::StepError {
                rank: 0,
                step: 0,
                error: "connection refused".into(),
            },
            Failure::Leftover {
                process: "pid 9".into(),
            },
        ];
        for other in others {
            let mut r = failed(vec![disagreement("the client never exited"), other.clone()]);
            apply(&mut r, &[entry("ucx-*")], false);
            assert_eq!(r.verdict, Verdict::Fail, "{other}");
            let why = r.reason.unwrap();
            assert!(why.contains(&format!("({})", other.kind())), "{why}");
        }
        // A failure without recorded evidence is not taken for the known one either.
        let mut r = result(Verdict::Fail);
        apply(&mut r, &[entry("ucx-*")], false);
        assert_eq!(r.verdict, Verdict::Fail);
        // An entry may list several kinds.
        let k = KnownFailure {
            kind: vec![FailureKind::ReconcileDisagreement, FailureKind::Watchdog],
            ..entry("ucx-*")
        };
        let mut r = failed(vec![
            disagreement("the client never exited"),
            Failure::Watchdog {
                summary: "hung".into(),
            },
        ]);
        apply(&mut r, &[k], false);
        assert_eq!(r.verdict, Verdict::Xfail);
    }

    #[test]
    fn an_entry_with_a_failure_pattern_covers_that_failure_and_no_other() {
        let k = KnownFailure {
            failure: Some("noticed the fault after .* over".into()),
            ..entry("ucx-server-death")
        };
        let failing = |failures: &[&str]| {
            let mut r = failed(failures.iter().map(|s| disagreement(s)).collect());
            apply(&mut r, std::slice::from_ref(&k), false);
            r
        };
        let r = failing(&[
            "rank 1 (survivor): noticed the fault after 10004.0 ms, over the 3s allowed",
        ]);
        assert_eq!(r.verdict, Verdict::Xfail);
        // The same scenario failing another way stays a failure, and says which failure it was.
        let r = failing(&[
            "rank 1 (survivor): noticed the fault after 10004.0 ms, over the 3s allowed",
            "data_mismatches = 3, expected 0",
        ]);
        assert_eq!(r.verdict, Verdict::Fail);
        let why = r.reason.unwrap();
        assert!(
            why.contains("but this is another: repeat 0: step 0, from every rank's evidence: data_mismatches = 3"),
            "{why}"
        );
        assert!(!why.contains("another: rank 1"), "{why}");
    }

    #[test]
    fn a_pattern_for_every_scenario_needs_match_all_and_a_list_has_a_size_limit() {
        let e = check(&entry("*")).unwrap_err();
        assert!(
            e.contains("matches every scenario") && e.contains("match_all: true"),
            "{e}"
        );
        assert!(check(&entry("**")).is_err());
        assert!(check(&KnownFailure {
            match_all: true,
            ..entry("*")
        })
        .is_ok());
        assert!(check(&entry("ucx-*")).is_ok());
        let many = vec![entry("a"); MAX_ENTRIES + 1];
        assert!(check_list(many.iter())
            .unwrap_err()
            .contains("more than the 1000"));
        assert!(check_list(many[..MAX_ENTRIES].iter()).is_ok());
    }

    #[test]
    fn an_entry_without_a_reason_is_a_located_error() {
        let dir = std::env::temp_dir().join(format!("wringer-known-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("known.yaml");
        std::fs::write(
            &f,
            "- scenario: a\n  kind: bound\n  reason: fine\n- scenario: b\n  kind: bound\n  reason: \"\"\n",
        )
        .unwrap();
        let e = load(&f).unwrap_err().to_string();
        assert!(e.contains("known.yaml:4:"), "{e}");
        assert!(e.contains("needs a reason"), "{e}");
        std::fs::write(
            &f,
            "- scenario: a\n  kind: bound\n  reason: r\n  failure: \"(\"\n",
        )
        .unwrap();
        let e = load(&f).unwrap_err().to_string();
        assert!(
            e.contains("known.yaml:1:") && e.contains("bad regex"),
            "{e}"
        );
        std::fs::write(&f, "- scenario: a\n  kind: bound\n  reasn: typo\n").unwrap();
        assert!(load(&f).unwrap_err().to_string().contains("known.yaml:3:"));
        // An entry without a kind, or with a misspelt one, says which kinds there are.
        std::fs::write(&f, "- scenario: a\n  reason: r\n").unwrap();
        let e = load(&f).unwrap_err().to_string();
        assert!(
            e.contains("known.yaml:1:")
                && e.contains("needs `kind:`")
                && e.contains("reconcile-disagreement"),
            "{e}"
        );
        std::fs::write(&f, "- scenario: a\n  kind: bounds\n  reason: r\n").unwrap();
        let e = load(&f).unwrap_err().to_string();
        assert!(
            e.contains("known.yaml:2:") && e.contains("step-error"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
