//! caller-sees-end: the peer resets, truncates a frame or sends garbage while callers of `recv` are the ones reading (the receiver thread parked aside); every caller, and `send` and `flush` right after, must report that same end, classified right, within a bound.
//!
//! One caller, then several, per kind of end. A caller that reads the end must publish it: a
//! caller that only returns it leaves `send` and `flush` writing into a dead stream, and a
//! reset, which can be read only once, is read later as a clean close. The transport's read
//! counters show who found the end; a case the receiver thread found is counted apart, since it
//! did not test a caller.

use super::support::{CASES, CASES_LATE, SLOWEST_CASE_MS};
use crate::model::invalid::Invalid;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use wringer_transport::{Error, Reader, Terminal};

use super::raw_peer::accept_conn;
use super::scripted_peer::{ignored_payload, pair, stop_peer, Driver, End, Script};
use super::{in_range, StepKind};
use crate::hosts::procfs::wait_until;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

crate::declare_metrics! {
    pub ENDS_MISREPORTED = "ends_misreported", Count, Lower;
    pub ENDS_FOUND_BY_RECEIVER = "ends_found_by_receiver", Count, Lower;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CallerSeesEnd {
    /// Rounds; each plays every kind of end, to one caller and to `callers` at once.
    pub rounds: u32,
    #[serde(default = "default_callers")]
    pub callers: u32,
    /// How long after the first report of the end every other caller may take to report it.
    pub bound: HumanDuration,
    pub deadline: HumanDuration,
}

fn default_callers() -> u32 {
    3
}

const MAX_ROUNDS: u32 = 10_000;
const MAX_CALLERS: u32 = 32;
/// Frames each caller-set receives before the end.
const FRAMES_BEFORE: u64 = 4;
/// Each caller's `recv` deadline: short, so callers stay in `recv` back to back.
const SLICE: Duration = Duration::from_millis(20);
const PATIENCE: Duration = Duration::from_secs(5);
const NOTED: usize = 6;

impl super::Describe for CallerSeesEnd {
    const ABOUT: &'static str =
        "a reset, truncation or garbage read by a caller reaches every caller, `send` and `flush`";
}

crate::reach_points! {
    pub END_READ_BY_A_CALLER = "end-read-by-a-caller",
        "a caller, not the receiver thread, read the connection's end (reset, truncation or garbage)";
}

impl StepSpec for CallerSeesEnd {
    fn reach_points(&self) -> &'static [crate::model::reach::ReachPoint] {
        &[END_READ_BY_A_CALLER]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[
            CASES,
            ENDS_MISREPORTED,
            CASES_LATE,
            SLOWEST_CASE_MS,
            ENDS_FOUND_BY_RECEIVER,
        ]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        in_range("rounds", self.rounds, 1, MAX_ROUNDS)?;
        in_range("callers", self.callers, 2, MAX_CALLERS)
    }
}

impl StepKind for CallerSeesEnd {
    fn run(&self, ctx: &RankContext, _step: usize, report: &mut StepReport) -> Result<()> {
        pair(ctx, self.deadline.0, PATIENCE, |deadline| {
            self.read(ctx, deadline, report)
        })
    }
}

/// What one caller saw: the end as `recv` reported it (and when), then `send` and `flush`.
struct Seen {
    recv: Option<(Error, Instant)>,
    send: Option<wringer_transport::Result<()>>,
    flush: Option<wringer_transport::Result<()>>,
}

/// How one case went.
#[derive(Default)]
struct Verdict {
    misreported: Vec<String>,
    late: bool,
    spread_ms: f64,
    found_by_receiver: bool,
}

