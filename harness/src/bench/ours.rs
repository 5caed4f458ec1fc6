//! Our side of each measurement: the transport over loopback, and the coordinator.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use wringer_transport::{Connection, ConnectionOptions};

use super::method::pin_this_thread;
use super::{CpuPinning, Sample};
use crate::model::duration::HumanDuration;
use crate::orchestration::coordinator::{self, Plan};
use crate::rank::steps::stall::Stall;
use crate::rank::steps::Step;

const T: Duration = Duration::from_secs(10);

/// Time each ping-pong round runs before it measures: sockperf's own warm-up, so both sides
/// measure a connection that is past slow start and has its buffers.
const WARM_UP: Duration = Duration::from_millis(400);

/// A connected pair over loopback, as plain streams: each end becomes a `Connection` on the
/// thread that uses it, so its receiver thread inherits that thread's CPU.
fn streams() -> Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let a = TcpStream::connect(l.local_addr()?)?;
    let (b, _) = l.accept()?;
    // As the transport's connect and listener set it, and as sockperf does.
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    Ok((a, b))
}

fn pair() -> Result<(Connection, Connection)> {
    let (a, b) = streams()?;
    let opts = options(None);
    Ok((
        Connection::from_stream(a, opts)?,
        Connection::from_stream(b, opts)?,
    ))
}

fn options(busy_poll: Option<Duration>) -> ConnectionOptions {
    ConnectionOptions {
        busy_poll,
        ..ConnectionOptions::default()
    }
}

/// Run `server` and `client` on threads of their own, pinned where `cpus` says (the threads
/// they start inherit the pin); the client's result once both have ended.
fn on_two_cpus<S, C>(cpus: Option<&CpuPinning>, server: S, client: C) -> Result<Sample>
where
    S: FnOnce() -> Result<()> + Send + 'static,
    C: FnOnce() -> Result<Sample> + Send + 'static,
{
    let (sc, cc) = (
        cpus.map(|p| p.server_cpus.clone()),
        cpus.map(|p| p.client_cpus.clone()),
    );
    let server = std::thread::spawn(move || pin_this_thread(sc.as_deref()).and_then(|()| server()));
    let client = std::thread::spawn(move || pin_this_thread(cc.as_deref()).and_then(|()| client()));
    let sample = client
        .join()
        .map_err(|_| anyhow::anyhow!("client thread panicked"))?;
    // The client's end is closed by now (or dropped on its error), which ends the server.
    let served = server
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))?;
    let sample = sample?;
    served?;
    Ok(sample)
}

/// One round of ping-pong: one-way latency p50 and p99 (µs, half the round trip, as sockperf
/// reports) through an echoing peer, measured for `run` after [`WARM_UP`]. `busy_poll` spins
/// both ends before they sleep.
pub fn pingpong(
    size: usize,
    run: Duration,
    busy_poll: Option<Duration>,
    cpus: Option<&CpuPinning>,
) -> Result<Sample> {
    let (a, b) = streams()?;
    let opts = options(busy_poll);
    let echo = move || -> Result<()> {
        let b = Connection::from_stream(b, opts)?;
        while let Ok(f) = b.recv(T) {
            if b.send(&f.payload, T).is_err() {
                break;
            }
            b.recycle(f.payload);
        }
        Ok(())
    };
    let client = move || -> Result<Sample> {
        let a = Connection::from_stream(a, opts)?;
        let msg = vec![0x5a; size];
        let mut hist = Histogram::<u64>::new(3)?;
        let measure_from = Instant::now() + WARM_UP;
        let end = measure_from + run;
        loop {
            let started = Instant::now();
            if started >= end {
                break;
            }
            a.send(&msg, T)?;
            let back = a.recv(T)?;
            let rtt = started.elapsed();
            anyhow::ensure!(
                back.payload.len() == size,
                "echo of {} bytes for {size}",
                back.payload.len()
            );
            a.recycle(back.payload);
            if started >= measure_from {
                hist.record(rtt.as_nanos() as u64 / 2)?;
            }
        }
        a.close()?;
        Ok(Sample {
            value: hist.value_at_quantile(0.5) as f64 / 1e3,
            p99: Some(hist.value_at_quantile(0.99) as f64 / 1e3),
            count: Some(hist.len()),
        })
    };
    on_two_cpus(cpus, echo, client)
}

