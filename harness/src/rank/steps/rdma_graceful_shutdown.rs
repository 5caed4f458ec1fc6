//! rdma-graceful-shutdown: rank 0 runs the DAQIRI-shaped RDMA server (worker per connection, stats thread); rank 1 connects, exchanges `messages` and disconnects, `connections` times; then the server shuts down gracefully.

use super::rdma_support::{RDMA_COMPLETION_ERRORS, RDMA_DATA_MISMATCHES, RDMA_SHUTDOWN_MS};
use crate::model::invalid::Invalid;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
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
    pub RDMA_CONNECTIONS_SERVED = "rdma_connections_served", Count, Neither;
    pub RDMA_WORKERS_JOINED = "rdma_workers_joined", Count, Neither;
    pub RDMA_POOL_LEAKED = "rdma_pool_leaked", Count, Lower;
    pub RDMA_STATS_SAMPLES = "rdma_stats_samples", Count, Neither;
    pub RDMA_STATS_MAX_LOCK_WAIT_MS = "rdma_stats_max_lock_wait_ms", Milliseconds, Lower;
    pub RDMA_WORKER_EXIT_MS = "rdma_worker_exit_ms", Milliseconds, Lower;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaGracefulShutdown {
    pub connections: u32,
    pub messages: u32,
    pub stats_period: HumanDuration,
    /// How long each worker takes to leave once told to (its queue draining).
    #[serde(default)]
    pub worker_drain: Option<HumanDuration>,
    pub deadline: HumanDuration,
}

impl super::Describe for RdmaGracefulShutdown {
    const ABOUT: &'static str =
        "DAQIRI-shaped server: workers joined, pool returned, stats thread live";
}

crate::reach_points! {
    pub STATS_SAMPLED_DURING_A_JOIN = "stats-sampled-during-a-join",
        "the stats thread read the connection registry while a worker was being joined (where a join under the registry lock would stall it: DAQIRI's deadlock)";
}

impl StepSpec for RdmaGracefulShutdown {
    fn reach_points(&self) -> &'static [crate::model::reach::ReachPoint] {
        &[STATS_SAMPLED_DURING_A_JOIN]
    }

    fn requires(&self) -> Vec<crate::model::requirement::Requirement> {
        vec![crate::model::requirement::Requirement::Rdma]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[
            RDMA_CONNECTIONS_SERVED,
            RDMA_WORKERS_JOINED,
            RDMA_POOL_LEAKED,
            RDMA_SHUTDOWN_MS,
            RDMA_STATS_SAMPLES,
            RDMA_DATA_MISMATCHES,
            RDMA_COMPLETION_ERRORS,
            RDMA_STATS_MAX_LOCK_WAIT_MS,
            RDMA_WORKER_EXIT_MS,
        ]
    }

    fn check(&self, _ranks: u32) -> Result<(), Invalid> {
        super::in_range("connections", self.connections, 1, 1000)?;
        super::in_range("messages", self.messages, 0, super::MAX_COUNT)?;
        if self
            .worker_drain
            .is_some_and(|d| d.0 > Duration::from_secs(10))
        {
            return Err(
                "worker_drain must be at most 10s (each of the connections waits it out)".into(),
            );
        }
        Ok(())
    }
}

impl StepKind for RdmaGracefulShutdown {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        graceful_shutdown(ctx, step, self, report)
    }
}

pub fn graceful_shutdown(
    ctx: &RankContext,
    step: usize,
    p: &RdmaGracefulShutdown,
    report: &mut StepReport,
) -> Result<()> {
    let (connections, messages) = (p.connections, p.messages);
    let (stats_period, deadline) = (p.stats_period.0, p.deadline.0);
    let worker_drain = p.worker_drain.map(|d| d.0).unwrap_or_default();
    if !ctx.in_pair() {
        return Ok(());
    }
    let server_ip = server_ip(ctx)?;
    let addr = SocketAddr::new(server_ip, port(step));
    let rc = options(4096, deadline);
    if ctx.rank == 0 {
        let pool = 4;
        let server = RdmaServer::start(ServerOptions {
            interfaces: vec![server_ip],
            port: port(step),
            rc,
            pool,
            stats_period,
            worker_drain,
        })?;
        ctx.pair_barrier(step, "listening", deadline)?;
        ctx.pair_barrier(step, "clients-done", deadline)?;
        // Every disconnect is handled by the server's CM loop; wait (bounded) for all of them.
        let served = wait_served(&server, connections as usize, deadline);
        let started = Instant::now();
        let stats = server.shutdown();
        let m = &mut report.metrics;
        m.insert(RDMA_SHUTDOWN_MS, started.elapsed().as_secs_f64() * 1e3);
        m.insert(RDMA_CONNECTIONS_SERVED, served.len() as f64);
        m.insert(RDMA_WORKERS_JOINED, stats.workers_joined as f64);
        m.insert(RDMA_POOL_LEAKED, (pool - stats.pool_free) as f64);
        m.insert(RDMA_STATS_SAMPLES, stats.stats_samples as f64);
        m.insert(RDMA_COMPLETION_ERRORS, stats.completion_errors as f64);
        m.insert(
            RDMA_STATS_MAX_LOCK_WAIT_MS,
            stats.stats_max_lock_wait.as_secs_f64() * 1e3,
        );
        m.insert(
            RDMA_WORKER_EXIT_MS,
            stats.max_worker_exit.as_secs_f64() * 1e3,
        );
        report.reach_times(
            STATS_SAMPLED_DURING_A_JOIN,
            stats.stats_samples_during_joins,
        );
        report.notes.push(format!(
            "server: {stats:?}; every worker's buffers came back after its join: {}",
            served.iter().all(|s| s.buffers_returned_after_join)
        ));
    } else {
        ctx.pair_barrier(step, "listening", deadline)?;
        let mut mismatches = 0u32;
        for c in 0..connections {
            let mut conn = connect(addr, rc).with_context(|| format!("connection {c}"))?;
            for i in 0..messages {
                let msg = pattern(ctx.seed, (c as u64) << 32 | i as u64, 512);
                conn.send(&msg, deadline)?;
                mismatches += (conn.recv(deadline)? != Received::Message(msg)) as u32;
            }
            drop(conn);
        }
        report
            .metrics
            .insert(RDMA_DATA_MISMATCHES, mismatches as f64);
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
    fn connections_and_the_drain_are_bounded() {
        let yaml = "rdma-graceful-shutdown: { connections: 10, messages: 5, stats_period: 5ms, worker_drain: 500ms, deadline: 240s }";
        let s = accepted(yaml, 2);
        assert!(s.metrics().contains(&RDMA_STATS_MAX_LOCK_WAIT_MS));
        assert!(
            refused(&yaml.replace("connections: 10", "connections: 0"), 2).contains("connections")
        );
        assert!(
            refused(&yaml.replace("worker_drain: 500ms", "worker_drain: 11s"), 2)
                .contains("worker_drain")
        );
    }
}
