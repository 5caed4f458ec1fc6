//! What a rank watches of its program while it runs: its output lines (errors, readiness,
//! metrics), its faults as they fall due, its log.

use super::*;

/// What one rank watches of its program while it runs.
pub(super) struct Watch<'a> {
    pub(super) role: &'a Role,
    pub(super) name: &'a str,
    pub(super) exec: &'a Exec,
    pub(super) port: u16,
    pub(super) error: Option<Regex>,
    pub(super) ready_line: Option<Regex>,
    pub(super) departs: Option<Regex>,
    pub(super) extracts: Vec<(Metric, Option<Regex>, Option<String>)>,
    /// This rank's faults, each with when it becomes due (once triggered) and whether it struck.
    pub(super) faults: Vec<Pending<'a>>,
    pub(super) metrics: BTreeMap<Metric, f64>,
    pub(super) record: Record,
    pub(super) exit: Option<Exit>,
    /// Bytes of output logged so far, against the step's log limit.
    pub(super) logged: u64,
    /// Log lines not yet written: written in blocks (when quiet, past 64 KiB, before any other
    /// log line), so a chatty program costs one write per block, not per line, and a syscall
    /// recorder does not trace the rank's own logging line by line.
    pub(super) pending_log: Vec<u8>,
}

pub(super) const LOG_BLOCK: usize = 64 << 10;

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.flush_log();
    }
}

