//! Soft-RoCE VMs (virtme-ng under TCG, this machine's filesystem read-only inside) for machines
//! whose kernel has no RDMA. A VM boots, runs sshd, and from then on is a host like any other:
//! ranks start over SSH, and the coordinator stays here.
//!
//! - `rxe-vm`: one VM with `rxe_devices` soft-RoCE devices, each on its own veth; its ranks
//!   talk over its loopback.
//! - `rxe-vm-pair`: two VMs joined by a qemu socket link bound to 127.0.0.1 (10.0.0.1 and
//!   10.0.0.2, one rxe device each): a real two-host RoCE link on one machine.
//!
//! Each VM also has a control NIC on qemu's user network: this machine reaches its sshd through
//! a port forwarded on 127.0.0.1, and its ranks reach the rendezvous at 10.0.2.2, which is this
//! machine's 127.0.0.1. The guest gets no default route, so nothing inside can reach any other
//! address through that NIC.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::hosts::backend::RemoteHost;
use crate::hosts::profile::{HostProfile, VmSpec};
use crate::hosts::shell::HostShell;
use crate::hosts::ssh::{quote, SshTarget};
use crate::model::faults::wire::WireScripts;
use crate::model::faults::WirePlane;

/// Time to boot and set up under TCG until sshd answers.
const BOOT_ALLOWANCE: Duration = Duration::from_secs(300);

/// This machine's 127.0.0.1 as a guest sees it (qemu's user network).
pub const HOST_FROM_GUEST: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2));

/// Why the profile's VMs cannot run on this machine (nothing installed): a `no-vm` skip, or a
/// failure where the profile must have RDMA. `None` when they can.
pub fn unavailable(profile: &HostProfile) -> Option<String> {
    let vm = profile.vm()?;
    if !crate::hosts::probe::on_path("vng") || !crate::hosts::probe::on_path("qemu-system-x86_64") {
        return Some("virtme-ng (`vng`) or qemu is not installed: run `just setup-rxe`".into());
    }
    if !vm.kernel.exists() {
        return Some(format!(
            "the kernel {} is missing: run `just setup-rxe`",
            vm.kernel.display()
        ));
    }
    None
}

/// Booted VMs, reachable over SSH; dropping them ends every VM (its whole process group) and
/// the master connections.
pub struct VmHosts {
    vms: Vec<Child>,
    /// One `ssh -M` per VM, which every command to it shares.
    masters: Vec<Child>,
    pub hosts: Vec<RemoteHost>,
    /// Where the consoles are.
    pub folder: PathBuf,
    /// A wire fault took a data link down since the rxe devices were last renewed.
    link_was_down: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for VmHosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmHosts")
            .field("hosts", &self.hosts)
            .field("folder", &self.folder)
            .finish()
    }
}

impl Drop for VmHosts {
    fn drop(&mut self) {
        for m in &mut self.masters {
            let _ = m.kill();
            let _ = m.wait();
        }
        for vm in &mut self.vms {
            kill_vm(vm);
        }
    }
}

