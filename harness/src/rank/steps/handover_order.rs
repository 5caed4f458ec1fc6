//! handover-order: frames carry their sequence, and rank 0's reads alternate between a caller waiting in `recv` (the direct path), the receiver thread queueing while nobody receives, a caller that arrives while the receiver holds half a frame (the hand-over), and several callers at once; every frame must arrive exactly once and in order.
//!
//! The hand-over round enters the window on purpose: the peer writes part of a frame, so the
//! receiver thread takes the read side and blocks for the rest; then the rest and the frames
//! behind it arrive in one write while a caller polls `recv` without waiting (from a seeded
//! moment). A caller that looks at the queue before it takes the read side can then read a
//! later frame, buffered behind the queued one, before it. The transport's read counters show
//! that each path, and the hand-over between them, ran.

use crate::model::invalid::Invalid;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use wringer_transport::{Connection, Error};

use super::raw_peer::accept_conn;
use super::scripted_peer::{pair, stop_peer, Driver, Script};
use super::{in_range, Seeded, StepKind};
use crate::hosts::procfs::wait_until;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

crate::declare_metrics! {
    pub FRAMES_DELIVERED = "frames_delivered", Count, Neither;
    pub FRAMES_OUT_OF_ORDER = "frames_out_of_order", Count, Lower;
    pub FRAMES_READ_DIRECTLY = "frames_read_directly", Count, Neither;
    pub FRAMES_FROM_QUEUE = "frames_from_queue", Count, Neither;
    pub READ_HANDOVERS = "read_handovers", Count, Neither;
    pub HANDOVER_ROUNDS = "handover_rounds", Count, Neither;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HandoverOrder {
    /// Rounds, a quarter of each kind (direct, queued, hand-over, several callers), in a
    /// seeded order.
    pub rounds: u32,
    /// Callers receiving at once in the several-callers rounds.
    #[serde(default = "default_callers")]
    pub callers: u32,
    pub deadline: HumanDuration,
}

fn default_callers() -> u32 {
    3
}

const MAX_ROUNDS: u32 = 100_000;
const MAX_CALLERS: u32 = 32;
/// Frames per round.
const MAX_FRAMES_PER_ROUND: u64 = 6;
/// How long one receive, a command or a wait for the receiver's state may take.
const PATIENCE: Duration = Duration::from_secs(5);
/// Violations described in the notes (the count covers them all).
const NOTED: usize = 5;

impl super::Describe for HandoverOrder {
    const ABOUT: &'static str = "frames in order and exactly once across a caller's own reads, the receiver's queue, the hand-over between them and several callers (a scripted raw peer)";
}

crate::reach_points! {
    pub READ_SIDE_HANDED_OVER = "read-side-handed-over",
        "a caller took the read side over from the receiver thread, which had queued frames before it";
}

impl StepSpec for HandoverOrder {
    fn reach_points(&self) -> &'static [crate::model::reach::ReachPoint] {
        &[READ_SIDE_HANDED_OVER]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[
            FRAMES_DELIVERED,
            FRAMES_OUT_OF_ORDER,
            FRAMES_READ_DIRECTLY,
            FRAMES_FROM_QUEUE,
            READ_HANDOVERS,
            HANDOVER_ROUNDS,
        ]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        in_range("rounds", self.rounds, 4, MAX_ROUNDS)?;
        in_range("callers", self.callers, 2, MAX_CALLERS)
    }
}