impl<'a> Watch<'a> {
    pub(super) fn new(
        exec: &'a Exec,
        name: &'a str,
        role: &'a Role,
        rank: u32,
        port: u16,
    ) -> Result<Watch<'a>> {
        let re = |r: &Option<String>| r.as_deref().map(Regex::new).transpose();
        let faults = exec
            .faults
            .iter()
            .enumerate()
            .filter(|(_, f)| f.role == name && f.rank.is_none_or(|r| r == rank))
            .map(|(index, fault)| {
                let line = match &fault.at {
                    Trigger::Line(l) => Some(Regex::new(l)?),
                    _ => None,
                };
                Ok(Pending {
                    index,
                    fault,
                    line,
                    due: None,
                    struck: false,
                })
            })
            .collect::<Result<Vec<_>, regex::Error>>()?;
        Ok(Watch {
            role,
            name,
            exec,
            port,
            error: re(&role.error)?,
            ready_line: re(&role.ready.as_ref().and_then(|r| r.line.clone()))?,
            departs: re(&role.departs)?,
            extracts: role
                .metrics
                .iter()
                .map(|x| Ok((x.metric, re(&x.regex)?, x.json.clone())))
                .collect::<Result<_, regex::Error>>()?,
            faults,
            metrics: BTreeMap::new(),
            record: Record {
                role: name.to_string(),
                rank,
                ..Record::default()
            },
            exit: None,
            logged: 0,
            pending_log: Vec::new(),
        })
    }

    /// Write the log lines held back, in one write.
    pub(super) fn flush_log(&mut self) {
        use std::io::Write;
        if !self.pending_log.is_empty() {
            let _ = std::io::stderr().write_all(&self.pending_log);
            self.pending_log.clear();
        }
    }

    /// Log and read one output line; true when it makes the program ready.
    pub(super) fn line(&mut self, ctx: &RankContext, l: &Line, started: Instant) -> bool {
        let pipe = match l.pipe {
            Pipe::Out => "out",
            Pipe::Err => "err",
        };
        let ms = l.at.saturating_duration_since(started).as_secs_f64() * 1000.0;
        let limit = self.exec.log_limit();
        if self.logged < limit {
            self.logged += l.text.len() as u64 + 1;
            use std::io::Write;
            let _ = writeln!(
                self.pending_log,
                "[exec {} rank {} +{ms:.3}ms {pipe}] {}",
                self.name,
                ctx.rank,
                printable(&l.text)
            );
            if self.pending_log.len() >= LOG_BLOCK {
                self.flush_log();
            }
            if self.logged >= limit {
                self.flush_log();
                eprintln!(
                    "[exec {} rank {}] output past the {} MiB log limit is not logged (still read for errors and metrics)",
                    self.name,
                    ctx.rank,
                    limit >> 20
                );
            }
        } else {
            self.record.unlogged_lines += 1;
        }
        self.record.tail.push(l.text.chars().take(300).collect());
        if self.record.tail.len() > TAIL_LINES {
            self.record.tail.remove(0);
        }
        if self.record.departed_us.is_none()
            && self.departs.as_ref().is_some_and(|r| r.is_match(&l.text))
        {
            self.record.departed_us = Some(wall_us(l.at));
        }
        if self.record.first_error_us.is_none()
            && self.error.as_ref().is_some_and(|r| r.is_match(&l.text))
        {
            self.record.first_error_us = Some(wall_us(l.at));
            self.record.first_error = Some(l.text.chars().take(300).collect());
        }
        for (metric, regex, json) in &self.extracts {
            let value = match (regex, json) {
                (Some(r), _) => r
                    .captures(&l.text)
                    .and_then(|c| c.get(1))
                    .and_then(|m| m.as_str().parse::<f64>().ok()),
                (None, Some(key)) => json_number(&l.text, key),
                _ => None,
            };
            if let Some(v) = value.filter(|v| v.is_finite()) {
                self.metrics.insert(*metric, v);
            }
        }
        for f in &mut self.faults {
            if f.due.is_none() && f.line.as_ref().is_some_and(|r| r.is_match(&l.text)) {
                f.due = Some(l.at + f.fault.delay.map(|d| d.0).unwrap_or_default());
            }
        }
        self.record.ready_us.is_none()
            && self
                .ready_line
                .as_ref()
                .is_some_and(|r| r.is_match(&l.text))
    }

    pub(super) fn trigger(&mut self, t: &Trigger, at: Instant) {
        for f in &mut self.faults {
            if f.due.is_none() && f.fault.at == *t {
                f.due = Some(at + f.fault.delay.map(|d| d.0).unwrap_or_default());
            }
        }
    }

    pub(super) fn on_ready(&mut self, ctx: &RankContext, step: usize, at: Instant) -> Result<()> {
        self.record.ready_us = Some(wall_us(at));
        self.flush_log();
        eprintln!("[exec {} rank {}] ready", self.name, ctx.rank);
        ctx.control.point(step, &format!("{}:ready", self.name))?;
        self.trigger(&Trigger::Ready, at);
        if self.exec.has_dependents(self.name) {
            let limit = self
                .role
                .ready
                .as_ref()
                .map(|r| r.timeout.0)
                .unwrap_or(Duration::from_secs(30));
            ctx.control
                .barrier_among(
                    &ready_barrier(step, self.name),
                    &self.exec.ready_members(self.name),
                    limit,
                )
                .context("waiting for the roles that come after this one to start")?;
        }
        Ok(())
    }

    /// Strike every fault whose time has come: a signal to the program, or, for a fault on its
    /// host, the point where the coordinator strikes it (see `faults`).
    pub(super) fn strike_due(&mut self, ctx: &RankContext, step: usize, proc: &External) {
        let now = Instant::now();
        for f in &mut self.faults {
            if f.struck || f.due.is_none_or(|due| now < due) {
                continue;
            }
            f.struck = true;
            if !self.pending_log.is_empty() {
                use std::io::Write;
                let _ = std::io::stderr().write_all(&std::mem::take(&mut self.pending_log));
            }
            let action = f.fault.action;
            let outcome = match action.kind().signal() {
                Some(signal) => proc.signal(signal).map_err(|e| e.to_string()),
                None => ctx
                    .control
                    .point(step, &fault_point(step, f.index))
                    .map_err(|e| format!("{e:#}")),
            };
            match outcome {
                Ok(()) => {
                    eprintln!(
                        "[exec {} rank {}] fault: {action:?} (program pid {})",
                        self.name,
                        self.record.rank,
                        proc.pid()
                    );
                    self.record.fault.get_or_insert((action, wall_us(now)));
                }
                Err(e) => self
                    .record
                    .violations
                    .push(format!("the {action:?} fault could not strike: {e}")),
            }
        }
    }

    pub(super) fn frozen(&self) -> bool {
        matches!(self.record.fault, Some((FaultAction::Sigstop, _)))
    }

    pub(super) fn ended(&mut self, why: &str) {
        self.record.ended_by_harness = Some(why.to_string());
    }

    /// What this rank can judge alone: how its program ended, and whether its faults struck.
    pub(super) fn judge_alone(&mut self) {
        let x = &self.role.expect;
        let v = &mut self.record.violations;
        for f in &self.faults {
            if !f.struck {
                v.push(format!(
                    "the {:?} fault at {:?} never struck (its trigger never came)",
                    f.fault.action, f.fault.at
                ));
            }
        }
        let struck = self.record.fault.is_some();
        match (&self.exit, &self.record.ended_by_harness) {
            _ if struck && x.exit.is_none() && x.signal.is_none() => {}
            // Exiting in time after a fault is judged with the fault's time, by the coordinator.
            (None, _) if x.exit_within.is_some() => {}
            (None, why) => {
                v.push(format!(
                    "did not exit: {} (killed by the harness)",
                    why.as_deref()
                        .unwrap_or("still running when the others were done")
                ));
            }
            (Some(exit), _) => {
                let wanted = match (&x.exit, &x.signal) {
                    (Some(code), _) => Some(Exit::Code(*code)),
                    (None, Some(s)) => s.parse::<Signal>().ok().map(|s| Exit::Signal(s as i32)),
                    (None, None) if x.exit_within.is_none() => Some(Exit::Code(0)),
                    (None, None) => None,
                };
                if let Some(w) = wanted.filter(|w| w != exit) {
                    v.push(format!("ended with {exit}, expected {w}"));
                }
            }
        }
        if self.role.departs.is_some() && self.record.departed_us.is_none() {
            v.push("never announced that it leaves (no line matched `departs`)".into());
        }
        if let Some(r) = self
            .role
            .ready
            .as_ref()
            .filter(|_| self.record.ready_us.is_none() && !struck)
        {
            v.push(format!(
                "{NEVER_READY} within {:?}: {}",
                r.timeout.0,
                r.awaited(self.port)
            ));
        }
    }
}

/// The number at dotted `key` in a JSON line. Lenient: bare keys (`{avg: 1.5}`, as perftest
/// writes them) are quoted first, and numbers given as strings are read too.
pub(super) fn json_number(line: &str, key: &str) -> Option<f64> {
    let text = line.trim();
    if !text.starts_with('{') {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(text).ok().or_else(|| {
        let bare = Regex::new(r#"([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)\s*:"#).ok()?;
        serde_json::from_str(&bare.replace_all(text, r#"$1"$2":"#)).ok()
    })?;
    let mut at = &value;
    for part in key.split('.') {
        at = at.get(part)?;
    }
    at.as_f64().or_else(|| at.as_str()?.trim().parse().ok())
}
