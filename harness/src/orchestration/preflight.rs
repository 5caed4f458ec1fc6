//! Before a scenario's ranks start: do its hosts have the programs its exec steps run, and do
//! its pre-checks pass there? A host that lacks one makes the scenario a typed skip
//! (`missing-program: fi_pingpong (Debian package libfabric-bin)`, `precheck: ...`), decided
//! by the policy like a missing RDMA device.

use std::time::Duration;

use crate::hosts::child;
use crate::hosts::placement::{Placement, RemoteHost};
use crate::hosts::programs;
use crate::model::requirement::{SkipCode, SkipReason};
use crate::rank::steps::Preflight;

const CHECK_LIMIT: Duration = Duration::from_secs(30);

/// The first need that some host does not meet, as a skip reason.
pub fn unmet(needs: &[Preflight], placement: &Placement) -> Option<SkipReason> {
    for need in needs {
        let failed = if placement.hosts().is_empty() {
            unmet_here(need)
        } else {
            placement
                .hosts()
                .iter()
                .find_map(|h| unmet_on(need, h).map(|why| format!("on {}: {why}", h.target.name)))
        };
        if let Some(detail) = failed {
            let code = match need {
                Preflight::Program { .. } => SkipCode::MissingProgram,
                Preflight::Check { .. } => SkipCode::Precheck,
            };
            return Some(SkipReason { code, detail });
        }
    }
    None
}

/// Why this machine does not meet `need`, or None when it does.
fn unmet_here(need: &Preflight) -> Option<String> {
    match need {
        Preflight::Program { name, package } => (!crate::hosts::programs::runnable(name))
            .then(|| programs::missing(name, package.as_deref())),
        Preflight::Check { command, reason } => {
            let words: Vec<&str> = command.iter().map(String::as_str).collect();
            match child::run_bounded(&words, CHECK_LIMIT) {
                Ok((Some(s), _)) if s.success() => None,
                Ok((Some(s), _)) => Some(format!("{reason} (`{}` exited {s})", command.join(" "))),
                Ok((None, _)) => Some(format!(
                    "{reason} (`{}` ran past {CHECK_LIMIT:?})",
                    command.join(" ")
                )),
                Err(why) => Some(format!("{reason} ({why})")),
            }
        }
    }
}

/// Why `host` does not meet `need`, or None when it does.
fn unmet_on(need: &Preflight, host: &RemoteHost) -> Option<String> {
    let target = &host.target;
    let shipped = programs::remote_search_path(&host.exe);
    let (words, why): (Vec<&str>, String) = match need {
        Preflight::Program { name, package } => (
            // shell: the program's name and the search path go as "$1" and "$2", never into the script.
            vec![
                "sh",
                "-c",
                "PATH=\"$2:$PATH\" command -v \"$1\" >/dev/null",
                "sh",
                name,
                &shipped,
            ],
            programs::missing(name, package.as_deref()),
        ),
        Preflight::Check { command, reason } => (
            command.iter().map(String::as_str).collect(),
            format!("{reason} (`{}` failed)", command.join(" ")),
        ),
    };
    match target.run(&words, CHECK_LIMIT) {
        Ok(out) if out.status.success() => None,
        Ok(_) => Some(why),
        Err(e) => Some(format!("{why}: {e:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_names_its_package() {
        let needs = [
            Preflight::Program {
                name: "sh".into(),
                package: None,
            },
            Preflight::Program {
                name: "wringer-no-such-tool".into(),
                package: Some("wringer-tools".into()),
            },
        ];
        let why = unmet(&needs, &crate::hosts::placement::local()).unwrap();
        assert_eq!(
            why.to_string(),
            "missing-program: wringer-no-such-tool (Debian package wringer-tools)"
        );
        assert!(unmet(&needs[..1], &crate::hosts::placement::local()).is_none());
    }

    #[test]
    fn a_failing_precheck_is_a_skip_with_its_reason_and_exit() {
        let needs = [Preflight::Check {
            command: vec!["sh".into(), "-c".into(), "exit 61".into()],
            reason: "no verbs provider".into(),
        }];
        let why = unmet(&needs, &crate::hosts::placement::local())
            .unwrap()
            .to_string();
        assert!(why.starts_with("precheck: no verbs provider"), "{why}");
        assert!(why.contains("61"), "{why}");
        let ok = [Preflight::Check {
            command: vec!["true".into()],
            reason: "never".into(),
        }];
        assert!(unmet(&ok, &crate::hosts::placement::local()).is_none());
    }
}
