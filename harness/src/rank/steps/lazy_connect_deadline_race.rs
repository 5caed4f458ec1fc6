//! lazy-connect-deadline-race: rank 1 connects to rank 0's lazy-connect wait around the wait's
//! deadline (swept across it with seeded jitter, and aimed where the outcomes flip), hundreds
//! of times. For every attempt both sides must agree: both have the connection, or neither
//! does and the initiator was refused or closed, never left in silence. The coordinator checks
//! that from both ranks' per-attempt outcomes (the Gloo review's 2f: a late timer that fires
//! after success loses the connection while the initiator believes it is connected).

use crate::model::invalid::Invalid;
use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use wringer_transport::Error;

use super::{connect_within, seq, Reconciled, StepKind, StruckFault};
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

crate::declare_metrics! {
    pub ATTEMPTS = "attempts", Count, Neither;
    pub BOTH_CONNECTED = "both_connected", Count, Neither;
    pub NEITHER_CONNECTED = "neither_connected", Count, Neither;
    pub DISAGREEMENTS = "disagreements", Count, Lower;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LazyConnectDeadlineRace {
    pub attempts: u32,
    /// The listener's wait for each attempt.
    pub wait_timeout: HumanDuration,
    /// Connects land within this much of the wait's deadline, either side.
    pub spread: HumanDuration,
    pub deadline: HumanDuration,
}

const MAX_ATTEMPTS: u32 = 5000;

/// How long the initiator's connect and the first frame may take once the race is decided:
/// generous, so a slow machine is never mistaken for silence.
const PROOF_LIMIT: Duration = Duration::from_secs(20);

/// What one side saw of one attempt: this kind's outcome, sent to the coordinator as data.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
enum Seen {
    /// The connection arrived (the listener) or was accepted (the initiator), and a frame
    /// crossed it.
    Connected,
    /// The listener's wait ran out first.
    TimedOut,
    /// The listener refused the initiator's connect.
    Refused,
    /// The initiator's connection was closed under it.
    Closed { error: String },
    /// Neither refused nor closed: the side was left without an answer.
    Silent { error: String },
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Seen::Connected => f.write_str("connected"),
            Seen::TimedOut => f.write_str("timed-out"),
            Seen::Refused => f.write_str("refused"),
            Seen::Closed { error } => write!(f, "closed: {error}"),
            Seen::Silent { error } => write!(f, "silent: {error}"),
        }
    }
}

impl super::Describe for LazyConnectDeadlineRace {
    const ABOUT: &'static str =
        "hundreds of connects across the wait's deadline; both sides must agree on each";
}

crate::reach_points! {
    pub CONNECTED_IN_LAST_MS = "connected-in-last-ms",
        "a connection reached the listener's wait within 1 ms of its deadline";
}

impl StepSpec for LazyConnectDeadlineRace {
    fn reach_points(&self) -> &'static [crate::model::reach::ReachPoint] {
        &[CONNECTED_IN_LAST_MS]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[ATTEMPTS, BOTH_CONNECTED, NEITHER_CONNECTED, DISAGREEMENTS]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        if !(1..=MAX_ATTEMPTS).contains(&self.attempts) {
            return Err(
                format!("attempts must be 1..={MAX_ATTEMPTS}, got {}", self.attempts).into(),
            );
        }
        if self.spread.0 >= self.wait_timeout.0 {
            return Err(
                "spread must be shorter than wait_timeout (connects land around the deadline)"
                    .into(),
            );
        }
        let needed = (self.wait_timeout.0 * 2 + Duration::from_millis(5)) * self.attempts;
        if needed >= self.deadline.0 {
            return Err(format!(
                "{} attempts need up to {needed:?}; the step deadline is {:?}",
                self.attempts, self.deadline.0
            )
            .into());
        }
        Ok(())
    }
}

