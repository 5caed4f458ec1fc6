//! The reference tools (`sockperf`, `iperf3`, perftest) as child processes: started on loopback
//! (a server lives for all the rounds of one measure), waited for with deadlines, pinned like
//! our side, killed by PID and reaped on every path.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use super::method::on_cpus;
use super::{CpuPinning, Sample};
use crate::hosts::child::{run_bounded, spawn, Reaped};

/// sockperf refuses messages of 1 MiB or more; its largest is compared with our 1 MiB.
pub const SOCKPERF_MAX: usize = (1 << 20) - 1;

fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(anyhow::Error::from)?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(anyhow::Error::from)
}

/// Start a server that will listen on `port`, and wait (bounded) until it does. Readiness is
/// read from /proc/net/tcp, so the check never connects to the tool itself.
fn start_server(cmd: &[String], port: u16) -> anyhow::Result<Reaped> {
    let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let server = spawn(&args)?;
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
    Err(anyhow::anyhow!("{} never listened on port {port}", args[0]))
}

/// Run a client to completion within `limit`; its stdout and stderr.
fn run_client(cmd: &[String], limit: Duration) -> anyhow::Result<String> {
    let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
    match run_bounded(&args, limit)? {
        (Some(_), out) => Ok(out),
        (None, _) => Err(anyhow::anyhow!(
            "{} did not finish within {limit:?}",
            args[0]
        )),
    }
}

/// A reference server that serves every round of one measure, stopped when dropped.
pub struct Server {
    _process: Reaped,
    port: u16,
    busy_poll: bool,
    cpus: Option<CpuPinning>,
}

/// A `sockperf server --tcp` on loopback. `busy_poll`: its busy-poll mode, non-blocking
/// sockets polled with a zero timeout, instead of sleeping in epoll.
pub fn sockperf_server(busy_poll: bool, cpus: Option<CpuPinning>) -> anyhow::Result<Server> {
    let port = free_port()?;
    let (p, max) = (port.to_string(), SOCKPERF_MAX.to_string());
    let mut cmd = vec![
        "sockperf",
        "server",
        "--tcp",
        "-i",
        "127.0.0.1",
        "-p",
        &p,
        "-m",
        &max,
    ];
    if busy_poll {
        cmd.extend(["--nonblocked", "--timeout", "0"]);
    }
    let process = start_server(
        &on_cpus(cpus.as_ref().map(|c| &c.server_cpus[..]), &cmd),
        port,
    )?;
    Ok(Server {
        _process: process,
        port,
        busy_poll,
        cpus,
    })
}

/// One round of `sockperf ping-pong --tcp` against `server`: one-way latency p50 and p99 in
/// µs, over `seconds` (sockperf's own 400 ms warm-up comes first and is not counted).
pub fn sockperf_round(server: &Server, size: usize, seconds: u64) -> anyhow::Result<Sample> {
    let (p, m, t) = (
        server.port.to_string(),
        size.min(SOCKPERF_MAX).to_string(),
        seconds.max(1).to_string(),
    );
    let mut cmd = vec![
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
    ];
    if server.busy_poll {
        // A single connection: sockperf spins on its non-blocking receive.
        cmd.push("--nonblocked");
    }
    let out = run_client(
        &on_cpus(server.cpus.as_ref().map(|c| &c.client_cpus[..]), &cmd),
        Duration::from_secs(seconds * 4 + 10),
    )?;
    parse_sockperf(&out)
}

