//! RDMA steps: RC connections over rdma_cm between rank 0 (server) and rank 1 (client), on the
//! first active RoCE interface each rank found.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use transport::rdma::discovery::{discover, GidType, PortState};
use transport::rdma::rc::{
    connect, RcConnection, RcListener, RcOptions, RdmaError, Received, RemoteRegion,
};
use transport::rdma::server::{RdmaServer, ServerOptions};

use super::pattern;
use crate::protocol::StepReport;
use crate::rank::Ctx;

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
fn local_addresses() -> Vec<IpAddr> {
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
fn port(step: usize) -> u16 {
    7471 + step as u16
}

/// Both ranks pass the step's barrier `name` (rank 0 and rank 1 only).
pub(super) fn barrier(ctx: &Ctx, step: usize, name: &str, deadline: Duration) -> Result<()> {
    ctx.control
        .barrier(&format!("rdma-{step}-{name}"), 2, deadline)
}

/// Where rank 0 serves: its first active RoCE address.
fn server_ip(ctx: &Ctx) -> Result<IpAddr> {
    ctx.peers[0]
        .rdma
        .context("rank 0 has no active RoCE interface")
}

/// The connections the server has finished with, once `count` of them are (or the deadline
/// passed: the caller's checks then see fewer).
fn wait_served(
    server: &RdmaServer,
    count: usize,
    deadline: Duration,
) -> Vec<transport::rdma::server::Served> {
    let end = Instant::now() + deadline;
    while server.served().len() < count && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    server.served()
}

fn options(max: u32, deadline: Duration) -> RcOptions {
    RcOptions {
        max_message: (max as usize).max(64),
        recv_depth: 16,
        timeout: deadline,
    }
}

/// Rank 0 accepts, rank 1 connects; the barrier makes sure the listener exists first.
pub(super) fn pair(ctx: &Ctx, step: usize, max: u32, deadline: Duration) -> Result<RcConnection> {
    let server = server_ip(ctx)?;
    let addr = SocketAddr::new(server, port(step));
    let opts = options(max, deadline);
    if ctx.rank == 0 {
        let listener =
            RcListener::bind(addr, opts).with_context(|| format!("rdma_cm listen on {addr}"))?;
        barrier(ctx, step, "listening", deadline)?;
        Ok(listener
            .accept(deadline)
            .context("accepting the RC connection")?)
    } else {
        barrier(ctx, step, "listening", deadline)?;
        Ok(connect(addr, opts).with_context(|| format!("connecting to {addr}"))?)
    }
}

pub(super) fn counts_into(c: &RcConnection, report: &mut StepReport) {
    report
        .metrics
        .insert("rdma_completion_errors".into(), c.counts().errors() as f64);
    report.metrics.insert(
        "retry_exc_err".into(),
        c.counts().get("RETRY_EXC_ERR") as f64,
    );
    report
        .notes
        .push(format!("rank completions by status: {:?}", c.counts().0));
}

pub fn pingpong(
    ctx: &Ctx,
    step: usize,
    sizes: &[u32],
    iterations: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if ctx.rank > 1 {
        return Ok(());
    }
    let max = sizes.iter().copied().max().unwrap_or(64);
    let mut c = pair(ctx, step, max, deadline)?;
    let (mut messages, mut mismatches) = (0u32, 0u32);
    for &size in sizes {
        for (kind, write) in [("send", false), ("write", true)] {
            let mut samples = vec![];
            for it in 0..iterations {
                let expected = pattern(
                    ctx.seed,
                    (size as u64) << 20 | it as u64 | (write as u64) << 60,
                    size as usize,
                );
                if ctx.rank == 1 {
                    let started = Instant::now();
                    if write {
                        c.write_imm(&expected, it, deadline)?;
                    } else {
                        c.send(&expected, deadline)?;
                    }
                    let back = c.recv(deadline)?;
                    samples.push(started.elapsed().as_secs_f64() * 1e6 / 2.0);
                    mismatches += !matches_payload(&back, &expected, write, it) as u32;
                } else {
                    let got = c.recv(deadline)?;
                    mismatches += !matches_payload(&got, &expected, write, it) as u32;
                    if write {
                        c.write_imm(&expected, it, deadline)?;
                    } else {
                        c.send(&expected, deadline)?;
                    }
                }
                messages += 1;
            }
            if !samples.is_empty() {
                let series = if write {
                    "write_latency_us"
                } else {
                    "latency_us"
                };
                report.samples.insert(format!("{series}/{size}"), samples);
            }
            let _ = kind;
        }
    }
    let (m, bad) = region_pingpong(ctx, &mut c, sizes, iterations, deadline, report)?;
    messages += m;
    mismatches += bad;
    report
        .metrics
        .insert("rdma_messages".into(), messages as f64);
    report
        .metrics
        .insert("rdma_data_mismatches".into(), mismatches as f64);
    counts_into(&c, report);
    barrier(ctx, step, "done", deadline)?;
    Ok(())
}

/// Ping-pong by RDMA WRITE between memory the step owns and registered itself (the path GPU
/// buffers take when staged): the receiver finds the bytes in its own region, nothing copied.
fn region_pingpong(
    ctx: &Ctx,
    c: &mut RcConnection,
    sizes: &[u32],
    iterations: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<(u32, u32)> {
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
    let (mut messages, mut mismatches) = (0, 0);
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
            let ok = got == Received::WrittenToRegion { imm: it, len: size }
                && memory[max..max + size] == expected[..];
            mismatches += !ok as u32;
            if ctx.rank == 1 {
                samples.push(started.elapsed().as_secs_f64() * 1e6 / 2.0);
            } else {
                // Echo the bytes from where they landed.
                c.write_region_imm(&region, max, size, &peer, max as u64, it, deadline)?;
            }
            messages += 1;
        }
        if !samples.is_empty() {
            report
                .samples
                .insert(format!("region_write_latency_us/{size}"), samples);
        }
    }
    drop(region);
    Ok((messages, mismatches))
}

