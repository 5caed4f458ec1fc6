//! The Slurm cleanup checks, run by `just test-slurm` against the Slurm test cluster (Debian's
//! slurmctld and slurmd in containers, `just setup-slurm`): after a SIGINT, a watchdog kill and
//! a SIGKILL of the coordinator, the scheduler shows no step of the run within 5 s, and while
//! the ranks run the run token shows in no command line, environment or `scontrol` output.
//! Each case starts its own cluster (hosts/slurm-containers.yaml) and ranks that hold their
//! step. The verdicts are read from the run's results.json as typed failures.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{repo, wringer_given};
use wringer::model::failure::{Failure, FailureKind};
use wringer::model::result::ScenarioResult;

fn out_dir() -> PathBuf {
    repo().join("reports/slurm-cleanup")
}

/// A run of hosts/slurm/hold.yaml whose ranks hold their step.
struct Held {
    child: Child,
    run: String,
    /// The controller's container.
    ctl: String,
}

fn docker_exec(container: &str, script: &str) -> Option<String> {
    let out = Command::new("docker")
        .args(["exec", container, "sh", "-c", script])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The run's own steps as the controller lists them (asked inside its container, which works
/// whether or not the coordinator, and its munged, still live); `None` when it cannot answer.
fn steps_of_run(ctl: &str, run: &str) -> Option<Vec<String>> {
    let table = docker_exec(ctl, "squeue --steps --noheader --format='%i %j'")?;
    let mine = format!(" wringer-{run}-");
    Some(
        table
            .lines()
            .filter(|l| l.contains(&mine) && !l.ends_with("-ctl"))
            .map(str::to_owned)
            .collect(),
    )
}

/// How long until the run has no step listed; `None` after 10 s. An unreachable controller
/// counts as not yet.
fn time_to_gone(ctl: &str, run: &str) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if steps_of_run(ctl, run).is_some_and(|s| s.is_empty()) {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

fn start_held(case: &str) -> Result<Held, String> {
    let log = out_dir().join(format!("{case}.log"));
    let child = wringer_given()
        .args([
            "run",
            "--hosts",
            "hosts/slurm-containers.yaml",
            "--report-dir",
        ])
        .arg(out_dir().join(case))
        .arg("hosts/slurm/hold.yaml")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{case}: starting wringer: {e}"))?;
    let mut held = Held {
        child,
        run: String::new(),
        ctl: String::new(),
    };
    let t0 = Instant::now();
    while held.run.is_empty() && t0.elapsed() < Duration::from_secs(60) {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(id) = text
            .lines()
            .find_map(|l| l.strip_prefix("wringer run ")?.split(':').next())
        {
            held.run = id.to_string();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    held.ctl = format!("wringer-{}-h3", held.run);
    // Until the ranks hold their step (the cluster starts in 20 to 60 s here).
    while t0.elapsed() < Duration::from_secs(180) {
        if steps_of_run(&held.ctl, &held.run).is_some_and(|s| !s.is_empty()) {
            return Ok(held);
        }
        if held.child.try_wait().ok().flatten().is_some() {
            return Err(format!(
                "{case}: the run ended before its step started: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = held.child.kill();
    let _ = held.child.wait();
    Err(format!("{case}: no step of run {} appeared", held.run))
}

/// A 32-hex-digit word (the run token's shape) anywhere in `text`.
fn has_token(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_hexdigit())
        .any(|w| w.len() == 32)
}

/// The token is on no command line and in no environment of the step's processes, nor in
/// what `scontrol show job` or `show step` prints.
fn token_hidden(held: &Held) -> Result<(), String> {
    let mut seen = vec![];
    let scontrol =
        docker_exec(&held.ctl, "scontrol show job -d; scontrol show step").unwrap_or_default();
    if has_token(&scontrol) {
        seen.push("scontrol".to_string());
    }
    for node in 0..2 {
        let procs = docker_exec(
            &format!("wringer-{}-h{node}", held.run),
            r#"for p in $(pgrep -f "wringer.* rank "); do tr "\0" "\n" < /proc/$p/cmdline; tr "\0" "\n" < /proc/$p/environ; done"#,
        )
        .unwrap_or_default();
        if !procs.contains("rank") {
            seen.push(format!("(no rank process found on h{node})"));
        }
        if has_token(&procs) || procs.contains("WRINGER_RUN_TOKEN") {
            seen.push(format!("h{node}"));
        }
    }
    if seen.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "token: a 32-hex-digit value or WRINGER_RUN_TOKEN shows in {}",
            seen.join(", ")
        ))
    }
}

/// The one scenario of a run, read as the typed record it is.
fn result_of(case: &str) -> Result<ScenarioResult, String> {
    let path = out_dir().join(case).join("results.json");
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&path).map_err(|e| format!("{case}: {}: {e}", path.display()))?,
    )
    .map_err(|e| format!("{case}: {e}"))?;
    serde_json::from_value(json["scenarios"][0].clone()).map_err(|e| format!("{case}: {e}"))
}

fn within_5s(case: &str, gone: Option<Duration>) -> Result<(), String> {
    match gone {
        Some(t) if t <= Duration::from_secs(5) => {
            eprintln!("slurm cleanup: {case}: step gone from squeue after {t:?}");
            Ok(())
        }
        Some(t) => Err(format!("{case}: the step left squeue only after {t:?}")),
        None => Err(format!("{case}: the step was still listed 10 s later")),
    }
}

fn sigint() -> Result<(), String> {
    let mut held = start_held("sigint")?;
    let token = token_hidden(&held);
    // SAFETY: kill(2) on a child we started and have not reaped.
    unsafe { libc::kill(held.child.id() as i32, libc::SIGINT) };
    let gone = time_to_gone(&held.ctl, &held.run);
    let _ = held.child.wait();
    token?;
    within_5s("SIGINT", gone)?;
    let r = result_of("sigint")?;
    if r.failure_kinds().contains(&FailureKind::Leftover) {
        return Err(format!(
            "SIGINT: the run reports a leftover: {:?}",
            r.evidence.failures
        ));
    }
    Ok(())
}

fn watchdog() -> Result<(), String> {
    let out = wringer_given()
        .args([
            "run",
            "--hosts",
            "hosts/slurm-containers.yaml",
            "--report-dir",
        ])
        .arg(out_dir().join("watchdog"))
        .arg("hosts/slurm/watchdog.yaml")
        .output()
        .map_err(|e| format!("watchdog: {e}"))?;
    if out.status.code() != Some(1) {
        return Err(format!(
            "watchdog: exit {:?}, want 1 (the step outlives its deadline)",
            out.status.code()
        ));
    }
    let r = result_of("watchdog")?;
    let fired = r.evidence.failures.iter().any(|f| {
        matches!(&f.failure, Failure::Watchdog { summary } if summary.contains("hung in step 0 (stall) past its"))
    });
    if !fired {
        return Err(format!(
            "watchdog: the failure is not the watchdog's: {:?}",
            r.evidence.failures
        ));
    }
    if r.failure_kinds().contains(&FailureKind::Leftover) {
        return Err(format!(
            "watchdog: a step of the run was still listed 5 s after it was cancelled: {:?}",
            r.evidence.failures
        ));
    }
    Ok(())
}

fn sigkill() -> Result<(), String> {
    let mut held = start_held("sigkill")?;
    let pid = held.child.id();
    let _ = held.child.kill();
    let gone = time_to_gone(&held.ctl, &held.run);
    let _ = held.child.wait();
    let mut failures = vec![];
    if let Err(e) = within_5s("SIGKILL", gone) {
        failures.push(e);
    }
    // srun dies with the coordinator (PR_SET_PDEATHSIG); salloc's pipe closes and it gives
    // the allocation back within 5 s.
    let t0 = Instant::now();
    let mut jobs = String::new();
    while t0.elapsed() < Duration::from_secs(5) {
        jobs = docker_exec(&held.ctl, "squeue --noheader --format='%i %j %T'")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&format!(" wringer-{}", held.run)))
            .collect::<Vec<_>>()
            .join("; ");
        if jobs.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !jobs.is_empty() {
        failures.push(format!(
            "SIGKILL: the allocation was not given back within 5 s: {jobs}"
        ));
    }
    // munged outlives the coordinator by 3 s here, for salloc to give the allocation back.
    let left = |run: &str| -> Vec<String> {
        let ps = Command::new("ps").args(["-eo", "pid,args"]).output();
        let ps = ps.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        ps.unwrap_or_default()
            .lines()
            .filter(|l| l.contains(run))
            .filter(|l| ["salloc", "srun", "munged"].iter().any(|p| l.contains(p)))
            .map(str::to_owned)
            .collect()
    };
    let t0 = Instant::now();
    while !left(&held.run).is_empty() && t0.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let still = left(&held.run);
    if !still.is_empty() {
        failures.push(format!(
            "SIGKILL: processes of the run still here 6 s later: {still:?}"
        ));
    }
    // What a killed coordinator leaves on purpose for the next run's sweep: its containers
    // and networks. Removed here, so the check leaves nothing behind.
    let label = format!("label=wringer.pid={pid}");
    for (list, remove) in [
        (vec!["ps", "-aq", "--filter"], vec!["rm", "-f"]),
        (
            vec!["network", "ls", "-q", "--filter"],
            vec!["network", "rm"],
        ),
    ] {
        let ids = Command::new("docker").args(&list).arg(&label).output();
        let ids = ids.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        for id in ids.unwrap_or_default().split_whitespace() {
            let _ = Command::new("docker")
                .args(&remove)
                .arg(id)
                .stdout(Stdio::null())
                .status();
        }
    }
    let _ = std::fs::remove_dir_all(format!("/tmp/wringer-slurm-{}", held.run));
    let _ = std::fs::remove_dir_all(format!("/tmp/wringer-keys-{}", held.run));
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

#[test]
#[ignore = "needs the Slurm test cluster (docker, the wringer-slurm:local image, munge and the Slurm clients): `just test-slurm` runs it"]
fn a_run_leaves_no_slurm_step_behind_after_sigint_the_watchdog_or_sigkill() {
    let _ = std::fs::remove_dir_all(out_dir());
    std::fs::create_dir_all(out_dir()).unwrap();
    // One case after the other: each starts its own cluster of four containers.
    let failures: Vec<String> = [sigint(), watchdog(), sigkill()]
        .into_iter()
        .filter_map(Result::err)
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
