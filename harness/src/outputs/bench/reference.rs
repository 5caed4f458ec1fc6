//! The reference tools (`sockperf`, `iperf3`) as child processes: started on loopback, waited
//! for with deadlines, killed by PID and reaped on every path.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use crate::hosts::child::{run_bounded, spawn, Reaped};

/// sockperf refuses messages of 1 MiB or more; its largest is compared with our 1 MiB.
pub const SOCKPERF_MAX: usize = (1 << 20) - 1;

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
    match run_bounded(cmd, limit)? {
        (Some(_), out) => Ok(out),
        (None, _) => Err(format!("{} did not finish within {limit:?}", cmd[0])),
    }
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

/// Where and what a perftest tool measures on this host.
pub struct Perftest<'a> {
    pub dev: &'a str,
    pub port: u8,
    pub gid: u32,
    pub ip: &'a str,
    pub size: usize,
    pub iters: u32,
}

impl Perftest<'_> {
    /// Run `tool` as server and client (with `extra` arguments on both); the numbers on the
    /// client's result line for our size.
    fn run(&self, tool: &str, extra: &[&str]) -> Result<Vec<f64>, String> {
        let tcp = free_port()?;
        let (port, gid, size, iters, tcp_s) = (
            self.port.to_string(),
            self.gid.to_string(),
            self.size.to_string(),
            self.iters.to_string(),
            tcp.to_string(),
        );
        let mut server = vec![
            tool, "-d", self.dev, "-i", &port, "-x", &gid, "-s", &size, "-n", &iters, "-F", "-p",
            &tcp_s,
        ];
        server.extend(extra);
        let _server = start_server(&server, tcp)?;
        let mut client = server.clone();
        client.push(self.ip);
        let out = run_client(&client, Duration::from_secs(120))?;
        result_line(&out, self.size).ok_or_else(|| {
            format!(
                "unreadable {tool} output: {}",
                out.lines().last().unwrap_or("")
            )
        })
    }
}

/// One-way latency "typical" and 99th percentile (µs) from `ib_send_lat`.
pub fn ib_send_lat(p: &Perftest) -> Result<(f64, f64), String> {
    let cols = p.run("ib_send_lat", &[])?;
    // bytes iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
    match (cols.get(4), cols.get(7)) {
        (Some(t), Some(p99)) => Ok((*t, *p99)),
        _ => Err("short ib_send_lat result line".into()),
    }
}

/// Average bandwidth (Gbit/s) from `ib_write_bw`.
pub fn ib_write_bw(p: &Perftest) -> Result<f64, String> {
    let cols = p.run("ib_write_bw", &["--report_gbits"])?;
    // bytes iterations BW-peak BW-average MsgRate
    cols.get(3)
        .copied()
        .ok_or_else(|| "short ib_write_bw result line".into())
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
