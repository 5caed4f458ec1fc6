//! The rank worker (`wringer rank`): joins the run's rendezvous, runs the steps it is sent, and
//! streams evidence back. It never decides a verdict.

use std::io::BufReader;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _, Result};
use wringer_transport::{Listener, ListenerOptions};

use super::context::{Control, RankContext};
use super::protocol::{read_line, write_line, CoordMsg, PeerAddrs, RankMsg, TOKEN_ENV};
use super::steps;

/// How long a rank waits for the coordinator's start message.
const START_TIMEOUT: Duration = Duration::from_secs(60);

pub fn run(rendezvous: SocketAddr, rank: u32, bind: IpAddr, token_stdin: bool) -> Result<()> {
    let token_hex = if token_stdin {
        token_from_stdin()?
    } else {
        std::env::var(TOKEN_ENV)
            .map_err(|_| anyhow!("{TOKEN_ENV} is not set; ranks are started by `wringer run`"))?
    };
    let token = u128::from_str_radix(&token_hex, 16).context("malformed run token")?;
    let stream = TcpStream::connect_timeout(&rendezvous, Duration::from_secs(10))
        .context("connecting to the coordinator")?;
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    write_line(
        &mut writer,
        &RankMsg::Hello {
            rank,
            token: token_hex,
            pid: std::process::id(),
        },
    )?;

    let listener = Listener::bind(SocketAddr::new(bind, 0), ListenerOptions::new(token))?;
    let raw = TcpListener::bind(SocketAddr::new(bind, 0))?;
    let addrs = PeerAddrs {
        transport: listener.local_addr(),
        raw: raw.local_addr()?,
        rdma: steps::rdma_support::local_address(),
        exec_port: free_port(bind)?,
    };
    write_line(&mut writer, &RankMsg::Ready { addrs })?;

    stream.set_read_timeout(Some(START_TIMEOUT))?;
    let mut reader = BufReader::new(stream);
    let (steps, peers, seed) = match read_line::<_, CoordMsg<steps::Step>>(&mut reader)
        .context("waiting for the start message")?
    {
        Some(CoordMsg::Start {
            steps,
            peers,
            seed,
            token: t,
        }) if t == format!("{token:032x}") => (steps, peers, seed),
        Some(other) => bail!("unexpected first message from the coordinator: {other:?}"),
        None => bail!("the coordinator closed the rendezvous before starting"),
    };
    reader.get_ref().set_read_timeout(None)?;

    // The coordinator's releases arrive on their own thread. If the coordinator goes away, this
    // rank must not outlive it: exit at once.
    let (tx, releases) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("wringer-control".into())
        .spawn(move || loop {
            match read_line::<_, CoordMsg<steps::Step>>(&mut reader) {
                Ok(Some(CoordMsg::Release { name })) => {
                    let _ = tx.send(name);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => std::process::exit(3),
            }
        })?;
    let ctx = RankContext {
        run_folder: std::env::temp_dir()
            .join(crate::hosts::private::run_folder_name("exec", token)),
        rank,
        ranks: peers.len() as u32,
        peers,
        token,
        seed,
        listener,
        raw,
        control: Control::new(writer, releases),
    };
    let ctx = Arc::new(ctx);
    for (i, step) in steps.iter().enumerate() {
        ctx.control.send(&RankMsg::StepStart { step: i })?;
        super::verbs_observer::mark(&format!("step-start {i}"));
        let outcome = steps::run(step, &ctx, i);
        super::verbs_observer::mark(&format!("step-end {i}"));
        match outcome {
            Ok(report) => ctx.control.send(&RankMsg::StepResult(report))?,
            Err(e) => ctx.control.send(&RankMsg::StepError {
                step: i,
                error: format!("{e:#}"),
            })?,
        }
    }
    ctx.control.send(&RankMsg::Done)?;
    Ok(())
}

/// A port nothing on this host uses now, for an external program to listen on. The kernel
/// hands out ephemeral ports in turn, so it is not given to another socket soon.
fn free_port(bind: IpAddr) -> Result<u16> {
    let probe = TcpListener::bind(SocketAddr::new(bind, 0)).context("reserving an exec port")?;
    Ok(probe.local_addr()?.port())
}

/// A rank started over SSH: lead its own process group (so the coordinator can kill all of it
/// at once), read the token from stdin, and exit as soon as stdin closes (the coordinator or
/// its ssh is gone).
fn token_from_stdin() -> Result<String> {
    // SAFETY: setsid has no memory-safety preconditions. It fails (harmlessly) when this
    // process already leads a group, which is all we need.
    unsafe { libc::setsid() };
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading the run token from stdin")?;
    std::thread::Builder::new()
        .name("wringer-stdin".into())
        .spawn(|| {
            let mut sink = [0u8; 64];
            use std::io::Read;
            let mut stdin = std::io::stdin();
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            std::process::exit(3);
        })?;
    Ok(line.trim().to_string())
}
