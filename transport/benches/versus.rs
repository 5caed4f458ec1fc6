//! Our TCP transport against the reference tools, in the same run, on the same sizes:
//! ping-pong latency against `sockperf ping-pong --tcp`, 1 MiB stream bandwidth against
//! `iperf3`, plus teardown cycle times. Prints a Markdown table with ratios.
//!
//! Latency is one-way (half the round trip), which is what sockperf reports. A missing tool is
//! reported as "not installed", not silently skipped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
mod common;

use common::pair;

const T: Duration = Duration::from_secs(10);
const SIZES: [usize; 4] = [64, 4096, 65536, 1 << 20];
/// sockperf refuses messages of 1 MiB or more; its largest is compared with our 1 MiB.
const SOCKPERF_MAX: usize = (1 << 20) - 1;

fn main() {
    let secs: u64 = std::env::var("VERSUS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let run = Duration::from_secs(secs);
    println!("| measure | wringer | reference | ratio (wringer/reference) |");
    println!("|---|---|---|---|");
    for size in SIZES {
        let ours = our_pingpong(size, run);
        let theirs = sockperf_pingpong(size.min(SOCKPERF_MAX), run);
        for (label, idx) in [("p50", 0), ("p99", 1)] {
            let o = [ours.0, ours.1][idx];
            let (t, ratio) = match &theirs {
                Ok(t) => {
                    let t = [t.0, t.1][idx];
                    (format!("{t:.1} µs (sockperf)"), format!("{:.2}", o / t))
                }
                Err(why) => (why.clone(), "-".into()),
            };
            println!(
                "| ping-pong {} {label} | {o:.1} µs | {t} | {ratio} |",
                human(size)
            );
        }
    }
    let ours = our_bandwidth(run);
    match iperf3_bandwidth(run) {
        Ok(t) => println!(
            "| stream 1 MiB | {ours:.2} Gbit/s | {t:.2} Gbit/s (iperf3) | {:.2} |",
            ours / t
        ),
        Err(why) => println!("| stream 1 MiB | {ours:.2} Gbit/s | {why} | - |"),
    }
    let (p50, p99, per_sec) = teardown_cycles(2000);
    println!("| teardown cycle p50 / p99 | {p50:.1} / {p99:.1} µs | - | - |");
    println!("| teardown cycles per second | {per_sec:.0} | - | - |");
}

fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s if s >= 1024 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// One-way latency percentiles (µs) of a ping-pong through an echoing peer.
fn our_pingpong(size: usize, run: Duration) -> (f64, f64) {
    let (a, b) = pair();
    let echo = std::thread::spawn(move || {
        while let Ok(f) = b.recv(T) {
            if b.send(&f.payload, T).is_err() {
                break;
            }
        }
    });
    let msg = vec![0x5a; size];
    let mut hist = Histogram::<u64>::new(3).unwrap();
    let warmup = Instant::now() + run / 10;
    let end = Instant::now() + run;
    while Instant::now() < end {
        let started = Instant::now();
        a.send(&msg, T).unwrap();
        let back = a.recv(T).unwrap();
        let rtt = started.elapsed();
        assert_eq!(back.payload.len(), size);
        if started > warmup {
            hist.record(rtt.as_nanos() as u64 / 2).unwrap();
        }
    }
    a.close().unwrap();
    echo.join().unwrap();
    (
        hist.value_at_quantile(0.5) as f64 / 1e3,
        hist.value_at_quantile(0.99) as f64 / 1e3,
    )
}

fn our_bandwidth(run: Duration) -> f64 {
    let (a, b) = pair();
    let sink = std::thread::spawn(move || {
        let mut bytes = 0u64;
        let started = Instant::now();
        while let Ok(f) = b.recv(T) {
            bytes += f.payload.len() as u64;
        }
        bytes as f64 * 8.0 / started.elapsed().as_secs_f64() / 1e9
    });
    let msg = vec![1u8; 1 << 20];
    let end = Instant::now() + run;
    while Instant::now() < end {
        a.send(&msg, T).unwrap();
    }
    a.flush(T).unwrap();
    a.close().unwrap();
    sink.join().unwrap()
}

fn teardown_cycles(n: usize) -> (f64, f64, f64) {
    let mut hist = Histogram::<u64>::new(3).unwrap();
    let started = Instant::now();
    for _ in 0..n {
        let (a, b) = pair();
        let t = Instant::now();
        a.close().unwrap();
        b.close().unwrap();
        hist.record(t.elapsed().as_nanos() as u64).unwrap();
    }
    let per_sec = n as f64 / started.elapsed().as_secs_f64();
    (
        hist.value_at_quantile(0.5) as f64 / 1e3,
        hist.value_at_quantile(0.99) as f64 / 1e3,
        per_sec,
    )
}

/// A reference tool's process, killed (by PID) and reaped on every exit path.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn(cmd: &[&str]) -> Result<Reaped, String> {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(Reaped)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                format!("{} not installed", cmd[0])
            } else {
                e.to_string()
            }
        })
}

