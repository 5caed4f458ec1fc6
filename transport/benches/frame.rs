//! Frame encode/decode throughput (sans-IO, no sockets).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use wringer_transport::frame::{Decoder, Frame, Kind};

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("frame");
    for size in [64usize, 4096, 1 << 20] {
        let frame = Frame::new(Kind::Data, 1, vec![0xa5; size]).unwrap();
        let bytes = frame.encode();
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_with_input(BenchmarkId::new("encode", size), &frame, |b, f| {
            b.iter(|| black_box(f.encode()))
        });
        g.bench_with_input(BenchmarkId::new("decode", size), &bytes, |b, bytes| {
            b.iter(|| {
                let mut d = Decoder::new(2 << 20);
                black_box(d.feed(bytes).unwrap())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