/// One round of ping-pong with our frames but without our connection: each end encodes and
/// decodes on its own thread, straight on the socket, with no receiver thread to hand frames
/// over. Set beside [`pingpong`], it shows what the hand-off costs.
pub fn pingpong_inline(size: usize, run: Duration, cpus: Option<&CpuPinning>) -> Result<Sample> {
    use std::io::Write;
    use wringer_transport::frame::{Frame, Kind};
    use wringer_transport::stream::FrameReader;
    let (mut a, mut b) = streams()?;
    let never = AtomicBool::new(false);
    let echo = move || -> Result<()> {
        let never = AtomicBool::new(false);
        let mut reader = FrameReader::new(wringer_transport::frame::DEFAULT_MAX_PAYLOAD);
        while let Ok(wringer_transport::frame::ReadOutcome::Frame(f)) =
            reader.read_frame(&mut b, &never)
        {
            b.write_all(&f.encode())?;
            reader.give_buffer(f.payload);
        }
        Ok(())
    };
    let client = move || -> Result<Sample> {
        let mut reader = FrameReader::new(wringer_transport::frame::DEFAULT_MAX_PAYLOAD);
        let mut hist = Histogram::<u64>::new(3)?;
        let measure_from = Instant::now() + WARM_UP;
        let end = measure_from + run;
        let mut sequence = 0;
        loop {
            let started = Instant::now();
            if started >= end {
                break;
            }
            let frame = Frame::new(Kind::Data, sequence, vec![0x5a; size])?;
            sequence += 1;
            a.write_all(&frame.encode())?;
            match reader.read_frame(&mut a, &never)? {
                wringer_transport::frame::ReadOutcome::Frame(f) => anyhow::ensure!(
                    f.payload.len() == size,
                    "echo of {} bytes for {size}",
                    f.payload.len()
                ),
                other => anyhow::bail!("the echo ended: {other:?}"),
            }
            if started >= measure_from {
                hist.record(started.elapsed().as_nanos() as u64 / 2)?;
            }
        }
        Ok(Sample {
            value: hist.value_at_quantile(0.5) as f64 / 1e3,
            p99: Some(hist.value_at_quantile(0.99) as f64 / 1e3),
            count: Some(hist.len()),
        })
    };
    on_two_cpus(cpus, echo, client)
}

/// One round of single-connection bandwidth in Gbit/s: `messages` frames of `size` bytes,
/// measured at the receiver from its first frame to its last.
pub fn bandwidth(size: usize, messages: u64, cpus: Option<&CpuPinning>) -> Result<Sample> {
    let (a, b) = streams()?;
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = move || -> Result<()> {
        let b = Connection::from_stream(b, options(None))?;
        let mut bytes = 0u64;
        let mut first: Option<Instant> = None;
        let mut last = Instant::now();
        while let Ok(f) = b.recv(T) {
            first.get_or_insert_with(Instant::now);
            last = Instant::now();
            bytes += f.payload.len() as u64;
            b.recycle(f.payload);
        }
        let secs = first.map(|f| (last - f).as_secs_f64()).unwrap_or(0.0);
        let _ = tx.send((bytes, secs));
        Ok(())
    };
    let sender = move || -> Result<Sample> {
        let a = Connection::from_stream(a, options(None))?;
        let msg = vec![1u8; size];
        for _ in 0..messages {
            a.send(&msg, T)?;
        }
        a.flush(T)?;
        a.close()?;
        Ok(Sample::default())
    };
    on_two_cpus(cpus, sink, sender)?;
    let (bytes, secs) = rx.recv_timeout(T)?;
    anyhow::ensure!(
        bytes == size as u64 * messages && secs > 0.0,
        "the receiver got {bytes} of {} bytes",
        size as u64 * messages
    );
    Ok(Sample {
        // The first frame's bytes arrived before the clock started.
        value: (bytes - size as u64) as f64 * 8.0 / secs / 1e9,
        p99: None,
        count: Some(messages),
    })
}