impl StepKind for HandoverOrder {
    fn run(&self, ctx: &RankContext, _step: usize, report: &mut StepReport) -> Result<()> {
        pair(ctx, self.deadline.0, PATIENCE, |deadline| {
            Reader::new(self, ctx, deadline).run(report)
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// A caller waits in `recv` as each frame arrives.
    Direct,
    /// The frames arrive while nobody receives: the receiver queues them.
    Queued,
    /// A caller comes while the receiver holds half a frame.
    Handover,
    /// Several callers receive at once.
    Callers,
}

/// The rounds: each block of four holds one of each kind, in a seeded order.
fn plan(seed: u64, rounds: u32) -> Vec<(Round, u64)> {
    let mut rng = Seeded::new(seed, 0x4841_4e44);
    let mut out = vec![];
    while out.len() < rounds as usize {
        let mut block = [
            Round::Direct,
            Round::Queued,
            Round::Handover,
            Round::Callers,
        ];
        for i in (1..block.len()).rev() {
            block.swap(i, rng.range(0, i as u64 + 1) as usize);
        }
        for kind in block {
            out.push((kind, rng.range(2, MAX_FRAMES_PER_ROUND + 1)));
        }
    }
    out.truncate(rounds as usize);
    out
}

struct Reader<'a> {
    ctx: &'a RankContext,
    rounds: Vec<(Round, u64)>,
    callers: u32,
    rng: Seeded,
    deadline: Instant,
    /// The next frame due, over the whole step, and frames delivered ahead of it.
    next: usize,
    ahead: BTreeSet<usize>,
    delivered: u64,
    violations: Vec<String>,
    handover_rounds: u64,
}

impl<'a> Reader<'a> {
    fn new(step: &HandoverOrder, ctx: &'a RankContext, deadline: Instant) -> Reader<'a> {
        Reader {
            ctx,
            rounds: plan(ctx.seed, step.rounds),
            callers: step.callers,
            rng: Seeded::new(ctx.seed, 0x4f52_4445),
            deadline,
            next: 0,
            ahead: BTreeSet::new(),
            delivered: 0,
            violations: vec![],
            handover_rounds: 0,
        }
    }

    fn run(mut self, report: &mut StepReport) -> Result<()> {
        let conn = accept_conn(self.ctx, PATIENCE)?;
        let lens: Vec<u64> = {
            let total: u64 = self.rounds.iter().map(|(_, n)| n).sum();
            (0..total).map(|_| self.rng.range(8, 1024)).collect()
        };
        let driver = Driver::new(&conn, Script::new(self.ctx.seed, 0, lens), PATIENCE)?;
        let rounds = std::mem::take(&mut self.rounds);
        for (i, (kind, frames)) in rounds.iter().enumerate() {
            if Instant::now() >= self.deadline {
                bail!(
                    "only {i} of {} rounds fit in the step deadline",
                    rounds.len()
                );
            }
            let first = self.next;
            let last = first + *frames as usize - 1;
            match kind {
                Round::Direct => self.direct(&driver, first, last)?,
                Round::Queued => self.queued(&driver, first, last)?,
                Round::Handover => self.handover(&driver, first, last)?,
                Round::Callers => self.callers(&driver, first, last)?,
            }
            // A violation already said what went wrong; the next round starts after it.
            self.next = last + 1;
            self.ahead.clear();
        }
        let stats = conn.read_stats();
        conn.close()?;
        stop_peer(self.ctx, PATIENCE)?;
        let m = &mut report.metrics;
        m.insert(FRAMES_DELIVERED, self.delivered as f64);
        m.insert(FRAMES_OUT_OF_ORDER, self.violations.len() as f64);
        m.insert(FRAMES_READ_DIRECTLY, stats.frames_read_by_callers as f64);
        m.insert(FRAMES_FROM_QUEUE, stats.frames_dequeued as f64);
        m.insert(READ_HANDOVERS, stats.handovers as f64);
        m.insert(HANDOVER_ROUNDS, self.handover_rounds as f64);
        report.reach_times(READ_SIDE_HANDED_OVER, stats.handovers);
        report.notes.push(format!(
            "{} frames in {} rounds: {} read by a caller itself, {} taken from the receiver's \
             queue, {} hand-overs of the read side, {} rounds with a caller arriving while the \
             receiver held half a frame",
            self.delivered,
            rounds.len(),
            stats.frames_read_by_callers,
            stats.frames_dequeued,
            stats.handovers,
            self.handover_rounds
        ));
        for v in self.violations.iter().take(NOTED) {
            report.notes.push(format!("out of order: {v}"));
        }
        Ok(())
    }

    /// Judge one frame a lone caller received: it must be the next one due.
    fn take(
        &mut self,
        round: &str,
        got: wringer_transport::Result<wringer_transport::frame::Frame>,
        s: &Script,
    ) {
        match got {
            Ok(frame) => {
                self.delivered += 1;
                match s.index_of(&frame) {
                    Some(i) if i == self.next => {
                        self.next += 1;
                        while self.ahead.remove(&self.next) {
                            self.next += 1;
                        }
                    }
                    Some(i) if i < self.next || !self.ahead.insert(i) => self
                        .violations
                        .push(format!("{round} round: frame {i} delivered twice")),
                    Some(i) => self.violations.push(format!(
                        "{round} round: frame {i} returned where frame {} was due",
                        self.next
                    )),
                    None => self.violations.push(format!(
                        "{round} round: frame {} (sequence {}) does not hold the bytes sent",
                        self.next, frame.header.sequence
                    )),
                }
            }
            Err(e) => self.violations.push(format!(
                "{round} round: recv failed where frame {} was due: {e}",
                self.next
            )),
        }
    }

    fn direct(&mut self, d: &Driver, first: usize, last: usize) -> Result<()> {
        for i in first..=last {
            d.write_to(d.script.end(i))?;
            let got = d.conn.recv(PATIENCE);
            self.take("direct", got, &d.script);
        }
        Ok(())
    }

    fn queued(&mut self, d: &Driver, first: usize, last: usize) -> Result<()> {
        let conn = d.conn;
        self.receiver_waits_for_bytes(conn)?;
        let queued = conn.read_stats().frames_queued;
        d.write_to(d.script.end(last))?;
        let all = (last - first + 1) as u64;
        if !wait_until(|| conn.read_stats().frames_queued >= queued + all, PATIENCE) {
            bail!(
                "the receiver did not queue {all} frames within {PATIENCE:?} while nobody received"
            );
        }
        for _ in first..=last {
            let got = conn.recv(PATIENCE);
            self.take("queued", got, &d.script);
        }
        Ok(())
    }

    fn handover(&mut self, d: &Driver, first: usize, last: usize) -> Result<()> {
        let conn = d.conn;
        self.receiver_waits_for_bytes(conn)?;
        // Part of the first frame, cut in its header or its payload.
        let (start, end) = (d.script.start(first), d.script.end(first));
        let cut = start + self.rng.range(1, end - start);
        d.write_to(cut)?;
        // The receiver took the part and blocks for the rest, holding the read side.
        let holds = || conn.read_stats().bytes == cut && conn.receiver_blocked_in_recv();
        if !wait_until(holds, PATIENCE) {
            bail!("the receiver never took part of a frame and blocked for the rest");
        }
        self.handover_rounds += 1;
        d.write_to(d.script.end(last))?;
        // A caller polls from a seeded moment: before the rest arrives, or around the receiver
        // queueing the frame it finished.
        let start_after = Duration::from_micros(self.rng.range(0, 60));
        let begin = Instant::now();
        while begin.elapsed() < start_after {
            std::hint::spin_loop();
        }
        let until = Instant::now() + PATIENCE;
        loop {
            match conn.recv(Duration::ZERO) {
                Err(Error::Timeout { .. }) if Instant::now() < until => continue,
                got => {
                    self.take("hand-over", got, &d.script);
                    break;
                }
            }
        }
        for _ in first + 1..=last {
            let got = conn.recv(PATIENCE);
            self.take("hand-over", got, &d.script);
        }
        Ok(())
    }

    fn callers(&mut self, d: &Driver, first: usize, last: usize) -> Result<()> {
        let conn = d.conn;
        let want = last - first + 1;
        let taken = AtomicUsize::new(0);
        let seen = Mutex::new(Vec::<(usize, Vec<Option<usize>>)>::new());
        // Writes of one to three frames each, from a seeded split.
        let mut cuts = vec![];
        let mut i = first;
        while i <= last {
            i = (i + self.rng.range(1, 4) as usize).min(last + 1);
            cuts.push(d.script.end(i - 1));
        }
        std::thread::scope(|s| -> Result<()> {
            for caller in 0..self.callers as usize {
                let (taken, seen, script) = (&taken, &seen, &d.script);
                s.spawn(move || {
                    let mut mine = vec![];
                    let until = Instant::now() + PATIENCE;
                    while taken.load(Ordering::Acquire) < want && Instant::now() < until {
                        match conn.recv(Duration::from_millis(5)) {
                            Ok(frame) => {
                                taken.fetch_add(1, Ordering::AcqRel);
                                mine.push(script.index_of(&frame));
                            }
                            Err(Error::Timeout { .. }) => {}
                            Err(_) => break,
                        }
                    }
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((caller, mine));
                });
            }
            for cut in &cuts {
                d.write_to(*cut)?;
            }
            Ok(())
        })?;
        let seen = seen.into_inner().unwrap_or_else(|p| p.into_inner());
        let mut all = BTreeSet::new();
        for (caller, frames) in &seen {
            self.delivered += frames.len() as u64;
            let mut before = None;
            for f in frames {
                match f {
                    None => self.violations.push(format!(
                        "several-callers round: caller {caller} got a frame that does not hold the bytes sent"
                    )),
                    Some(i) if before.is_some_and(|b| b >= *i) => self.violations.push(format!(
                        "several-callers round: caller {caller} got frame {i} after frame {}",
                        before.unwrap_or_default()
                    )),
                    Some(i) if !all.insert(*i) => self.violations.push(format!(
                        "several-callers round: frame {i} delivered twice"
                    )),
                    Some(i) => before = Some(*i),
                }
            }
        }
        let expected: BTreeSet<usize> = (first..=last).collect();
        for missing in expected.difference(&all) {
            self.violations.push(format!(
                "several-callers round: frame {missing} never delivered"
            ));
        }
        self.next = last + 1;
        Ok(())
    }

    /// Wait until nobody has received for long enough that the receiver thread is back on the
    /// socket, waiting for bytes (it leaves it to callers for up to 16 ms after they stop).
    fn receiver_waits_for_bytes(&self, conn: &Connection) -> Result<()> {
        if !wait_until(|| conn.receiver_blocked_in_recv(), PATIENCE) {
            bail!("the receiver thread never went back to waiting for bytes once nobody received");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_of_four_rounds_has_one_of_each_kind_in_a_seeded_order() {
        let a = plan(7, 400);
        assert_eq!(a.len(), 400);
        for block in a.chunks(4) {
            let kinds: BTreeSet<String> = block.iter().map(|(k, _)| format!("{k:?}")).collect();
            assert_eq!(kinds.len(), 4, "{block:?}");
        }
        assert!(a
            .iter()
            .all(|(_, n)| (2..=MAX_FRAMES_PER_ROUND).contains(n)));
        assert_eq!(a, plan(7, 400), "the same seed makes the same plan");
        assert_ne!(a, plan(8, 400), "another seed another order");
    }
}
