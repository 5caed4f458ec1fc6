//! Real programs nobody here wrote, believed correct, audited clean with both recorders: a
//! finding on any of them would be a false alarm (see docs/audit.md for what each exercises).
//! Each runs under `wringer audit` (the descriptor lifecycle and the wait-for audit), with the sync observer
//! preloaded, with eBPF and with strace.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::repo;

const WRINGER: &str = env!("CARGO_BIN_EXE_wringer");

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wringer-real-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fixture(name: &str) -> String {
    repo()
        .join("harness/tests/fixtures/real")
        .join(name)
        .display()
        .to_string()
}

/// A program this machine must have (CI installs it): its absolute path.
fn program(name: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", "command -v \"$1\"", "sh", name])
        .output()
        .unwrap();
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        !path.is_empty(),
        "{name} is not installed (`just test` and .ci/run install it)"
    );
    path
}

/// Audit `command` in `dir` with both recorders; each must pass clean.
fn clean(dir: &Path, what: &str, ranks: u32, command: &[String]) {
    for backend in ["ebpf", "strace"] {
        let report = dir.join(format!("report-{backend}"));
        let out = Command::new(WRINGER)
            .current_dir(dir)
            .args(["audit", "--audit-backend", backend, "--deadline", "120s"])
            // The descriptor rules and the wait-for audit: neither may flag a correct program.
            .args(["--check", "fd-lifecycle", "--check", "waits"])
            .args(["--ranks", &ranks.to_string()])
            .arg("--report-dir")
            .arg(&report)
            .arg("--")
            .args(command)
            .env("WRINGER_REPLAYS", "0")
            .env("CI", "true")
            .output()
            .unwrap();
        let summary = std::fs::read_to_string(report.join("summary.md")).unwrap_or_default();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{what} ({backend}) is not clean:\n{summary}\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}

#[test]
fn an_interpreter_s_threaded_server_and_its_event_loop() {
    let dir = scratch("python");
    let python = program("python3");
    clean(
        &dir,
        "Python's ThreadingTCPServer",
        1,
        &[python.clone(), fixture("threaded_http_server.py")],
    );
    clean(
        &dir,
        "Python's asyncio",
        1,
        &[python, fixture("asyncio_echo.py")],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_javascript_runtime_s_http_server() {
    let dir = scratch("node");
    clean(
        &dir,
        "node's http",
        1,
        &[program("node"), fixture("http_server.js")],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_build_tool_with_its_jobserver() {
    let dir = scratch("make");
    let out = dir.display().to_string();
    clean(
        &dir,
        "make -j4 with a sub-make",
        1,
        &[
            program("make"),
            "-j4".into(),
            "-s".into(),
            "-f".into(),
            fixture("jobserver.mk"),
            format!("OUT={out}"),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Threaded compressors and a threaded sort, on a few MB.
#[test]
fn threaded_compressors_and_sort() {
    let dir = scratch("compress");
    let data = dir.join("data.txt");
    let text: String = (0..200_000)
        .map(|i| format!("{} line {i}\n", i * 7919 % 100_003))
        .collect();
    std::fs::write(&data, text).unwrap();
    let d = data.display().to_string();
    clean(
        &dir,
        "xz -T2",
        1,
        &words(&[&program("xz"), "-T2", "-k", "-f", &d]),
    );
    let zst = dir.join("data.zst").display().to_string();
    clean(
        &dir,
        "zstd -T2",
        1,
        &words(&[&program("zstd"), "-T2", "-q", "-f", &d, "-o", &zst]),
    );
    let sorted = dir.join("sorted").display().to_string();
    clean(
        &dir,
        "sort --parallel=2",
        1,
        &words(&[
            &program("sort"),
            "--parallel=2",
            "-S",
            "1M",
            "-o",
            &sorted,
            &d,
        ]),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Launchers and shims: a bash script that execs itself and then the program, and a shell
/// pipeline of everyday tools.
#[test]
fn launchers_shims_and_pipelines() {
    let dir = scratch("shims");
    clean(
        &dir,
        "a bash shim",
        1,
        &words(&[&fixture("shim.sh"), &program("gzip"), "--version"]),
    );
    clean(
        &dir,
        "a shell pipeline",
        1,
        &words(&[
            &program("sh"),
            "-c",
            "seq 1 50000 | sort -r | gzip -c | gunzip -c | tail -1 > /dev/null; ls / | wc -l > /dev/null",
        ]),
    );
    clean(
        &dir,
        "git",
        1,
        &words(&[
            &program("sh"),
            "-c",
            "rm -rf r && git init -q r && cd r && echo x > f && git add f && git -c user.name=w -c user.email=w@w commit -qm x && git log --oneline > /dev/null",
        ]),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The seed library itself: Gloo's allreduce, two processes.
#[test]
fn gloo_through_wringer_gloo() {
    let dir = scratch("gloo");
    let gloo = repo().join("target/external/wringer-gloo");
    assert!(
        gloo.is_file(),
        "{} is missing: `just external` builds it",
        gloo.display()
    );
    clean(
        &dir,
        "Gloo's allreduce",
        2,
        &words(&[
            &gloo.display().to_string(),
            "--rank",
            "{rank}",
            "--size",
            "{ranks}",
            "--store",
            "{dir}",
            "--host",
            "{host}",
            "--timeout-ms",
            "5000",
            "--rounds",
            "20",
        ]),
    );
    let _ = std::fs::remove_dir_all(&dir);
}
