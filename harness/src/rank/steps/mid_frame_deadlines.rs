//! mid-frame-deadlines: a raw peer dribbles each frame in pieces, cut at seeded offsets in its header and its payload, and rank 0's `recv` deadline expires at every cut; the next `recv` must return the same frame, whole, every byte checked.
//!
//! Rank 0 paces the peer (see `scripted_peer`) and keeps receiving between pieces, so the
//! receiver thread stays aside and the caller is the one holding the part it read. A timeout
//! counts at a cut only once the transport has read exactly the bytes up to it: the deadline
//! then expired inside the frame, not before it.

use super::support::FRAMES_INTACT;
use crate::model::invalid::Invalid;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use wringer_transport::frame::HEADER_LEN;
use wringer_transport::Error;

use super::raw_peer::accept_conn;
use super::scripted_peer::{pair, stop_peer, Driver, Script};
use super::{in_range, Seeded, StepKind};
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

crate::declare_metrics! {
    pub FRAMES_LOST_AFTER_TIMEOUT = "frames_lost_after_timeout", Count, Lower;
    pub MID_HEADER_TIMEOUTS = "mid_header_timeouts", Count, Neither;
    pub MID_PAYLOAD_TIMEOUTS = "mid_payload_timeouts", Count, Neither;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MidFrameDeadlines {
    pub frames: u32,
    /// Cuts inside each frame's header, and inside its payload.
    pub header_cuts: u32,
    pub payload_cuts: u32,
    /// Every this many frames, a payload larger than the 8 KiB read buffer (the path that
    /// reads a payload straight into its frame); 0 for none.
    #[serde(default)]
    pub large_every: u32,
    /// The deadline each `recv` is given, which expires at the cuts.
    pub recv_timeout: HumanDuration,
    pub deadline: HumanDuration,
}

const MAX_FRAMES: u32 = 100_000;
/// At most one cut per header byte but the first.
const MAX_HEADER_CUTS: u32 = HEADER_LEN as u32 - 1;
const MAX_PAYLOAD_CUTS: u32 = 64;
const SMALL: (u64, u64) = (64, 4096);
const LARGE: (u64, u64) = (9 << 10, 256 << 10);
/// How long a command, or the wait for the bytes up to a cut, may take.
const PATIENCE: Duration = Duration::from_secs(5);

impl super::Describe for MidFrameDeadlines {
    const ABOUT: &'static str = "`recv` deadlines expiring at seeded cuts inside headers and payloads; each frame then whole";
}

crate::reach_points! {
    pub TIMEOUT_MID_HEADER = "timeout-mid-header",
        "a recv deadline expired with part of a frame's header read";
    pub TIMEOUT_MID_PAYLOAD = "timeout-mid-payload",
        "a recv deadline expired with part of a frame's payload read";
}

impl StepSpec for MidFrameDeadlines {
    fn reach_points(&self) -> &'static [crate::model::reach::ReachPoint] {
        &[TIMEOUT_MID_HEADER, TIMEOUT_MID_PAYLOAD]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[
            FRAMES_INTACT,
            FRAMES_LOST_AFTER_TIMEOUT,
            MID_HEADER_TIMEOUTS,
            MID_PAYLOAD_TIMEOUTS,
        ]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        in_range("frames", self.frames, 1, MAX_FRAMES)?;
        in_range("header_cuts", self.header_cuts, 0, MAX_HEADER_CUTS)?;
        in_range("payload_cuts", self.payload_cuts, 0, MAX_PAYLOAD_CUTS)?;
        if self.recv_timeout.0.is_zero() || self.recv_timeout.0 > PATIENCE {
            return Err(format!("recv_timeout must be above 0 and at most {PATIENCE:?}").into());
        }
        Ok(())
    }
}

impl StepKind for MidFrameDeadlines {
    fn run(&self, ctx: &RankContext, _step: usize, report: &mut StepReport) -> Result<()> {
        pair(ctx, self.deadline.0, PATIENCE, |deadline| {
            self.read(ctx, deadline, report)
        })
    }
}

/// Where a cut falls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Within {
    Header,
    Payload,
}

impl MidFrameDeadlines {
    /// Payload lengths, seeded: small ones through the buffered path, and every
    /// `large_every`-th one past the read buffer.
    fn lens(&self, rng: &mut Seeded) -> Vec<u64> {
        (1..=self.frames as u64)
            .map(|i| {
                let (lo, hi) = if self.large_every > 0 && i % self.large_every as u64 == 0 {
                    LARGE
                } else {
                    SMALL
                };
                rng.range(lo, hi)
            })
            .collect()
    }

    /// The cuts of frame `i`, in stream order: distinct seeded offsets inside its header (never
    /// at its first byte) and inside its payload.
    fn cuts(&self, s: &Script, i: usize, rng: &mut Seeded) -> Vec<(u64, Within)> {
        let start = s.start(i);
        let header = start + 1..start + HEADER_LEN as u64;
        let payload = start + HEADER_LEN as u64 + 1..s.end(i);
        let mut cuts = std::collections::BTreeMap::new();
        for (range, n, within) in [
            (header, self.header_cuts, Within::Header),
            (payload, self.payload_cuts, Within::Payload),
        ] {
            let n = (n as u64).min(range.end.saturating_sub(range.start));
            while (cuts.values().filter(|w| **w == within).count() as u64) < n {
                cuts.insert(rng.range(range.start, range.end), within);
            }
        }
        cuts.into_iter().collect()
    }