/// Wait (bounded) until something listens on 127.0.0.1:`port`, read from /proc/net/tcp so the
/// check itself does not connect to the tool.
fn wait_listening(port: u16) -> Result<(), String> {
    let needle = format!("0100007F:{port:04X}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        if table.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1] == needle && f[3] == "0A"
        }) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!("nothing listened on port {port}"))
}

/// Run a client to completion within `limit`, returning its stdout.
fn run_client(cmd: &[&str], limit: Duration) -> Result<String, String> {
    let mut child = spawn(cmd)?;
    let deadline = Instant::now() + limit;
    loop {
        match child.0.try_wait().map_err(|e| e.to_string())? {
            Some(_) => break,
            None if Instant::now() > deadline => return Err(format!("{} timed out", cmd[0])),
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let mut out = String::new();
    use std::io::Read;
    if let Some(mut s) = child.0.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    if let Some(mut s) = child.0.stderr.take() {
        let _ = s.read_to_string(&mut out);
    }
    Ok(out)
}

fn sockperf_pingpong(size: usize, run: Duration) -> Result<(f64, f64), String> {
    let port = free_port().to_string();
    let max = SOCKPERF_MAX.to_string();
    let _server = spawn(&[
        "sockperf",
        "server",
        "--tcp",
        "-i",
        "127.0.0.1",
        "-p",
        &port,
        "-m",
        &max,
    ])?;
    wait_listening(port.parse().unwrap())?;
    let (m, t) = (size.to_string(), run.as_secs().max(1).to_string());
    let out = run_client(
        &[
            "sockperf",
            "ping-pong",
            "--tcp",
            "-i",
            "127.0.0.1",
            "-p",
            &port,
            "-m",
            &m,
            "-t",
            &t,
        ],
        run * 4 + T,
    )?;
    let pct = |p: &str| {
        out.lines()
            .find(|l| l.contains(&format!("percentile {p} =")))
            .and_then(|l| l.rsplit('=').next())
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    match (pct("50.000"), pct("99.000")) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(format!(
            "unparsable sockperf output: {}",
            out.lines().last().unwrap_or("")
        )),
    }
}

fn iperf3_bandwidth(run: Duration) -> Result<f64, String> {
    let port = free_port().to_string();
    let _server = spawn(&["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", &port])?;
    wait_listening(port.parse().unwrap())?;
    let t = run.as_secs().max(1).to_string();
    let out = run_client(
        &[
            "iperf3",
            "-c",
            "127.0.0.1",
            "-p",
            &port,
            "-l",
            "1M",
            "-t",
            &t,
            "-J",
        ],
        run * 4 + T,
    )?;
    let after = out
        .split("\"sum_received\"")
        .nth(1)
        .ok_or("no sum_received in iperf3 output")?;
    let bps = after
        .split("\"bits_per_second\":")
        .nth(1)
        .and_then(|s| s.split([',', '}']).next())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .ok_or("no bits_per_second in iperf3 output")?;
    Ok(bps / 1e9)
}