impl StepKind for LazyConnectDeadlineRace {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        if !ctx.in_pair() {
            return Ok(());
        }
        let (wait, spread, deadline) = (self.wait_timeout.0, self.spread.0, self.deadline.0);
        let mut rng = ctx.seed ^ (step as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut aim = Aim::new(spread);
        for i in 0..self.attempts {
            ctx.pair_barrier(step, &format!("attempt-{i}"), deadline)?;
            let sequence = seq(step, i as u64);
            let outcome = if ctx.rank == 0 {
                let waited = std::time::Instant::now();
                let got = ctx.listener.wait_for(sequence, wait);
                if got.is_ok() && waited.elapsed() + Duration::from_millis(1) >= wait {
                    report.reach(CONNECTED_IN_LAST_MS);
                }
                match got {
                    // The initiator proves the connection works from its side too.
                    Ok(conn) => match conn.recv(PROOF_LIMIT) {
                        Ok(_) => Seen::Connected,
                        Err(e) => Seen::Silent {
                            error: e.to_string(),
                        },
                    },
                    Err(Error::Timeout { .. }) => Seen::TimedOut,
                    Err(e) => return Err(e.into()),
                }
            } else {
                let at = aim.next_offset(i, &mut rng) + wait.as_micros() as i64;
                std::thread::sleep(Duration::from_micros(at.max(0) as u64));
                let seen = initiate(ctx, sequence, PROOF_LIMIT);
                aim.learn(i, &seen);
                seen
            };
            report.outcome(&outcome)?;
        }
        // The listener must outlive the last attempt: without this, rank 0 could finish (and
        // close its listener) while rank 1's last connect is still on its way, which reads as
        // a refusal the transport never made.
        ctx.pair_barrier(step, "attempts-done", deadline)?;
        Ok(())
    }

    fn reconcile(&self, reports: &[(u32, &StepReport)], _: &[StruckFault]) -> Reconciled {
        let side = |rank: u32| {
            reports
                .iter()
                .find(|(r, _)| *r == rank)
                .map(|(_, s)| s.outcomes::<Seen>())
        };
        let (listener, initiator) = match (side(0), side(1)) {
            (Some(Ok(l)), Some(Ok(i))) => (l, i),
            (Some(Err(e)), _) | (_, Some(Err(e))) => {
                return Reconciled {
                    failures: vec![e.0],
                    ..Reconciled::default()
                }
            }
            // A side without evidence is judged as missing evidence by the verdict.
            _ => return Reconciled::default(),
        };
        let attempts = listener.len().max(initiator.len());
        let (mut both, mut neither, mut disagree) = (0, 0, 0);
        let mut notes = vec![];
        for i in 0..attempts {
            match (listener.get(i), initiator.get(i)) {
                (Some(Seen::Connected), Some(Seen::Connected)) => both += 1,
                (Some(Seen::TimedOut), Some(Seen::Refused | Seen::Closed { .. })) => neither += 1,
                _ => {
                    disagree += 1;
                    if notes.len() < 10 {
                        let full = |o: Option<&Seen>| o.map_or("nothing".into(), |s| s.to_string());
                        notes.push(format!(
                            "attempt {i}: the listener saw {}, the initiator {}",
                            full(listener.get(i)),
                            full(initiator.get(i))
                        ));
                    }
                }
            }
        }
        let metrics = vec![
            (ATTEMPTS, attempts as f64),
            (BOTH_CONNECTED, both as f64),
            (NEITHER_CONNECTED, neither as f64),
            (DISAGREEMENTS, disagree as f64),
        ];
        Reconciled {
            metrics,
            notes,
            failures: vec![],
        }
    }
}

/// Where rank 1's connects land, in µs from the listener's deadline. Every fourth attempt
/// sweeps the whole spread, so both outcomes occur wherever the deadline falls in it. The rest
/// aim at the point where this machine's outcomes flip (the deadline as the listener sees it,
/// after the accept and the hello), found by a staircase: one nudge later after a connect that
/// succeeded, one earlier after one that did not. A uniform sweep of milliseconds lands in a
/// narrow race window a few times in hundreds; the aimed connects, tens of times.
struct Aim {
    spread: i64,
    nudge: i64,
    at: i64,
}

impl Aim {
    fn new(spread: Duration) -> Aim {
        let spread = spread.as_micros() as i64;
        Aim {
            spread,
            nudge: (spread / 20).max(1),
            at: 0,
        }
    }

    /// Whether `attempt` is one of the sweep's (the others are aimed, and teach the aim).
    fn sweeps(attempt: u32) -> bool {
        attempt % 4 == 0
    }

    fn next_offset(&self, attempt: u32, rng: &mut u64) -> i64 {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        let within = |half: i64| (*rng % (2 * half as u64 + 1)) as i64 - half;
        if Aim::sweeps(attempt) {
            within(self.spread)
        } else {
            (self.at + within(self.nudge)).clamp(-self.spread, self.spread)
        }
    }

    fn learn(&mut self, attempt: u32, seen: &Seen) {
        if !Aim::sweeps(attempt) {
            let later = if *seen == Seen::Connected { 1 } else { -1 };
            self.at = (self.at + later * self.nudge).clamp(-self.spread, self.spread);
        }
    }
}

