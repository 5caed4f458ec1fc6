//! The reference tools (`sockperf`, `iperf3`) as child processes: started on loopback, waited
//! for with deadlines, killed by PID and reaped on every path.

use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// sockperf refuses messages of 1 MiB or more; its largest is compared with our 1 MiB.
pub const SOCKPERF_MAX: usize = (1 << 20) - 1;

/// A child process, killed and reaped when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(cmd: &[&str]) -> Result<Reaped, String> {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(Reaped)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("{} is not installed", cmd[0]),
            _ => format!("{}: {e}", cmd[0]),
        })
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// Start a server that will listen on `port`, and wait (bounded) until it does. Readiness is
/// read from /proc/net/tcp, so the check never connects to the tool itself.
fn start_server(cmd: &[&str], port: u16) -> Result<Reaped, String> {
    let server = spawn(cmd)?;
    let needle = format!(":{port:04X}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let listening = table.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&needle) && f[3] == "0A"
        });
        if listening {
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!("{} never listened on port {port}", cmd[0]))
}

/// Run a client to completion within `limit`; its stdout and stderr.
fn run_client(cmd: &[&str], limit: Duration) -> Result<String, String> {
    let mut child = spawn(cmd)?;
    let mut pipes = (child.0.stdout.take(), child.0.stderr.take());
    // Drain on a thread so a chatty client cannot block on a full pipe.
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        if let Some(s) = pipes.0.as_mut() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(s) = pipes.1.as_mut() {
            let _ = s.read_to_string(&mut out);
        }
        out
    });
    let deadline = Instant::now() + limit;
    loop {
        match child.0.try_wait().map_err(|e| e.to_string())? {
            Some(_) => break,
            None if Instant::now() > deadline => {
                return Err(format!("{} did not finish within {limit:?}", cmd[0]))
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    Ok(reader.join().unwrap_or_default())
}

/// One-way latency p50 and p99 in µs from `sockperf ping-pong --tcp`.
pub fn sockperf_pingpong(size: usize, run: Duration) -> Result<(f64, f64), String> {
    let port = free_port()?;
    let (p, max) = (port.to_string(), SOCKPERF_MAX.to_string());
    let _server = start_server(
        &[
            "sockperf",
            "server",
            "--tcp",
            "-i",
            "127.0.0.1",
            "-p",
            &p,
            "-m",
            &max,
        ],
        port,
    )?;
    let (m, t) = (
        size.min(SOCKPERF_MAX).to_string(),
        run.as_secs().max(1).to_string(),
    );
    let out = run_client(
        &[
            "sockperf",
            "ping-pong",
            "--tcp",
            "-i",
            "127.0.0.1",
            "-p",
            &p,
            "-m",
            &m,
            "-t",
            &t,
        ],
        run * 4 + Duration::from_secs(10),
    )?;
    let pct = |q: &str| {
        out.lines()
            .find(|l| l.contains(&format!("percentile {q} =")))
            .and_then(|l| l.rsplit('=').next())
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    match (pct("50.000"), pct("99.000")) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(format!(
            "unreadable sockperf output: {}",
            out.lines().last().unwrap_or("")
        )),
    }
}

/// Single-stream bandwidth in Gbit/s from `iperf3` with 1 MiB writes.
pub fn iperf3_bandwidth(run: Duration) -> Result<f64, String> {
    let port = free_port()?;
    let p = port.to_string();
    let _server = start_server(&["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", &p], port)?;
    let t = run.as_secs().max(1).to_string();
    let out = run_client(
        &[
            "iperf3",
            "-c",
            "127.0.0.1",
            "-p",
            &p,
            "-l",
            "1M",
            "-t",
            &t,
            "-J",
        ],
        run * 4 + Duration::from_secs(10),
    )?;
    let json: serde_json::Value =
        serde_json::from_str(&out).map_err(|e| format!("unreadable iperf3 output: {e}"))?;
    json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|bps| bps / 1e9)
        .ok_or_else(|| "iperf3 reported no received bandwidth".to_string())
}

/// One-way latency "typical" and 99th percentile (µs) from `ib_send_lat` on this host.
pub fn ib_send_lat(
    dev: &str,
    port: u8,
    gid: u32,
    ip: &str,
    size: usize,
    iters: u32,
) -> Result<(f64, f64), String> {
    let tcp = free_port()?;
    let common = perftest_args(dev, port, gid, size, iters, tcp);
    let common: Vec<&str> = common.iter().map(String::as_str).collect();
    let mut server = vec!["ib_send_lat"];
    server.extend(&common);
    let _server = start_server(&server, tcp)?;
    let mut client = server.clone();
    client.push(ip);
    let out = run_client(&client, Duration::from_secs(120))?;
    let cols = result_line(&out, size).ok_or_else(|| {
        format!(
            "unreadable ib_send_lat output: {}",
            out.lines().last().unwrap_or("")
        )
    })?;
    // bytes iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
    match (cols.get(4), cols.get(7)) {
        (Some(t), Some(p99)) => Ok((*t, *p99)),
        _ => Err("short ib_send_lat result line".into()),
    }
}

/// Average bandwidth (Gbit/s) from `ib_write_bw` on this host.
pub fn ib_write_bw(
    dev: &str,
    port: u8,
    gid: u32,
    ip: &str,
    size: usize,
    iters: u32,
) -> Result<f64, String> {
    let tcp = free_port()?;
    let mut args = perftest_args(dev, port, gid, size, iters, tcp);
    args.push("--report_gbits".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = vec!["ib_write_bw"];
    server.extend(&args);
    let _server = start_server(&server, tcp)?;
    let mut client = server.clone();
    client.push(ip);
    let out = run_client(&client, Duration::from_secs(120))?;
    // bytes iterations BW-peak BW-average MsgRate
    result_line(&out, size)
        .and_then(|c| c.get(3).copied())
        .ok_or_else(|| {
            format!(
                "unreadable ib_write_bw output: {}",
                out.lines().last().unwrap_or("")
            )
        })
}

fn perftest_args(dev: &str, port: u8, gid: u32, size: usize, iters: u32, tcp: u16) -> Vec<String> {
    [
        "-d",
        dev,
        "-i",
        &port.to_string(),
        "-x",
        &gid.to_string(),
        "-s",
        &size.to_string(),
        "-n",
        &iters.to_string(),
        "-F",
        "-p",
        &tcp.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The numbers on perftest's result line for `size` (it starts with the message size).
fn result_line(out: &str, size: usize) -> Option<Vec<f64>> {
    out.lines().find_map(|l| {
        let cols: Vec<f64> = l
            .split_whitespace()
            .filter_map(|c| c.parse().ok())
            .collect();
        (cols.first() == Some(&(size as f64)) && cols.len() >= 4).then_some(cols)
    })
}
