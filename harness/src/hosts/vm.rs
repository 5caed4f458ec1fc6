//! Soft-RoCE VMs (virtme-ng under TCG, this machine's filesystem read-only inside) for machines
//! whose kernel has no RDMA. The run happens inside a VM: the same wringer binary runs the
//! selected scenarios there and writes its report into a folder the VM may write; its results
//! are then recorded here.
//!
//! - `rxe-vm`: one VM with `rxe_devices` soft-RoCE devices, each on its own veth; ranks are
//!   local processes inside it.
//! - `rxe-vm-pair`: two VMs joined by a qemu socket link bound to 127.0.0.1 (10.0.0.1 and
//!   10.0.0.2, one rxe device each). Both run sshd with a key made for the run; the first runs
//!   the coordinator, which reaches both hosts over SSH: the same path as a real pair.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::hosts::profile::{HostProfile, ProfileKind, VmSpec};
use crate::hosts::ssh::quote;
use crate::model::result::ScenarioResult;

/// Time to boot and set up under TCG, on top of the scenarios' own deadlines.
const BOOT_ALLOWANCE: Duration = Duration::from_secs(300);

/// What the run inside the VM is asked to do.
pub struct VmRun<'a> {
    pub files: &'a [PathBuf],
    pub repeat: Option<u32>,
    pub strict: bool,
    pub no_audit: bool,
    pub seed: u64,
    /// The outer run's report folder; the VM writes under `vm/` there.
    pub dir: &'a Path,
    /// Every scenario's deadline times its repeats; boot time is added here.
    pub budget: Duration,
}

/// What came back from the VM.
pub struct VmOutcome {
    /// The results the inner run reported (possibly fewer than asked for).
    pub results: Vec<ScenarioResult>,
    /// Why the VM ended early, when it did.
    pub ended: Option<&'static str>,
    /// Where the consoles and the inner report are.
    pub inner: PathBuf,
}

/// Why the VM run did not happen.
#[derive(Debug, PartialEq)]
pub enum VmError {
    /// The VM cannot run on this machine (nothing installed): a `no-vm` skip, or a failure
    /// where the profile must have RDMA.
    Unavailable(String),
    /// It should have run and did not (a file not written, a program that failed): a harness
    /// error, never a skip.
    Failed(String),
}

impl From<anyhow::Error> for VmError {
    fn from(why: anyhow::Error) -> Self {
        VmError::Failed(format!("{why:#}"))
    }
}

/// Boot the profile's VM(s) and run the scenarios there.
pub fn run(
    profile: &HostProfile,
    req: &VmRun,
    interrupted: &AtomicBool,
) -> Result<VmOutcome, VmError> {
    let budget = req.budget + BOOT_ALLOWANCE;
    let vm = profile
        .vm
        .as_ref()
        .ok_or_else(|| VmError::Failed("the profile has no `vm`".into()))?;
    if !crate::hosts::probe::on_path("vng") || !crate::hosts::probe::on_path("qemu-system-x86_64") {
        return Err(VmError::Unavailable(
            "virtme-ng (`vng`) or qemu is not installed: run `just setup-rxe`".into(),
        ));
    }
    if !vm.kernel.exists() {
        return Err(VmError::Unavailable(format!(
            "the kernel {} is missing: run `just setup-rxe`",
            vm.kernel.display()
        )));
    }
    let inner = std::path::absolute(req.dir)
        .map_err(anyhow::Error::from)?
        .join("vm");
    std::fs::create_dir_all(&inner).map_err(anyhow::Error::from)?;
    let ended = match profile.kind {
        ProfileKind::RxeVmPair => run_pair(profile, vm, req, &inner, budget, interrupted)?,
        _ => run_single(profile, vm, req, &inner, budget, interrupted)?,
    };
    Ok(VmOutcome {
        results: read_results(&inner.join("report/results.json")),
        ended,
        inner,
    })
}

