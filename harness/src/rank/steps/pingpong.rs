//! pingpong: ping-pong with every byte checked and latency per size, over either fabric. Over
//! TCP every pair of ranks meets (a full mesh, round-robin); over RDMA ranks 0 and 1 meet on
//! an RC queue pair, by SEND, then by WRITE with immediate, by WRITE into registered regions
//! (RDMA's own ways to move a message), and by SEND with no copy on either side: sent from a
//! registered region, received and echoed in the ring slot it landed in.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use wringer_transport::rdma::rc::{InPlace, RcConnection, Received, RemoteRegion};
use wringer_transport::Connection;

use super::fabric::{Fabric, Link};
use super::rdma_support::{counts_into, pair};
use super::rdma_support::{RDMA_COMPLETION_ERRORS, RDMA_DATA_MISMATCHES, RETRY_EXC_ERR};
use super::support::DATA_MISMATCHES;
use super::{check_sizes, connect_to, pattern, seq, StepKind};
use crate::model::duration::HumanDuration;
use crate::model::invalid::Invalid;
use crate::model::metric::{Metric, Series};
use crate::model::scenario::StepSpec;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

crate::declare_metrics! {
    pub PAIRS_VERIFIED = "pairs_verified", Count, Neither;
    pub RDMA_MESSAGES = "rdma_messages", Count, Neither;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Pingpong {
    #[serde(default)]
    pub fabric: Fabric,
    pub sizes: Vec<u32>,
    pub iterations: u32,
    pub deadline: HumanDuration,
}

/// The point its ranks report once the TCP mesh stands, where a scenario's fault may strike.
const MESH_READY: &str = "mesh-ready";

impl super::Describe for Pingpong {
    const ABOUT: &'static str = "ping-pong, every byte checked, latency per size: a TCP full mesh, or RDMA SEND, WRITE with immediate, registered-region WRITE and zero-copy SEND (in place)";
}

impl StepSpec for Pingpong {
    fn requires(&self) -> Vec<crate::model::requirement::Requirement> {
        self.fabric.requires()
    }

    fn points(&self) -> Vec<String> {
        match self.fabric {
            Fabric::Tcp => vec![MESH_READY.into()],
            Fabric::Rdma => vec![],
        }
    }

    fn metrics(&self) -> &'static [Metric] {
        match self.fabric {
            Fabric::Tcp => &[PAIRS_VERIFIED, DATA_MISMATCHES],
            Fabric::Rdma => &[
                RDMA_MESSAGES,
                RDMA_DATA_MISMATCHES,
                RDMA_COMPLETION_ERRORS,
                RETRY_EXC_ERR,
            ],
        }
    }

    fn series(&self) -> &'static [Series] {
        match self.fabric {
            Fabric::Tcp => &[Series::Latency],
            Fabric::Rdma => &[
                Series::Latency,
                Series::WriteLatency,
                Series::RegionWriteLatency,
                Series::InPlaceLatency,
            ],
        }
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        check_sizes(&self.sizes, self.iterations)
    }
}

impl StepKind for Pingpong {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        match self.fabric {
            Fabric::Tcp => tcp_mesh(ctx, step, self, report),
            Fabric::Rdma => rdma_pair(ctx, step, self, report),
        }
    }
}

/// What one pair's ping-pong saw: latency samples (µs, one way) by size, on the pinger's
/// side, and the messages that came back other than sent.
#[derive(Default)]
struct Exchanged {
    samples: BTreeMap<u32, Vec<f64>>,
    messages: u32,
    mismatches: Mismatches,
}

/// The checks that failed: how many, and the first few of them named (way, size, iteration),
/// for the step's notes, so a count above zero comes with where it came from.
#[derive(Default)]
struct Mismatches {
    count: u32,
    named: Vec<String>,
}

impl Mismatches {
    /// Notes kept; the count goes on past them.
    const NAMED: usize = 5;

    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.count += 1;
            if self.named.len() < Self::NAMED {
                self.named.push(what());
            }
        }
    }

    fn add(&mut self, other: Mismatches) {
        self.count += other.count;
        let room = Self::NAMED.saturating_sub(self.named.len());
        self.named.extend(other.named.into_iter().take(room));
    }

    fn report_as(self, metric: Metric, report: &mut StepReport) {
        report.metrics.insert(metric, self.count as f64);
        let shown = self.named.len() as u32;
        report
            .notes
            .extend(self.named.into_iter().map(|n| format!("mismatch: {n}")));
        if self.count > shown {
            report
                .notes
                .push(format!("mismatch: {} more not named", self.count - shown));
        }
    }
}

