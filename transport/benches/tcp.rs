//! TCP over loopback: ping-pong round trips, 1 MiB stream bandwidth, and teardown cycles.
//! Percentiles and the comparison with sockperf/iperf3 are in the `versus` bench.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
mod common;

use common::pair;

const T: Duration = Duration::from_secs(10);

fn pingpong(c: &mut Criterion) {
    let mut g = c.benchmark_group("tcp_pingpong");
    for size in [64usize, 4096, 1 << 20] {
        let (a, b) = pair();
        let echo = std::thread::spawn(move || {
            while let Ok(f) = b.recv(T) {
                if b.send(&f.payload, T).is_err() {
                    break;
                }
            }
        });
        let msg = vec![7u8; size];
        g.throughput(Throughput::Bytes(size as u64 * 2));
        g.bench_with_input(BenchmarkId::from_parameter(size), &msg, |bench, msg| {
            bench.iter(|| {
                a.send(msg, T).unwrap();
                a.recv(T).unwrap()
            })
        });
        a.close().unwrap();
        echo.join().unwrap();
    }
    g.finish();
}

fn stream(c: &mut Criterion) {
    let mut g = c.benchmark_group("tcp_stream");
    let (a, b) = pair();
    let sink = std::thread::spawn(move || while b.recv(T).is_ok() {});
    let msg = vec![1u8; 1 << 20];
    g.throughput(Throughput::Bytes(msg.len() as u64));
    g.bench_function("1MiB", |bench| bench.iter(|| a.send(&msg, T).unwrap()));
    a.close().unwrap();
    sink.join().unwrap();
    g.finish();
}

fn teardown(c: &mut Criterion) {
    c.bench_function("teardown_cycle", |bench| {
        bench.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (a, b) = pair();
                let started = Instant::now();
                a.close().unwrap();
                b.close().unwrap();
                total += started.elapsed();
            }
            total
        })
    });
}

criterion_group!(benches, pingpong, stream, teardown);
criterion_main!(benches);