/// Boot `count` VMs (1, or 2 joined by a link) with their consoles in `folder`, and wait until
/// each answers over SSH.
pub fn boot(profile: &HostProfile, count: u8, folder: &Path) -> Result<VmHosts> {
    let vm = profile.vm().context("the profile has no `vm`")?;
    let folder = std::path::absolute(folder)?;
    std::fs::create_dir_all(&folder)?;
    let key = folder.join("key");
    let _ = std::fs::remove_file(&key);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .output()
        .context("ssh-keygen")?;
    if !out.status.success() {
        bail!(
            "ssh-keygen failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::copy(key.with_extension("pub"), folder.join("authorized_keys"))?;
    let link = free_port()?;
    let mut booted = VmHosts {
        vms: vec![],
        masters: vec![],
        hosts: vec![],
        folder: folder.clone(),
        link_was_down: Default::default(),
    };
    for n in 1..=count {
        let ssh_port = free_port()?;
        let script = folder.join(format!("vm-{n}.sh"));
        std::fs::write(&script, guest_script(vm, n, count, &folder))?;
        let mut qemu = format!(
            "-netdev user,id=c0,net=10.0.2.0/24,hostfwd=tcp:127.0.0.1:{ssh_port}-10.0.2.15:22 \
             -device virtio-net-pci,netdev=c0,mac={}",
            mac(1, n)
        );
        if count > 1 {
            // The first VM listens on the link and the second connects: wait (bounded) until
            // the first's qemu listens.
            let mode = if n == 1 { "listen" } else { "connect" };
            qemu.push_str(&format!(
                " -netdev socket,id=d0,{mode}=127.0.0.1:{link} -device virtio-net-pci,netdev=d0,mac={}",
                mac(0, n)
            ));
            if n > 1 {
                wait_listening(link, &mut booted.vms[0])?;
            }
        }
        let memory = &vm.memory;
        let child = vng(
            vm,
            memory,
            &folder,
            &script,
            &folder.join(format!("console-{n}.log")),
            &qemu,
        )?;
        booted.vms.push(child);
        let target = SshTarget {
            name: format!("vm-{n}"),
            host: "127.0.0.1".into(),
            user: Some("root".into()),
            port: Some(ssh_port),
            identity: Some(key.clone()),
            trust_new_host_keys: true,
            control: Some(folder.join(format!("ssh-{n}.sock"))),
        };
        booted.hosts.push(RemoteHost {
            target: HostShell::ssh(target),
            // The VM sees this machine's files: the binary is where it is here.
            exe: std::env::current_exe()?.display().to_string(),
            data_addr: if count > 1 {
                format!("10.0.0.{n}")
            } else {
                "127.0.0.1".into()
            },
        });
    }
    let deadline = Instant::now() + BOOT_ALLOWANCE;
    for (i, h) in booted.hosts.iter().enumerate() {
        loop {
            let ready = h
                .target
                .run(&["cat", "/tmp/wringer-vm-ready"], Duration::from_secs(20));
            if ready.is_ok_and(|o| o.status.success()) {
                break;
            }
            if let Ok(Some(status)) = booted.vms[i].try_wait() {
                bail!(
                    "{} ended while booting ({status}); its console: {}",
                    h.target.name,
                    folder.join(format!("console-{}.log", i + 1)).display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not answer over SSH within {}s of booting; its console: {}",
                    h.target.name,
                    BOOT_ALLOWANCE.as_secs(),
                    folder.join(format!("console-{}.log", i + 1)).display()
                );
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let masters: Vec<Child> = booted.hosts.iter().map(master).collect::<Result<_>>()?;
    booted.masters = masters;
    Ok(booted)
}

/// Hold a master connection open to `host` (its socket is the target's `control`), and wait
/// (bounded) until commands can share it. Should it fail, commands connect on their own.
fn master(host: &RemoteHost) -> Result<Child> {
    let crate::hosts::shell::Via::Ssh(t) = &host.target.via else {
        bail!("{}: not reached over SSH", host.target.name);
    };
    let mut m = t.master().context("a VM's target names its socket")?;
    let socket = t
        .control
        .clone()
        .context("a VM's target names its socket")?;
    let _ = std::fs::remove_file(&socket);
    m.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = m.spawn().context("starting the ssh master")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{}: the ssh master connection did not come up",
                host.target.name
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(child)
}

/// A MAC address: NIC 1 is the control NIC, NIC 0 the data link, of VM `n`.
fn mac(nic: u8, n: u8) -> String {
    format!("52:54:00:00:0{nic}:0{n}")
}

/// The guest's set-up: the control NIC (no default route), the RDMA devices, sshd; then it
/// waits to be killed.
fn guest_script(vm: &VmSpec, n: u8, count: u8, folder: &Path) -> String {
    let mut s = format!(
        "set -e\nmodprobe virtio_net\n\
         nic() {{ for d in /sys/class/net/*; do [ \"$(cat $d/address)\" = \"$1\" ] && echo ${{d##*/}} && return; done; }}\n\
         for i in $(seq 1 100); do C=$(nic {control}); [ -n \"$C\" ] && break; sleep 0.2; done\n\
         ip link set lo up\nip addr add 10.0.2.15/24 dev $C\nip link set $C up\n\
         modprobe rdma_rxe\n",
        control = mac(1, n)
    );
    if count > 1 {
        s.push_str(&format!(
            "for i in $(seq 1 100); do D=$(nic {data}); [ -n \"$D\" ] && break; sleep 0.2; done\n\
             ip addr add 10.0.0.{n}/24 dev $D\nip link set $D up\nrdma link add rxe0 type rxe netdev $D\n\
             echo $D > {DATA_NIC_FILE}\n",
            data = mac(0, n)
        ));
    } else {
        for i in 0..vm.rxe_devices {
            s.push_str(&format!(
                "ip link add wrx{i}a type veth peer name wrx{i}b\nip link set wrx{i}a up\nip link set wrx{i}b up\n\
                 ip addr add 10.213.{i}.1/24 dev wrx{i}a\nrdma link add rxe{i} type rxe netdev wrx{i}a\n"
            ));
        }
    }
    // Commands arrive through root's shell, which would read this machine's shell start-up
    // files (a pyenv or conda set-up costs seconds a command under TCG): inside the VM they
    // read as empty.
    s.push_str(
        "H=$(getent passwd root | cut -d: -f6)\n\
         for f in .bashrc .bash_profile .bash_login .profile; do if [ -f \"$H/$f\" ]; then mount --bind /dev/null \"$H/$f\"; fi; done\n",
    );
    // sshd with PAM, since root's password is locked, on a host key made at boot.
    s.push_str(&format!(
        "mkdir -p /tmp/sshd /run/sshd\nssh-keygen -q -t ed25519 -N '' -f /tmp/sshd/host_key\n\
         /usr/sbin/sshd -f /dev/null -o HostKey=/tmp/sshd/host_key -o AuthorizedKeysFile={keys} -o PermitRootLogin=prohibit-password \
         -o StrictModes=no -o UsePAM=yes -o PidFile=/tmp/sshd/pid -o ListenAddress=10.0.2.15 -o MaxStartups=100:30:200\n\
         echo ready > /tmp/wringer-vm-ready\nwhile true; do sleep 3600; done\n",
        keys = quote(&folder.join("authorized_keys").display().to_string())
    ));
    s
}

/// Where a pair VM keeps the name of its data NIC (the RoCE link), for the wire faults.
const DATA_NIC_FILE: &str = "/tmp/wringer-data-nic";

impl VmHosts {
    /// VM `host`'s end of the RoCE wire, for the wire faults (nftables, netem, ip, inside the
    /// guest).
    pub fn wire(&self, host: usize) -> Option<VmWire<'_>> {
        self.hosts
            .get(host)
            .map(|struck| VmWire { vms: self, struck })
    }

    /// What the wire faults matched on each VM, before they are healed: the RoCE packets each
    /// nftables chain counted (dropped, or corrupted), the packets netem held back.
    pub fn wire_counters(&self) -> Vec<String> {
        if self.hosts.len() < 2 {
            return vec![];
        }
        let mut out = vec![];
        for h in &self.hosts {
            match h
                .target
                // shell: a constant script.
                .check(&["sh", "-c", COUNTERS_SCRIPT], Duration::from_secs(30))
            {
                Ok(text) => {
                    if let Some(line) = counters_line(&text) {
                        out.push(format!("{}: {line}", h.target.name));
                    }
                }
                Err(e) => out.push(format!(
                    "{}: the wire fault's counters could not be read: {e:#}",
                    h.target.name
                )),
            }
        }
        out
    }

    /// Undo every wire fault on every VM: the link is up, unshaped and unfiltered.
    pub fn heal_wires(&self) -> Result<()> {
        if self.hosts.len() < 2 {
            return Ok(());
        }
        for h in &self.hosts {
            h.target
                // shell: a constant script.
                .check(&["sh", "-c", HEAL_SCRIPT], Duration::from_secs(60))
                .with_context(|| format!("healing the RoCE link of {}", h.target.name))?;
        }
        Ok(())
    }

    /// After the attempt's processes are gone: a link that was taken down gets fresh rxe
    /// devices on both VMs (see RENEW_RXE_SCRIPT).
    pub fn renew_after_link_down(&self) -> Result<()> {
        if !self
            .link_was_down
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            return Ok(());
        }
        for h in &self.hosts {
            h.target
                // shell: a constant script.
                .check(&["sh", "-c", RENEW_RXE_SCRIPT], Duration::from_secs(90))
                .with_context(|| format!("renewing the rxe device of {}", h.target.name))?;
        }
        Ok(())
    }
}

/// Prints each nftables chain of the fault with its counter, and netem's packet count.
const COUNTERS_SCRIPT: &str = "D=$(cat /tmp/wringer-data-nic) || exit 1\n\
    nft list table inet wringer 2>/dev/null | grep -o 'chain [a-z]*\\|counter packets [0-9]*'\n\
    tc -s qdisc show dev $D 2>/dev/null | grep -A1 '^qdisc netem' | grep -o 'Sent [0-9]* bytes [0-9]* pkt' | sed 's/^/netem /'\n\
    true\n";

/// One line from COUNTERS_SCRIPT's output: `RoCE packets matched: out 12, in 9; netem sent 3400
/// packets`; `None` when no wire fault was set up on the host.
fn counters_line(text: &str) -> Option<String> {
    let mut chains = vec![];
    let mut chain = "";
    let mut netem = None;
    for l in text.lines().map(str::trim) {
        if let Some(name) = l.strip_prefix("chain ") {
            chain = name;
        } else if let Some(n) = l.strip_prefix("counter packets ") {
            chains.push(format!("{chain} {n}"));
        } else if let Some(rest) = l.strip_prefix("netem Sent ") {
            let pkts = rest.split_whitespace().nth(2).unwrap_or("?");
            netem = Some(format!("netem sent {pkts} packets"));
        }
    }
    let mut parts = vec![];
    if !chains.is_empty() {
        parts.push(format!(
            "RoCE packets the fault's rules matched: {}",
            chains.join(", ")
        ));
    }
    parts.extend(netem);
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Removes what any wire fault set up; a link that was taken down comes back up (and a
/// pending `up_after` finds it up already).
const HEAL_SCRIPT: &str = "D=$(cat /tmp/wringer-data-nic) || exit 1\n\
    if [ -f /tmp/wringer-link-up.pid ]; then kill $(cat /tmp/wringer-link-up.pid) 2>/dev/null; rm -f /tmp/wringer-link-up.pid; fi\n\
    nft delete table inet wringer 2>/dev/null\n\
    tc qdisc del dev $D root 2>/dev/null\n\
    ip link set $D up\n\
    for i in $(seq 1 100); do grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state && exit 0; sleep 0.1; done\n\
    echo 'the rxe port did not come back ACTIVE within 10 s' >&2; exit 1\n";

/// A new rxe device on the data NIC, once no process holds the old one: after its netdev went
/// down, a connection to or from the VM's rxe device never completed again (the peer's CM
/// REP was never seen), so the next attempt gets a fresh device.
const RENEW_RXE_SCRIPT: &str = "D=$(cat /tmp/wringer-data-nic) || exit 1\n\
    rdma link delete rxe0 || exit 1\n\
    rdma link add rxe0 type rxe netdev $D || exit 1\n\
    for i in $(seq 1 100); do grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state && exit 0; sleep 0.1; done\n\
    echo 'the new rxe port did not become ACTIVE within 10 s' >&2; exit 1\n";

/// One VM's end of the RoCE wire, as a wire fault strikes it.
pub struct VmWire<'a> {
    vms: &'a VmHosts,
    struck: &'a RemoteHost,
}

impl WirePlane for VmWire<'_> {
    fn address(&self) -> &str {
        &self.struck.data_addr
    }

    fn apply(&self, scripts: &WireScripts) -> Result<()> {
        let h = self.struck;
        h.target
            // shell: each wire fault builds these from its typed, range-checked parameters (numbers, the VM's own addresses).
            .check(
                &[
                    "sh",
                    "-c",
                    &format!("set -e\nD=$(cat {DATA_NIC_FILE})\n{}", scripts.struck),
                ],
                Duration::from_secs(60),
            )
            .with_context(|| format!("striking a wire fault on {}", h.target.name))?;
        if let Some(script) = &scripts.peer {
            for p in self.vms.hosts.iter().filter(|p| !std::ptr::eq(*p, h)) {
                p.target
                    .check(
                        // shell: each wire fault builds these from its typed, range-checked parameters (numbers, the VM's own addresses).
                        &["sh", "-c", &format!("set -e\n{script}")],
                        Duration::from_secs(60),
                    )
                    .with_context(|| {
                        format!(
                            "striking a wire fault (what {} sends) on {}",
                            h.target.name, p.target.name
                        )
                    })?;
            }
        }
        Ok(())
    }

    fn link_goes_down(&self) {
        self.vms
            .link_was_down
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Wait (bounded) until something listens on 127.0.0.1:`port`: the first VM's end of the link.
fn wait_listening(port: u16, first: &mut Child) -> Result<()> {
    let needle = format!("0100007F:{port:04X}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains(&needle) && l.split_whitespace().nth(3) == Some("0A"))
    {
        if Instant::now() > deadline || matches!(first.try_wait(), Ok(Some(_))) {
            bail!("the first VM never opened its end of the link");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn vng(
    vm: &VmSpec,
    memory: &str,
    folder: &Path,
    script: &Path,
    console: &Path,
    qemu: &str,
) -> Result<Child> {
    let log = std::fs::File::create(console)?;
    Command::new("vng")
        .args(["--disable-kvm", "--run"])
        .arg(&vm.kernel)
        .args([
            "--memory",
            memory,
            "--cpus",
            &vm.cpus.to_string(),
            "--rwdir",
        ])
        .arg(folder)
        .arg(format!("--qemu-opts={qemu}"))
        .arg("--exec")
        .arg(guest_command(script))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting vng")
}

/// The guest's command line for its boot script. The guest's shell splits this line again:
/// the path goes as one quoted word, so a report folder's name can hold any character without
/// running anything.
fn guest_command(script: &Path) -> String {
    format!(
        "sh -- {}",
        crate::hosts::ssh::quote(&script.display().to_string())
    )
}

fn kill_vm(child: &mut Child) {
    // SAFETY: signals the process group created for this vng (qemu included).
    unsafe { libc::killpg(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_script_reaches_the_guest_shell_as_one_word() {
        let dir = std::env::temp_dir().join(format!("wringer-vm-quote-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let marker = dir.join("ran");
        let script = dir.join("a b;touch ran; $(touch ran)'x.sh");
        std::fs::write(&script, "echo booted\n").unwrap();
        let out = std::process::Command::new("sh")
            .current_dir(&dir)
            .args(["-c", &guest_command(&script)])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "booted\n");
        assert!(!marker.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_guest_has_no_default_route() {
        let vm = VmSpec {
            kernel: "/nonexistent".into(),
            memory: "1G".into(),
            cpus: 1,
            rxe_devices: 2,
        };
        for (n, count) in [(1, 1), (1, 2), (2, 2)] {
            let s = guest_script(&vm, n, count, Path::new("/tmp/x"));
            assert!(!s.contains("default"), "{s}");
            assert!(s.contains("ListenAddress=10.0.2.15"));
            assert!(s.contains(&mac(1, n)));
        }
        assert_eq!(
            guest_script(&vm, 1, 1, Path::new("/x"))
                .matches("rdma link add")
                .count(),
            2
        );
        assert!(guest_script(&vm, 2, 2, Path::new("/x")).contains("10.0.0.2/24"));
        assert!(guest_script(&vm, 2, 2, Path::new("/x")).contains(DATA_NIC_FILE));
    }

    #[test]
    fn the_counters_say_what_each_rule_matched_and_nothing_when_no_fault_was_set() {
        let text = "chain departing\ncounter packets 12\nchain arriving\ncounter packets 9\nnetem Sent 4056 bytes 31 pkt\n";
        assert_eq!(
            counters_line(text).unwrap(),
            "RoCE packets the fault's rules matched: departing 12, arriving 9; netem sent 31 packets"
        );
        assert_eq!(counters_line(""), None);
    }

    #[test]
    fn healing_removes_every_wire_fault_and_brings_the_link_up() {
        assert!(
            HEAL_SCRIPT.contains("nft delete table inet wringer")
                && HEAL_SCRIPT.contains("ip link set $D up")
        );
    }
}
