//! Speaking `ibv_rc_pingpong`'s out-of-band exchange, so the reference tool can be the peer:
//! a user can tell a fabric problem (the reference fails too) from a transport problem.
//!
//! The exchange (rdma-core's libibverbs/examples/rc_pingpong.c, read to learn the format): over
//! TCP the client sends `LID:QPN:PSN:GID` as `%04x:%06x:%06x:` plus the GID's 16 bytes in hex,
//! NUL-terminated (52 bytes); the server answers the same; the client then sends `done\0`. The
//! QPs are set up by hand (no rdma_cm). The client sends first; each side sends again once its
//! previous send completed and a message arrived.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::GenericCompletionQueue;
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::Mtu;
use sideway::ibverbs::queue_pair::{
    GenericQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;

use super::rc::{cm_io, cm_msg, CompletionCounts, RdmaError, WcStatus};

const MSG_LEN: usize = 52;
const RECV_WR: u64 = 1;
const SEND_WR: u64 = 2;

#[derive(Clone, Debug)]
pub struct CompatOptions {
    pub device: String,
    pub port: u8,
    pub gid_index: u32,
    pub size: usize,
    pub iterations: u32,
    pub timeout: Duration,
}

#[derive(Clone, Copy, Debug)]
pub enum Role {
    /// Wait for `ibv_rc_pingpong <our address>` on this TCP port.
    Server { tcp_port: u16 },
    /// Connect to `ibv_rc_pingpong` (server mode) at this address.
    Client { server: SocketAddr },
}

#[derive(Clone, Debug)]
pub struct CompatOutcome {
    pub iterations: u32,
    /// Microseconds per iteration, as ibv_rc_pingpong reports it.
    pub usec_per_iter: f64,
    pub counts: CompletionCounts,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Dest {
    lid: u16,
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
}

impl Dest {
    fn wire(&self) -> [u8; MSG_LEN] {
        let gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        let text = format!("{:04x}:{:06x}:{:06x}:{gid}", self.lid, self.qpn, self.psn);
        let mut out = [0u8; MSG_LEN];
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    fn parse(bytes: &[u8]) -> Result<Dest, RdmaError> {
        let bad = || {
            cm_msg(format!(
                "not an rc_pingpong address: {:?}",
                String::from_utf8_lossy(bytes)
            ))
        };
        let text = std::str::from_utf8(bytes)
            .map_err(|_| bad())?
            .trim_end_matches('\0');
        let parts: Vec<&str> = text.split(':').collect();
        if parts.len() != 4 || parts[3].len() != 32 {
            return Err(bad());
        }
        let hex = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = u8::from_str_radix(&parts[3][2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Dest {
            lid: hex(parts[0])? as u16,
            qpn: hex(parts[1])?,
            psn: hex(parts[2])?,
            gid,
        })
    }
}

fn v(e: impl std::fmt::Display) -> RdmaError {
    RdmaError::Verbs(e.to_string())
}

/// Run `iterations` ping-pongs of `size` bytes with ibv_rc_pingpong as the peer.
pub fn run(role: Role, opts: &CompatOptions) -> Result<CompatOutcome, RdmaError> {
    let deadline = Instant::now() + opts.timeout;
    let list = DeviceList::new().map_err(v)?;
    let device = list
        .iter()
        .find(|d| d.name() == opts.device)
        .ok_or_else(|| v(format!("no RDMA device {}", opts.device)))?;
    let ctx = device.open().map_err(v)?;
    let pd = ctx.alloc_pd().map_err(v)?;
    let rx_depth = 64u32;
    let cq: GenericCompletionQueue = ctx
        .create_cq_builder()
        .setup_cqe(rx_depth + 1)
        .build()
        .map_err(v)?
        .into();
    let mut builder = pd.create_qp_builder();
    builder
        .setup_max_send_wr(1)
        .setup_max_recv_wr(rx_depth)
        .setup_max_send_sge(1)
        .setup_max_recv_sge(1)
        .setup_send_cq(cq.clone())
        .setup_recv_cq(cq.clone());
    let mut qp: GenericQueuePair = builder.build_ex().map_err(v)?.into();
    let mut init = QueuePairAttribute::new();
    init.setup_state(QueuePairState::Init)
        .setup_pkey_index(0)
        .setup_port(opts.port)
        .setup_access_flags(AccessFlags::LocalWrite | AccessFlags::RemoteWrite);
    qp.modify(&init).map_err(v)?;
    let buf: Box<[u8]> = vec![0u8; opts.size.max(1)].into_boxed_slice();
    // SAFETY: the region covers `buf`, which is declared before it and so outlives it (locals
    // drop in reverse order), and which never moves (a boxed slice).
    let mr = unsafe {
        pd.reg_mr(buf.as_ptr() as usize, buf.len(), AccessFlags::LocalWrite)
            .map_err(v)?
    };
    let post_recv = |qp: &mut GenericQueuePair| -> Result<(), RdmaError> {
        let mut g = qp.start_post_recv();
        let wr = g.construct_wr(RECV_WR);
        // SAFETY: `buf` is registered as `mr`, both alive for every use of this QP.
        unsafe { wr.setup_sge(mr.lkey(), buf.as_ptr() as u64, opts.size as u32) };
        g.post().map_err(v)
    };
    for _ in 0..rx_depth {
        post_recv(&mut qp)?;
    }
    let port = ctx.query_port(opts.port).map_err(v)?;
    let gid: Gid = ctx.query_gid(opts.port, opts.gid_index).map_err(v)?;
    let psn = (std::process::id().wrapping_mul(2_654_435_761)) & 0x00ff_ffff;
    let local = Dest {
        lid: port.lid(),
        qpn: qp.qp_number(),
        psn,
        gid: gid.raw,
    };

    // The out-of-band exchange, every read and write bounded.
    let mut stream = match role {
        Role::Client { server } => {
            let mut s = loop {
                match TcpStream::connect_timeout(&server, Duration::from_secs(1)) {
                    Ok(s) => break s,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(100))
                    }
                    Err(e) => {
                        return Err(cm_io(
                            format!("connecting to ibv_rc_pingpong at {server}"),
                            &e,
                        ))
                    }
                }
            };
            s.set_read_timeout(Some(opts.timeout)).map_err(v)?;
            s.write_all(&local.wire()).map_err(v)?;
            s
        }
        Role::Server { tcp_port } => {
            let l = TcpListener::bind(("0.0.0.0", tcp_port)).map_err(v)?;
            l.set_nonblocking(true).map_err(v)?;
            let s = loop {
                match l.accept() {
                    Ok((s, _)) => break s,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(_) => {
                        return Err(RdmaError::Timeout {
                            during: "waiting for ibv_rc_pingpong to connect",
                            after: opts.timeout,
                        })
                    }
                }
            };
            s.set_nonblocking(false).map_err(v)?;
            s.set_read_timeout(Some(opts.timeout)).map_err(v)?;
            s
        }
    };
    let mut msg = [0u8; MSG_LEN];
    stream
        .read_exact(&mut msg)
        .map_err(|e| cm_io("reading the peer's address".into(), &e))?;
    let remote = Dest::parse(&msg)?;
    connect_qp(&mut qp, opts, &local, &remote)?;
    match role {
        Role::Client { .. } => stream.write_all(b"done\0").map_err(v)?,
        Role::Server { .. } => {
            stream.write_all(&local.wire()).map_err(v)?;
            let mut done = [0u8; 5];
            stream
                .read_exact(&mut done)
                .map_err(|e| cm_io("waiting for \"done\"".into(), &e))?;
        }
    }

    let post_send = |qp: &mut GenericQueuePair| -> Result<(), RdmaError> {
        let mut g = qp.start_post_send();
        let wr = g
            .construct_wr(SEND_WR, WorkRequestFlags::Signaled)
            .setup_send();
        // SAFETY: as for the receives.
        unsafe { wr.setup_sge(mr.lkey(), buf.as_ptr() as u64, opts.size as u32) };
        g.post().map_err(v)
    };
    let started = Instant::now();
    let (mut sent, mut received) = (0u32, 0u32);
    let mut counts = CompletionCounts::default();
    let (mut send_pending, mut recv_pending) = (false, true);
    if matches!(role, Role::Client { .. }) {
        post_send(&mut qp)?;
        send_pending = true;
    }
    while sent < opts.iterations || received < opts.iterations {
        let mut got = vec![];
        if let Ok(poller) = cq.start_poll() {
            for wc in poller {
                got.push((wc.wr_id(), wc.status()));
            }
        }
        if got.is_empty() {
            if Instant::now() > deadline {
                return Err(RdmaError::Timeout {
                    during: "ping-pong with ibv_rc_pingpong",
                    after: opts.timeout,
                });
            }
            continue;
        }
        for (wr, status) in got {
            let status = WcStatus::from_raw(status);
            *counts.0.entry(status).or_default() += 1;
            if !status.is_success() {
                return Err(RdmaError::Completion { status, wr_id: wr });
            }
            if wr == SEND_WR {
                sent += 1;
                send_pending = false;
            } else {
                received += 1;
                recv_pending = false;
                post_recv(&mut qp)?;
            }
        }
        if sent < opts.iterations && !send_pending && !recv_pending {
            post_send(&mut qp)?;
            send_pending = true;
            recv_pending = true;
        }
    }
    let usec_per_iter = started.elapsed().as_secs_f64() * 1e6 / opts.iterations as f64;
    Ok(CompatOutcome {
        iterations: opts.iterations,
        usec_per_iter,
        counts,
    })
}

fn connect_qp(
    qp: &mut GenericQueuePair,
    opts: &CompatOptions,
    local: &Dest,
    remote: &Dest,
) -> Result<(), RdmaError> {
    let mut rtr = QueuePairAttribute::new();
    rtr.setup_state(QueuePairState::ReadyToReceive)
        .setup_path_mtu(Mtu::Mtu1024)
        .setup_dest_qp_num(remote.qpn)
        .setup_rq_psn(remote.psn)
        .setup_max_dest_read_atomic(1)
        .setup_min_rnr_timer(12);
    let mut ah = AddressHandleAttribute::new();
    ah.setup_dest_lid(remote.lid)
        .setup_port(opts.port)
        .setup_service_level(0);
    if remote.gid != [0u8; 16] {
        ah.setup_grh_src_gid_index(opts.gid_index as u8)
            .setup_grh_dest_gid(&Gid { raw: remote.gid })
            .setup_grh_hop_limit(1);
    }
    rtr.setup_address_vector(&ah);
    qp.modify(&rtr).map_err(v)?;
    let mut rts = QueuePairAttribute::new();
    rts.setup_state(QueuePairState::ReadyToSend)
        .setup_sq_psn(local.psn)
        .setup_timeout(14)
        .setup_retry_cnt(7)
        .setup_rnr_retry(7)
        .setup_max_read_atomic(1);
    qp.modify(&rts).map_err(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_format_is_rc_pingpongs() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 213, 0, 1],
        };
        let w = d.wire();
        assert_eq!(
            &w[..51],
            b"0000:000011:abcdef:00000000000000000000ffff0ad50001"
        );
        assert_eq!(
            w[51], 0,
            "NUL-terminated, 52 bytes like sizeof msg in rc_pingpong.c"
        );
        assert_eq!(Dest::parse(&w).unwrap(), d);
        assert!(Dest::parse(b"garbage").is_err());
    }
}
