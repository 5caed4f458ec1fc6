//! exact-reads: rank 1 (an adversarial raw peer) dribbles frames byte by byte and splits one at every offset; rank 0 must read every frame whole.

use super::support::FRAMES_INTACT;
use crate::model::invalid::Invalid;
use std::io::Write;
use std::net::Shutdown;
use std::time::Duration;

use anyhow::Result;
use wringer_transport::frame::HEADER_LEN;

use super::{pattern, raw_connect};
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::raw_peer::*;
use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

crate::declare_metrics! {
    pub FRAMES_CORRUPT = "frames_corrupt", Count, Lower;
    pub FRAMES_MISSING = "frames_missing", Count, Lower;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExactReads {
    pub dribbled_frames: u32,
    /// A small frame split at every offset (the buffered read path).
    pub split_payload_bytes: u32,
    /// Large payloads (the path that reads straight into the frame), each split at every
    /// header offset, at the payload's first and last bytes, and at `random_splits` seeded
    /// offsets.
    #[serde(default)]
    pub large_sizes: Vec<u32>,
    #[serde(default)]
    pub random_splits: u32,
    pub deadline: HumanDuration,
}

/// Largest payload, as the transport accepts.
const MAX_SIZE: u32 = wringer_transport::frame::DEFAULT_MAX_PAYLOAD;
const MAX_SMALL: u32 = 64 << 10;
const MAX_DRIBBLED: u32 = 10_000;
const MAX_LARGE_SIZES: usize = 8;
const MAX_RANDOM_SPLITS: u32 = 64;
/// How long a write may wait for the receiver to make room.
const STALLED_WRITE: Duration = Duration::from_secs(10);

impl super::Describe for ExactReads {
    const ABOUT: &'static str = "a raw peer dribbles and splits frames; every frame read whole";
}

impl StepSpec for ExactReads {
    fn metrics(&self) -> &'static [Metric] {
        &[FRAMES_INTACT, FRAMES_CORRUPT, FRAMES_MISSING]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        if self.dribbled_frames > MAX_DRIBBLED {
            return Err(format!("dribbled_frames must be at most {MAX_DRIBBLED}").into());
        }
        if !(1..=MAX_SMALL).contains(&self.split_payload_bytes) {
            return Err(format!("split_payload_bytes must be 1..={MAX_SMALL}").into());
        }
        if self.large_sizes.len() > MAX_LARGE_SIZES
            || self.large_sizes.iter().any(|s| !(1..=MAX_SIZE).contains(s))
        {
            return Err(format!(
                "large_sizes: at most {MAX_LARGE_SIZES} sizes, each 1..={MAX_SIZE} bytes"
            )
            .into());
        }
        if self.random_splits > MAX_RANDOM_SPLITS {
            return Err(format!("random_splits must be at most {MAX_RANDOM_SPLITS}").into());
        }
        Ok(())
    }
}

impl StepKind for ExactReads {
    fn run(&self, ctx: &RankContext, _step: usize, report: &mut StepReport) -> Result<()> {
        let plan = self.plan(ctx.seed);
        match ctx.rank {
            1 => send(ctx, &plan, self.deadline.0),
            0 => receive(ctx, &plan, self.deadline.0, report),
            _ => Ok(()),
        }
    }
}

/// How one frame goes on the wire.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Delivery {
    /// Byte by byte.
    Dribbled,
    /// In two writes, the first ending at this offset of the encoded frame.
    SplitAt(usize),
}

impl ExactReads {
    /// Every frame, in order: (payload length, delivery). Both ranks compute the same plan.
    fn plan(&self, seed: u64) -> Vec<(usize, Delivery)> {
        let mut plan: Vec<(usize, Delivery)> = (0..self.dribbled_frames as usize)
            .map(|i| (100 + i, Delivery::Dribbled))
            .collect();
        let small = self.split_payload_bytes as usize;
        plan.extend((1..HEADER_LEN + small).map(|at| (small, Delivery::SplitAt(at))));
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for &size in &self.large_sizes {
            let len = size as usize;
            let total = HEADER_LEN + len;
            let mut offsets: Vec<usize> = (1..=HEADER_LEN).collect();
            offsets.extend([HEADER_LEN + 1, total - 1]);
            for _ in 0..self.random_splits {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                offsets.push(1 + (rng % (total as u64 - 1)) as usize);
            }
            offsets.retain(|at| *at >= 1 && *at < total);
            plan.extend(offsets.into_iter().map(|at| (len, Delivery::SplitAt(at))));
        }
        plan
    }
}

