//! listener-never-answers: rank 0 is an adversary that accepts the TCP connection and reads the
//! hello, then stays silent, sends half an answer, or closes without answering; rank 1's
//! connect must fail within its connect deadline, with the typed error the case demands, every
//! time (the Gloo review's 1a: the initiator's backstop).

use super::support::{CASES, CASES_LATE, SLOWEST_CASE_MS};
use crate::model::invalid::Invalid;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use wringer_transport::frame::{Frame, Kind, HEADER_LEN};
use wringer_transport::Error;

use super::{accept_within, connect_within, StepKind};
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

crate::declare_metrics! {
    pub CASES_MISCLASSIFIED = "cases_misclassified", Count, Lower;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerNeverAnswers {
    /// The initiator's connect deadline (its hello backstop is the same).
    pub connect_deadline: HumanDuration,
    /// How many times each case is played.
    #[serde(default = "one")]
    pub rounds: u32,
    /// Cross-host: after reading the hello, rank 0 reports the point `hello-read`, where a
    /// scenario fault cuts its host's link (no FIN, no RST). Only the silent case is played.
    #[serde(default)]
    pub cut_link_after_hello: bool,
    pub deadline: HumanDuration,
}

fn one() -> u32 {
    1
}

/// The most rounds a step may ask for: each one waits out a connect deadline.
const MAX_ROUNDS: u32 = 100;

/// Time a failure may take past the connect deadline (scheduling, not design).
const SLACK: Duration = Duration::from_millis(500);

/// What the adversary does after reading the hello.
#[derive(Clone, Copy, Debug)]
enum Case {
    Silent,
    HalfAnswer,
    Close,
}

const PLAYED: [Case; 3] = [Case::Silent, Case::HalfAnswer, Case::Close];

impl Case {
    /// Whether `e` is the failure this case must produce.
    fn expects(self, e: &Error) -> bool {
        match self {
            // Nothing (or only part of a header) ever arrives: the backstop's timeout.
            Case::Silent | Case::HalfAnswer => {
                matches!(e, Error::Timeout { during, .. } if *during == "handshake")
            }
            Case::Close => matches!(e, Error::Handshake { .. }),
        }
    }
}

/// The point its ranks report, where a scenario's fault may strike.
const HELLO_READ: &str = "hello-read";

impl super::Describe for ListenerNeverAnswers {
    const ABOUT: &'static str =
        "an adversarial listener stays silent, half answers or closes (or its link is cut)";
}

impl StepSpec for ListenerNeverAnswers {
    fn points(&self) -> Vec<String> {
        vec![HELLO_READ.into()]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[CASES, CASES_MISCLASSIFIED, CASES_LATE, SLOWEST_CASE_MS]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        if !(1..=MAX_ROUNDS).contains(&self.rounds) {
            return Err(format!("rounds must be 1..={MAX_ROUNDS}, got {}", self.rounds).into());
        }
        if self.cut_link_after_hello && self.rounds != 1 {
            return Err(
                "with cut_link_after_hello there is one round (a cut link stays cut)".into(),
            );
        }
        let needed = (self.connect_deadline.0 + SLACK) * 3 * self.rounds;
        if needed >= self.deadline.0 {
            return Err(format!(
                "{} rounds of 3 cases need up to {needed:?}; the step deadline is {:?}",
                self.rounds, self.deadline.0
            )
            .into());
        }
        Ok(())
    }
}

impl StepKind for ListenerNeverAnswers {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        if !ctx.in_pair() {
            return Ok(());
        }
        let deadline = self.deadline.0;
        let limit = self.connect_deadline.0;
        let (mut wrong, mut late, mut slowest) = (0u32, 0u32, 0f64);
        let mut n = 0u32;
        let cases: &[Case] = if self.cut_link_after_hello {
            &[Case::Silent]
        } else {
            &PLAYED
        };
        for round in 0..self.rounds {
            for (i, case) in cases.iter().enumerate() {
                let name = format!("case-{round}-{i}");
                if ctx.rank == 0 {
                    let mut s = accept_within(&ctx.raw, deadline)?;
                    read_hello(&mut s, limit + SLACK)?;
                    if self.cut_link_after_hello {
                        // The coordinator's line runs on the control network, which the cut
                        // leaves alone: the release says the link is gone.
                        ctx.control.point_and_wait(step, HELLO_READ, deadline)?;
                    }
                    match case {
                        Case::Silent => {}
                        Case::HalfAnswer => {
                            let ack = Frame::new(Kind::HelloAck, 0, vec![])?.encode();
                            s.write_all(&ack[..HEADER_LEN / 2])?;
                        }
                        Case::Close => s.shutdown(Shutdown::Both)?,
                    }
                    // Hold the connection until the initiator has its outcome.
                    ctx.pair_barrier(step, &name, deadline)?;
                    continue;
                }
                let sequence = super::seq(step, n as u64);
                let started = Instant::now();
                let outcome = connect_within(ctx, ctx.peers[0].raw, sequence, limit);
                let took = started.elapsed();
                n += 1;
                slowest = slowest.max(took.as_secs_f64() * 1e3);
                let ok = match &outcome {
                    Ok(_) => false,
                    Err(e) => case.expects(e),
                };
                wrong += !ok as u32;
                late += (took > limit + SLACK) as u32;
                if !ok || round == 0 {
                    report.notes.push(format!(
                        "{case:?}: {} after {:.1} ms",
                        match &outcome {
                            Ok(_) => "connected (to a listener that never answered)".to_string(),
                            Err(e) => e.to_string(),
                        },
                        took.as_secs_f64() * 1e3
                    ));
                }
                drop(outcome);
                ctx.pair_barrier(step, &name, deadline)?;
            }
        }
        if ctx.rank == 1 {
            let m = &mut report.metrics;
            m.insert(CASES, n as f64);
            m.insert(CASES_MISCLASSIFIED, wrong as f64);
            m.insert(CASES_LATE, late as f64);
            m.insert(SLOWEST_CASE_MS, slowest);
        }
        Ok(())
    }
}

