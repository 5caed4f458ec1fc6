//! `wringer`: the coordinator (`run`, `list`, `probe`, `validate`) and the rank worker (`rank`).

use harness::model::invalid::Invalid;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use harness::hosts::{placement, probe, profile as hosts};
use harness::model::input::InputError;
use harness::model::scenario;
use harness::orchestration::policy::{Decision, Policy};
use harness::orchestration::runner;
use harness::outputs::progress::{printable, Progress};
use harness::outputs::report::ReportWriter;
use harness::outputs::{bench, site};
use harness::rank::steps::{self, Loaded};

/// Puts collective-communication transports through the wringer.
#[derive(Parser)]
#[command(name = "wringer", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run scenarios and write a report (exit 0: all passed or skipped, 1: a failure, 2: bad input).
    Run {
        /// Scenario files or folders.
        #[arg(default_value = "scenarios")]
        paths: Vec<PathBuf>,
        #[arg(long, default_value = "hosts/local.yaml")]
        hosts: PathBuf,
        /// Where to write the report (default: reports/<run-id>/).
        #[arg(long)]
        report_dir: Option<PathBuf>,
        /// Only scenarios whose name contains this text.
        #[arg(long)]
        filter: Option<String>,
        /// Override every scenario's repeat count (1 to 10,000).
        #[arg(long, value_parser = |s: &str| s.parse::<u32>().map_err(|e| Invalid(e.to_string())).and_then(harness::model::scenario::check_repeat))]
        repeat: Option<u32>,
        /// Seed for payload patterns (recorded in the report).
        #[arg(long)]
        seed: Option<u64>,
        /// Turn every skip into a failure.
        #[arg(long)]
        strict: bool,
        /// Run without the lifecycle audit and perturbations the scenarios and profile ask
        /// for (to measure what the audit costs, or where strace cannot run).
        #[arg(long)]
        no_audit: bool,
    },
    /// List scenarios with their requirements and whether this host profile can run them.
    List {
        #[arg(default_value = "scenarios")]
        paths: Vec<PathBuf>,
        #[arg(long, default_value = "hosts/local.yaml")]
        hosts: PathBuf,
        /// List the metrics the step kinds declare (name, unit, which way is better) instead.
        #[arg(long, conflicts_with = "kinds")]
        metrics: bool,
        /// List the step kinds (the registry) and what each is for instead.
        #[arg(long)]
        kinds: bool,
    },
    /// Show what each host of the profile has (probed on the host itself, over SSH for remote
    /// profiles). Without --hosts: this machine.
    Probe {
        #[arg(long)]
        hosts: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Parse and check scenario and host files only.
    Validate {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Measure the transport and the coordinator against the reference tools (sockperf,
    /// iperf3) in one run; prints a ratio table and writes bench.json and bench.md.
    Bench {
        /// Seconds each side runs per latency round (ours and the reference alternate).
        #[arg(long, default_value_t = 1)]
        seconds: u64,
        /// Fewer rounds (7 kept) and measures, for CI.
        #[arg(long)]
        quick: bool,
        /// An earlier bench.json: show how far each ratio moved since (more than 15% is marked).
        #[arg(long)]
        against: Option<PathBuf>,
        /// Where bench.json and bench.md go.
        #[arg(long, default_value = "reports/bench")]
        out: PathBuf,
        /// Rank counts for the coordinator start-up measurement.
        #[arg(long, value_delimiter = ',', default_value = "2,8,32,64")]
        ranks: Vec<u32>,
        /// Only the RDMA rows (used inside the rxe VM by `just bench-rdma`).
        #[arg(long)]
        rdma_only: bool,
        /// Only the TCP rows whose measure contains this text (for example `busy-poll` or
        /// `64 B`); the other measures are not run.
        #[arg(long)]
        only: Option<String>,
        /// Only the launcher rows: start --ranks ranks through this Slurm profile against
        /// --launch-ssh (`just bench-launch`).
        #[arg(long, requires = "launch_ssh")]
        launch_slurm: Option<PathBuf>,
        /// The SSH profile the Slurm launcher is measured against.
        #[arg(long, requires = "launch_slurm")]
        launch_ssh: Option<PathBuf>,
    },
    /// Write one self-contained HTML page from run folders and the history of earlier runs.
    Report {
        /// Run folders (each holding results.json, and optionally bench.json).
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// The history file; these runs are added to it.
        #[arg(long, default_value = "reports/history.jsonl")]
        history: PathBuf,
        #[arg(long, default_value = "reports/site/index.html")]
        out: PathBuf,
        /// Flag a trend value worse than the earlier runs' median by more than this fraction.
        #[arg(long, default_value_t = 0.2, value_parser = fraction)]
        threshold: f64,
    },
    /// The rank worker (started by `wringer run`, not by hand).
    Rank {
        #[arg(long)]
        rendezvous: SocketAddr,
        #[arg(long, required_unless_present = "slurm")]
        rank: Option<u32>,
        /// The address this rank's listeners bind to and advertise to the other ranks.
        #[arg(long, default_value = "127.0.0.1")]
        bind: std::net::IpAddr,
        /// Read the run token from the first line of stdin (ranks started over SSH), and exit
        /// when stdin closes.
        #[arg(long)]
        token_stdin: bool,
        /// Started as a Slurm task laid out `cyclic` or `block:N`: the rank comes from
        /// SLURM_PROCID, and its end is reported on stdout.
        #[arg(long, conflicts_with = "rank")]
        slurm: Option<String>,
        /// Slurm tasks: the address to bind on each node of the step, in node order.
        #[arg(long, value_delimiter = ',', requires = "slurm")]
        bind_per_node: Vec<std::net::IpAddr>,
        /// Slurm tasks: bind to this interface's IPv4 address on each node.
        #[arg(long, requires = "slurm", conflicts_with = "bind_per_node")]
        bind_interface: Option<String>,
        /// Slurm tasks: run the rank under this command (strace, for the lifecycle audit),
        /// one word each; `{rank}` becomes the rank.
        #[arg(long = "trace-word", requires = "slurm", allow_hyphen_values = true)]
        trace_words: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Run {
            paths,
            hosts,
            report_dir,
            filter,
            repeat,
            seed,
            strict,
            no_audit,
        } => (|| {
            let profile = hosts::load(&hosts)?;
            let scenarios = load_all(&paths)?;
            let opts = runner::RunOptions {
                report_dir,
                filter,
                repeat,
                seed,
                strict,
                no_audit,
            };
            let mut progress = Progress::default();
            let mut files = ReportWriter::default();
            runner::run(scenarios, &profile, &opts, &mut [&mut progress, &mut files])
        })(),
        Command::List { kinds: true, .. } => {
            for (name, about) in harness::rank::steps::Step::ABOUT {
                harness::say!("{name:<28} {about}");
            }
            Ok(0)
        }
        Command::List { metrics: true, .. } => {
            for m in harness::model::metric::Metric::all() {
                let unit = serde_json::to_value(m.unit()).unwrap_or_default();
                let better = serde_json::to_value(m.better()).unwrap_or_default();
                harness::say!(
                    "{:<32} unit={:<16} better={}",
                    m.as_str(),
                    unit.as_str().unwrap_or_default(),
                    better.as_str().unwrap_or_default()
                );
            }
            Ok(0)
        }
        Command::List { paths, hosts, .. } => (|| {
            let profile = hosts::load(&hosts)?;
            // This machine's facts, judged by the same policy a run uses.
            let facts = [probe::local()];
            let policy = Policy {
                profile: &profile,
                facts: &facts,
                strict: false,
                host_control: profile.kind == hosts::ProfileKind::Containers
                    || profile
                        .slurm
                        .as_ref()
                        .is_some_and(|s| s.test_cluster.is_some()),
                no_audit: false,
            };
            for l in load_all(&paths)? {
                let s = &l.scenario;
                let reqs: Vec<String> = s
                    .requires
                    .iter()
                    .map(|r| format!("{r:?}").to_lowercase())
                    .collect();
                let verdict = match policy.decide(s) {
                    Decision::Run => "runnable".to_string(),
                    Decision::Skip(reason) => format!("skip ({})", printable(&reason.to_string())),
                    Decision::Fail(reason) => format!("fail ({})", printable(&reason.to_string())),
                };
                harness::say!(
                    "{:<42} ranks={:<3} requires=[{}]  {verdict}",
                    printable(&s.name),
                    s.ranks.value,
                    reqs.join(", ")
                );
            }
            Ok(0)
        })(),
        Command::Probe { hosts, json } => (|| {
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
                harness::say!("{}", serde_json::to_string_pretty(&facts[0])?);
            } else if json {
                harness::say!("{}", serde_json::to_string_pretty(&facts)?);
            } else {
                for f in &facts {
                    print_facts(&name, f);
                }
            }
            Ok(0)
        })(),
        Command::Validate { paths } => validate(&paths),
        Command::Bench {
            seconds,
            quick,
            against,
            out,
            ranks,
            rdma_only,
            only,
            launch_slurm,
            launch_ssh,
        } => (|| {
            // Read first: a missing or broken earlier report is an input error before any work.
            use anyhow::Context as _;
            let earlier: Option<bench::BenchReport> = match &against {
                Some(p) => Some(
                    serde_json::from_slice(
                        &std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
                    )
                    .with_context(|| format!("{} is not a bench.json", p.display()))?,
                ),
                None => None,
            };
            let opts = bench::BenchOptions {
                seconds,
                quick,
                out_dir: out.clone(),
                ranks,
                rdma_only,
                only,
                launch: launch_slurm.zip(launch_ssh),
            };
            let report = bench::run(&opts)?;
            let mut text = bench::markdown(&report);
            if let (Some(earlier), Some(p)) = (&earlier, &against) {
                let (table, over) = bench::drift_markdown(&bench::drift(earlier, &report), 0.15);
                text.push_str(&format!(
                    "\n## Against {}\n\n{table}\n{over} row(s) moved by more than 15%.\n",
                    p.display()
                ));
            }
            harness::say!("{}", text.trim_end());
            bench::write(&report, &text, &out)?;
            harness::say!("written: {}/bench.json, bench.md", out.display());
            Ok(0)
        })(),
        Command::Report {
            runs,
            history,
            out,
            threshold,
        } => (|| {
            let opts = site::ReportOptions {
                runs,
                history,
                out,
                threshold,
            };
            let page = site::write(&opts)?;
            harness::say!("report: {}", page.display());
            Ok(0)
        })(),
        Command::Rank {
            rendezvous,
            rank,
            bind,
            token_stdin,
            slurm,
            bind_per_node,
            bind_interface,
            trace_words,
        } => match (slurm, rank) {
            (Some(layout), _) => harness::rank::slurm_task::run(
                rendezvous,
                &layout,
                harness::rank::slurm_task::Binding {
                    per_node: &bind_per_node,
                    interface: bind_interface.as_deref(),
                },
                &trace_words,
            )
            .map(i32::from),
            (None, Some(rank)) => {
                harness::rank::worker::run(rendezvous, rank, bind, token_stdin).map(|()| 0)
            }
            (None, None) => Err(anyhow::anyhow!("`wringer rank` needs --rank or --slurm")),
        },
    };
    match outcome {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            // A message may quote the input (a field name, a path): never raw to the terminal.
            eprintln!("error: {}", printable(&format!("{e:#}")));
            // Bad input (files, YAML, schema) is exit 2; anything else is a failure.
            let bad_input = e.downcast_ref::<InputError>().is_some()
                || e.downcast_ref::<clap::Error>().is_some();
            ExitCode::from(if bad_input { 2 } else { 1 })
        }
    }
}