impl CallerSeesEnd {
    fn read(&self, ctx: &RankContext, deadline: Instant, report: &mut StepReport) -> Result<()> {
        let (mut cases, mut misreported, mut late, mut by_receiver) = (0u64, 0u64, 0u64, 0u64);
        let mut slowest = 0f64;
        let mut tag = 0u64;
        for _ in 0..self.rounds {
            for end in End::ALL {
                for callers in [1, self.callers] {
                    if Instant::now() >= deadline {
                        bail!("only {cases} cases fit in the step deadline");
                    }
                    tag += 1;
                    let v = self.case(ctx, end, callers as usize, tag)?;
                    cases += 1;
                    if !v.misreported.is_empty() {
                        misreported += 1;
                    }
                    late += v.late as u64;
                    by_receiver += v.found_by_receiver as u64;
                    if !v.found_by_receiver {
                        report.reach(END_READ_BY_A_CALLER);
                    }
                    slowest = slowest.max(v.spread_ms);
                    let noted = report.notes.len();
                    if noted < NOTED {
                        for m in &v.misreported {
                            report
                                .notes
                                .push(format!("{} to {callers} caller(s): {m}", end.name()));
                        }
                    }
                }
            }
        }
        stop_peer(ctx, PATIENCE)?;
        let m = &mut report.metrics;
        m.insert(CASES, cases as f64);
        m.insert(ENDS_MISREPORTED, misreported as f64);
        m.insert(CASES_LATE, late as f64);
        m.insert(SLOWEST_CASE_MS, slowest);
        m.insert(ENDS_FOUND_BY_RECEIVER, by_receiver as f64);
        report.notes.push(format!(
            "{cases} ends (reset, truncation, garbage; to one caller and to {}), read by a \
             caller in {} of them; {misreported} misreported; the last caller reported its end \
             at most {slowest:.1} ms after the first",
            self.callers,
            cases - by_receiver
        ));
        Ok(())
    }

    fn case(&self, ctx: &RankContext, end: End, callers: usize, tag: u64) -> Result<Verdict> {
        let conn = accept_conn(ctx, PATIENCE)?;
        let lens = vec![32; FRAMES_BEFORE as usize];
        let d = Driver::new(&conn, Script::new(ctx.seed, tag << 8, lens), PATIENCE)?;
        let seen = Mutex::new(Vec::<Seen>::new());
        std::thread::scope(|s| -> Result<()> {
            for _ in 0..callers {
                s.spawn(|| {
                    let saw = receive_until_end(&conn);
                    seen.lock().unwrap_or_else(|p| p.into_inner()).push(saw);
                });
            }
            // The frames arrive with the callers in recv: the receiver thread steps aside.
            d.write_to(d.script.end(d.script.frames() - 1))?;
            let delivered = || {
                let st = conn.read_stats();
                st.frames_read_by_callers + st.frames_dequeued >= FRAMES_BEFORE
            };
            if !wait_until(delivered, PATIENCE) {
                bail!("the callers did not receive the {FRAMES_BEFORE} frames before the end");
            }
            d.end(end)?;
            Ok(())
        })?;
        let seen = seen.into_inner().unwrap_or_else(|p| p.into_inner());
        let v = judge(
            end,
            &seen,
            conn.terminal(),
            conn.read_stats().ended_by,
            self.bound.0,
        );
        conn.close()?;
        Ok(v)
    }
}

/// One caller: receive until `recv` reports an end, then try `send` and `flush` at once.
fn receive_until_end(conn: &wringer_transport::Connection) -> Seen {
    let until = Instant::now() + PATIENCE;
    while Instant::now() < until {
        match conn.recv(SLICE) {
            Ok(_) | Err(Error::Timeout { .. }) => {}
            Err(e) => {
                let at = Instant::now();
                let send = conn.send(&ignored_payload(), SLICE);
                let flush = conn.flush(SLICE);
                return Seen {
                    recv: Some((e, at)),
                    send: Some(send),
                    flush: Some(flush),
                };
            }
        }
    }
    Seen {
        recv: None,
        send: None,
        flush: None,
    }
}