/// The inner `wringer run` command line (the run itself, inside the first VM).
fn wringer_run(req: &VmRun, hosts: &Path, inner: &Path) -> anyhow::Result<String> {
    let exe = std::env::current_exe().map_err(anyhow::Error::from)?;
    let cwd = std::env::current_dir().map_err(anyhow::Error::from)?;
    let mut args = vec![exe.display().to_string(), "run".into()];
    args.extend(req.files.iter().map(|f| {
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
    args.extend(["--seed".into(), req.seed.to_string()]);
    if let Some(r) = req.repeat {
        args.extend(["--repeat".into(), r.to_string()]);
    }
    if req.strict {
        args.push("--strict".into());
    }
    if req.no_audit {
        args.push("--no-audit".into());
    }
    let words: Vec<String> = args.iter().map(|a| quote(a)).collect();
    // Tests switch a transport bug on (a `bug-injection` build only); the VM's ranks need it too.
    let bug = std::env::var("WRINGER_TRANSPORT_BUG")
        .ok()
        .filter(|b| !b.is_empty() && b.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
        .map(|b| format!("WRINGER_TRANSPORT_BUG={} ", quote(&b)))
        .unwrap_or_default();
    Ok(format!(
        "cd {}\n{bug}CI=true {}\necho $? > {}\n",
        quote(&cwd.display().to_string()),
        words.join(" "),
        quote(&inner.join("exit").display().to_string())
    ))
}

fn vng(
    vm: &VmSpec,
    memory: &str,
    cpus: u32,
    inner: &Path,
    script: &Path,
    console: &Path,
    extra: Option<String>,
) -> anyhow::Result<Child> {
    let log = std::fs::File::create(console).map_err(anyhow::Error::from)?;
    let mut c = Command::new("vng");
    c.args(["--disable-kvm", "--run"])
        .arg(&vm.kernel)
        .args(["--memory", memory, "--cpus", &cpus.to_string(), "--rwdir"])
        .arg(inner);
    if let Some(q) = extra {
        c.arg(format!("--qemu-opts={q}"));
    }
    c.arg("--exec")
        .arg(format!("sh {}", script.display()))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(anyhow::Error::from)?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| anyhow::anyhow!("starting vng: {e}"))
}

/// Wait for `child` within `deadline` (or until interrupted); the VM's process group goes on
/// every path.
fn wait_vm(child: &mut Child, deadline: Instant, interrupted: &AtomicBool) -> Option<&'static str> {
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
    kill_vm(child);
    ended
}

fn kill_vm(child: &mut Child) {
    // SAFETY: signals the process group created for this vng (qemu included).
    unsafe { libc::killpg(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}

fn run_single(
    profile: &HostProfile,
    vm: &VmSpec,
    req: &VmRun,
    inner: &Path,
    budget: Duration,
    interrupted: &AtomicBool,
) -> anyhow::Result<Option<&'static str>> {
    let hosts = inner.join("rxe.yaml");
    std::fs::write(
        &hosts,
        format!(
            "name: {}\ndescription: inside the rxe VM\nkind: local\nmust_have: [rdma]\n",
            profile.name
        ),
    )
    .map_err(anyhow::Error::from)?;
    let mut script = String::from("set -e\nmodprobe rdma_rxe\n");
    for i in 0..vm.rxe_devices {
        script.push_str(&format!(
            "ip link add wrx{i}a type veth peer name wrx{i}b\nip link set wrx{i}a up\nip link set wrx{i}b up\nip addr add 10.213.{i}.1/24 dev wrx{i}a\nrdma link add rxe{i} type rxe netdev wrx{i}a\n"
        ));
    }
    script.push_str("set +e\n");
    script.push_str(&wringer_run(req, &hosts, inner)?);
    let path = inner.join("run.sh");
    std::fs::write(&path, script).map_err(anyhow::Error::from)?;
    let mut child = vng(
        vm,
        &vm.memory,
        vm.cpus,
        inner,
        &path,
        &inner.join("console.log"),
        None,
    )?;
    Ok(wait_vm(&mut child, Instant::now() + budget, interrupted))
}

fn run_pair(
    profile: &HostProfile,
    vm: &VmSpec,
    req: &VmRun,
    inner: &Path,
    budget: Duration,
    interrupted: &AtomicBool,
) -> anyhow::Result<Option<&'static str>> {
    let key = inner.join("key");
    let _ = std::fs::remove_file(&key);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .output()
        .map_err(|e| anyhow::anyhow!("ssh-keygen: {e}"))?;
    if !out.status.success() {
        return Err(anyhow::anyhow!(
            "ssh-keygen failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    std::fs::copy(key.with_extension("pub"), inner.join("authorized_keys"))
        .map_err(anyhow::Error::from)?;
    let _ = std::fs::remove_file(inner.join("done"));
    // Both VMs: NIC up, one rxe device on it, sshd (PAM, since root's password is locked) on a
    // host key made at boot.
    let host = format!(
        "set -e\nmodprobe virtio_net\nfor i in $(seq 1 50); do NIC=$(ip -o link | awk -F': ' '$2 != \"lo\" {{print $2; exit}}'); [ -n \"$NIC\" ] && break; sleep 0.2; done\n\
         ip addr add 10.0.0.$1/24 dev $NIC\nip link set $NIC up\nmodprobe rdma_rxe\nrdma link add rxe0 type rxe netdev $NIC\n\
         mkdir -p /tmp/sshd /run/sshd\nssh-keygen -q -t ed25519 -N '' -f /tmp/sshd/host_key\n\
         /usr/sbin/sshd -f /dev/null -o HostKey=/tmp/sshd/host_key -o AuthorizedKeysFile={keys} -o PermitRootLogin=prohibit-password \
         -o StrictModes=no -o UsePAM=yes -o PidFile=/tmp/sshd/pid -o ListenAddress=10.0.0.$1 -o MaxStartups=100:30:200\n",
        keys = quote(&inner.join("authorized_keys").display().to_string())
    );
    std::fs::write(inner.join("host.sh"), host).map_err(anyhow::Error::from)?;
    let done = quote(&inner.join("done").display().to_string());
    std::fs::write(
        inner.join("b.sh"),
        format!(
            "sh {} 2\nwhile [ ! -f {done} ]; do sleep 1; done\n",
            quote(&inner.join("host.sh").display().to_string())
        ),
    )
    .map_err(anyhow::Error::from)?;
    let hosts = inner.join("pair.yaml");
    let host_entry = |n: u8, name: &str| {
        format!(
            "  - name: {name}\n    ssh: {{ host: 10.0.0.{n}, user: root, identity: {key}, trust_new_host_keys: true }}\n    data_addr: 10.0.0.{n}\n    remote_dir: {dir}\n",
            key = key.display(),
            dir = inner.join(name).display()
        )
    };
    std::fs::write(
        &hosts,
        format!("name: {}\ndescription: two soft-RoCE VMs\nkind: ssh\ncoordinator_addr: 10.0.0.1\nhosts:\n{}{}must_have: [rdma, xhost]\n", profile.name, host_entry(1, "vm-a"), host_entry(2, "vm-b")),
    )
    .map_err(anyhow::Error::from)?;
    let a = format!(
        "sh {} 1\nset +e\n{}touch {done}\n",
        quote(&inner.join("host.sh").display().to_string()),
        wringer_run(req, &hosts, inner)?
    );
    std::fs::write(inner.join("a.sh"), a).map_err(anyhow::Error::from)?;

    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(anyhow::Error::from)?
        .port();
    let nic = |mode: &str, mac: u8| {
        format!("-netdev socket,id=n0,{mode}=127.0.0.1:{port} -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:0{mac}")
    };
    let deadline = Instant::now() + budget;
    let mut b = vng(
        vm,
        &vm.memory,
        vm.cpus,
        inner,
        &inner.join("b.sh"),
        &inner.join("console-b.log"),
        Some(nic("listen", 2)),
    )?;
    // Host A connects to host B's link: wait (bounded) until B's qemu listens.
    let needle = format!("0100007F:{port:04X}");
    while !std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains(&needle) && l.split_whitespace().nth(3) == Some("0A"))
    {
        if Instant::now() > deadline
            || interrupted.load(Ordering::Relaxed)
            || matches!(b.try_wait(), Ok(Some(_)))
        {
            kill_vm(&mut b);
            return Ok(Some("host B's VM never opened its link"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut a = match vng(
        vm,
        &vm.memory,
        vm.cpus,
        inner,
        &inner.join("a.sh"),
        &inner.join("console-a.log"),
        Some(nic("connect", 1)),
    ) {
        Ok(a) => a,
        Err(e) => {
            kill_vm(&mut b);
            return Err(e);
        }
    };
    let ended = wait_vm(&mut a, deadline, interrupted);
    kill_vm(&mut b);
    Ok(ended)
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