/// Teardown cycles per second (connect a pair, close both), over `n` cycles.
pub fn teardown_rate(n: usize) -> Result<f64> {
    let started = Instant::now();
    for _ in 0..n {
        let (a, b) = pair()?;
        a.close()?;
        b.close()?;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Median time (ms) for the coordinator to start `ranks` local rank processes and finish the
/// rendezvous, over `tries` runs of a one-step scenario.
pub fn coordinator_startup(ranks: u32, tries: usize, log_dir: &Path) -> Result<f64> {
    let mut times = (0..tries)
        .map(|t| {
            let dir = log_dir.join(format!("startup-{ranks}-{t}"));
            startup_once(ranks, &crate::hosts::placement::local(), &dir)
        })
        .collect::<Result<Vec<f64>>>()?;
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

/// The time (ms) for the coordinator to start `ranks` ranks where `placement` puts them and
/// finish the rendezvous, in one run of a one-step scenario.
pub fn startup_once(
    ranks: u32,
    placement: &crate::hosts::placement::Placement,
    log_dir: &Path,
) -> Result<f64> {
    let steps = [Step::Stall(Stall {
        duration: HumanDuration(Duration::from_millis(1)),
        deadline: HumanDuration(Duration::from_secs(10)),
    })];
    let never = AtomicBool::new(false);
    let plan = Plan {
        scenario: "bench-launch",
        audit: &[],
        perturb: &[],
        backend: crate::model::scenario::AuditBackend::Strace,
        ranks,
        steps: &steps,
        faults: &[],
        deadline: Duration::from_secs(60),
        seed: 0,
        log_dir,
        interrupted: &never,
        placement,
        perturb_by: crate::orchestration::audit::PerturbBy::Strace,
        suppressions: &[],
    };
    let attempt = coordinator::run(&plan);
    if let Some(e) = attempt.setup_error {
        anyhow::bail!("{ranks} ranks: {e}");
    }
    Ok(attempt
        .rendezvous
        .context("the rendezvous never completed")?
        .as_secs_f64()
        * 1e3)
}

/// An RC connection to this host itself on `port`: the accepted side runs `serve` on a thread
/// (joined by [`joined`]), the connected side is returned.
fn rc_loopback(
    ip: std::net::IpAddr,
    port: u16,
    size: usize,
    serve: impl FnOnce(&mut wringer_transport::rdma::rc::RcConnection) -> Result<()> + Send + 'static,
) -> Result<(
    wringer_transport::rdma::rc::RcConnection,
    std::thread::JoinHandle<Result<()>>,
)> {
    use wringer_transport::rdma::rc::{connect, RcListener, RcOptions};
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

/// A fresh RDMA CM port for each round, so no round waits on the last one's port.
fn next_rc_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(7600);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn joined(server: std::thread::JoinHandle<Result<()>>) -> Result<()> {
    server
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))?
}

/// A cheap clock for timing each round trip, as perftest's cycle counter: the CPU's time-stamp
/// counter where there is one, scaled by the wall clock over the whole run. Inside the rxe VM
/// (TCG) a reading of the wall clock costs about 3 µs, which every round trip would carry.
struct Ticks {
    tsc: u64,
    wall: Instant,
}

impl Ticks {
    fn now() -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: RDTSC reads a counter; it has no preconditions on x86_64.
            unsafe { std::arch::x86_64::_rdtsc() }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
            EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
        }
    }

    fn start() -> Ticks {
        Ticks {
            tsc: Ticks::now(),
            wall: Instant::now(),
        }
    }

    /// Ticks per nanosecond since `start`.
    fn per_ns(&self) -> f64 {
        let ns = self.wall.elapsed().as_nanos().max(1) as f64;
        (Ticks::now() - self.tsc) as f64 / ns
    }
}

/// RDMA SEND one-way latency p50/p99 (µs) over an RC connection to this host itself.
pub fn rdma_pingpong(ip: std::net::IpAddr, size: usize, iters: u32) -> Result<Sample> {
    use wringer_transport::rdma::rc::Received;
    let (mut c, server) = rc_loopback(ip, next_rc_port(), size, move |c| {
        for _ in 0..iters {
            if let Received::Message(m) = c.recv(RC_TIMEOUT)? {
                c.send(&m, RC_TIMEOUT)?;
            }
        }
        Ok(())
    })?;
    let msg = vec![0x5au8; size];
    let mut hist = Histogram::<u64>::new(3)?;
    let mut ticks = Vec::with_capacity(iters as usize);
    let clock = Ticks::start();
    for _ in 0..iters {
        let t = Ticks::now();
        c.send(&msg, RC_TIMEOUT)?;
        c.recv(RC_TIMEOUT)?;
        ticks.push(Ticks::now() - t);
    }
    let per_ns = clock.per_ns();
    for t in ticks {
        hist.record((t as f64 / per_ns / 2.0) as u64)?;
    }
    joined(server)?;
    Ok(Sample {
        value: hist.value_at_quantile(0.5) as f64 / 1e3,
        p99: Some(hist.value_at_quantile(0.99) as f64 / 1e3),
        count: Some(iters.into()),
    })
}