/// p50, p99 and the message count from sockperf's report.
fn parse_sockperf(out: &str) -> anyhow::Result<Sample> {
    let pct = |q: &str| {
        out.lines()
            .find(|l| l.contains(&format!("percentile {q} =")))
            .and_then(|l| l.rsplit('=').next())
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let count = out
        .lines()
        .find(|l| l.contains("[Valid Duration]"))
        .and_then(|l| l.split("SentMessages=").nth(1))
        .and_then(|v| v.split(';').next())
        .and_then(|v| v.trim().parse().ok());
    match (pct("50.000"), pct("99.000")) {
        (Some(a), Some(b)) => Ok(Sample {
            value: a,
            p99: Some(b),
            count,
        }),
        _ => Err(anyhow::anyhow!(
            "unreadable sockperf output: {}",
            out.lines().last().unwrap_or("")
        )),
    }
}

/// An `iperf3 -s` on loopback, serving one client after another.
pub fn iperf3_server(cpus: Option<CpuPinning>) -> anyhow::Result<Server> {
    let port = free_port()?;
    let p = port.to_string();
    let cmd = ["iperf3", "-s", "-B", "127.0.0.1", "-p", &p];
    let process = start_server(
        &on_cpus(cpus.as_ref().map(|c| &c.server_cpus[..]), &cmd),
        port,
    )?;
    Ok(Server {
        _process: process,
        port,
        busy_poll: false,
        cpus,
    })
}

/// One round of single-stream bandwidth in Gbit/s from `iperf3`: `messages` writes of `size`
/// bytes, as received.
pub fn iperf3_round(server: &Server, size: usize, messages: u64) -> anyhow::Result<Sample> {
    let (p, l, n) = (
        server.port.to_string(),
        size.to_string(),
        (size as u64 * messages).to_string(),
    );
    let cmd = [
        "iperf3",
        "-c",
        "127.0.0.1",
        "-p",
        &p,
        "-l",
        &l,
        "-n",
        &n,
        "-J",
    ];
    let out = run_client(
        &on_cpus(server.cpus.as_ref().map(|c| &c.client_cpus[..]), &cmd),
        Duration::from_secs(60),
    )?;
    let json: serde_json::Value =
        serde_json::from_str(&out).map_err(|e| anyhow::anyhow!("unreadable iperf3 output: {e}"))?;
    json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|bps| Sample {
            value: bps / 1e9,
            p99: None,
            count: Some(messages),
        })
        .ok_or_else(|| anyhow::anyhow!("iperf3 reported no received bandwidth"))
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
    fn run(&self, tool: &str, extra: &[&str]) -> anyhow::Result<Vec<f64>> {
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
        let server: Vec<String> = server.iter().map(|s| s.to_string()).collect();
        let _server = start_server(&server, tcp)?;
        let mut client = server.clone();
        client.push(self.ip.to_string());
        let out = run_client(&client, Duration::from_secs(120))?;
        result_line(&out, self.size).ok_or_else(|| {
            anyhow::anyhow!(
                "unreadable {tool} output: {}",
                out.lines().last().unwrap_or("")
            )
        })
    }
}

/// One-way latency "typical" and 99th percentile (µs) from `ib_send_lat`.
pub fn ib_send_lat(p: &Perftest) -> anyhow::Result<Sample> {
    let cols = p.run("ib_send_lat", &[])?;
    // bytes iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
    match (cols.get(4), cols.get(7)) {
        (Some(t), Some(p99)) => Ok(Sample {
            value: *t,
            p99: Some(*p99),
            count: Some(p.iters.into()),
        }),
        _ => Err(anyhow::anyhow!("short ib_send_lat result line")),
    }
}

/// Average bandwidth (Gbit/s) from `ib_write_bw`.
pub fn ib_write_bw(p: &Perftest) -> anyhow::Result<Sample> {
    let cols = p.run("ib_write_bw", &["--report_gbits"])?;
    // bytes iterations BW-peak BW-average MsgRate
    cols.get(3)
        .map(|&bw| Sample {
            value: bw,
            p99: None,
            count: Some(p.iters.into()),
        })
        .ok_or_else(|| anyhow::anyhow!("short ib_write_bw result line"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockperf_report_gives_p50_p99_and_the_count() {
        let out = "sockperf: [Total Run] RunTime=1.000 sec; Warm up time=400 msec; SentMessages=17552; ReceivedMessages=17551\n\
                   sockperf: [Valid Duration] RunTime=0.552 sec; SentMessages=9388; ReceivedMessages=9388\n\
                   sockperf: ---> percentile 99.000 =   25.101\n\
                   sockperf: ---> percentile 50.000 =   10.980\n";
        assert_eq!(
            parse_sockperf(out).ok(),
            Some(Sample {
                value: 10.98,
                p99: Some(25.101),
                count: Some(9388)
            })
        );
        assert!(parse_sockperf("sockperf: ERROR").is_err());
    }

    #[test]
    fn perftest_result_line_is_the_one_for_our_size() {
        let out = " #bytes #iterations t_min[usec] t_max[usec] t_typical[usec]\n 4096 200 10.1 30.2 12.5 13.0 1.1 20.0 30.0\n";
        assert_eq!(result_line(out, 4096).unwrap()[4], 12.5);
        assert!(result_line(out, 64).is_none());
    }
}
