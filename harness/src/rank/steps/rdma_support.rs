//! What the RDMA steps share: local RoCE addresses, the RC pair between ranks 0 and 1, per-step ports, completion counts.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use wringer_transport::rdma::discovery::{discover, GidType, PortState};
use wringer_transport::rdma::rc::WcStatus;
use wringer_transport::rdma::rc::{connect, RcConnection, RcListener, RcOptions};
use wringer_transport::rdma::server::RdmaServer;

use crate::rank::context::RankContext;
use crate::rank::protocol::StepReport;

crate::declare_metrics! {
    pub RDMA_DATA_MISMATCHES = "rdma_data_mismatches", Count, Lower;
    pub RDMA_COMPLETION_ERRORS = "rdma_completion_errors", Count, Lower;
    pub RETRY_EXC_ERR = "retry_exc_err", Count, Lower;
    pub RDMA_TX_MESSAGES = "rdma_tx_messages", Count, Neither;
    pub RDMA_RX_MESSAGES = "rdma_rx_messages", Count, Neither;
    pub RDMA_SHUTDOWN_MS = "rdma_shutdown_ms", Milliseconds, Lower;
}

/// The device, port and GID index behind this host's first active RoCE v2 IPv4 GID.
pub fn local_gid() -> Option<(String, u8, u32)> {
    let devices = discover(Path::new("/sys")).ok()?;
    devices.iter().find_map(|d| {
        d.ports
            .iter()
            .filter(|p| p.state == PortState::Active)
            .find_map(|p| {
                p.gids
                    .iter()
                    .find(|g| g.kind == GidType::RoceV2 && matches!(g.ip, Some(IpAddr::V4(_))))
                    .map(|g| (d.name.clone(), p.number as u8, g.index))
            })
    })
}

/// This host's first active RoCE v2 address (IPv4), if it has RDMA at all.
pub fn local_address() -> Option<IpAddr> {
    local_addresses().into_iter().next()
}

/// Every active RoCE v2 IPv4 address, one per port, in discovery order.
pub(super) fn local_addresses() -> Vec<IpAddr> {
    let Ok(devices) = discover(Path::new("/sys")) else {
        return vec![];
    };
    devices
        .iter()
        .flat_map(|d| d.ports.iter())
        .filter(|p| p.state == PortState::Active)
        .filter_map(|p| {
            p.gids
                .iter()
                .find(|g| g.kind == GidType::RoceV2 && matches!(g.ip, Some(IpAddr::V4(_))))
                .and_then(|g| g.ip)
        })
        .collect()
}

/// rdma_cm port for a step: distinct per step, so a listener of an earlier step never answers.
pub(super) fn port(step: usize) -> u16 {
    7471 + step as u16
}

/// Where rank 0 serves: its first active RoCE address.
pub(super) fn server_ip(ctx: &RankContext) -> Result<IpAddr> {
    ctx.peers[0]
        .rdma
        .context("rank 0 has no active RoCE interface")
}

/// The connections the server has finished with, once `count` of them are (or the deadline
/// passed: the caller's checks then see fewer).
pub(super) fn wait_served(
    server: &RdmaServer,
    count: usize,
    deadline: Duration,
) -> Vec<wringer_transport::rdma::server::Served> {
    let end = Instant::now() + deadline;
    while server.served().len() < count && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    server.served()
}

pub(super) fn options(max: u32, deadline: Duration) -> RcOptions {
    RcOptions {
        max_message: (max as usize).max(64),
        recv_depth: 16,
        timeout: deadline,
    }
}

/// Rank 0 accepts, rank 1 connects; the barrier makes sure the listener exists first.
pub(super) fn pair(
    ctx: &RankContext,
    step: usize,
    max: u32,
    deadline: Duration,
) -> Result<RcConnection> {
    let server = server_ip(ctx)?;
    let addr = SocketAddr::new(server, port(step));
    let opts = options(max, deadline);
    if ctx.rank == 0 {
        let listener =
            RcListener::bind(addr, opts).with_context(|| format!("rdma_cm listen on {addr}"))?;
        ctx.pair_barrier(step, "listening", deadline)?;
        Ok(listener
            .accept(deadline)
            .context("accepting the RC connection")?)
    } else {
        ctx.pair_barrier(step, "listening", deadline)?;
        Ok(connect(addr, opts).with_context(|| format!("connecting to {addr}"))?)
    }
}

pub(super) fn counts_into(c: &RcConnection, report: &mut StepReport) {
    report
        .metrics
        .insert(RDMA_COMPLETION_ERRORS, c.counts().errors() as f64);
    report
        .metrics
        .insert(RETRY_EXC_ERR, c.counts().get(WcStatus::RetryExcErr) as f64);
    report
        .notes
        .push(format!("rank completions by status: {:?}", c.counts().0));
}