/// Ping-pong every size `iterations` times over one link; the pinger times each round trip,
/// the other side echoes what it got. `tag` names each message's pattern.
fn ping_pong(
    link: &mut dyn Link,
    way: &str,
    pinger: bool,
    p: &Pingpong,
    seed: u64,
    tag: impl Fn(u32, u32) -> u64,
) -> Result<Exchanged> {
    let deadline = p.deadline.0;
    let mut out = Exchanged::default();
    for &size in &p.sizes {
        for it in 0..p.iterations {
            let expected = pattern(seed, tag(size, it), size as usize);
            if pinger {
                let started = Instant::now();
                link.send(&expected, deadline)?;
                let back = link.recv(deadline)?;
                out.samples
                    .entry(size)
                    .or_default()
                    .push(started.elapsed().as_secs_f64() * 1e6 / 2.0);
                out.mismatches.check(back == expected, || {
                    format!("{way}, {size} B, iteration {it}: the echo came back other than sent")
                });
            } else {
                let got = link.recv(deadline)?;
                out.mismatches.check(got == expected, || {
                    format!("{way}, {size} B, iteration {it}: received other than sent")
                });
                link.send(&got, deadline)?;
            }
            out.messages += 1;
        }
    }
    Ok(out)
}

/// Over TCP: every pair of ranks meets, in round-robin rounds.
fn tcp_mesh(ctx: &RankContext, step: usize, p: &Pingpong, report: &mut StepReport) -> Result<()> {
    let deadline = p.deadline.0;
    let mut conns = mesh(ctx, step, deadline)?;
    // Faults that shape the data phase (a rate limit) strike here, before any data moves.
    ctx.control.point_and_wait(step, MESH_READY, deadline)?;
    let mut samples: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    let (mut pairs_verified, mut mismatches) = (0u32, Mismatches::default());
    for partner in schedule(ctx.rank, ctx.ranks) {
        let Some(partner) = partner else { continue };
        let conn = conns
            .get_mut(&partner)
            .context("no connection to a partner")?;
        let (low, high) = (ctx.rank.min(partner) as u64, ctx.rank.max(partner) as u64);
        let way = format!("with rank {partner}");
        let seen = ping_pong(conn, &way, ctx.rank < partner, p, ctx.seed, |size, it| {
            low << 48 | high << 32 | (size as u64) << 8 | it as u64
        })?;
        for (size, v) in seen.samples {
            samples.entry(size).or_default().extend(v);
        }
        pairs_verified += (seen.mismatches.count == 0) as u32;
        mismatches.add(seen.mismatches);
    }
    for c in conns.values() {
        c.close()?;
    }
    report.metrics.insert(PAIRS_VERIFIED, pairs_verified as f64);
    mismatches.report_as(DATA_MISMATCHES, report);
    for (size, v) in samples {
        report.sample(Series::Latency, size as u64, v);
    }
    Ok(())
}

/// Over RDMA: ranks 0 and 1 on one RC queue pair, by SEND (rank 1 pings), then by WRITE with
/// immediate, then by WRITE into registered regions.
fn rdma_pair(ctx: &RankContext, step: usize, p: &Pingpong, report: &mut StepReport) -> Result<()> {
    if !ctx.in_pair() {
        return Ok(());
    }
    let deadline = p.deadline.0;
    let max = p.sizes.iter().copied().max().unwrap_or(64);
    let mut c = pair(ctx, step, max, deadline)?;
    let sent = ping_pong(&mut c, "SEND", ctx.rank == 1, p, ctx.seed, |size, it| {
        (size as u64) << 20 | it as u64
    })?;
    for (size, v) in sent.samples {
        report.sample(Series::Latency, size as u64, v);
    }
    let (mut messages, mut mismatches) = (sent.messages, sent.mismatches);
    messages += write_pingpong(ctx, &mut c, p, &mut mismatches, report)?;
    messages += region_pingpong(ctx, &mut c, p, &mut mismatches, report)?;
    messages += in_place_pingpong(ctx, &mut c, p, &mut mismatches, report)?;
    report.metrics.insert(RDMA_MESSAGES, messages as f64);
    mismatches.report_as(RDMA_DATA_MISMATCHES, report);
    counts_into(&c, report);
    ctx.pair_barrier(step, "done", deadline)?;
    Ok(())
}