fn matches_payload(got: &Received, expected: &[u8], write: bool, it: u32) -> bool {
    match got {
        Received::Message(m) => !write && m == expected,
        Received::Written { imm, data } => write && *imm == it && data == expected,
        Received::WrittenToRegion { .. } => false,
    }
}

pub fn stream(
    ctx: &Ctx,
    step: usize,
    messages: u32,
    size: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if ctx.rank > 1 {
        return Ok(());
    }
    let mut c = pair(ctx, step, size, deadline)?;
    let end = Instant::now() + deadline;
    if ctx.rank == 1 {
        let mut sent = 0u32;
        for i in 0..messages {
            c.send(
                &pattern(ctx.seed, i as u64, size as usize),
                end.saturating_duration_since(Instant::now()),
            )?;
            sent += 1;
        }
        report
            .metrics
            .insert("rdma_tx_messages".into(), sent as f64);
    } else {
        let (mut received, mut bytes, mut corrupt) = (0u32, 0u64, 0u32);
        while received < messages {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("only {received} of {messages} messages arrived within the step deadline");
            }
            match c.recv(left)? {
                Received::Message(m) => {
                    corrupt += (m != pattern(ctx.seed, received as u64, size as usize)) as u32;
                    bytes += m.len() as u64;
                    received += 1;
                }
                other => bail!("unexpected {other:?} in a SEND stream"),
            }
        }
        report
            .metrics
            .insert("rdma_rx_messages".into(), received as f64);
        report.metrics.insert("rdma_rx_bytes".into(), bytes as f64);
        report.metrics.insert(
            "rdma_dropped".into(),
            (messages - received + corrupt) as f64,
        );
    }
    counts_into(&c, report);
    barrier(ctx, step, "done", deadline)?;
    Ok(())
}

pub fn graceful_shutdown(
    ctx: &Ctx,
    step: usize,
    connections: u32,
    messages: u32,
    stats_period: Duration,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if ctx.rank > 1 {
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
        })?;
        barrier(ctx, step, "listening", deadline)?;
        barrier(ctx, step, "clients-done", deadline)?;
        // Every disconnect is handled by the server's CM loop; wait (bounded) for all of them.
        let served = wait_served(&server, connections as usize, deadline);
        let started = Instant::now();
        let stats = server.shutdown();
        let m = &mut report.metrics;
        m.insert(
            "rdma_shutdown_ms".into(),
            started.elapsed().as_secs_f64() * 1e3,
        );
        m.insert("rdma_connections_served".into(), served.len() as f64);
        m.insert("rdma_workers_joined".into(), stats.workers_joined as f64);
        m.insert("rdma_pool_leaked".into(), (pool - stats.pool_free) as f64);
        m.insert("rdma_stats_samples".into(), stats.stats_samples as f64);
        m.insert(
            "rdma_completion_errors".into(),
            stats.completion_errors as f64,
        );
        report.notes.push(format!(
            "server: {stats:?}; every worker's buffers came back after its join: {}",
            served.iter().all(|s| s.buffers_returned_after_join)
        ));
    } else {
        barrier(ctx, step, "listening", deadline)?;
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
            .insert("rdma_data_mismatches".into(), mismatches as f64);
        barrier(ctx, step, "clients-done", deadline)?;
    }
    Ok(())
}

pub fn interface_index(
    ctx: &Ctx,
    step: usize,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if ctx.rank > 1 {
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
            interfaces: interfaces.clone(),
            port: port(step),
            rc,
            pool: 4,
            stats_period: Duration::from_millis(20),
        })?;
        barrier(ctx, step, "listening", deadline)?;
        barrier(ctx, step, "clients-done", deadline)?;
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
            .insert("rdma_interfaces_served".into(), distinct.len() as f64);
        report
            .metrics
            .insert("rdma_interface_mismatches".into(), mismatches as f64);
        server.shutdown();
    } else {
        barrier(ctx, step, "listening", deadline)?;
        for ip in &addresses {
            let mut conn = connect(SocketAddr::new(*ip, port(step)), rc)?;
            let msg = ip.to_string().into_bytes();
            conn.send(&msg, deadline)?;
            if conn.recv(deadline)? != Received::Message(msg) {
                bail!("the echo from {ip} differs");
            }
        }
        barrier(ctx, step, "clients-done", deadline)?;
    }
    Ok(())
}