/// RDMA SEND one-way latency p50/p99 (µs) with no copy on either side, as `ib_send_lat` runs:
/// the pinger sends from a region it registered, the echoing side receives in place and sends
/// the message back from the ring slot it landed in.
pub fn rdma_pingpong_in_place(ip: std::net::IpAddr, size: usize, iters: u32) -> Result<Sample> {
    use wringer_transport::rdma::rc::InPlace;
    let (mut c, server) = rc_loopback(ip, next_rc_port(), size, move |c| {
        for i in 0..iters {
            match c.recv_in_place(RC_TIMEOUT)? {
                InPlace::Message(m) => m.echo(RC_TIMEOUT)?,
                InPlace::Other(other) => anyhow::bail!("round {i}: expected a SEND, got {other:?}"),
            }
        }
        // The last echo must leave before the connection is torn down.
        c.finish_posted(RC_TIMEOUT)?;
        Ok(())
    })?;
    let mut msg = vec![0x5au8; size];
    // SAFETY: `msg` outlives the region (dropped below, after it) and is not written while the
    // NIC reads it.
    let region = unsafe { c.register_host(msg.as_mut_ptr(), size) }?;
    let mut hist = Histogram::<u64>::new(3)?;
    let mut ticks = Vec::with_capacity(iters as usize);
    let clock = Ticks::start();
    for _ in 0..iters {
        let t = Ticks::now();
        // As ib_send_lat: the send's own completion is reaped by the waits that follow, not
        // waited for (the bytes never change, so the NIC may read them again at any time).
        c.post_send_region(&region, 0, size, RC_TIMEOUT)?;
        drop(c.recv_in_place(RC_TIMEOUT)?);
        ticks.push(Ticks::now() - t);
    }
    c.finish_posted(RC_TIMEOUT)?;
    let per_ns = clock.per_ns();
    for t in ticks {
        hist.record((t as f64 / per_ns / 2.0) as u64)?;
    }
    drop(region);
    joined(server)?;
    Ok(Sample {
        value: hist.value_at_quantile(0.5) as f64 / 1e3,
        p99: Some(hist.value_at_quantile(0.99) as f64 / 1e3),
        count: Some(iters.into()),
    })
}

/// RDMA WRITE (with immediate) bandwidth in Gbit/s, measured at the writer: `iters` writes of
/// `size` bytes from a region the caller registered into the region the peer advertised, no
/// byte copied on either side, pipelined up to the send queue's depth.
pub fn rdma_write_bw(ip: std::net::IpAddr, size: usize, iters: u32) -> Result<Sample> {
    use wringer_transport::rdma::rc::{Received, RemoteRegion};
    let (mut c, server) = rc_loopback(ip, next_rc_port(), size, move |c| {
        let mut target = vec![0u8; size];
        // SAFETY: `target` outlives the region (dropped at the end of this closure, after it)
        // and nothing reads it while the peer writes.
        let region = unsafe { c.register_host(target.as_mut_ptr(), size) }?;
        c.send(&region.remote().to_bytes(), RC_TIMEOUT)?;
        for i in 0..iters {
            match c.recv(RC_TIMEOUT)? {
                Received::WrittenToRegion { imm, len } if imm == i && len == size => {}
                other => {
                    anyhow::bail!("write {i}: expected {size} bytes in the region, got {other:?}")
                }
            }
        }
        drop(region);
        Ok(())
    })?;
    let peer = match c.recv(RC_TIMEOUT)? {
        Received::Message(m) => {
            RemoteRegion::from_bytes(&m).context("the peer's region advert is not 16 bytes")?
        }
        other => anyhow::bail!("expected the peer's region advert, got {other:?}"),
    };
    let mut source = vec![0x77u8; size];
    // SAFETY: `source` outlives the region (dropped below, after it) and is not written while
    // the NIC reads it.
    let region = unsafe { c.register_host(source.as_mut_ptr(), size) }?;
    let t = Instant::now();
    for i in 0..iters {
        c.post_region_write(&region, 0, size, &peer, 0, i, RC_TIMEOUT)?;
    }
    c.finish_posted(RC_TIMEOUT)?;
    let secs = t.elapsed().as_secs_f64();
    drop(region);
    joined(server)?;
    Ok(Sample {
        value: size as f64 * iters as f64 * 8.0 / secs / 1e9,
        p99: None,
        count: Some(iters.into()),
    })
}
