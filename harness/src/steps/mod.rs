//! Step implementations: what each rank does for each step kind, and the evidence it reports.

mod adversary;
mod death;
mod gpu;
mod lazy;
mod pingpong;
pub mod rdma;
mod teardown;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use transport::{connect, ConnectOptions, Connection, Hello};

use crate::protocol::StepReport;
use crate::rank::Ctx;
use crate::scenario::Step;

pub fn run(step: &Step, ctx: &Ctx, index: usize) -> Result<StepReport> {
    let mut report = StepReport {
        step: index,
        ..StepReport::default()
    };
    let deadline = step.deadline().0;
    match step {
        Step::TeardownCycles { cycles, .. } => {
            teardown::run(ctx, index, *cycles, deadline, &mut report)?
        }
        Step::ExactReads {
            dribbled_frames,
            split_payload_bytes,
            ..
        } => adversary::exact_reads(
            ctx,
            *dribbled_frames,
            *split_payload_bytes,
            deadline,
            &mut report,
        )?,
        Step::EofTruncation { .. } => adversary::eof_truncation(ctx, index, deadline, &mut report)?,
        Step::ReceiverError { .. } => adversary::receiver_error(ctx, index, deadline, &mut report)?,
        Step::PeerDeath {
            victim,
            frames_before_fault,
            detect_timeout,
            ..
        } => death::peer_death(
            ctx,
            index,
            *victim,
            *frames_before_fault,
            detect_timeout.0,
            deadline,
            &mut report,
        )?,
        Step::ExitBeforeFirstExchange {
            exiting_rank,
            connect_timeout,
            ..
        } => death::exit_before_first_exchange(
            ctx,
            index,
            *exiting_rank,
            connect_timeout.0,
            &mut report,
        )?,
        Step::LazyConnect { wait_timeout, .. } => {
            lazy::run(ctx, index, wait_timeout.0, deadline, &mut report)?
        }
        Step::LazyConnectPartition {
            wait_timeout,
            connect_deadline,
            ..
        } => lazy::partition(
            ctx,
            index,
            wait_timeout.0,
            connect_deadline.0,
            deadline,
            &mut report,
        )?,
        Step::Pingpong {
            sizes, iterations, ..
        } => pingpong::run(ctx, index, sizes, *iterations, deadline, &mut report)?,
        Step::RdmaPingpong {
            sizes, iterations, ..
        } => rdma::pingpong(ctx, index, sizes, *iterations, deadline, &mut report)?,
        Step::RdmaLosslessStream { messages, size, .. } => {
            rdma::stream(ctx, index, *messages, *size, deadline, &mut report)?
        }
        Step::RdmaGracefulShutdown {
            connections,
            messages,
            stats_period,
            ..
        } => rdma::graceful_shutdown(
            ctx,
            index,
            *connections,
            *messages,
            stats_period.0,
            deadline,
            &mut report,
        )?,
        Step::RdmaInterfaceIndex { .. } => {
            rdma::interface_index(ctx, index, deadline, &mut report)?
        }
        Step::RdmaPeerDeath {
            frames_before_fault,
            detect_timeout,
            ..
        } => rdma::peer_death(
            ctx,
            index,
            *frames_before_fault,
            detect_timeout.0,
            deadline,
            &mut report,
        )?,
        Step::RdmaXhostSend {
            messages,
            server_seconds,
            ..
        } => rdma::xhost_send(
            ctx,
            index,
            *messages,
            server_seconds.0,
            deadline,
            &mut report,
        )?,
        Step::RdmaInteropRcPingpong {
            size, iterations, ..
        } => rdma::interop(ctx, *size, *iterations, deadline, &mut report)?,
        Step::GpuPingpongTcp {
            sizes,
            iterations,
            stream_messages,
            ..
        }
        | Step::GpuPingpongRdma {
            sizes,
            iterations,
            stream_messages,
            ..
        } => {
            let plan = gpu::Plan {
                sizes,
                iterations: *iterations,
                stream_messages: *stream_messages,
            };
            if matches!(step, Step::GpuPingpongTcp { .. }) {
                gpu::tcp(ctx, index, &plan, deadline, &mut report)?
            } else {
                gpu::rdma(ctx, index, &plan, deadline, &mut report)?
            }
        }
        Step::Stall { duration, .. } => std::thread::sleep(duration.0),
    }
    Ok(report)
}

/// Sequence numbers for lazy connects, unique per step so steps never collide.
pub fn seq(step: usize, n: u64) -> u64 {
    (step as u64) << 32 | n
}

/// Deterministic payload: the receiver can verify every byte without being told them.
pub fn pattern(seed: u64, tag: u64, len: usize) -> Vec<u8> {
    let mut x = seed ^ tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn connect_to(ctx: &Ctx, peer: u32, sequence: u64, deadline: Duration) -> Result<Connection> {
    let hello = Hello {
        rank: ctx.rank,
        sequence,
        generation: 0,
        token: ctx.token,
    };
    let opts = ConnectOptions {
        deadline,
        ..ConnectOptions::default()
    };
    Ok(connect(ctx.peers[peer as usize].transport, &hello, &opts)?)
}

pub fn raw_connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Accept one raw connection, waiting at most `timeout`.
pub fn accept_within(listener: &TcpListener, timeout: Duration) -> Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    bail!("no peer connected within {timeout:?}");
                }
                let mut pfd = libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call; the listener keeps
                // the fd open.
                unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Percentile (0..=100) of unsorted samples, or 0 for none.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let idx = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[idx.min(v.len() - 1)]
}

/// Wait (bounded) for this process's descriptor and thread counts to return to a baseline;
/// returns the remaining deltas. Threads that just finished need a moment to leave /proc.
pub fn settle(fds: usize, threads: usize, limit: Duration) -> (f64, f64) {
    let deadline = Instant::now() + limit;
    loop {
        let (f, t) = (crate::procfs::open_fds(), crate::procfs::threads());
        if (f == fds && t == threads) || Instant::now() >= deadline {
            return (f as f64 - fds as f64, t as f64 - threads as f64);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn fd_is_closed(fd: i32) -> bool {
    // SAFETY: F_GETFD only queries the descriptor table; an invalid fd yields EBADF.
    let rc = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
}