fn load_all(paths: &[PathBuf]) -> anyhow::Result<Vec<Loaded>> {
    let files = scenario::discover(paths)?;
    if files.is_empty() {
        return Err(
            InputError::plain(Path::new(&paths[0]), "no scenario files (*.yaml) found").into(),
        );
    }
    let mut loaded = vec![];
    let mut names = std::collections::HashMap::new();
    for f in files {
        let l = steps::load(&f)?;
        if let Some(prev) = names.insert(l.scenario.name.clone(), f.clone()) {
            return Err(InputError::plain(
                &f,
                format!(
                    "scenario name `{}` is also used by {}",
                    l.scenario.name,
                    prev.display()
                ),
            )
            .into());
        }
        loaded.push(l);
    }
    expand_releases(loaded)
}

/// Scenarios with `releases:` become one scenario per installed release.
fn expand_releases(loaded: Vec<Loaded>) -> anyhow::Result<Vec<Loaded>> {
    let mut found = std::collections::BTreeMap::new();
    let mut out = vec![];
    for l in loaded {
        let Some(family) = l.scenario.releases else {
            out.push(l);
            continue;
        };
        let path = l.path.clone();
        let releases = match found.entry(family.as_str()) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => e.insert(
                harness::hosts::releases::installed(family)
                    .map_err(|why| InputError::plain(&path, why))?,
            ),
        };
        out.extend(steps::for_releases(l, releases).map_err(|why| InputError::plain(&path, why))?);
    }
    Ok(out)
}