fn send(ctx: &RankContext, plan: &[(usize, Delivery)], deadline: Duration) -> Result<()> {
    let mut s = raw_connect(ctx.peers[0].raw, deadline)?;
    // A receiver that stopped reading (it failed) must not leave this write blocked forever.
    s.set_write_timeout(Some(STALLED_WRITE))?;
    for (seq, (len, how)) in plan.iter().enumerate() {
        let bytes = data(ctx.seed, seq as u64, *len);
        match how {
            Delivery::Dribbled => {
                for byte in bytes {
                    s.write_all(&[byte])?;
                }
            }
            Delivery::SplitAt(at) => {
                s.write_all(&bytes[..*at])?;
                s.flush()?;
                s.write_all(&bytes[*at..])?;
            }
        }
    }
    s.shutdown(Shutdown::Write)?;
    ctx.control.barrier("exact-reads-checked", 2, deadline)?;
    Ok(())
}

fn receive(
    ctx: &RankContext,
    plan: &[(usize, Delivery)],
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    let conn = accept_conn(ctx, deadline)?;
    let (mut intact, mut corrupt) = (0u32, 0u32);
    for (seq, (len, how)) in plan.iter().enumerate() {
        let seq = seq as u64;
        match conn.recv(deadline) {
            Ok(f) if f.header.sequence == seq && f.payload == pattern(ctx.seed, seq, *len) => {
                intact += 1;
                conn.recycle(f.payload);
            }
            Ok(f) => {
                corrupt += 1;
                if corrupt <= 5 {
                    report.notes.push(format!(
                        "frame {seq} ({len} bytes, {how:?}): got sequence {} with {} bytes, not the pattern",
                        f.header.sequence,
                        f.payload.len()
                    ));
                }
            }
            Err(e) => {
                report.notes.push(format!("after {intact} frames: {e}"));
                break;
            }
        }
    }
    let expected = plan.len() as u32;
    let m = &mut report.metrics;
    m.insert(FRAMES_INTACT, intact as f64);
    m.insert(FRAMES_CORRUPT, corrupt as f64);
    m.insert(FRAMES_MISSING, (expected - intact - corrupt) as f64);
    let large = plan.iter().filter(|(len, _)| *len >= 64 << 10).count();
    report.notes.push(format!(
        "{expected} frames expected: dribbled, split at every offset, and {large} large ones split at header offsets, payload edges and seeded offsets"
    ));
    ctx.control.barrier("exact-reads-checked", 2, deadline)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(large: Vec<u32>, random: u32) -> ExactReads {
        ExactReads {
            dribbled_frames: 2,
            split_payload_bytes: 4,
            large_sizes: large,
            random_splits: random,
            deadline: HumanDuration(Duration::from_secs(10)),
        }
    }

    #[test]
    fn the_plan_splits_large_frames_at_the_header_the_payload_edges_and_seeded_offsets() {
        let plan = step(vec![1 << 20], 3).plan(42);
        assert_eq!(plan[0], (100, Delivery::Dribbled));
        let small = plan.iter().filter(|(l, _)| *l == 4).count();
        assert_eq!(small, HEADER_LEN + 3);
        let large: Vec<usize> = plan
            .iter()
            .filter(|(l, _)| *l == 1 << 20)
            .map(|(_, d)| match d {
                Delivery::SplitAt(at) => *at,
                Delivery::Dribbled => 0,
            })
            .collect();
        assert_eq!(large.len(), HEADER_LEN + 2 + 3);
        assert!(large.contains(&HEADER_LEN));
        assert!(large.contains(&(HEADER_LEN + 1)));
        assert!(large.contains(&(HEADER_LEN + (1 << 20) - 1)));
        assert_eq!(
            plan,
            step(vec![1 << 20], 3).plan(42),
            "both ranks plan alike"
        );
        assert_ne!(
            plan,
            step(vec![1 << 20], 3).plan(43),
            "the seed moves the random splits"
        );
    }

    #[test]
    fn sizes_and_counts_have_bounds() {
        assert!(step(vec![16 << 20], 64).check(2).is_ok());
        assert!(step(vec![(16 << 20) + 1], 0).check(2).is_err());
        assert!(step(vec![0], 0).check(2).is_err());
        assert!(step(vec![1; 9], 0).check(2).is_err());
        assert!(step(vec![], 65).check(2).is_err());
    }
}