/// Rank 1's side of one attempt: connect, and prove the connection with one frame.
fn initiate(ctx: &RankContext, sequence: u64, limit: Duration) -> Seen {
    match connect_within(ctx, ctx.peers[0].transport, sequence, limit) {
        Ok(conn) => match conn.send(b"attempt", limit) {
            Ok(()) => Seen::Connected,
            Err(e) => Seen::Closed {
                error: e.to_string(),
            },
        },
        Err(Error::Rejected(_)) => Seen::Refused,
        Err(e @ (Error::Handshake { .. } | Error::PeerClosed)) => Seen::Closed {
            error: e.to_string(),
        },
        Err(e) => Seen::Silent {
            error: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(outcomes: &[Seen]) -> StepReport {
        let mut r = StepReport::default();
        for o in outcomes {
            r.outcome(o).unwrap();
        }
        r
    }

    fn silent() -> Seen {
        Seen::Silent {
            error: "timed out".into(),
        }
    }

    fn step() -> LazyConnectDeadlineRace {
        LazyConnectDeadlineRace {
            attempts: 4,
            wait_timeout: HumanDuration(Duration::from_millis(20)),
            spread: HumanDuration(Duration::from_millis(10)),
            deadline: HumanDuration(Duration::from_secs(30)),
        }
    }

    #[test]
    fn both_sides_must_tell_the_same_story_for_every_attempt() {
        use Seen::*;
        let listener = report(&[Connected, TimedOut, TimedOut, TimedOut]);
        let initiator = report(&[Connected, Refused, Connected, silent()]);
        let Reconciled {
            metrics: m, notes, ..
        } = step().reconcile(&[(0, &listener), (1, &initiator)], &[]);
        assert_eq!(notes.len(), 2);
        assert!(
            notes[0].starts_with("attempt 2: the listener saw timed-out, the initiator connected")
        );
        assert_eq!(
            m,
            vec![
                (ATTEMPTS, 4.0),
                (BOTH_CONNECTED, 1.0),
                (NEITHER_CONNECTED, 1.0),
                (DISAGREEMENTS, 2.0),
            ]
        );
    }

    #[test]
    fn the_aimed_connects_follow_the_flip_point_and_the_sweep_covers_the_spread() {
        let mut aim = Aim::new(Duration::from_millis(10));
        let mut rng = 0x2545_f491_4f6c_dd1d;
        // Connects that land before -3 ms succeed here: the aim settles there.
        let mut swept = (i64::MAX, i64::MIN);
        for i in 0..400 {
            let offset = aim.next_offset(i, &mut rng);
            assert!((-10_000..=10_000).contains(&offset), "{offset}");
            if Aim::sweeps(i) {
                swept = (swept.0.min(offset), swept.1.max(offset));
            }
            let seen = if offset < -3_000 {
                Seen::Connected
            } else {
                Seen::Refused
            };
            aim.learn(i, &seen);
        }
        assert!((-4_000..=-2_000).contains(&aim.at), "{}", aim.at);
        assert!(swept.0 < -9_000 && swept.1 > 9_000, "{swept:?}");
    }

    #[test]
    fn a_missing_side_yields_no_verdict_metrics() {
        let listener = report(&[Seen::Connected]);
        assert!(step().reconcile(&[(0, &listener)], &[]).metrics.is_empty());
    }

    #[test]
    fn an_outcome_that_does_not_parse_is_a_failure_not_a_dropped_attempt() {
        let listener = report(&[Seen::Connected]);
        let mut initiator = report(&[Seen::Connected]);
        initiator
            .outcomes
            .push(serde_json::json!({"outcome": "teleported"}));
        let r = step().reconcile(&[(0, &listener), (1, &initiator)], &[]);
        assert!(r.metrics.is_empty());
        assert_eq!(r.failures.len(), 1, "{r:?}");
        assert!(r.failures[0].contains("outcome 1"), "{:?}", r.failures);
    }

    #[test]
    fn attempts_spread_and_deadline_are_checked() {
        assert!(step().check(2).is_ok());
        let mut s = step();
        s.spread = HumanDuration(Duration::from_millis(20));
        assert!(s.check(2).is_err());
        s = step();
        s.attempts = 5001;
        assert!(s.check(2).is_err());
        s = step();
        s.attempts = 2000;
        assert!(s.check(2).unwrap_err().contains("need up to"));
    }
}