/// Read the initiator's hello frame (header, then the payload it announces).
fn read_hello(s: &mut TcpStream, limit: Duration) -> Result<()> {
    s.set_read_timeout(Some(limit))?;
    let mut header = [0u8; HEADER_LEN];
    s.read_exact(&mut header)?;
    let len = u32::from_be_bytes(header[HEADER_LEN - 4..].try_into()?) as usize;
    if len > 256 {
        bail!("a hello of {len} bytes is not a hello");
    }
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_case_demands_its_own_typed_failure() {
        let timeout = Error::Timeout {
            during: "handshake",
            after: Duration::from_secs(1),
        };
        let closed = Error::Handshake {
            addr: "127.0.0.1:1".parse().unwrap(),
            reason: "peer closed the connection during the handshake".into(),
        };
        assert!(Case::Silent.expects(&timeout));
        assert!(Case::HalfAnswer.expects(&timeout));
        assert!(!Case::Close.expects(&timeout));
        assert!(Case::Close.expects(&closed));
        assert!(!Case::Silent.expects(&closed));
        let connect_timeout = Error::Timeout {
            during: "recv",
            after: Duration::from_secs(1),
        };
        assert!(!Case::Silent.expects(&connect_timeout));
    }

    #[test]
    fn rounds_and_the_step_deadline_are_checked() {
        let step = |rounds, deadline| ListenerNeverAnswers {
            connect_deadline: HumanDuration(Duration::from_secs(1)),
            rounds,
            cut_link_after_hello: false,
            deadline: HumanDuration(Duration::from_secs(deadline)),
        };
        assert!(step(1, 30).check(2).is_ok());
        let mut cut = step(2, 30);
        cut.cut_link_after_hello = true;
        assert!(cut.check(2).unwrap_err().contains("one round"));
        assert!(step(0, 30).check(2).is_err());
        assert!(step(101, 9999).check(2).is_err());
        assert!(step(5, 10).check(2).unwrap_err().contains("need up to"));
    }
}