pub fn peer_death(
    ctx: &Ctx,
    step: usize,
    frames_before_fault: u32,
    detect_timeout: Duration,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if ctx.rank > 1 {
        return Ok(());
    }
    let mut c = pair(ctx, step, 4096, deadline)?;
    let payload = vec![0xd1u8; 1024];
    if ctx.rank == 1 {
        for _ in 0..frames_before_fault {
            c.send(&payload, deadline)?;
        }
        ctx.control.point(step, "mid-stream")?;
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if c.send(&payload, detect_timeout).is_err() {
                break;
            }
        }
        bail!("still alive at the end of the step: no fault struck at `mid-stream`");
    }
    let mut frames = 0u64;
    let mut last = Instant::now();
    let error = loop {
        match c.recv(detect_timeout) {
            Ok(_) => {
                frames += 1;
                last = Instant::now();
            }
            Err(e) => break e,
        }
    };
    let detect_ms = last.elapsed().as_secs_f64() * 1e3;
    report.metrics.insert("survivor_detected".into(), 1.0);
    report.metrics.insert("detect_ms".into(), detect_ms);
    let how = match error {
        RdmaError::Disconnected => "rdma_cm DISCONNECTED".to_string(),
        e => e.to_string(),
    };
    report.notes.push(format!(
        "rank 0 received {frames} messages, then: {how} ({detect_ms:.1} ms after the last)"
    ));
    Ok(())
}

pub fn xhost_send(
    ctx: &Ctx,
    step: usize,
    messages: u32,
    server_seconds: Duration,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    if ctx.rank > 1 {
        return Ok(());
    }
    let server_ip = server_ip(ctx)?;
    let rc = options(4096, deadline);
    if ctx.rank == 0 {
        let started = Instant::now();
        // The server posts its receives before it accepts (RdmaServer does, by construction).
        let server = RdmaServer::start(ServerOptions {
            interfaces: vec![server_ip],
            port: port(step),
            rc,
            pool: 2,
            stats_period: Duration::from_millis(100),
        })?;
        barrier(ctx, step, "listening", deadline)?;
        barrier(ctx, step, "clients-done", deadline)?;
        // Serve until the timer, then shut down gracefully: the exit must follow the timer.
        let timer = started + server_seconds;
        while Instant::now() < timer {
            std::thread::sleep(Duration::from_millis(20));
        }
        let t = Instant::now();
        let served = server.served();
        let stats = server.shutdown();
        report
            .metrics
            .insert("rdma_shutdown_ms".into(), t.elapsed().as_secs_f64() * 1e3);
        report.metrics.insert(
            "rdma_rx_messages".into(),
            served.iter().map(|s| s.messages).sum::<u64>() as f64,
        );
        report.metrics.insert(
            "rdma_completion_errors".into(),
            stats.completion_errors as f64,
        );
        report
            .notes
            .push(format!("server on {server_ip}: {stats:?}"));
    } else {
        barrier(ctx, step, "listening", deadline)?;
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
        report
            .metrics
            .insert("rdma_tx_messages".into(), sent as f64);
        report.metrics.insert("rdma_echoes".into(), echoes as f64);
        report.metrics.insert(
            "retry_exc_err".into(),
            conn.counts().get("RETRY_EXC_ERR") as f64,
        );
        report.notes.push(format!(
            "client {:?} -> {server_ip}: {:?}",
            local_address(),
            conn.counts().0
        ));
        drop(conn);
        barrier(ctx, step, "clients-done", deadline)?;
    }
    Ok(())
}

/// `ibv_rc_pingpong` as a child, within `limit`: whether it succeeded, and its output.
fn reference(args: &[String], limit: Duration) -> Result<(bool, String)> {
    let cmd: Vec<&str> = std::iter::once("ibv_rc_pingpong")
        .chain(args.iter().map(String::as_str))
        .collect();
    let (status, out) = crate::child::run_bounded(&cmd, limit)
        .map_err(|e| anyhow::anyhow!("{e} (it comes with ibverbs-utils)"))?;
    Ok((status.is_some_and(|s| s.success()), out))
}

pub fn interop(
    ctx: &Ctx,
    size: u32,
    iterations: u32,
    deadline: Duration,
    report: &mut StepReport,
) -> Result<()> {
    use transport::rdma::compat::{run, CompatOptions, Role};
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
        report
            .metrics
            .insert(format!("interop_as_{role}"), ok as u8 as f64);
    }
    report
        .metrics
        .insert("rdma_completion_errors".into(), errors as f64);
    Ok(())
}
