//! The rank side: start the role's program, strike its faults, and report its record.

use super::*;

/// A role's fault that is still to strike.
pub(super) struct Pending<'a> {
    /// Its place in the step's `faults`, which names its point.
    pub(super) index: usize,
    pub(super) fault: &'a RoleFault,
    pub(super) line: Option<Regex>,
    pub(super) due: Option<Instant>,
    pub(super) struck: bool,
}

/// The point where the coordinator strikes a role's host-level fault.
pub(super) fn fault_point(step: usize, index: usize) -> String {
    format!("exec-{step}-fault-{index}")
}

pub(super) fn ready_barrier(step: usize, role: &str) -> String {
    format!("step-{step}-exec-ready-{role}")
}

impl StepKind for Exec {
    fn run(&self, ctx: &RankContext, step: usize, report: &mut StepReport) -> Result<()> {
        let Some((name, role)) = self.role_of(ctx.rank) else {
            return Ok(());
        };
        let started = Instant::now();
        // Leave the coordinator's watchdog time to hear from us after our own limit.
        let margin = (self.deadline.0 / 10).min(Duration::from_secs(5));
        let end = started + self.deadline.0 - margin;
        let left = || end.saturating_duration_since(Instant::now());
        let dir = ctx.run_dir()?.join(format!("step-{step}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // The step's programs start together: a rank that sat out the steps before would
        // otherwise start its program while its peers still run theirs, and a program that
        // waits for its group with a timeout (a torch or Gloo store) would give up on them.
        ctx.control
            .barrier_among(
                &format!("step-{step}-exec-start"),
                &self.all_ranks(),
                left(),
            )
            .context("waiting for the step's other ranks to start")?;
        let values = values(ctx, &dir);
        for dep in &role.after {
            ctx.control
                .barrier_among(&ready_barrier(step, dep), &self.ready_members(dep), left())
                .with_context(|| format!("role `{name}` waited for role `{dep}` to be ready"))?;
        }
        let fill = |t: &String| template::fill(t, &values).map_err(anyhow::Error::msg);
        let program = fill(&role.program)?;
        let args = role.args.iter().map(fill).collect::<Result<Vec<_>>>()?;
        let env = template::fill_map(&role.env, &values).map_err(anyhow::Error::msg)?;
        // Escaped: an argument holding a newline must not forge a line of the rank log.
        let shown: Vec<String> = args.iter().map(|a| printable(a)).collect();
        log(
            ctx,
            name,
            started,
            &format!("starting: {} {}", printable(&program), shown.join(" ")),
        );
        // Shipped programs (beside wringer) come first; a missing one stays a typed error.
        let path = programs::search_path();
        let resolved = programs::resolve(&program, &path)
            .map(|p| p.display().to_string())
            .ok_or_else(|| missing(&program, role))?;
        let stdbuf = programs::resolve("stdbuf", &path).filter(|_| role.line_buffered);
        let (program, args) = match stdbuf {
            Some(stdbuf) => {
                let mut words = vec!["-oL".to_string(), "-eL".to_string(), resolved];
                words.extend(args);
                (stdbuf.display().to_string(), words)
            }
            None => (resolved, args),
        };
        let mut proc = External::spawn(&program, &args, &env).map_err(|e| match e {
            SpawnError::Missing(p) => missing(&p, role),
            other => anyhow::anyhow!(other),
        })?;
        let mut watch = Watch::new(self, name, role, ctx.rank, values.ports[ctx.rank as usize])?;
        watch.record.started_us = wall_us(started);
        watch.trigger(&Trigger::Started, started);
        // Where a scenario's own faults (a host kill, a link cut) can strike this role.
        ctx.control.point(step, &format!("{name}:started"))?;
        let mut last_output = Instant::now();
        let mut next_port_check = Instant::now();
        // Whether the program has ended is asked between bursts of output, not once a line:
        // each ask is a wait4, and under a syscall recorder a chatty program would pay one
        // traced call per line.
        let mut next_exit_check = Instant::now();
        loop {
            let exited = if Instant::now() >= next_exit_check {
                next_exit_check = Instant::now() + POLL;
                proc.exited()
            } else {
                None
            };
            if let Some(exit) = exited {
                for l in proc.finish(Duration::from_millis(200)) {
                    watch.line(ctx, &l, started);
                }
                watch.record.exit = Some(exit.to_string());
                watch.record.exit_us = Some(wall_us(Instant::now()));
                watch.exit = Some(exit);
                break;
            }
            let now = Instant::now();
            if now >= end {
                match role
                    .ready
                    .as_ref()
                    .filter(|_| watch.record.ready_us.is_none())
                {
                    // Its readiness never came: that is the reason, and the roles after it
                    // are released rather than left to fail on the barrier.
                    Some(r) => {
                        watch.ended(&format!(
                            "not ready by the step's deadline: {}",
                            r.awaited(watch.port)
                        ));
                        if self.has_dependents(name) {
                            let _ = ctx.control.barrier_among(
                                &ready_barrier(step, name),
                                &self.ready_members(name),
                                margin / 4,
                            );
                        }
                    }
                    None => watch.ended("still running at the step's deadline"),
                }
                hang_evidence(ctx, name, &proc);
                break;
            }
            if watch.frozen() {
                // Frozen on purpose: it stays frozen until every rank is done.
                break;
            }
            if let Some(t) = self.no_output_timeout {
                if now.duration_since(last_output) > t.0 {
                    watch.ended(&format!("printed nothing for {:?}", t.0));
                    hang_evidence(ctx, name, &proc);
                    break;
                }
            }
            match proc.next_line(POLL) {
                Some(l) => {
                    last_output = l.at;
                    if watch.line(ctx, &l, started) {
                        watch.on_ready(ctx, step, l.at)?;
                    }
                }
                // Quiet: write what is logged, and the next turn asks whether it ended.
                None => {
                    watch.flush_log();
                    next_exit_check = Instant::now();
                }
            }
            if let Some(r) = role
                .ready
                .as_ref()
                .filter(|_| watch.record.ready_us.is_none())
            {
                if Instant::now() >= next_port_check {
                    let ready = if r.listening {
                        next_port_check = Instant::now() + Duration::from_millis(20);
                        external::listening_on(watch.port)
                    } else if let Some(c) = &r.command {
                        next_port_check = Instant::now() + Duration::from_millis(100);
                        ready_command(c, &values)?
                    } else {
                        false
                    };
                    if ready {
                        watch.on_ready(ctx, step, Instant::now())?;
                    }
                }
            }
            if let Some(r) = &role.ready {
                // Readiness is given up before the step's own end, whatever its timeout says,
                // so this role (not the roles waiting for it) says why the step failed.
                let limit = r
                    .timeout
                    .0
                    .min(self.deadline.0.saturating_sub(margin + margin / 2));
                if watch.record.ready_us.is_none() && started.elapsed() > limit {
                    watch.ended(&format!(
                        "not ready within {limit:?}: {}",
                        r.awaited(watch.port)
                    ));
                    // Release the roles that wait for this one: they would otherwise wait
                    // out the step, and the reason would be a barrier, not this.
                    if self.has_dependents(name) {
                        let _ = ctx.control.barrier_among(
                            &ready_barrier(step, name),
                            &self.ready_members(name),
                            left(),
                        );
                    }
                    break;
                }
            }
            watch.strike_due(ctx, step, &proc);
        }
        // Every rank of the step meets here before any program is ended, so a frozen peer
        // stays frozen (and a dead one dead) until every survivor has had its say.
        let done = ctx.control.barrier_among(
            &format!("step-{step}-exec-done"),
            &self.all_ranks(),
            left() + margin / 2,
        );
        for l in proc.finish(Duration::from_millis(200)) {
            watch.line(ctx, &l, started);
        }
        let stray = external::end_descendants();
        if stray > 0 {
            log(
                ctx,
                name,
                started,
                &format!("ended {stray} processes the program left behind"),
            );
        }
        for l in proc.close_pipes(Duration::from_secs(2)) {
            watch.line(ctx, &l, started);
        }
        watch.flush_log();
        let _ = std::fs::remove_dir_all(&dir);
        done.context("waiting for the other ranks' programs to end")?;
        if watch.record.exit.is_none() && watch.exit.is_none() {
            if let Some(e) = proc.exited() {
                log(ctx, name, started, &format!("ended by the harness: {e}"));
            }
        }
        if watch.record.unlogged_lines > 0 {
            log(
                ctx,
                name,
                started,
                &format!(
                    "the log was cut: {} lines past its limit not logged",
                    watch.record.unlogged_lines
                ),
            );
        }
        watch.record.peak_rss_kib = procfs::peak_rss_kib();
        watch.judge_alone();
        for (metric, value) in &watch.metrics {
            report.metrics.insert(*metric, *value);
        }
        report.outcome(&watch.record)?;
        Ok(())
    }

    fn reconcile(&self, reports: &[(u32, &StepReport)], faults: &[StruckFault]) -> Reconciled {
        reconcile(self, reports, faults)
    }

    fn preflight(&self) -> Vec<Preflight> {
        let mut needs = vec![];
        for role in self.roles.values() {
            if !role.program.contains('{') {
                needs.push(Preflight::Program {
                    name: role.program.clone(),
                    package: role.package.clone(),
                });
            }
            if let Some(p) = &role.precheck {
                needs.push(Preflight::Check {
                    command: p.command.clone(),
                    reason: p.skip.clone(),
                });
            }
        }
        needs
    }
}

/// Whether a readiness command exits 0 now (bounded: a check that hangs counts as not yet).
pub(super) fn ready_command(words: &[String], values: &Values) -> Result<bool> {
    let filled = words
        .iter()
        .map(|w| template::fill(w, values))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let refs: Vec<&str> = filled.iter().map(String::as_str).collect();
    Ok(matches!(
        crate::hosts::child::run_bounded(&refs, Duration::from_secs(5)),
        Ok((Some(s), _)) if s.success()
    ))
}

pub(super) fn missing(program: &str, role: &Role) -> anyhow::Error {
    anyhow::anyhow!(
        "missing-program: {}",
        programs::missing(program, role.package.as_deref())
    )
}

pub(super) fn values(ctx: &RankContext, dir: &std::path::Path) -> Values {
    let host = ctx.peers[ctx.rank as usize].transport.ip();
    Values {
        rank: ctx.rank,
        ranks: ctx.ranks,
        iface: interface_of(host).unwrap_or_default(),
        dir: dir.display().to_string(),
        seed: ctx.seed,
        hosts: ctx
            .peers
            .iter()
            .map(|p| p.transport.ip().to_string())
            .collect(),
        ports: ctx.peers.iter().map(|p| p.exec_port).collect(),
        rdma: ctx
            .peers
            .iter()
            .map(|p| p.rdma.map(|a| a.to_string()))
            .collect(),
    }
}

/// The interface that holds `ip` on this host.
pub(super) fn interface_of(ip: std::net::IpAddr) -> Option<String> {
    nix::ifaddrs::getifaddrs().ok()?.find_map(|a| {
        let addr = a.address?;
        let same = match ip {
            std::net::IpAddr::V4(v4) => addr.as_sockaddr_in().is_some_and(|s| s.ip() == v4),
            std::net::IpAddr::V6(v6) => addr.as_sockaddr_in6().is_some_and(|s| s.ip() == v6),
        };
        same.then(|| a.interface_name.clone())
    })
}

/// Stacks of the program and every process under it, into the rank log, before the harness
/// ends it: a hang is evidence like any other.
pub(super) fn hang_evidence(ctx: &RankContext, role: &str, proc: &External) {
    for pid in procfs::process_tree(proc.pid()) {
        let stacks = procfs::capture_stacks(pid, Some(Duration::from_secs(10)));
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        eprintln!(
            "[exec {role} rank {}] stacks of pid {pid} ({}) before the harness ends it:\n{stacks}",
            ctx.rank,
            comm.trim()
        );
    }
}

pub(super) fn log(ctx: &RankContext, role: &str, started: Instant, text: &str) {
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    eprintln!("[exec {role} rank {} +{ms:.3}ms] {text}", ctx.rank);
}