/// Check every file: host profiles (under a `hosts` folder) and scenarios; report them all.
/// A fraction for `--threshold`: a finite number from 0 to 100 (NaN would flag nothing, ever).
fn fraction(s: &str) -> Result<f64, Invalid> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && (0.0..=100.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("`{s}` must be a finite number from 0 to 100 (0.2 flags 20% worse)").into())
    }
}

fn validate(paths: &[PathBuf]) -> anyhow::Result<i32> {
    use harness::model::input::FileKind;
    let mut files = vec![];
    for p in paths {
        files.extend(scenario::discover(std::slice::from_ref(p))?);
    }
    let mut bad = 0;
    for f in &files {
        // What a file is follows from what it says, not from the folder it sits in: a host
        // profile has a top-level `kind:`, a known-failures file is a list.
        // Read the one bounded way (a FIFO or /dev/zero is refused here, not waited on); the
        // folder only names what the file was meant to be in that error.
        let meant = if f.components().any(|c| c.as_os_str() == "hosts") {
            FileKind::Profile
        } else {
            FileKind::Scenario
        };
        let text = match harness::model::input::read_bytes(f, meant) {
            Ok(bytes) => bytes,
            Err(e) => {
                bad += 1;
                eprintln!("error: {}", printable(&e.to_string()));
                continue;
            }
        };
        let text = String::from_utf8_lossy(&text);
        let first = text
            .lines()
            .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .unwrap_or("");
        let result = if first.starts_with("- ") || first == "-" {
            harness::model::known::load(f).map(|_| ())
        } else if text.lines().any(|l| l.starts_with("kind:")) {
            hosts::load(f).map(|_| ())
        } else {
            steps::load(f).map(|_| ())
        };
        match result {
            Ok(()) => harness::say!("ok   {}", f.display()),
            Err(e) => {
                bad += 1;
                eprintln!("error: {}", printable(&e.to_string()));
            }
        }
    }
    Ok(if bad > 0 { 2 } else { 0 })
}

