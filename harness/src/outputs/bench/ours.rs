//! Our side of each measurement: the transport over loopback, and the coordinator.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use transport::{Connection, ConnectionOptions};

use crate::model::duration::Dur;
use crate::orchestration::coordinator::{self, Plan};
use crate::rank::steps::stall::Stall;
use crate::rank::steps::Step;

const T: Duration = Duration::from_secs(10);

fn pair(busy_poll: Option<Duration>) -> Result<(Connection, Connection)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let a = TcpStream::connect(l.local_addr()?)?;
    let (b, _) = l.accept()?;
    let opts = ConnectionOptions {
        busy_poll,
        ..ConnectionOptions::default()
    };
    Ok((
        Connection::from_stream(a, opts)?,
        Connection::from_stream(b, opts)?,
    ))
}

/// One-way latency p50 and p99 (µs, half the round trip, as sockperf reports) through an
/// echoing peer, after a 10% warm-up. `busy_poll` spins both ends before they sleep.
pub fn pingpong(size: usize, run: Duration, busy_poll: Option<Duration>) -> Result<(f64, f64)> {
    let (a, b) = pair(busy_poll)?;
    let echo = std::thread::spawn(move || {
        while let Ok(f) = b.recv(T) {
            if b.send(&f.payload, T).is_err() {
                break;
            }
            b.recycle(f.payload);
        }
    });
    let msg = vec![0x5a; size];
    let mut hist = Histogram::<u64>::new(3)?;
    let warm = Instant::now() + run / 10;
    let end = Instant::now() + run;
    while Instant::now() < end {
        let started = Instant::now();
        a.send(&msg, T)?;
        let back = a.recv(T)?;
        let rtt = started.elapsed();
        anyhow::ensure!(
            back.payload.len() == size,
            "echo of {} bytes for {size}",
            back.payload.len()
        );
        if started > warm {
            hist.record(rtt.as_nanos() as u64 / 2)?;
        }
    }
    a.close()?;
    echo.join()
        .map_err(|_| anyhow::anyhow!("echo thread panicked"))?;
    Ok((
        hist.value_at_quantile(0.5) as f64 / 1e3,
        hist.value_at_quantile(0.99) as f64 / 1e3,
    ))
}

/// Single-connection bandwidth in Gbit/s with 1 MiB frames, measured at the receiver.
pub fn bandwidth(run: Duration) -> Result<f64> {
    let (a, b) = pair(None)?;
    let sink = std::thread::spawn(move || {
        let mut bytes = 0u64;
        let mut first: Option<Instant> = None;
        while let Ok(f) = b.recv(T) {
            first.get_or_insert_with(Instant::now);
            bytes += f.payload.len() as u64;
            b.recycle(f.payload);
        }
        let secs = first
            .map(|f| f.elapsed().as_secs_f64())
            .unwrap_or(f64::INFINITY);
        bytes as f64 * 8.0 / secs / 1e9
    });
    let msg = vec![1u8; 1 << 20];
    let end = Instant::now() + run;
    while Instant::now() < end {
        a.send(&msg, T)?;
    }
    a.flush(T)?;
    a.close()?;
    sink.join()
        .map_err(|_| anyhow::anyhow!("sink thread panicked"))
}

/// Teardown cycles per second (connect a pair, close both), over `n` cycles.
pub fn teardown_rate(n: usize) -> Result<f64> {
    let started = Instant::now();
    for _ in 0..n {
        let (a, b) = pair(None)?;
        a.close()?;
        b.close()?;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Median time (ms) for the coordinator to start `ranks` rank processes and finish the
/// rendezvous, over `tries` runs of a one-step scenario.
pub fn coordinator_startup(ranks: u32, tries: usize, log_dir: &Path) -> Result<f64> {
    let steps = [Step::Stall(Stall {
        duration: Dur(Duration::from_millis(1)),
        deadline: Dur(Duration::from_secs(10)),
    })];
    let never = AtomicBool::new(false);
    let mut times = vec![];
    for t in 0..tries {
        let dir = log_dir.join(format!("startup-{ranks}-{t}"));
        let plan = Plan {
            audit: &[],
            perturb: &[],
            ranks,
            steps: &steps,
            faults: &[],
            deadline: Duration::from_secs(60),
            seed: 0,
            log_dir: &dir,
            interrupted: &never,
            placement: &crate::hosts::placement::Placement::Local,
        };
        let attempt = coordinator::run(&plan);
        if let Some(e) = attempt.setup_error {
            anyhow::bail!("{ranks} ranks: {e}");
        }
        times.push(
            attempt
                .rendezvous
                .context("the rendezvous never completed")?
                .as_secs_f64()
                * 1e3,
        );
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

/// An RC connection to this host itself on `port`: the accepted side runs `serve` on a thread
/// (joined by [`joined`]), the connected side is returned.
fn rc_loopback(
    ip: std::net::IpAddr,
    port: u16,
    size: usize,
    serve: impl FnOnce(&mut transport::rdma::rc::RcConnection) -> Result<()> + Send + 'static,
) -> Result<(
    transport::rdma::rc::RcConnection,
    std::thread::JoinHandle<Result<()>>,
)> {
    use transport::rdma::rc::{connect, RcListener, RcOptions};
    let addr = std::net::SocketAddr::new(ip, port);
    let opts = RcOptions {
        max_message: size.max(64),
        recv_depth: 16,
        timeout: RC_TIMEOUT,
    };
    let listener = RcListener::bind(addr, opts)?;
    let server = std::thread::spawn(move || serve(&mut listener.accept(RC_TIMEOUT)?));
    Ok((connect(addr, opts)?, server))
}

const RC_TIMEOUT: Duration = Duration::from_secs(30);

fn joined(server: std::thread::JoinHandle<Result<()>>) -> Result<()> {
    server
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))?
}

/// RDMA SEND one-way latency p50/p99 (µs) over an RC connection to this host itself.
pub fn rdma_pingpong(ip: std::net::IpAddr, size: usize, iters: u32) -> Result<(f64, f64)> {
    use transport::rdma::rc::Received;
    let (mut c, server) = rc_loopback(ip, 7600, size, move |c| {
        for _ in 0..iters {
            if let Received::Message(m) = c.recv(RC_TIMEOUT)? {
                c.send(&m, RC_TIMEOUT)?;
            }
        }
        Ok(())
    })?;
    let msg = vec![0x5au8; size];
    let mut hist = Histogram::<u64>::new(3)?;
    for _ in 0..iters {
        let t = Instant::now();
        c.send(&msg, RC_TIMEOUT)?;
        c.recv(RC_TIMEOUT)?;
        hist.record(t.elapsed().as_nanos() as u64 / 2)?;
    }
    joined(server)?;
    Ok((
        hist.value_at_quantile(0.5) as f64 / 1e3,
        hist.value_at_quantile(0.99) as f64 / 1e3,
    ))
}

/// RDMA WRITE (with immediate) bandwidth in Gbit/s, measured at the writer.
pub fn rdma_write_bw(ip: std::net::IpAddr, size: usize, iters: u32) -> Result<f64> {
    let (mut c, server) = rc_loopback(ip, 7601, size, move |c| {
        for _ in 0..iters {
            c.recv(RC_TIMEOUT)?;
        }
        Ok(())
    })?;
    let msg = vec![0x77u8; size];
    let t = Instant::now();
    for i in 0..iters {
        c.write_imm(&msg, i, RC_TIMEOUT)?;
    }
    let secs = t.elapsed().as_secs_f64();
    joined(server)?;
    Ok(size as f64 * iters as f64 * 8.0 / secs / 1e9)
}