/// Ping-pong by RDMA WRITE with immediate into the peer's advertised buffer.
fn write_pingpong(
    ctx: &RankContext,
    c: &mut RcConnection,
    p: &Pingpong,
    mismatches: &mut Mismatches,
    report: &mut StepReport,
) -> Result<u32> {
    let deadline = p.deadline.0;
    let mut messages = 0;
    for &size in &p.sizes {
        let mut samples = vec![];
        for it in 0..p.iterations {
            let expected = pattern(
                ctx.seed,
                (size as u64) << 20 | it as u64 | 1 << 60,
                size as usize,
            );
            let written = |got: &Received| matches!(got, Received::Written { imm, data } if *imm == it && *data == expected);
            if ctx.rank == 1 {
                let started = Instant::now();
                c.write_imm(&expected, it, deadline)?;
                let back = c.recv(deadline)?;
                samples.push(started.elapsed().as_secs_f64() * 1e6 / 2.0);
                mismatches.check(written(&back), || {
                    format!(
                        "WRITE with immediate, {size} B, iteration {it}: the echo came back as {}",
                        brief(&back)
                    )
                });
            } else {
                let got = c.recv(deadline)?;
                mismatches.check(written(&got), || {
                    format!(
                        "WRITE with immediate, {size} B, iteration {it}: received {}",
                        brief(&got)
                    )
                });
                c.write_imm(&expected, it, deadline)?;
            }
            messages += 1;
        }
        if !samples.is_empty() {
            report.sample(Series::WriteLatency, size as u64, samples);
        }
    }
    Ok(messages)
}

/// Ping-pong by RDMA WRITE between memory the step owns and registered itself (the path GPU
/// buffers take when staged): the receiver finds the bytes in its own region, nothing copied.
fn region_pingpong(
    ctx: &RankContext,
    c: &mut RcConnection,
    p: &Pingpong,
    mismatches: &mut Mismatches,
    report: &mut StepReport,
) -> Result<u32> {
    let (sizes, iterations, deadline) = (&p.sizes, p.iterations, p.deadline.0);
    let max = sizes.iter().copied().max().unwrap_or(64) as usize;
    // Each side writes from its first half into the peer's second half; every message has its
    // own pattern, so stale bytes from an earlier one never pass for a new one.
    let mut memory = vec![0u8; 2 * max].into_boxed_slice();
    // SAFETY: `memory` is a boxed slice that neither moves nor is freed before `region`, which
    // is dropped at the end of this function, before `memory`.
    let region = unsafe { c.register_host(memory.as_mut_ptr(), 2 * max) }?;
    c.send(&region.remote().to_bytes(), deadline)?;
    let peer = match c.recv(deadline)? {
        Received::Message(m) => RemoteRegion::from_bytes(&m).context("region advert")?,
        other => bail!("expected the peer's region advert, got {other:?}"),
    };
    let mut messages = 0;
    for &size in sizes {
        let size = size as usize;
        let mut samples = vec![];
        for it in 0..iterations {
            let expected = pattern(ctx.seed, (size as u64) << 20 | it as u64 | 3 << 60, size);
            let started = Instant::now();
            if ctx.rank == 1 {
                memory[..size].copy_from_slice(&expected);
                c.write_region_imm(&region, 0, size, &peer, max as u64, it, deadline)?;
            }
            let got = c.recv(deadline)?;
            // The bytes landed before the WRITE_WITH_IMM's receive completed.
            let arrived = got == Received::WrittenToRegion { imm: it, len: size };
            let landed = memory[max..max + size] == expected[..];
            mismatches.check(arrived && landed, || {
                format!(
                    "WRITE into a region, {size} B, iteration {it}: {}",
                    if arrived {
                        "the region holds other bytes".to_string()
                    } else {
                        format!("received {}", brief(&got))
                    }
                )
            });
            if ctx.rank == 1 {
                samples.push(started.elapsed().as_secs_f64() * 1e6 / 2.0);
            } else {
                // Echo the bytes from where they landed.
                c.write_region_imm(&region, max, size, &peer, max as u64, it, deadline)?;
            }
            messages += 1;
        }
        if !samples.is_empty() {
            report.sample(Series::RegionWriteLatency, size as u64, samples);
        }
    }
    drop(region);
    Ok(messages)
}

/// SENDs pipelined back to back by [`in_place_pingpong`] at each size, to see them land in order.
const PIPELINED: u32 = 8;

