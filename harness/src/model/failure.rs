//! Why a repeat failed, as data: one [`Failure`] per reason, from the coordinator through the
//! verdict into `results.json` and onto the page. Known failures match on its [`FailureKind`],
//! so a listed scenario that fails another way still fails.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

use super::metric::{Bound, Metric};
use super::requirement::SkipReason;

/// The rank number under which the coordinator's own derived evidence is reported.
pub const COORDINATOR: u32 = u32::MAX;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Failure {
    /// The harness could not start or run the repeat (hosts, ranks, rendezvous).
    HarnessError { detail: String },
    /// SIGINT or SIGTERM ended the run before the scenario finished.
    Interrupted { detail: String },
    /// The deadline passed with ranks still running; their stacks are in the evidence.
    Watchdog { summary: String },
    /// A rank ended (or a process joined) in a way the scenario did not plan for.
    UnexpectedExit { detail: String },
    /// A rank's step returned an error.
    StepError {
        rank: u32,
        step: usize,
        error: String,
    },
    /// The lifecycle audit found a violation in a rank's syscall trace.
    AuditViolation { rank: Option<u32>, detail: String },
    /// An expectation only every rank's evidence together can judge, broken.
    ReconcileDisagreement { step: usize, detail: String },
    /// A process of the run alive on a host after it ended.
    Leftover { process: String },
    /// A scenario fault whose point no rank reached.
    FaultMissed { detail: String },
    /// A point the scenario must reach (a race window entered) that no repeat reached: its
    /// checks passed without being put to the test.
    NeverReached {
        point: String,
        meaning: String,
        repeats: u32,
    },
    /// A metric outside its bound; `value: None` means no rank reported it.
    Bound {
        metric: Metric,
        /// The rank that reported it ([`COORDINATOR`] for evidence derived from every rank).
        rank: Option<u32>,
        value: Option<f64>,
        expected: Bound,
    },
    /// A scenario that could not run where it must (`--strict`, the profile's `must_have`).
    Unmet { skip: SkipReason, by: String },
    /// A failure recorded before results were typed (schema 1 and 2): its text as written.
    Recorded { text: String },
}

/// Which case a [`Failure`] is, without its data: what known failures name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    HarnessError,
    Interrupted,
    Watchdog,
    UnexpectedExit,
    StepError,
    AuditViolation,
    ReconcileDisagreement,
    Leftover,
    FaultMissed,
    NeverReached,
    Bound,
    Unmet,
    Recorded,
}

impl FailureKind {
    pub const ALL: [FailureKind; 13] = [
        FailureKind::HarnessError,
        FailureKind::Interrupted,
        FailureKind::Watchdog,
        FailureKind::UnexpectedExit,
        FailureKind::StepError,
        FailureKind::AuditViolation,
        FailureKind::ReconcileDisagreement,
        FailureKind::Leftover,
        FailureKind::FaultMissed,
        FailureKind::NeverReached,
        FailureKind::Bound,
        FailureKind::Unmet,
        FailureKind::Recorded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::HarnessError => "harness-error",
            FailureKind::Interrupted => "interrupted",
            FailureKind::Watchdog => "watchdog",
            FailureKind::UnexpectedExit => "unexpected-exit",
            FailureKind::StepError => "step-error",
            FailureKind::AuditViolation => "audit-violation",
            FailureKind::ReconcileDisagreement => "reconcile-disagreement",
            FailureKind::Leftover => "leftover",
            FailureKind::FaultMissed => "fault-missed",
            FailureKind::NeverReached => "never-reached",
            FailureKind::Bound => "bound",
            FailureKind::Unmet => "unmet",
            FailureKind::Recorded => "recorded",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Failure {
    pub fn kind(&self) -> FailureKind {
        match self {
            Failure::HarnessError { .. } => FailureKind::HarnessError,
            Failure::Interrupted { .. } => FailureKind::Interrupted,
            Failure::Watchdog { .. } => FailureKind::Watchdog,
            Failure::UnexpectedExit { .. } => FailureKind::UnexpectedExit,
            Failure::StepError { .. } => FailureKind::StepError,
            Failure::AuditViolation { .. } => FailureKind::AuditViolation,
            Failure::ReconcileDisagreement { .. } => FailureKind::ReconcileDisagreement,
            Failure::Leftover { .. } => FailureKind::Leftover,
            Failure::FaultMissed { .. } => FailureKind::FaultMissed,
            Failure::NeverReached { .. } => FailureKind::NeverReached,
            Failure::Bound { .. } => FailureKind::Bound,
            Failure::Unmet { .. } => FailureKind::Unmet,
            Failure::Recorded { .. } => FailureKind::Recorded,
        }
    }
}

/// The sentence a person reads; known failures' `failure:` patterns match it.
impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::HarnessError { detail } => write!(f, "harness error: {detail}"),
            Failure::Interrupted { detail } => f.write_str(detail),
            Failure::Watchdog { summary } => write!(f, "watchdog: {summary}"),
            Failure::UnexpectedExit { detail } => f.write_str(detail),
            Failure::StepError { rank, step, error } => {
                write!(f, "rank {rank} step {step}: {error}")
            }
            Failure::AuditViolation { detail, .. } => write!(f, "audit: {detail}"),
            Failure::ReconcileDisagreement { step, detail } => {
                write!(f, "step {step}, from every rank's evidence: {detail}")
            }
            Failure::Leftover { process } => write!(f, "process left behind: {process}"),
            Failure::FaultMissed { detail } => f.write_str(detail),
            Failure::NeverReached {
                point,
                meaning,
                repeats,
            } => write!(
                f,
                "never reached: `{point}` ({meaning}) in any of {repeats} repeats: the checks that depend on it were never put to the test"
            ),
            Failure::Bound {
                metric,
                value: None,
                expected,
                ..
            } => {
                write!(
                    f,
                    "no rank reported `{metric}`: no evidence for `{metric}` {expected}"
                )
            }
            Failure::Bound {
                metric,
                rank,
                value: Some(v),
                expected,
            } => {
                let whose = match rank {
                    Some(COORDINATOR) | None => "from both sides' evidence".to_string(),
                    Some(r) => format!("on rank {r}"),
                };
                let why = expected
                    .check(*v)
                    .err()
                    .map_or_else(|| v.to_string(), String::from);
                write!(f, "`{metric}` {whose}: {why} (expected {expected})")
            }
            Failure::Unmet { skip, by } => {
                write!(f, "{skip} (a skip turned into a failure by {by})")
            }
            Failure::Recorded { text } => f.write_str(text),
        }
    }
}