fn judge(
    end: End,
    seen: &[Seen],
    terminal: Option<&Terminal>,
    ended_by: Option<Reader>,
    bound: Duration,
) -> Verdict {
    let mut v = Verdict {
        found_by_receiver: ended_by != Some(Reader::Caller),
        ..Verdict::default()
    };
    let report = |what: &str, got: &Option<wringer_transport::Result<()>>| -> Option<String> {
        match got {
            Some(Err(e)) if end.is_reported_by(e) => None,
            Some(Err(e)) => Some(format!("{what} reported `{e}`")),
            Some(Ok(())) => Some(format!("{what} succeeded after the end")),
            None => None,
        }
    };
    let times: Vec<Instant> = seen
        .iter()
        .filter_map(|s| s.recv.as_ref().map(|r| r.1))
        .collect();
    for (i, s) in seen.iter().enumerate() {
        match &s.recv {
            None => v.misreported.push(format!(
                "caller {i}'s recv never reported the end within {PATIENCE:?}"
            )),
            Some((e, _)) if !end.is_reported_by(e) => v
                .misreported
                .push(format!("caller {i}'s recv reported `{e}`")),
            Some(_) => {}
        }
        v.misreported
            .extend(report(&format!("caller {i}'s send"), &s.send));
        v.misreported
            .extend(report(&format!("caller {i}'s flush"), &s.flush));
    }
    match terminal {
        Some(Terminal::Failed(r)) if end.is_reported_by(&Error::Receiver(r.clone())) => {}
        other => v
            .misreported
            .push(format!("the connection's published end is {other:?}")),
    }
    if let (Some(first), Some(last)) = (times.iter().min(), times.iter().max()) {
        let spread = *last - *first;
        v.spread_ms = spread.as_secs_f64() * 1e3;
        v.late = spread > bound;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use wringer_transport::ReceiverError;

    fn reset() -> ReceiverError {
        ReceiverError::Io {
            kind: std::io::ErrorKind::ConnectionReset,
            errno: Some(104),
            message: "reset".into(),
        }
    }

    fn saw(at: Instant, send: wringer_transport::Result<()>) -> Seen {
        Seen {
            recv: Some((Error::Receiver(reset()), at)),
            send: Some(send),
            flush: Some(Err(Error::Receiver(reset()))),
        }
    }

    #[test]
    fn an_end_reported_alike_by_every_reader_in_time_passes() {
        let t = Instant::now();
        let seen = [
            saw(t, Err(Error::Receiver(reset()))),
            saw(t + Duration::from_millis(5), Err(Error::Receiver(reset()))),
        ];
        let v = judge(
            End::Reset,
            &seen,
            Some(&Terminal::Failed(reset())),
            Some(Reader::Caller),
            Duration::from_millis(100),
        );
        assert!(v.misreported.is_empty(), "{:?}", v.misreported);
        assert!(!v.late && !v.found_by_receiver);
        assert!((v.spread_ms - 5.0).abs() < 0.5);
    }

    #[test]
    fn a_send_that_succeeds_a_clean_close_or_a_late_caller_is_caught() {
        let t = Instant::now();
        let seen = [
            saw(t, Ok(())),
            saw(
                t + Duration::from_millis(300),
                Err(Error::Receiver(reset())),
            ),
        ];
        let v = judge(
            End::Reset,
            &seen,
            Some(&Terminal::PeerClosed),
            Some(Reader::Receiver),
            Duration::from_millis(100),
        );
        assert_eq!(v.misreported.len(), 2, "{:?}", v.misreported);
        assert!(v.misreported[0].contains("send succeeded after the end"));
        assert!(v.misreported[1].contains("published end is Some(PeerClosed)"));
        assert!(v.late && v.found_by_receiver);
        let none = [Seen {
            recv: None,
            send: None,
            flush: None,
        }];
        let v = judge(End::Garbage, &none, None, None, Duration::from_millis(100));
        assert!(
            v.misreported[0].contains("never reported the end"),
            "{:?}",
            v.misreported
        );
    }
}