/// Ping-pong by SEND with no copy on either side: the pinger sends from a region it registered,
/// the other side receives in place and echoes from the ring slot the message landed in. Then
/// the pinger posts [`PIPELINED`] SENDs without waiting, each numbered in its first bytes: they
/// must complete in order (the transport checks every completion) and land in order, and once
/// every lent slot is given back the receive ring must be whole again.
fn in_place_pingpong(
    ctx: &RankContext,
    c: &mut RcConnection,
    p: &Pingpong,
    mismatches: &mut Mismatches,
    report: &mut StepReport,
) -> Result<u32> {
    let (sizes, iterations, deadline) = (&p.sizes, p.iterations, p.deadline.0);
    let max = sizes.iter().copied().max().unwrap_or(64).max(8) as usize;
    let mut memory = vec![0u8; max * PIPELINED as usize].into_boxed_slice();
    // SAFETY: `memory` is a boxed slice that neither moves nor is freed before `region`, which
    // is dropped at the end of this function, before `memory`; it is written only between
    // sends, once finish_posted (inside send_region) has returned.
    let region = unsafe { c.register_host(memory.as_mut_ptr(), memory.len()) }?;
    let mut messages = 0;
    for &size in sizes {
        let size = size as usize;
        let mut samples = vec![];
        for it in 0..iterations {
            let expected = pattern(ctx.seed, (size as u64) << 20 | it as u64 | 4 << 60, size);
            if ctx.rank == 1 {
                memory[..size].copy_from_slice(&expected);
                let started = Instant::now();
                c.send_region(&region, 0, size, deadline)?;
                let back = c.recv_in_place(deadline)?;
                samples.push(started.elapsed().as_secs_f64() * 1e6 / 2.0);
                let ok = matches!(&back, InPlace::Message(m) if **m == expected[..]);
                mismatches.check(ok, || {
                    format!("SEND in place, {size} B, iteration {it}: the echo came back other than sent")
                });
            } else {
                match c.recv_in_place(deadline)? {
                    InPlace::Message(m) => {
                        mismatches.check(*m == expected[..], || {
                            format!(
                                "SEND in place, {size} B, iteration {it}: received other than sent"
                            )
                        });
                        m.echo(deadline)?;
                    }
                    InPlace::Other(other) => bail!("expected a SEND, got {other:?}"),
                }
            }
            messages += 1;
        }
        if !samples.is_empty() {
            report.sample(Series::InPlaceLatency, size as u64, samples);
        }
        // Pipelined: PIPELINED sends in flight at once, each from its own part of the region.
        let size = size.max(8);
        let numbered = |n: u32| {
            let mut m = pattern(ctx.seed, (size as u64) << 20 | n as u64 | 5 << 60, size);
            m[..8].copy_from_slice(&u64::from(n).to_be_bytes());
            m
        };
        if ctx.rank == 1 {
            for n in 0..PIPELINED {
                let at = n as usize * size;
                memory[at..at + size].copy_from_slice(&numbered(n));
            }
            for n in 0..PIPELINED {
                c.post_send_region(&region, n as usize * size, size, deadline)?;
            }
            c.finish_posted(deadline)?;
        } else {
            for n in 0..PIPELINED {
                match c.recv_in_place(deadline)? {
                    InPlace::Message(m) => {
                        mismatches.check(*m == numbered(n)[..], || {
                            let first = m
                                .get(..8)
                                .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
                            format!("pipelined SEND {n} of {PIPELINED}, {size} B: received other bytes (numbered {first:?})")
                        });
                        m.give_back()?;
                    }
                    InPlace::Other(other) => bail!("expected SEND {n}, got {other:?}"),
                }
            }
            // Every lent slot went back into the ring, echoed ones once their sends completed.
            // (The peer may already be sending the next size: a slot holding its message is
            // in the ring too.)
            c.finish_posted(deadline)?;
            mismatches.check(c.ring_whole(), || {
                format!(
                    "after {size} B: a receive ring slot is still out ({} receives posted)",
                    c.posted_receives()
                )
            });
        }
        messages += PIPELINED;
    }
    drop(region);
    Ok(messages)
}

/// What a receive returned, in a few words (not its bytes).
fn brief(r: &Received) -> String {
    match r {
        Received::Message(m) => format!("a SEND of {} B", m.len()),
        Received::Written { imm, data } => {
            format!("a WRITE of {} B with immediate {imm}", data.len())
        }
        Received::WrittenToRegion { imm, len } => {
            format!("a WRITE of {len} B into the region with immediate {imm}")
        }
    }
}

