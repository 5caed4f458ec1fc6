//! The `rxe-vm` host profile: for machines whose kernel has no RDMA. One VM (virtme-ng, TCG,
//! this machine's filesystem read-only) gets soft-RoCE devices, and the run happens inside it:
//! the same wringer binary runs the selected scenarios there on a local profile that must have
//! RDMA, writing its report into a folder the VM may write. Its results are then recorded here.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::hosts::HostProfile;
use crate::report::{Evidence, ScenarioResult, Verdict};
use crate::runner::RunOptions;

/// Time to boot the VM and set up rxe under TCG, on top of the scenarios' own deadlines.
const BOOT_ALLOWANCE: Duration = Duration::from_secs(240);

pub fn run(
    profile: &HostProfile,
    files: &[PathBuf],
    opts: &RunOptions,
    seed: u64,
    dir: &Path,
    interrupted: &AtomicBool,
) -> Vec<ScenarioResult> {
    let names: Vec<(String, PathBuf)> = files
        .iter()
        .filter_map(|f| {
            crate::scenario::load(f)
                .ok()
                .map(|l| (l.scenario.name.clone(), f.clone()))
        })
        .collect();
    let outcome = (|| -> Result<Vec<ScenarioResult>, String> {
        let vm = profile.vm.as_ref().ok_or("the profile has no `vm`")?;
        if !crate::probe::on_path("vng") || !crate::probe::on_path("qemu-system-x86_64") {
            return Err(
                "no-vm: virtme-ng (`vng`) or qemu is not installed: run `just setup-rxe`".into(),
            );
        }
        if !vm.kernel.exists() {
            return Err(format!(
                "no-vm: the kernel {} is missing: run `just setup-rxe`",
                vm.kernel.display()
            ));
        }
        let dir = std::path::absolute(dir).map_err(|e| e.to_string())?;
        let inner = dir.join("vm");
        std::fs::create_dir_all(&inner).map_err(|e| e.to_string())?;
        let hosts = inner.join("rxe.yaml");
        std::fs::write(
            &hosts,
            format!(
                "name: {}\ndescription: inside the rxe VM\nkind: local\nmust_have: [rdma]\n",
                profile.name
            ),
        )
        .map_err(|e| e.to_string())?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let cwd = std::env::current_dir().map_err(|e| e.to_string())?;
        let mut script = String::from("set -e\nmodprobe rdma_rxe\n");
        for i in 0..vm.rxe_devices {
            script.push_str(&format!(
                "ip link add wrx{i}a type veth peer name wrx{i}b\nip link set wrx{i}a up\nip link set wrx{i}b up\nip addr add 10.213.{i}.1/24 dev wrx{i}a\nrdma link add rxe{i} type rxe netdev wrx{i}a\n"
            ));
        }
        let mut args = vec!["run".to_string()];
        args.extend(files.iter().map(|f| {
            std::path::absolute(f)
                .unwrap_or_else(|_| f.clone())
                .display()
                .to_string()
        }));
        args.extend([
            "--hosts".into(),
            hosts.display().to_string(),
            "--report-dir".into(),
            inner.join("report").display().to_string(),
        ]);
        args.extend(["--seed".into(), seed.to_string()]);
        if let Some(r) = opts.repeat {
            args.extend(["--repeat".into(), r.to_string()]);
        }
        if opts.strict {
            args.push("--strict".into());
        }
        let quoted: Vec<String> = args.iter().map(|a| crate::ssh::quote(a)).collect();
        script.push_str(&format!(
            "cd {}\nset +e\nCI=true {} {}\necho $? > {}\n",
            crate::ssh::quote(&cwd.display().to_string()),
            crate::ssh::quote(&exe.display().to_string()),
            quoted.join(" "),
            inner.join("exit").display()
        ));
        let script_path = inner.join("run.sh");
        std::fs::write(&script_path, script).map_err(|e| e.to_string())?;
        let console =
            std::fs::File::create(inner.join("console.log")).map_err(|e| e.to_string())?;
        let budget: Duration = names
            .iter()
            .filter_map(|(_, f)| crate::scenario::load(f).ok())
            .map(|l| l.scenario.deadline.0 * opts.repeat.unwrap_or(l.scenario.repeat))
            .sum::<Duration>()
            + BOOT_ALLOWANCE;
        let mut child = Command::new("vng")
            .args(["--disable-kvm", "--run"])
            .arg(&vm.kernel)
            .args([
                "--memory",
                &vm.memory,
                "--cpus",
                &vm.cpus.to_string(),
                "--rwdir",
            ])
            .arg(&inner)
            .arg("--exec")
            .arg(format!("sh {}", script_path.display()))
            .stdin(Stdio::null())
            .stdout(console.try_clone().map_err(|e| e.to_string())?)
            .stderr(console)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting vng: {e}"))?;
        let deadline = Instant::now() + budget;
        let ended = loop {
            if let Ok(Some(_)) = child.try_wait() {
                break None;
            }
            if interrupted.load(Ordering::Relaxed) {
                break Some("interrupted");
            }
            if Instant::now() > deadline {
                break Some("the VM run passed its deadline");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // The VM (qemu and vng) goes with its process group on every path.
        // SAFETY: signals the process group created for vng above.
        unsafe { libc::killpg(child.id() as i32, libc::SIGKILL) };
        let _ = child.wait();
        let results = read_results(&inner.join("report/results.json"));
        let console = inner.join("console.log").display().to_string();
        let mut out = results;
        // Scenarios the VM never reported: failures with the reason and the console log.
        for (name, file) in &names {
            if !out.iter().any(|r| &r.name == name) {
                let why =
                    ended.unwrap_or("the VM ended before reporting it (boot or rxe setup failed?)");
                out.push(failed(name, file, format!("{why}; VM console: {console}")));
            }
        }
        Ok(out)
    })();
    match outcome {
        Ok(r) => r,
        Err(why) => names.iter().map(|(n, f)| skipped(n, f, &why)).collect(),
    }
}

fn read_results(path: &Path) -> Vec<ScenarioResult> {
    #[derive(serde::Deserialize)]
    struct Doc {
        scenarios: Vec<ScenarioResult>,
    }
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Doc>(&b).ok())
        .map(|d| d.scenarios)
        .unwrap_or_default()
}

fn blank(name: &str, file: &Path, verdict: Verdict, reason: String) -> ScenarioResult {
    ScenarioResult {
        name: name.to_string(),
        file: file.to_owned(),
        verdict,
        reason: Some(reason),
        duration_s: 0.0,
        repeats: 0,
        repeats_failed: 0,
        metrics: Default::default(),
        latency: Default::default(),
        evidence: Evidence::default(),
    }
}

fn failed(name: &str, file: &Path, reason: String) -> ScenarioResult {
    blank(name, file, Verdict::Fail, reason)
}

fn skipped(name: &str, file: &Path, reason: &str) -> ScenarioResult {
    blank(name, file, Verdict::Skip, reason.to_string())
}