/// One failure of one repeat, as `results.json` records it (schema 3).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Failed {
    /// The repeat that failed; `None` for a scenario that failed before any repeat ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
    #[serde(flatten)]
    pub failure: Failure,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.repeat {
            Some(r) => write!(f, "repeat {r}: {}", self.failure),
            None => write!(f, "{}", self.failure),
        }
    }
}

/// Reads schema 3's typed entries and the older files' strings (`repeat 2: ...`), which stay
/// as written: their kind was never recorded, so none is guessed from the text.
impl<'de> Deserialize<'de> for Failed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Text(String),
            Typed {
                #[serde(default)]
                repeat: Option<u32>,
                #[serde(flatten)]
                failure: Failure,
            },
        }
        Ok(match Either::deserialize(d)? {
            Either::Text(text) => Failed {
                repeat: None,
                failure: Failure::Recorded { text },
            },
            Either::Typed { repeat, failure } => Failed { repeat, failure },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::declare_metrics! {
        TEST_DETECT_MS = "test_detect_ms", Milliseconds, Lower;
    }

    fn bound(max: f64) -> Bound {
        Bound {
            min: None,
            max: Some(max),
            equals: None,
        }
    }

    #[test]
    fn a_failure_keeps_its_kind_and_data_through_json() {
        let failures = [
            Failure::StepError {
                rank: 1,
                step: 0,
                error: "peer reset".into(),
            },
            Failure::Bound {
                metric: TEST_DETECT_MS,
                rank: Some(2),
                value: Some(4000.0),
                expected: bound(3000.0),
            },
            Failure::Leftover {
                process: "pid 7 (wringer)".into(),
            },
        ];
        for (i, f) in failures.into_iter().enumerate() {
            let failed = Failed {
                repeat: Some(i as u32),
                failure: f,
            };
            let json = serde_json::to_string(&failed).unwrap();
            let back: Failed = serde_json::from_str(&json).unwrap();
            assert_eq!(back, failed, "{json}");
            assert!(json.contains("\"kind\":"), "{json}");
        }
    }

    #[test]
    fn an_older_results_string_reads_as_recorded_text() {
        let back: Failed = serde_json::from_str("\"repeat 0: watchdog: rank 1 hung\"").unwrap();
        assert_eq!(back.failure.kind(), FailureKind::Recorded);
        assert_eq!(back.to_string(), "repeat 0: watchdog: rank 1 hung");
    }

    #[test]
    fn the_sentence_names_the_rank_and_the_bound() {
        let f = Failure::Bound {
            metric: TEST_DETECT_MS,
            rank: Some(2),
            value: Some(4000.0),
            expected: bound(3000.0),
        };
        assert_eq!(
            f.to_string(),
            "`test_detect_ms` on rank 2: 4000 > max 3000 (expected <= 3000)"
        );
        let f = Failure::Bound {
            metric: TEST_DETECT_MS,
            rank: None,
            value: None,
            expected: bound(3000.0),
        };
        assert!(f
            .to_string()
            .starts_with("no rank reported `test_detect_ms`"));
        assert_eq!(f.kind().as_str(), "bound");
    }
}
