//! Inside a machine with an RDMA device: an RC connection to itself over rdma_cm, SEND/RECV
//! ping-pong and WRITE with immediate, every byte checked. `cargo run --example rdma_rc_smoke
//! --features rdma -- 10.213.0.1:7471`
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use wringer_transport::rdma::rc::{connect, RcListener, RcOptions, Received};

fn main() {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .expect("address")
        .parse()
        .expect("address");
    let opts = RcOptions::default();
    let listener = RcListener::bind(addr, opts).expect("bind");
    let server = std::thread::spawn(move || {
        let mut c = listener.accept(Duration::from_secs(20)).expect("accept");
        for _ in 0..100 {
            match c.recv(Duration::from_secs(10)).expect("server recv") {
                Received::Message(m) => c.send(&m, Duration::from_secs(10)).expect("echo"),
                other => panic!("unexpected {other:?}"),
            }
        }
        match c.recv(Duration::from_secs(10)).expect("write recv") {
            Received::Written { imm, data } => {
                assert_eq!(imm, 0xdead_beef);
                c.send(&data, Duration::from_secs(10)).expect("echo write");
            }
            other => panic!("expected a write, got {other:?}"),
        }
        c.counts().clone()
    });
    let mut c = connect(addr, opts).expect("connect");
    let started = Instant::now();
    for i in 0..100u32 {
        let msg: Vec<u8> = (0..4096u32).map(|b| (b ^ i) as u8).collect();
        c.send(&msg, Duration::from_secs(10)).expect("send");
        assert_eq!(
            c.recv(Duration::from_secs(10)).expect("recv"),
            Received::Message(msg)
        );
    }
    let rtt = started.elapsed() / 100;
    let payload = vec![0x5a; 1000];
    c.write_imm(&payload, 0xdead_beef, Duration::from_secs(10))
        .expect("write");
    assert_eq!(
        c.recv(Duration::from_secs(10)).expect("recv after write"),
        Received::Message(payload)
    );
    let server_counts = server.join().expect("server");
    println!("ok: 100 SEND round trips of 4 KiB, {rtt:?} each; WRITE_WITH_IMM ok; client {:?}; server {:?}", c.counts(), server_counts);
}