/// Connect to every other rank: initiate towards higher ranks, wait for lower ones.
fn mesh(ctx: &RankContext, step: usize, deadline: Duration) -> Result<BTreeMap<u32, Connection>> {
    std::thread::scope(|s| {
        let initiators: Vec<_> = (ctx.rank + 1..ctx.ranks)
            .map(|peer| {
                (
                    peer,
                    s.spawn(move || connect_to(ctx, peer, seq(step, ctx.rank as u64), deadline)),
                )
            })
            .collect();
        let mut conns = BTreeMap::new();
        for peer in 0..ctx.rank {
            conns.insert(
                peer,
                ctx.listener.wait_for(seq(step, peer as u64), deadline)?,
            );
        }
        for (peer, h) in initiators {
            conns.insert(
                peer,
                h.join().map_err(|_| anyhow!("connect thread panicked"))??,
            );
        }
        Ok(conns)
    })
}

/// Round-robin (circle method): in each round every rank has one partner, or none (odd count).
fn schedule(rank: u32, ranks: u32) -> Vec<Option<u32>> {
    let m = ranks + ranks % 2;
    (0..m - 1)
        .map(|round| {
            let partner = if rank == m - 1 {
                // The fixed seat meets whoever sits opposite it this round.
                round
            } else if rank == round {
                m - 1
            } else {
                (2 * round + (m - 1) - rank) % (m - 1)
            };
            (partner < ranks && partner != rank).then_some(partner)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{schedule, Mismatches};
    use crate::rank::protocol::StepReport;
    use crate::rank::steps::rdma_support::RDMA_DATA_MISMATCHES;

    #[test]
    fn every_mismatch_is_counted_and_the_first_few_named() {
        let mut first = Mismatches::default();
        first.check(true, || unreachable!("a check that held names nothing"));
        for it in 0..4 {
            first.check(false, || format!("SEND, 64 B, iteration {it}"));
        }
        let mut second = Mismatches::default();
        for it in 0..3 {
            second.check(false, || format!("WRITE, 64 B, iteration {it}"));
        }
        first.add(second);
        let mut report = StepReport::new(0);
        first.report_as(RDMA_DATA_MISMATCHES, &mut report);
        assert_eq!(report.metrics[&RDMA_DATA_MISMATCHES], 7.0);
        assert_eq!(
            report.notes,
            [
                "mismatch: SEND, 64 B, iteration 0",
                "mismatch: SEND, 64 B, iteration 1",
                "mismatch: SEND, 64 B, iteration 2",
                "mismatch: SEND, 64 B, iteration 3",
                "mismatch: WRITE, 64 B, iteration 0",
                "mismatch: 2 more not named",
            ]
        );
    }
    use crate::model::metric::Series;
    use crate::model::scenario::StepSpec;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn the_fabric_decides_what_is_recorded() {
        let tcp = accepted(
            "pingpong: { sizes: [64, 4096], iterations: 20, deadline: 90s }",
            8,
        );
        assert_eq!(tcp.series(), &[Series::Latency]);
        assert_eq!(tcp.points(), vec!["mesh-ready".to_string()]);
        let rdma = accepted(
            "pingpong: { fabric: rdma, sizes: [64, 4096, 65536], iterations: 20, deadline: 90s }",
            2,
        );
        assert_eq!(
            rdma.series(),
            &[
                Series::Latency,
                Series::WriteLatency,
                Series::RegionWriteLatency,
                Series::InPlaceLatency
            ],
            "SEND copying, WRITE with immediate, region WRITE, SEND in place"
        );
        assert!(rdma.metrics().iter().any(|m| m.as_str() == "rdma_messages"));
        assert!(
            refused("pingpong: { sizes: [64], iterations: 0, deadline: 90s }", 2)
                .contains("iterations")
        );
        assert!(refused(
            "pingpong: { fabric: ib, sizes: [64], iterations: 1, deadline: 9s }",
            2
        )
        .contains("fabric"));
    }

    #[test]
    fn every_pair_meets_exactly_once_and_symmetrically() {
        for ranks in 2..=9u32 {
            let table: Vec<_> = (0..ranks).map(|r| schedule(r, ranks)).collect();
            for r in 0..ranks {
                let mut met: Vec<u32> = table[r as usize].iter().flatten().copied().collect();
                for (round, p) in table[r as usize].iter().enumerate() {
                    if let Some(p) = p {
                        assert_eq!(
                            table[*p as usize][round],
                            Some(r),
                            "ranks={ranks} round={round}"
                        );
                    }
                }
                met.sort();
                let others: Vec<u32> = (0..ranks).filter(|&o| o != r).collect();
                assert_eq!(met, others, "ranks={ranks} rank={r}");
            }
        }
    }
}
