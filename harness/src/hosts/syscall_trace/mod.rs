//! The lifecycle audit's eBPF backend: the kernel records one process tree's syscalls into a
//! ring buffer without stopping a thread (`ebpf-audit/audit.bpf.c`), and this side decodes
//! them into the checker's typed calls (`decode`, written to [`calls_path`]), beside the
//! strace-style lines a person reads (`render`). A rank runs under it as under strace:
//! `wringer trace-syscalls --out FILE -- PROGRAM`, which follows every child and thread the
//! program makes (by the process tree, from the tracer's own forks), and exits as it does.
//!
//! Built with aya (pure Rust, stable toolchain: nothing but clang at build time, from
//! Debian's packages); libbpf-rs would build libbpf and libelf from C, and aya's own kernel
//! side needs a nightly `bpf-linker`, which no registry here offers.

pub mod decode;
pub mod render;
pub mod table;

use std::path::Path;

/// Where the kernel exposes its tracepoints.
const TRACEFS: &str = "/sys/kernel/tracing";

/// Why this host cannot use the eBPF backend, or `None` when it can (the probe's check: the
/// program is in this build, we are root, tracefs is mounted, mounting it when it is not, and
/// the program loads and attaches).
pub fn unusable() -> Option<String> {
    if !cfg!(ebpf_audit) {
        return Some(
            "this wringer was built without its eBPF program (no clang at build time)".into(),
        );
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("loading BPF programs needs root".into());
    }
    if let Err(e) = mount_tracefs() {
        return Some(e.to_string());
    }
    // Loaded and verified (CO-RE relocations against this kernel's BTF included), not
    // attached: attaching would put every thread of the machine on the traced syscall path.
    #[cfg(ebpf_audit)]
    if let Err(e) = kernel::Tracer::load(false, false) {
        return Some(format!("the BPF program did not load: {e:#}"));
    }
    None
}

