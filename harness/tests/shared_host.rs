//! A shared host and hostile input: nothing a run does can be planted or injected by another
//! local user, overrides are checked like scenario files, and every line printed for pasting
//! reruns exactly what it says and nothing else. See docs/trust.md.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::repo;

const WRINGER: &str = env!("CARGO_BIN_EXE_wringer");

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wringer-shared-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn wringer_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(WRINGER)
        .current_dir(dir)
        .args(args)
        .env("CI", "true")
        .env("WRINGER_REPLAYS", "0")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn hosts() -> String {
    repo().join("hosts/local.yaml").display().to_string()
}

/// A report folder named like a strace `-o` command (`!cmd` and `|cmd` are run by strace
/// through `sh -c`) runs nothing, under both recorders and with a perturbation.
#[test]
fn a_report_folder_named_like_a_command_runs_nothing() {
    let dir = scratch("inject");
    for (i, name) in ["!touch injected-a;", "|touch injected-b;"]
        .iter()
        .enumerate()
    {
        let o = wringer_in(
            &dir,
            &[
                "audit",
                "--audit-backend",
                "strace",
                "--report-dir",
                name,
                "--perturb",
                "{syscall: getpid, delay_exit: 1us}",
                "--",
                "/bin/true",
            ],
            &[],
        );
        assert_eq!(o.status.code(), Some(0), "{i}: {}", text(&o));
        assert!(
            dir.join(name).join("results.json").is_file(),
            "{}",
            text(&o)
        );
    }
    assert!(!dir.join("injected-a").exists() && !dir.join("injected-b").exists());
    // A folder named like an option reaches the eBPF recorder as a path too.
    let o = wringer_in(&dir, &["audit", "--report-dir=-o", "--", "/bin/true"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Build a shared library whose constructor creates `marker`: what another user would plant.
fn planted_library(dir: &Path, marker: &Path) -> PathBuf {
    let src = dir.join("plant.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void p(void) {{ FILE *f = fopen(\"{}\", \"w\"); if (f) fclose(f); }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let lib = dir.join("plant.so");
    let cc = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .unwrap();
    assert!(cc.success());
    lib
}

/// Files planted in $TMPDIR at every name wringer used before (the verbs observer by content
/// hash, the exec folder by port), and symlinks there, are never preloaded, entered or
/// followed: the observer is written fresh into a private folder and the exec folder's name
/// comes from the run's secret token.
#[test]
fn files_planted_in_the_shared_temporary_folder_are_never_used() {
    let dir = scratch("plant");
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let marker = dir.join("planted-code-ran");
    let lib = planted_library(&dir, &marker);
    let bytes = std::fs::read(&lib).unwrap();
    // The old fixed names: by hash of the content (any hash: a planter pads to the length).
    for name in [
        "wringer-verbs-0000000000000000.so",
        "wringer-verbs-scope-0000000000000000.so",
    ] {
        std::fs::write(tmp.join(name), &bytes).unwrap();
    }
    for port in 1024..1034 {
        let d = tmp.join(format!("wringer-exec-{port}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    std::os::unix::fs::symlink("/etc", tmp.join("wringer-verbs.XXXXXXXX")).unwrap();
    let t = tmp.display().to_string();
    // The program reports its exec folder's mode and owner: private, and this user's.
    let o = wringer_in(
        &dir,
        &[
            "audit",
            "--check",
            "verbs-lifecycle",
            "--report-dir",
            "report",
            "--",
            "sh",
            "-c",
            "stat -c 'exec-folder %a %u' \"$(dirname \"$1\")\"; grep -c plant.so /proc/self/maps || true",
            "sh",
            "{dir}",
        ],
        &[("TMPDIR", &t)],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!marker.exists(), "a planted library ran: {}", text(&o));
    let logs: String = walk(&dir.join("report"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    assert!(
        logs.contains(&format!("exec-folder 700 {me}")),
        "the exec folder is not private: {logs}"
    );
    // Nothing the run left in $TMPDIR is open to others.
    for p in walk(&tmp) {
        let m = std::fs::symlink_metadata(&p).unwrap();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("wringer-exec-1") || name.starts_with("wringer-verbs") {
            continue; // the plants themselves
        }
        if m.is_dir() {
            assert_eq!(m.permissions().mode() & 0o077, 0, "{} is open", p.display());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn walk(d: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    if let Ok(rd) = std::fs::read_dir(d) {
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out
}

/// `WRINGER_HIP_LIBRARY` naming a FIFO does not hang the probe (its open would block).
#[test]
fn a_fifo_named_by_an_environment_variable_hangs_nothing() {
    let dir = scratch("fifo");
    let fifo = dir.join("libamdhip64.so");
    let c = std::ffi::CString::new(fifo.display().to_string()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut child = Command::new(WRINGER)
        .arg("probe")
        .current_dir(repo())
        .env("WRINGER_HIP_LIBRARY", &fifo)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.is_some(), "`wringer probe` hung on a FIFO");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Overrides are input like a scenario file: a fault at a point no step reaches, on a rank
/// the scenario does not have, or one `wringer audit` cannot apply, is exit 2 naming the flag;
/// a `when` or `probability` strace would refuse is refused at once.
#[test]
fn overrides_get_the_checks_a_scenario_file_gets() {
    let dir = repo();
    let file = "scenarios/tcp-peer-death.yaml";
    let cases: [(&[&str], &str); 7] = [
        (
            &[
                "run",
                file,
                "--fault",
                "{rank: 1, at: no-such-point, action: sigkill}",
            ],
            "no step reaches that point",
        ),
        (
            &[
                "run",
                file,
                "--fault",
                "{rank: 9, at: mid-stream, action: sigkill}",
            ],
            "rank 9",
        ),
        (
            &[
                "audit",
                "--fault",
                "{rank: 0, at: x, action: sigkill}",
                "--",
                "/bin/true",
            ],
            "--fault",
        ),
        (&["audit", "--exit", "256", "--", "/bin/true"], "256"),
        (
            &[
                "run",
                file,
                "--perturb",
                "{syscall: poll, delay_exit: 1ms, when: \"3 +2\"}",
            ],
            "digits only",
        ),
        (
            &[
                "run",
                file,
                "--perturb",
                "{syscall: poll, delay_exit: 1ms, probability: 0.000001}",
            ],
            "rarer than strace",
        ),
        (
            &[
                "run",
                file,
                "scenarios/tcp-close-during-recv.yaml",
                "--seed",
                "1",
                "--attempt",
                "0",
                "--shrink",
            ],
            "takes one scenario",
        ),
    ];
    for (args, says) in cases {
        let o = wringer_in(&dir, args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
}

/// `wringer report` on a results.json that is not one: exit 2 with the field named, and names
/// that are not names (they become ids and file names on the page) refused.
#[test]
fn a_results_file_read_back_is_checked_field_by_field() {
    let dir = scratch("results");
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let good = serde_json::json!({
        "run_id": "r1", "host_profile": "local", "started_unix": 1,
        "scenarios": [{
            "name": "s", "file": "s.yaml", "verdict": "pass", "reason": null,
            "duration_s": 1.0, "repeats": 1, "repeats_failed": 0,
            "metrics": {}, "latency": {},
            "evidence": { "failures": [], "notes": [], "faults": [], "stacks": [],
                          "rank_logs": [], "rejected_rendezvous_connections": 0 }
        }]
    });
    let report = |v: &Value| {
        std::fs::write(run.join("results.json"), serde_json::to_vec(v).unwrap()).unwrap();
        let out = dir.join("site.html").display().to_string();
        wringer_in(&dir, &["report", "run", "--out", &out], &[])
    };
    let o = report(&good);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let mut wrong_type = good.clone();
    wrong_type["scenarios"][0]["repeats"] = Value::String("many".into());
    let o = report(&wrong_type);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("scenarios[0].repeats"), "{}", text(&o));
    let mut long_name = good.clone();
    long_name["scenarios"][0]["name"] = Value::String("x".repeat(1 << 20));
    let o = report(&long_name);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("scenarios[0].name"),
        "{}",
        &text(&o)[..300]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A stand-in `wringer` on PATH that records the words it was given (NUL-separated) and
/// nothing else: a pasted line is checked for what it would run.
fn recorder(dir: &Path) -> (PathBuf, PathBuf) {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let words = dir.join("words");
    let shim = bin.join("wringer");
    std::fs::write(
        &shim,
        format!(
            "#!/bin/sh\nprintf '%s\\0' \"$@\" > '{}'\nprintf '%s' \"$WRINGER_TORCH\" > '{}.env'\n",
            words.display(),
            words.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    (bin, words)
}

/// Paste `line` into bash in `dir` with the recorder first on PATH; the words it ran.
fn paste(dir: &Path, line: &str) -> Vec<String> {
    let (bin, words) = recorder(dir);
    let _ = std::fs::remove_file(&words);
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = Command::new("bash")
        .current_dir(dir)
        .arg("-c")
        .arg(line)
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{line}: {}", text(&o));
    let raw = std::fs::read(&words).unwrap();
    raw.split(|b| *b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8(w.to_vec()).unwrap())
        .collect()
}

fn replay_line(report: &Path) -> String {
    let v: Value =
        serde_json::from_slice(&std::fs::read(report.join("results.json")).unwrap()).unwrap();
    v["scenarios"][0]["evidence"]["replays"][0]["command"]
        .as_str()
        .expect("a replay line")
        .to_string()
}

/// A failing scenario in a file named like an option and holding a bidi override: the
/// printed line, pasted, gives `wringer` the same file and flags, and runs nothing else.
#[test]
fn replay_lines_paste_back_to_the_same_command_and_nothing_else() {
    let dir = scratch("paste");
    let name = "-x\u{202e}$(touch pwned)'.yaml";
    std::fs::copy(
        repo().join("harness/tests/fixtures/impossible.yaml"),
        dir.join(name),
    )
    .unwrap();
    let o = wringer_in(
        &dir,
        &["run", "--hosts", &hosts(), "--report-dir", "r", "--", name],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let line = replay_line(&dir.join("r"));
    assert!(!line.contains('\u{202e}'), "a raw bidi override in {line}");
    let words = paste(&dir, &line);
    assert!(
        !dir.join("pwned").exists(),
        "the line ran a command: {line}"
    );
    assert_eq!(words.last().unwrap(), &format!("./{name}"), "{line}");
    assert!(words.contains(&"--seed".to_string()) && words.contains(&"--attempt".to_string()));
    // `wringer audit`'s line keeps what the command had to do, and when.
    let o = wringer_in(
        &dir,
        &[
            "audit",
            "--exit",
            "3",
            "--deadline",
            "20s",
            "--report-dir",
            "a",
            "--",
            "sh",
            "-c",
            "exit 4",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let words = paste(&dir, &replay_line(&dir.join("a")));
    let joined = words.join(" ");
    assert!(
        joined.contains("--exit 3") && joined.contains("--deadline 20s"),
        "{joined}"
    );
    assert!(joined.ends_with("-- sh -c exit 4"), "{joined}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A program printing 4 MB (two million lines) under strace: the rank reads and logs its
/// output in blocks, so its own traced calls do not grow with the lines (they were one log
/// write and one `wait4` per line, and the step ran out its deadline).
#[test]
fn a_chatty_program_costs_the_rank_a_call_per_block_not_per_line() {
    let dir = scratch("chatty");
    let o = wringer_in(
        &dir,
        &[
            "audit",
            "--audit-backend",
            "strace",
            "--deadline",
            "60s",
            "--report-dir",
            "r",
            "--perturb",
            "{syscall: getpid, delay_exit: 1us}",
            "--",
            "sh",
            "-c",
            "yes | head -c 4000000",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let trace = walk(&dir.join("r"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|x| x == "strace"))
        .expect("the rank's trace");
    let t = std::fs::read_to_string(trace).unwrap();
    let log_writes = t.matches("write(2, \"[exec").count();
    let waits = t.lines().filter(|l| l.contains(" wait4(")).count();
    assert!(
        log_writes < 5_000,
        "{log_writes} log writes for 2,000,000 lines"
    );
    assert!(waits < 5_000, "{waits} wait4 calls for 2,000,000 lines");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A program that exits leaving 2,000 children holding its output pipes: all of them are
/// ended, and the rank's own pipes and reader threads are not reported as the program's leak.
#[test]
fn thousands_of_children_left_behind_are_ended_and_not_a_leak_of_the_rank() {
    let dir = scratch("children");
    for round in 0..3 {
        let report = format!("r{round}");
        let o = wringer_in(
            &dir,
            &[
                "audit",
                // strace: 2,000 forks overflow the eBPF ring on two cores (a lossy trace is
                // never clean), which is the recorder's matter, not this test's.
                "--audit-backend",
                "strace",
                "--check",
                "leaks",
                "--check",
                "fd-lifecycle",
                "--report-dir",
                &report,
                "--",
                "sh",
                "-c",
                "for i in $(seq 2000); do sleep 120 & done; echo started; exit 0",
            ],
            &[],
        );
        assert_eq!(o.status.code(), Some(0), "round {round}: {}", text(&o));
        let log: String = walk(&dir.join(&report))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect();
        assert!(log.contains("ended 2000 processes"), "{log}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A role whose readiness never comes and has no timeout of its own: the step's deadline ends
/// it with that reason, and the failure's replays stay within the scenario's deadline (the
/// failed attempt and its replays together), so the run does not spend three deadlines.
#[test]
fn a_role_never_ready_is_ended_by_the_step_deadline_and_replays_fit_the_scenario_deadline() {
    let dir = scratch("never-ready");
    let file = repo().join("harness/tests/fixtures/exec/never-ready-untimed.yaml");
    let o = Command::new(WRINGER)
        .current_dir(&dir)
        .args(["run", "--hosts", &hosts(), "--report-dir", "r"])
        .arg(&file)
        .env("CI", "true")
        .env("WRINGER_REPLAYS", "2")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: Value =
        serde_json::from_slice(&std::fs::read(dir.join("r/results.json")).unwrap()).unwrap();
    let s = &v["scenarios"][0];
    let logs: String = walk(&dir.join("r"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    let all = format!("{s}{logs}");
    assert!(all.contains("not ready within"), "{all}");
    assert!(
        s["reason"]
            .as_str()
            .unwrap()
            .contains("nothing listened on its port"),
        "{s}"
    );
    // 8 s an attempt against a 20 s deadline: one replay fits, the second would not.
    let replayed = &s["evidence"]["replays"][0]["replayed"];
    assert!(replayed[1].as_u64().unwrap() <= 1, "{replayed}");
    assert!(
        s["evidence"]["notes"]
            .to_string()
            .contains("would run past the scenario's deadline"),
        "{s}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
