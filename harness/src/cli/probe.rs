//! `wringer probe`: what each host of a profile has, probed where it is.

use std::path::PathBuf;

use wringer::hosts::profile as hosts;
use wringer::hosts::{placement, probe};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    pub hosts: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let (hosts, json) = (a.hosts, a.json);
    let (name, facts) = match hosts {
        None => ("this machine".to_string(), vec![probe::local()]),
        Some(file) => {
            let profile = hosts::load(&file)?;
            let run_id = format!("probe-{}", std::process::id());
            let placement = placement::prepare(&profile, &run_id)?;
            (profile.name.clone(), placement::facts(&placement)?)
        }
    };
    if json && facts.len() == 1 {
        wringer::say!("{}", serde_json::to_string_pretty(&facts[0])?);
    } else if json {
        wringer::say!("{}", serde_json::to_string_pretty(&facts)?);
    } else {
        for f in &facts {
            print_facts(&name, f);
        }
    }
    Ok(0)
}

fn print_facts(profile: &str, f: &probe::HostFacts) {
    wringer::say!("host profile: {profile}");
    wringer::say!("host:    {} (kernel {})", f.host, f.kernel);
    wringer::say!("root:    {}", f.root);
    match &f.rdma_absent {
        Some(why) => wringer::say!("rdma:    none ({why})"),
        None => {
            for d in &f.rdma_devices {
                let ports: Vec<String> = d
                    .ports
                    .iter()
                    .map(|p| format!("port {} {}", p.port, p.state))
                    .collect();
                wringer::say!(
                    "rdma:    {}{} [{}]",
                    d.name,
                    if d.rxe { " (rxe)" } else { "" },
                    ports.join(", ")
                );
            }
        }
    }
    if f.gpus.is_empty() {
        let why = f.gpu_absent.as_deref().unwrap_or("no GPU");
        let code = f.gpu_absent_code.map(|c| c.as_str()).unwrap_or("no-gpu");
        wringer::say!("gpu:     none ({code}): {why}");
    } else {
        wringer::say!(
            "gpu:     {}, driver {}",
            f.gpu_runtime.as_deref().unwrap_or("?"),
            f.gpu_driver.as_deref().unwrap_or("?")
        );
        for g in &f.gpus {
            wringer::say!(
                "gpu:     {}: {} {}, {}, {} MiB, dmabuf {}{}",
                g.index,
                g.vendor,
                g.model,
                g.arch,
                g.memory_mib,
                if g.dmabuf { "yes" } else { "no" },
                g.unsupported
                    .as_deref()
                    .map(|u| format!(" (unusable: {u})"))
                    .unwrap_or_default()
            );
        }
    }
    wringer::say!("netns:   {}", f.netns);
    wringer::say!("docker:  {}", f.docker);
    wringer::say!("vm:      {} (virtme-ng + qemu)", f.vm);
    wringer::say!("gdb:     {}", f.gdb);
    match &f.ebpf_absent {
        None => wringer::say!(
            "audit:   eBPF (strace {})",
            if f.strace {
                "for perturbations"
            } else {
                "missing: perturbations skip"
            }
        ),
        Some(why) => wringer::say!("audit:   strace ({why})"),
    }
}
