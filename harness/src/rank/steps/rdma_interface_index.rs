//! rdma-interface-index: the server is configured with every local RoCE interface in reverse order; rank 1 connects once to each address and says which one it dialled.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{bail, Result};
use wringer_transport::rdma::rc::{connect, Received};
use wringer_transport::rdma::server::{RdmaServer, ServerOptions};

use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;
use serde::{Deserialize, Serialize};

use super::rdma_support::*;
use super::StepKind;
use crate::model::duration::HumanDuration;
use crate::model::metric::Metric;
use crate::model::scenario::StepSpec;

crate::declare_metrics! {
    pub RDMA_INTERFACES_SERVED = "rdma_interfaces_served", Count, Neither;
    pub RDMA_INTERFACE_MISMATCHES = "rdma_interface_mismatches", Count, Lower;
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaInterfaceIndex {
    pub deadline: HumanDuration,
}

impl super::Describe for RdmaInterfaceIndex {
    const ABOUT: &'static str = "the server picks interfaces by configured index, not port number";
}

impl StepSpec for RdmaInterfaceIndex {
    fn requires(&self) -> Vec<crate::model::requirement::Requirement> {
        vec![crate::model::requirement::Requirement::Rdma]
    }

    fn metrics(&self) -> &'static [Metric] {
        &[RDMA_INTERFACES_SERVED, RDMA_INTERFACE_MISMATCHES]
    }
}

impl StepKind for RdmaInterfaceIndex {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        interface_index(ctx, step, self.deadline.0, report)
    }
}

pub fn interface_index(
    ctx: &RankContext,
    step: usize,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if !ctx.in_pair() {
        return Ok(());
    }
    let addresses = local_addresses();
    if addresses.len() < 2 {
        bail!("needs two active RoCE interfaces, found {addresses:?}");
    }
    let rc = options(4096, deadline);
    if ctx.rank == 0 {
        // Configured in reverse order, so list index and discovery order (and port numbers,
        // all 1 on rxe) disagree.
        let interfaces: Vec<IpAddr> = addresses.iter().rev().copied().collect();
        let server = RdmaServer::start(ServerOptions {
            worker_drain: Duration::ZERO,
            interfaces: interfaces.clone(),
            port: port(step),
            rc,
            pool: 4,
            stats_period: Duration::from_millis(20),
        })?;
        ctx.pair_barrier(step, "listening", deadline)?;
        ctx.pair_barrier(step, "clients-done", deadline)?;
        let served = wait_served(&server, addresses.len(), deadline);
        let mut mismatches = 0;
        for s in &served {
            let dialled = String::from_utf8_lossy(&s.first_message).to_string();
            let configured = interfaces[s.interface].to_string();
            if dialled != configured {
                mismatches += 1;
            }
            report.notes.push(format!(
                "connection to {dialled} served by interface {} ({configured})",
                s.interface
            ));
        }
        let distinct: std::collections::BTreeSet<usize> =
            served.iter().map(|s| s.interface).collect();
        report
            .metrics
            .insert(RDMA_INTERFACES_SERVED, distinct.len() as f64);
        report
            .metrics
            .insert(RDMA_INTERFACE_MISMATCHES, mismatches as f64);
        server.shutdown();
    } else {
        ctx.pair_barrier(step, "listening", deadline)?;
        for ip in &addresses {
            let mut conn = connect(SocketAddr::new(*ip, port(step)), rc)?;
            let msg = ip.to_string().into_bytes();
            conn.send(&msg, deadline)?;
            if conn.recv(deadline)? != Received::Message(msg) {
                bail!("the echo from {ip} differs");
            }
        }
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
    fn the_interfaces_served_and_mismatches_are_declared() {
        let s = accepted("rdma-interface-index: { deadline: 60s }", 2);
        assert_eq!(
            s.metrics(),
            &[RDMA_INTERFACES_SERVED, RDMA_INTERFACE_MISMATCHES]
        );
        assert!(
            refused("rdma-interface-index: { deadline: 60s, interfaces: 3 }", 2)
                .contains("unknown field")
        );
    }
}
