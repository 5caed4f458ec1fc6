//! rdma-interop-rc-pingpong: rank 0 plays ping-pong with rdma-core's `ibv_rc_pingpong` on this host, in both roles, speaking its out-of-band exchange.

use super::rdma_support::RDMA_COMPLETION_ERRORS;
use crate::model::invalid::Invalid;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::rdma_support::*;
use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

crate::declare_metrics! {
    pub INTEROP_AS_CLIENT = "interop_as_client", Flag, Neither;
    pub INTEROP_AS_SERVER = "interop_as_server", Flag, Neither;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaInteropRcPingpong {
    pub size: u32,
    pub iterations: u32,
    pub deadline: HumanDuration,
}

impl super::Describe for RdmaInteropRcPingpong {
    const ABOUT: &'static str = "ping-pong with rdma-core's `ibv_rc_pingpong`, both roles";
}

impl StepSpec for RdmaInteropRcPingpong {
    fn requires(&self) -> Vec<crate::model::requirement::Requirement> {
        vec![crate::model::requirement::Requirement::Rdma]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[INTEROP_AS_CLIENT, INTEROP_AS_SERVER, RDMA_COMPLETION_ERRORS]
    }

    fn min_ranks(&self) -> u32 {
        1
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        super::in_range("size", self.size, 1, super::MAX_MESSAGE)?;
        super::in_range("iterations", self.iterations, 1, super::MAX_COUNT)
    }
}

impl StepKind for RdmaInteropRcPingpong {
    fn run(&self, ctx: &RankContext, _step: usize, report: &mut StepReport) -> Result<()> {
        interop(ctx, self.size, self.iterations, self.deadline.0, report)
    }
}

/// `ibv_rc_pingpong` as a child, within `limit`: whether it succeeded, and its output.
fn reference(args: &[String], limit: Duration) -> Result<(bool, String)> {
    let cmd: Vec<&str> = std::iter::once("ibv_rc_pingpong")
        .chain(args.iter().map(String::as_str))
        .collect();
    let (status, out) = crate::hosts::child::run_bounded(&cmd, limit)
        .map_err(|e| anyhow::anyhow!("{e} (it comes with ibverbs-utils)"))?;
    Ok((status.is_some_and(|s| s.success()), out))
}

pub fn interop(
    ctx: &RankContext,
    size: u32,
    iterations: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    use wringer_transport::rdma::compat::{run, CompatOptions, Role};
    if ctx.rank != 0 {
        return Ok(());
    }
    let (device, port, gid) = local_gid().context("no active RoCE v2 GID on this host")?;
    let opts = CompatOptions {
        device: device.clone(),
        port,
        gid_index: gid,
        size: size as usize,
        iterations,
        timeout: deadline,
    };
    let common = vec![
        "-d".to_string(),
        device,
        "-i".into(),
        port.to_string(),
        "-g".into(),
        gid.to_string(),
        "-s".into(),
        size.to_string(),
        "-n".into(),
        iterations.to_string(),
    ];
    let mut errors = 0u64;
    for (role, tcp) in [("client", 18515u16), ("server", 18516u16)] {
        let mut args = common.clone();
        args.extend(["-p".into(), tcp.to_string()]);
        let (ours, theirs) = if role == "client" {
            // ibv_rc_pingpong serves; we connect.
            let tool = std::thread::spawn(move || reference(&args, deadline));
            let ours = run(
                Role::Client {
                    server: SocketAddr::from(([127, 0, 0, 1], tcp)),
                },
                &opts,
            );
            (
                ours,
                tool.join()
                    .map_err(|_| anyhow::anyhow!("reference thread panicked"))??,
            )
        } else {
            args.push("127.0.0.1".into());
            let tool = std::thread::spawn(move || reference(&args, deadline));
            let ours = run(Role::Server { tcp_port: tcp }, &opts);
            (
                ours,
                tool.join()
                    .map_err(|_| anyhow::anyhow!("reference thread panicked"))??,
            )
        };
        let ok = ours.is_ok() && theirs.0;
        let line = theirs
            .1
            .lines()
            .find(|l| l.contains("usec/iter"))
            .unwrap_or("(no timing line)")
            .trim()
            .to_string();
        match &ours {
            Ok(o) => {
                errors += o.counts.errors();
                report.notes.push(format!("wringer as {role}: {} iterations, {:.1} usec/iter; ibv_rc_pingpong: {line} (exit ok: {})", o.iterations, o.usec_per_iter, theirs.0));
            }
            Err(e) => report.notes.push(format!(
                "wringer as {role}: {e}; ibv_rc_pingpong said: {}",
                theirs.1.trim()
            )),
        }
        let metric = if role == "client" {
            INTEROP_AS_CLIENT
        } else {
            INTEROP_AS_SERVER
        };
        report.metrics.insert(metric, ok as u8 as f64);
    }
    report.metrics.insert(RDMA_COMPLETION_ERRORS, errors as f64);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::model::scenario::StepSpec;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn one_rank_plays_both_roles_with_checked_sizes() {
        let s = accepted(
            "rdma-interop-rc-pingpong: { size: 4096, iterations: 100, deadline: 60s }",
            1,
        );
        assert_eq!(s.min_ranks(), 1);
        assert!(refused(
            "rdma-interop-rc-pingpong: { size: 0, iterations: 100, deadline: 60s }",
            1
        )
        .contains("size"));
        assert!(refused(
            "rdma-interop-rc-pingpong: { size: 64, iterations: 0, deadline: 60s }",
            1
        )
        .contains("iterations"));
    }
}
