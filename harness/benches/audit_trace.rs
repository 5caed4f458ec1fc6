//! Where the eBPF recorder's and the checker's time goes, per trace of a teardown-shaped
//! workload (a connection per cycle: its receiver thread names itself, polls and reads, and
//! the main thread shuts the socket down, joins and closes): rendering the kernel's events as
//! text and as typed events, writing and reading the typed events, and checking the trace from
//! its typed events or from its text read as strace's.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use wringer::hosts::syscall_trace::render::{Event, Kind, Out, Renderer};
use wringer::hosts::syscall_trace::typed_events;
use wringer::model::scenario::AuditCheck;
use wringer::model::traced::codec;
use wringer::orchestration::audit;

const CYCLES: u64 = 2_500;

fn event(tid: u32, kind: Kind, name: &str, args: [u64; 6], ret: i64, ts: u64) -> Event {
    Event {
        ts,
        ..Event::of(tid, kind, name, args, ret)
    }
}

/// The kernel side's events of `CYCLES` teardown cycles.
fn workload() -> Vec<Event> {
    let mut out = vec![];
    // The clock, advanced a microsecond a call.
    let ts = std::cell::Cell::new(1_000_000_000u64);
    let tick = || {
        ts.set(ts.get() + 1_000);
        ts.get()
    };
    let call = |out: &mut Vec<Event>, tid, name: &str, args, ret, caps: [Vec<u8>; 2]| {
        let at = tick();
        let mut e = event(tid, Kind::Enter, name, args, 0, at);
        e.captures = caps.clone();
        out.push(e);
        let mut x = event(tid, Kind::Exit, name, args, ret, at + 500);
        x.captures = caps;
        out.push(x);
    };
    let none = || [vec![], vec![]];
    call(&mut out, 100, "execve", [0; 6], 0, none());
    let thread = (libc::CLONE_VM | libc::CLONE_THREAD) as u64;
    for c in 0..CYCLES {
        let fd = 5 + (c % 2) as i64;
        let rx = 1_000 + c as u32;
        let a = [fd as u64, 0x1000, 64, 0, 0, 0];
        call(
            &mut out,
            100,
            "socket",
            [2, 1 | libc::O_CLOEXEC as u64, 0, 0, 0, 0],
            fd,
            none(),
        );
        call(
            &mut out,
            100,
            "connect",
            [fd as u64, 0x2000, 16, 0, 0, 0],
            0,
            none(),
        );
        call(
            &mut out,
            100,
            "setsockopt",
            [fd as u64, 6, 1, 0x3000, 4, 0],
            0,
            none(),
        );
        call(
            &mut out,
            100,
            "clone3",
            [0x4000, 88, 0, 0, 0, 0],
            rx as i64,
            [thread.to_ne_bytes().to_vec(), vec![]],
        );
        let name = format!("wringer-rx-{fd}\0").into_bytes();
        call(
            &mut out,
            rx,
            "prctl",
            [libc::PR_SET_NAME as u64, 0x5000, 0, 0, 0, 0],
            0,
            [name, vec![]],
        );
        let polled = [(fd as i32).to_ne_bytes(), [1, 0, 0, 0]].concat();
        call(
            &mut out,
            rx,
            "poll",
            [0x6000, 1, 100, 0, 0, 0],
            1,
            [polled, vec![]],
        );
        call(
            &mut out,
            100,
            "write",
            [fd as u64, 0x7000, 40, 0, 0, 0],
            40,
            none(),
        );
        call(&mut out, rx, "read", a, 40, none());
        // The receiver's last read is split by the shutdown that ends it.
        let at = tick();
        out.push(event(rx, Kind::Enter, "read", a, 0, at));
        call(
            &mut out,
            100,
            "shutdown",
            [fd as u64, 2, 0, 0, 0, 0],
            0,
            none(),
        );
        out.push(event(rx, Kind::Exit, "read", a, 0, at + 2_000));
        out.push(event(rx, Kind::ThreadExit, "read", [0; 6], 0, at + 3_000));
        call(
            &mut out,
            100,
            "futex",
            [0x8000, libc::FUTEX_WAIT as u64, 2, 0, 0, 0],
            0,
            none(),
        );
        call(
            &mut out,
            100,
            "close",
            [fd as u64, 0, 0, 0, 0, 0],
            0,
            none(),
        );
    }
    out
}

fn render(events: &[Event]) -> Out {
    let mut r = Renderer::new(100, 0);
    let mut out = Out::default();
    for e in events {
        r.feed(e.clone(), &mut out);
    }
    r.finish(&mut out);
    out
}

fn typed(out: &Out) -> Vec<u8> {
    let mut typed = codec::MAGIC.to_vec();
    for e in &out.events {
        codec::encode(e, &mut typed);
    }
    typed
}

fn bench(c: &mut Criterion) {
    let events = workload();
    let out = render(&events);
    let typed = typed(&out);
    let checks = [AuditCheck::FdLifecycle, AuditCheck::Leaks];
    eprintln!(
        "audit_trace: {} kernel events, {} lines, {} bytes of text, {} bytes of typed events",
        events.len(),
        out.events.len(),
        out.text.len(),
        typed.len()
    );
    let mut g = c.benchmark_group("audit_trace");
    g.sample_size(10);
    g.bench_function("recorder: render text and typed events", |b| {
        b.iter(|| black_box(render(black_box(&events))))
    });
    g.bench_function("recorder: write typed events", |b| {
        b.iter(|| black_box(self::typed(black_box(&out))))
    });
    g.bench_function("checker: read typed events", |b| {
        b.iter(|| black_box(typed_events(&out.text, &typed).unwrap()))
    });
    g.bench_function("checker: check from typed events", |b| {
        b.iter(|| {
            let t = typed_events(&out.text, &typed).unwrap();
            black_box(audit::analyse_after(&out.text, Some(t), &checks, false))
        })
    });
    g.bench_function("checker: check from text (strace's way)", |b| {
        b.iter(|| black_box(audit::analyse_after(&out.text, None, &checks, false)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