fn print_facts(profile: &str, f: &probe::HostFacts) {
    harness::say!("host profile: {profile}");
    harness::say!("host:    {} (kernel {})", f.host, f.kernel);
    harness::say!("root:    {}", f.root);
    match &f.rdma_absent {
        Some(why) => harness::say!("rdma:    none ({why})"),
        None => {
            for d in &f.rdma_devices {
                let ports: Vec<String> = d
                    .ports
                    .iter()
                    .map(|p| format!("port {} {}", p.port, p.state))
                    .collect();
                harness::say!(
                    "rdma:    {}{} [{}]",
                    d.name,
                    if d.rxe { " (rxe)" } else { "" },
                    ports.join(", ")
                );
            }
        }
    }
    if f.gpus.is_empty() {
        let why = f.gpu_absent.as_deref().unwrap_or("no NVIDIA GPU");
        if f.amd_kfd {
            harness::say!(
                "gpu:     none usable: AMD GPU (/dev/kfd) present, ROCm not supported yet; {why}"
            );
        } else {
            harness::say!("gpu:     none: {why}");
        }
    } else {
        for g in &f.gpus {
            harness::say!(
                "gpu:     {}: {}, {} MiB, compute {}, driver CUDA {}, dmabuf {}",
                g.index,
                g.model,
                g.memory_mib,
                g.compute_capability,
                f.gpu_driver.as_deref().unwrap_or("?"),
                if g.dmabuf { "yes" } else { "no" }
            );
        }
    }
    harness::say!("netns:   {}", f.netns);
    harness::say!("docker:  {}", f.docker);
    harness::say!("vm:      {} (virtme-ng + qemu)", f.vm);
    harness::say!("gdb:     {}", f.gdb);
}