    fn read(&self, ctx: &RankContext, deadline: Instant, report: &mut StepReport) -> Result<()> {
        let mut rng = Seeded::new(ctx.seed, 0x4d49_4446);
        let conn = accept_conn(ctx, PATIENCE)?;
        let lens = self.lens(&mut rng);
        let d = Driver::new(&conn, Script::new(ctx.seed, 0, lens), PATIENCE)?;
        let timeout = self.recv_timeout.0;
        let (mut intact, mut lost) = (0u64, 0u64);
        let (mut in_header, mut in_payload) = (0u64, 0u64);
        'frames: for i in 0..d.script.frames() {
            if Instant::now() >= deadline {
                bail!(
                    "only {i} of {} frames fit in the step deadline",
                    self.frames
                );
            }
            for (cut, within) in self.cuts(&d.script, i, &mut rng) {
                d.write_to(cut)?;
                let at = cut - d.script.start(i);
                let until = Instant::now() + PATIENCE;
                // Receive until a deadline expires with the bytes up to the cut read.
                loop {
                    match conn.recv(timeout) {
                        Err(Error::Timeout { .. }) if conn.read_stats().bytes == cut => break,
                        Err(Error::Timeout { .. }) if Instant::now() < until => {}
                        Err(Error::Timeout { .. }) => bail!(
                            "frame {i}: the {at} bytes up to the cut never arrived within {PATIENCE:?}"
                        ),
                        other => {
                            lost += 1;
                            report.notes.push(format!(
                                "frame {i}, {at} bytes in ({within:?}): a recv returned {} \
                                 instead of timing out, after an earlier recv timed out inside \
                                 this frame",
                                outcome(&other)
                            ));
                            break 'frames;
                        }
                    }
                }
                match within {
                    Within::Header => in_header += 1,
                    Within::Payload => in_payload += 1,
                }
            }
            d.write_to(d.script.end(i))?;
            let got = conn.recv(PATIENCE);
            match &got {
                Ok(frame) if d.script.is_frame(i, frame) => intact += 1,
                _ => {
                    lost += 1;
                    report.notes.push(format!(
                        "frame {i}: after its recv deadlines expired inside it, the next recv \
                         returned {} instead of the frame whole",
                        outcome(&got)
                    ));
                    break;
                }
            }
        }
        conn.close()?;
        stop_peer(ctx, PATIENCE)?;
        report.reach_times(TIMEOUT_MID_HEADER, in_header);
        report.reach_times(TIMEOUT_MID_PAYLOAD, in_payload);
        let m = &mut report.metrics;
        m.insert(FRAMES_INTACT, intact as f64);
        m.insert(FRAMES_LOST_AFTER_TIMEOUT, lost as f64);
        m.insert(MID_HEADER_TIMEOUTS, in_header as f64);
        m.insert(MID_PAYLOAD_TIMEOUTS, in_payload as f64);
        let stats = conn.read_stats();
        report.notes.push(format!(
            "{intact} frames whole after {in_header} deadlines inside a header and {in_payload} \
             inside a payload; the caller made {} reads, the receiver thread {}",
            stats.reads_by_callers, stats.reads_by_receiver
        ));
        Ok(())
    }
}

/// What a `recv` returned, in words.
fn outcome(got: &wringer_transport::Result<wringer_transport::frame::Frame>) -> String {
    match got {
        Ok(f) => format!(
            "a frame with sequence {} and {} payload bytes",
            f.header.sequence,
            f.payload.len()
        ),
        Err(e) => format!("`{e}`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step() -> MidFrameDeadlines {
        MidFrameDeadlines {
            frames: 12,
            header_cuts: 3,
            payload_cuts: 2,
            large_every: 4,
            recv_timeout: HumanDuration(Duration::from_millis(5)),
            deadline: HumanDuration(Duration::from_secs(10)),
        }
    }

    #[test]
    fn cuts_fall_inside_the_header_and_the_payload_never_at_a_boundary() {
        let s = step();
        let mut rng = Seeded::new(3, 0);
        let script = Script::new(3, 0, s.lens(&mut rng));
        for i in 0..script.frames() {
            let cuts = s.cuts(&script, i, &mut rng);
            let (start, end) = (script.start(i), script.end(i));
            let header: Vec<_> = cuts.iter().filter(|c| c.1 == Within::Header).collect();
            assert_eq!(header.len(), 3);
            assert_eq!(cuts.len(), 5);
            for (cut, within) in &cuts {
                assert!(*cut > start && *cut < end, "{cut} outside {start}..{end}");
                let header_end = start + HEADER_LEN as u64;
                match within {
                    Within::Header => assert!(*cut < header_end),
                    Within::Payload => assert!(*cut > header_end),
                }
            }
            assert!(cuts.windows(2).all(|w| w[0].0 < w[1].0), "in stream order");
        }
    }

    #[test]
    fn every_large_every_th_payload_takes_the_direct_path() {
        let s = step();
        let lens = s.lens(&mut Seeded::new(1, 0));
        for (i, len) in lens.iter().enumerate() {
            let large = (i + 1) % 4 == 0;
            assert_eq!(*len >= 8 << 10, large, "frame {i}: {len} bytes");
        }
    }
}
