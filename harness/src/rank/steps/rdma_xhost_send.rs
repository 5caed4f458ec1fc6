//! rdma-xhost-send: DAQIRI #113 across hosts: rank 0 runs the RDMA server for `server_seconds`, rank 1 (on the other host) SENDs `messages` and receives every echo; then the server's timer ends it.

use super::rdma_support::{
    RDMA_COMPLETION_ERRORS, RDMA_RX_MESSAGES, RDMA_SHUTDOWN_MS, RDMA_TX_MESSAGES, RETRY_EXC_ERR,
};
use crate::model::invalid::Invalid;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use wringer_transport::rdma::rc::WcStatus;
use wringer_transport::rdma::rc::{connect, Received};
use wringer_transport::rdma::server::{RdmaServer, ServerOptions};

use super::pattern;
use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::rdma_support::*;
use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

crate::declare_metrics! {
    pub RDMA_ECHOES = "rdma_echoes", Count, Neither;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaXhostSend {
    pub messages: u32,
    pub server_seconds: HumanDuration,
    pub deadline: HumanDuration,
}

impl super::Describe for RdmaXhostSend {
    const ABOUT: &'static str = "DAQIRI #113 across hosts: every SEND echoed";
}

impl StepSpec for RdmaXhostSend {
    fn requires(&self) -> Vec<crate::model::requirement::Requirement> {
        vec![crate::model::requirement::Requirement::Rdma]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[
            RDMA_TX_MESSAGES,
            RDMA_RX_MESSAGES,
            RDMA_ECHOES,
            RETRY_EXC_ERR,
            RDMA_SHUTDOWN_MS,
            RDMA_COMPLETION_ERRORS,
        ]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        super::in_range("messages", self.messages, 1, super::MAX_COUNT)
    }
}

impl StepKind for RdmaXhostSend {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        xhost_send(
            ctx,
            step,
            self.messages,
            self.server_seconds.0,
            self.deadline.0,
            report,
        )
    }
}

pub fn xhost_send(
    ctx: &RankContext,
    step: usize,
    messages: u32,
    server_seconds: Duration,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if !ctx.in_pair() {
        return Ok(());
    }
    let server_ip = server_ip(ctx)?;
    let rc = options(4096, deadline);
    if ctx.rank == 0 {
        let started = Instant::now();
        // The server posts its receives before it accepts (RdmaServer does, by construction).
        let server = RdmaServer::start(ServerOptions {
            worker_drain: Duration::ZERO,
            interfaces: vec![server_ip],
            port: port(step),
            rc,
            pool: 2,
            stats_period: Duration::from_millis(100),
        })?;
        ctx.pair_barrier(step, "listening", deadline)?;
        ctx.pair_barrier(step, "clients-done", deadline)?;
        // Serve until the timer, then shut down gracefully: the exit must follow the timer.
        let timer = started + server_seconds;
        while Instant::now() < timer {
            std::thread::sleep(Duration::from_millis(20));
        }
        let t = Instant::now();
        // Served counts come after the shutdown: a client's disconnect may still be on its way
        // when the timer ends (slow hosts), and the shutdown disconnects it then.
        let (stats, served) = server.shutdown_and_served();
        report
            .metrics
            .insert(RDMA_SHUTDOWN_MS, t.elapsed().as_secs_f64() * 1e3);
        report.metrics.insert(
            RDMA_RX_MESSAGES,
            served.iter().map(|s| s.messages).sum::<u64>() as f64,
        );
        report
            .metrics
            .insert(RDMA_COMPLETION_ERRORS, stats.completion_errors as f64);
        report
            .notes
            .push(format!("server on {server_ip}: {stats:?}"));
    } else {
        ctx.pair_barrier(step, "listening", deadline)?;
        let mut conn = connect(SocketAddr::new(server_ip, port(step)), rc)
            .with_context(|| format!("connecting to {server_ip} from the other host"))?;
        let (mut sent, mut echoes) = (0u32, 0u32);
        for i in 0..messages {
            let msg = pattern(ctx.seed, i as u64, 1024);
            conn.send(&msg, deadline)?;
            sent += 1;
            if conn.recv(deadline)? == Received::Message(msg) {
                echoes += 1;
            }
        }
        report.metrics.insert(RDMA_TX_MESSAGES, sent as f64);
        report.metrics.insert(RDMA_ECHOES, echoes as f64);
        report.metrics.insert(
            RETRY_EXC_ERR,
            conn.counts().get(WcStatus::RetryExcErr) as f64,
        );
        report.notes.push(format!(
            "client {:?} -> {server_ip}: {:?}",
            local_address(),
            conn.counts().0
        ));
        drop(conn);
        ctx.pair_barrier(step, "clients-done", deadline)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scenario::StepSpec;
    use crate::rank::steps::testing::{accepted, refused};

    #[test]
    fn every_send_is_counted_and_the_count_is_bounded() {
        let s = accepted(
            "rdma-xhost-send: { messages: 50, server_seconds: 5s, deadline: 200s }",
            2,
        );
        assert!(s.metrics().contains(&RDMA_ECHOES));
        assert!(refused(
            "rdma-xhost-send: { messages: 0, server_seconds: 5s, deadline: 200s }",
            2
        )
        .contains("messages"));
    }
}