/// tracefs is not mounted on every machine at boot; root can mount it.
fn mount_tracefs() -> anyhow::Result<()> {
    let events = Path::new(TRACEFS).join("events/raw_syscalls");
    if events.exists() {
        return Ok(());
    }
    let status = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev", TRACEFS])
        .stderr(std::process::Stdio::piped())
        .output();
    match status {
        Ok(o) if o.status.success() && events.exists() => Ok(()),
        Ok(o) => anyhow::bail!(
            "tracefs is not mounted at {TRACEFS} and mounting it failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => anyhow::bail!("tracefs is not mounted at {TRACEFS} (mount: {e})"),
    }
}

/// Run `program` under the eBPF recorder, writing its trace to `out`; returns its exit status.
#[cfg(ebpf_audit)]
pub fn trace(
    out: &Path,
    futex: bool,
    program: &[String],
) -> anyhow::Result<std::process::ExitStatus> {
    kernel::trace(out, futex, program)
}

#[cfg(not(ebpf_audit))]
pub fn trace(
    _out: &Path,
    _futex: bool,
    _program: &[String],
) -> anyhow::Result<std::process::ExitStatus> {
    anyhow::bail!("this wringer was built without its eBPF program (no clang at build time)")
}

/// Where the eBPF recorder writes the typed events of the trace it writes to `trace`, in the
/// compact form of [`codec`](crate::model::traced::codec), numbered by the trace's lines.
pub fn calls_path(trace: &Path) -> std::path::PathBuf {
    let mut p = trace.as_os_str().to_owned();
    p.push(".calls");
    p.into()
}

/// The typed events of `trace`, as [`calls_path`] holds them (`calls`), when they are whole:
/// every record complete, and none of the trace's lines after the last of them an event (a
/// recorder killed mid-write). `None` otherwise: then the trace's text is read instead.
pub fn typed_events(trace: &str, calls: &[u8]) -> Option<Vec<crate::model::traced::Traced>> {
    let events = crate::model::traced::codec::decode_all(calls)?;
    let covered = events.last().map_or(0, |e| e.line + 1);
    let rest_are_notes = trace
        .lines()
        .skip(covered)
        .all(|l| l.is_empty() || l.starts_with('#'));
    rest_are_notes.then_some(events)
}

/// The line a trace carries when the ring buffer dropped events: such a trace is incomplete,
/// and the audit never reads it as clean.
pub const LOST_PREFIX: &str = "# wringer-ebpf: lost ";

/// Events the trace says were lost (the last count it gives).
pub fn lost_events(trace: &str) -> u64 {
    trace
        .lines()
        .filter_map(|l| l.strip_prefix(LOST_PREFIX))
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

#[cfg(ebpf_audit)]
mod kernel {
    use std::fs::File;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    use std::path::Path;
    use std::process::{Command, ExitStatus};
    use std::time::Duration;

    use anyhow::{Context, Result};
    use aya::maps::{Array, HashMap, MapData, RingBuf};
    use aya::programs::raw_trace_point::RawTracePointLinkId;
    use aya::programs::RawTracePoint;
    use aya::{Ebpf, EbpfLoader};

    use super::render::{Event, Out, Renderer};
    use super::{table, LOST_PREFIX, TRACEFS};

    static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/audit.bpf.o"));

    /// How long the ring buffer is waited on between checks of the program's exit.
    const POLL: Duration = Duration::from_millis(20);

    pub struct Tracer {
        bpf: Ebpf,
        links: Vec<(&'static str, RawTracePointLinkId)>,
    }

    impl Tracer {
        /// Load the program, recording the syscalls of the audit (and `futex`), and attach it.
        pub fn load(futex: bool, attach: bool) -> Result<Tracer> {
            raise_memlock();
            let mut loader = EbpfLoader::new();
            // Tests shrink the ring to make it overflow (a power of two of pages).
            if let Some(bytes) = std::env::var("WRINGER_EBPF_RING_BYTES")
                .ok()
                .and_then(|v| v.parse::<u32>().ok())
            {
                loader.map_max_entries("events", bytes);
            }
            let mut bpf = loader
                .load(PROGRAM)
                .context("loading the audit's BPF program")?;
            {
                let mut captures: Array<_, [u8; 16]> =
                    Array::try_from(bpf.map_mut("captures").context("no captures map")?)?;
                for s in table::recorded(futex) {
                    captures.set(s.nr as u32, table::capture_entry(s), 0)?;
                }
            }
            let mut links = vec![];
            let mut programs = vec![
                ("on_enter", "sys_enter"),
                ("on_exit", "sys_exit"),
                ("on_fork", "sched_process_fork"),
                ("on_task_exit", "sched_process_exit"),
            ];
            // io_uring's operations, where this kernel's tracepoints take the request first.
            if uring_tracepoints() {
                programs.extend([
                    ("on_uring_submit", "io_uring_submit_req"),
                    ("on_uring_file", "io_uring_file_get"),
                    ("on_uring_done", "io_uring_complete"),
                ]);
            }
            for (prog, tracepoint) in programs {
                let p: &mut RawTracePoint = bpf
                    .program_mut(prog)
                    .with_context(|| format!("no program {prog}"))?
                    .try_into()?;
                p.load().with_context(|| format!("verifying {prog}"))?;
                if attach {
                    let id = p
                        .attach(tracepoint)
                        .with_context(|| format!("attaching {prog} to {tracepoint}"))?;
                    links.push((prog, id));
                }
            }
            Ok(Tracer { bpf, links })
        }

        /// Detach every tracepoint. A raw tracepoint's detach does not wait for the RCU grace
        /// period that frees it, so this takes microseconds.
        fn detach(mut self) {
            for (prog, id) in std::mem::take(&mut self.links) {
                let p: Option<&mut RawTracePoint> =
                    self.bpf.program_mut(prog).and_then(|p| p.try_into().ok());
                if let Some(p) = p {
                    let _ = p.detach(id);
                }
            }
        }

        /// Events dropped because the ring buffer was full.
        fn lost(&self) -> u64 {
            self.bpf
                .map("lost")
                .and_then(|m| Array::<_, u64>::try_from(m).ok())
                .and_then(|a| a.get(&0, 0).ok())
                .unwrap_or(0)
        }
    }

    /// Whether this kernel has io_uring's tracepoints in the form the program reads: a
    /// submission told by its request alone (`io_uring_submit_req`, 6.0 on), and the file and
    /// completion tracepoints that name the request. Older kernels are audited without their
    /// io_uring operations.
    fn uring_tracepoints() -> bool {
        [
            "io_uring_submit_req",
            "io_uring_file_get",
            "io_uring_complete",
        ]
        .iter()
        .all(|event| {
            let path = format!("{TRACEFS}/events/io_uring/{event}/format");
            std::fs::read_to_string(path).is_ok_and(|text| has_field(&text, "req"))
        })
    }

    /// Whether a tracefs format file declares this field (`field:void * req; offset:16;…`).
    fn has_field(format: &str, field: &str) -> bool {
        format.lines().any(|l| {
            l.trim_start()
                .strip_prefix("field:")
                .and_then(|decl| decl.split(';').next())
                .is_some_and(|decl| decl.rsplit([' ', '*']).next() == Some(field))
        })
    }

    #[cfg(test)]
    #[test]
    fn a_format_file_declares_a_field_by_its_whole_name() {
        let format = "name: io_uring_file_get\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\n\tfield:void * req;\toffset:16;\tsize:8;\n\tfield:u64 user_data_req;\toffset:24;\tsize:8;\n\tfield:int fd;\toffset:32;\tsize:4;\n\nprint fmt: \"req %p\", REC->req\n";
        assert!(has_field(format, "req"));
        assert!(has_field(format, "fd"));
        assert!(has_field(format, "user_data_req"));
        assert!(!has_field(format, "user_data"));
        assert!(!has_field(format, "opcode"));
    }

    /// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK.
    fn raise_memlock() {
        let _ = nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_MEMLOCK,
            nix::sys::resource::RLIM_INFINITY,
            nix::sys::resource::RLIM_INFINITY,
        );
    }

    fn clock_ns(c: nix::time::ClockId) -> i128 {
        nix::time::clock_gettime(c)
            .map(|t| t.tv_sec() as i128 * 1_000_000_000 + t.tv_nsec() as i128)
            .unwrap_or(0)
    }

    /// Now on BPF's clock (`bpf_ktime_get_ns`).
    fn monotonic_ns() -> u64 {
        clock_ns(nix::time::ClockId::CLOCK_MONOTONIC) as u64
    }

    /// Nanoseconds to add to BPF's clock for the time of day.
    fn epoch_offset() -> i128 {
        use nix::time::ClockId;
        clock_ns(ClockId::CLOCK_REALTIME) - clock_ns(ClockId::CLOCK_MONOTONIC)
    }

    pub fn trace(out: &Path, futex: bool, program: &[String]) -> Result<ExitStatus> {
        let mut tracer = Tracer::load(futex, true)?;
        let mut file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
        let calls_path = super::calls_path(out);
        let mut calls = File::create(&calls_path)
            .with_context(|| format!("creating {}", calls_path.display()))?;
        calls.write_all(crate::model::traced::codec::MAGIC)?;
        {
            let mut traced: HashMap<_, u32, u8> =
                HashMap::try_from(tracer.bpf.map_mut("traced").context("no traced map")?)?;
            // Our own forks are followed; our own calls are not recorded.
            traced.insert(std::process::id(), 2, 0)?;
        }
        let mut ring: RingBuf<MapData> =
            RingBuf::try_from(tracer.bpf.take_map("events").context("no events map")?)?;
        let (name, args) = program.split_first().context("no program to trace")?;
        let mut command = Command::new(name);
        command.args(args);
        // SAFETY: prctl is async-signal-safe and touches no memory of ours. If the recorder is
        // killed (a fault aimed at it, the run's end), the program goes too, as under strace.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let mut render = Renderer::new(child.id(), epoch_offset());
        let mut lost_reported = 0;
        let mut text = Out::default();
        loop {
            let exited = child.try_wait()?;
            let mut pfd = libc::pollfd {
                fd: ring.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            if exited.is_none() {
                // SAFETY: one valid pollfd that lives across the call.
                unsafe { libc::poll(&mut pfd, 1, POLL.as_millis() as i32) };
            }
            while let Some(item) = ring.next() {
                if let Some(e) = Event::decode(&item) {
                    render.feed(e, &mut text);
                }
            }
            if exited.is_some() {
                render.finish(&mut text);
            } else {
                render.drained(monotonic_ns(), &mut text);
            }
            let lost = tracer.lost();
            if lost > lost_reported {
                text.note(&format!(
                    "{LOST_PREFIX}{lost} events (the ring buffer was full)"
                ));
                lost_reported = lost;
            }
            // The typed events go first: a recorder killed between the two writes leaves
            // events for lines the text lacks (ignored), never text lines without their events.
            let (lines, events) = text.take();
            let mut typed = Vec::new();
            for e in &events {
                crate::model::traced::codec::encode(e, &mut typed);
            }
            calls.write_all(&typed)?;
            if !lines.is_empty() {
                file.write_all(lines.as_bytes())?;
            }
            if let Some(status) = exited {
                drop(calls);
                drop(file);
                drop(ring);
                tracer.detach();
                return Ok(status);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_events_are_used_only_when_they_cover_the_trace() {
        use crate::model::traced::{codec, Event, Traced};
        let trace = "1 1.0 close(3) = 0\n2 1.1 close(4) = 0\n# wringer-ebpf: lost 2 events\n";
        let file = |lines: &[usize]| {
            let mut b = codec::MAGIC.to_vec();
            for line in lines {
                let e = Traced {
                    line: *line,
                    tid: 1,
                    event: Event::Exited,
                };
                codec::encode(&e, &mut b);
            }
            b
        };
        assert_eq!(
            typed_events(trace, &file(&[0, 1])).map(|e| e.len()),
            Some(2)
        );
        // The second line has no event: the recorder stopped between its two writes.
        assert_eq!(typed_events(trace, &file(&[0])), None);
        // A record cut short.
        let whole = file(&[0, 1]);
        assert_eq!(typed_events(trace, &whole[..whole.len() - 2]), None);
        assert_eq!(typed_events("", &file(&[])), Some(vec![]));
    }

    #[test]
    fn the_last_lost_count_is_the_one_read() {
        let t =
            "1 1.0 close(3) = 0\n# wringer-ebpf: lost 2 events\n# wringer-ebpf: lost 7 events\n";
        assert_eq!(lost_events(t), 7);
        assert_eq!(lost_events("1 1.0 close(3) = 0\n"), 0);
    }
}
