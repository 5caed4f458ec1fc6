//! The verbs audit's checker: one process's verbs trace (written by the observer preloaded
//! into it, `harness/verbs-audit/wringer_verbs.c`) in, violations with their evidence out.
//! Pure, so it is unit-tested on hand-written traces.
//!
//! A trace line is `<unix time> <tid> <event> key=value...`. The invariants:
//! - an MR deregistered, or its memory unmapped, while a posted, uncompleted WR references it;
//! - memory reused: a receive posted into bytes another uncompleted receive still targets;
//! - a QP destroyed (or reset) with WRs never completed or flushed;
//! - a CQ destroyed before a QP that uses it; a PD deallocated while MRs, QPs or SRQs live;
//! - a completion polled for a QP that no longer exists;
//! - a post to a QP in the error state;
//! - completion errors, by status, naming the first WR that failed (a SEND that found no
//!   receive shows as RNR_RETRY_EXC_ERR where the provider reports it);
//! - verbs objects created in a step and alive at its end (or, for a program that marks no
//!   steps, at its exit);
//! - a trace that was cut short (its size bound), which is never read as clean.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// One violation, with the trace lines that show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsViolation {
    /// Short name of the invariant (stable: tests and known failures match on it).
    pub check: &'static str,
    pub message: String,
    /// (line number, line), in trace order.
    pub evidence: Vec<(usize, String)>,
}

impl fmt::Display for VerbsViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.check, self.message)?;
        for (n, line) in &self.evidence {
            write!(f, "\n      line {n}: {line}")?;
        }
        Ok(())
    }
}

const QPS_RESET: u32 = 0;
const QPS_ERR: u32 = 6;
const WC_SUCCESS: u32 = 0;
const WC_WR_FLUSH_ERR: u32 = 5;
const WC_RECV: u32 = 128;
const SEND_INLINE: u32 = 8;
const WR_RDMA_READ: u32 = 4;

/// libibverbs' `enum ibv_wc_status`, by value.
pub fn wc_status_name(status: u32) -> &'static str {
    const NAMES: &[&str] = &[
        "SUCCESS",
        "LOC_LEN_ERR",
        "LOC_QP_OP_ERR",
        "LOC_EEC_OP_ERR",
        "LOC_PROT_ERR",
        "WR_FLUSH_ERR",
        "MW_BIND_ERR",
        "BAD_RESP_ERR",
        "LOC_ACCESS_ERR",
        "REM_INV_REQ_ERR",
        "REM_ACCESS_ERR",
        "REM_OP_ERR",
        "RETRY_EXC_ERR",
        "RNR_RETRY_EXC_ERR",
        "LOC_RDD_VIOL_ERR",
        "REM_INV_RD_REQ_ERR",
        "REM_ABORT_ERR",
        "INV_EECN_ERR",
        "INV_EEC_STATE_ERR",
        "FATAL_ERR",
        "RESP_TIMEOUT_ERR",
        "GENERAL_ERR",
        "TM_ERR",
        "TM_RNDV_INCOMPLETE",
    ];
    NAMES.get(status as usize).copied().unwrap_or("UNKNOWN")
}

/// At most this many lines of evidence per violation.
const EVIDENCE: usize = 6;
/// At most this many violations of one check per trace (the rest are counted).
const PER_CHECK: usize = 3;

#[derive(Clone, Debug)]
struct Line<'a> {
    n: usize,
    text: &'a str,
    time: f64,
    tid: u32,
    event: &'a str,
    fields: HashMap<&'a str, &'a str>,
}

impl<'a> Line<'a> {
    fn parse(n: usize, text: &'a str) -> Option<Line<'a>> {
        let mut words = text.split_whitespace();
        let time = words.next()?.parse().ok()?;
        let tid = words.next()?.parse().ok()?;
        let event = words.next()?;
        let fields = words.filter_map(|w| w.split_once('=')).collect();
        Some(Line {
            n,
            text,
            time,
            tid,
            event,
            fields,
        })
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.fields.get(key).copied()
    }

    fn num(&self, key: &str) -> Option<u64> {
        let v = self.get(key)?;
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sge {
    addr: u64,
    len: u64,
    lkey: u32,
}

fn parse_sges(s: &str) -> Vec<Sge> {
    s.split(',')
        .filter_map(|one| {
            let (addr, rest) = one.split_once('+')?;
            let (len, lkey) = rest.split_once('/')?;
            Some(Sge {
                addr: u64::from_str_radix(addr.trim_start_matches("0x"), 16).ok()?,
                len: len.parse().ok()?,
                lkey: lkey.parse().ok()?,
            })
        })
        .collect()
}

#[derive(Clone, Debug)]
struct Posted {
    wr: u64,
    line: usize,
    call: u64,
    recv: bool,
    /// The bytes the hardware will read or write later (none for inline data).
    sges: Vec<Sge>,
    /// Whether the hardware writes the bytes (receives, RDMA READ targets).
    writes: bool,
}

#[derive(Debug)]
struct Qp {
    qpn: u32,
    /// The shared receive queue its receives come from, if any.
    srq: Option<String>,
    pd: String,
    cqs: [String; 2],
    state: u32,
    created: usize,
    /// Where it went to the error state, as the program knows it: its own modify, or an
    /// error completion it polled.
    errored: Option<usize>,
    /// Moved to the error state by the harness (the `qp-error` fault): the program learns it
    /// from the first flushed completion, not from the modify.
    forced: bool,
    send: Vec<Posted>,
    recv: Vec<Posted>,
}

#[derive(Debug)]
struct Mr {
    pd: String,
    addr: u64,
    len: u64,
    lkey: u32,
    created: usize,
}

/// A live object of another kind (context, PD, CQ, SRQ, cm_id) and where it was made.
#[derive(Debug)]
struct Object {
    kind: &'static str,
    parent: Option<String>,
    created: usize,
}

#[derive(Default)]
struct Checker<'a> {
    lines: Vec<Line<'a>>,
    qps: BTreeMap<String, Qp>,
    qp_by_num: HashMap<u32, String>,
    dead_qpns: HashMap<u32, usize>,
    mrs: BTreeMap<String, Mr>,
    objects: BTreeMap<String, Object>,
    srq_posted: HashMap<String, Vec<Posted>>,
    threads: HashMap<u32, &'a str>,
    /// Where the running step started (line index), if the program marks steps.
    running_step: Option<(String, usize)>,
    marks_steps: bool,
    exited: bool,
    data_truncated: Option<usize>,
    errors: BTreeMap<u32, (u64, usize)>,
    found: Vec<VerbsViolation>,
    /// QPs the `qp-error` fault is about to move to the error state.
    forcing: BTreeSet<String>,
}

/// Check one process's verbs trace.
pub fn analyse(trace: &str) -> Vec<VerbsViolation> {
    let mut c = Checker {
        lines: trace
            .lines()
            .enumerate()
            .filter_map(|(i, t)| Line::parse(i + 1, t))
            .collect(),
        ..Checker::default()
    };
    for i in 0..c.lines.len() {
        c.event(i);
    }
    c.finish();
    let mut per: HashMap<&'static str, usize> = HashMap::new();
    let mut kept = vec![];
    for v in c.found {
        let n = per.entry(v.check).or_default();
        *n += 1;
        if *n <= PER_CHECK {
            kept.push(v);
        }
    }
    for (check, n) in per.into_iter().filter(|(_, n)| *n > PER_CHECK) {
        kept.push(VerbsViolation {
            check,
            message: format!("{} more like the above", n - PER_CHECK),
            evidence: vec![],
        });
    }
    kept
}

impl<'a> Checker<'a> {
    fn text(&self, i: usize) -> (usize, String) {
        let l = &self.lines[i];
        let name = self.threads.get(&l.tid).copied().unwrap_or("?");
        (l.n, format!("{} [thread {} {name}]", l.text, l.tid))
    }

    fn report(&mut self, check: &'static str, message: String, mut at: Vec<usize>) {
        at.sort_unstable();
        at.dedup();
        let keep = at.len().saturating_sub(EVIDENCE);
        let evidence = at[keep..].iter().map(|&i| self.text(i)).collect();
        self.found.push(VerbsViolation {
            check,
            message,
            evidence,
        });
    }

    fn event(&mut self, i: usize) {
        let l = self.lines[i].clone();
        let key = |k: &str| l.get(k).unwrap_or("?").to_string();
        match l.event {
            "thread" => {
                self.threads.insert(l.tid, l.get("name").unwrap_or("?"));
            }
            // librdmacm keeps the device contexts it opens until the process ends: they are
            // the library's, not the program's, and no leak.
            "ctx-open" if l.get("by") == Some("librdmacm") => {}
            "ctx-open" => self.object(&key("ctx"), "context", None, i),
            "pd-alloc" => self.object(&key("pd"), "PD", Some(key("ctx")), i),
            "cq-create" => self.object(&key("cq"), "CQ", Some(key("ctx")), i),
            "srq-create" => self.object(&key("srq"), "SRQ", Some(key("pd")), i),
            "cm-id-create" => self.object(&key("id"), "cm_id", None, i),
            "ctx-close" | "cq-destroy" | "srq-destroy" | "cm-id-destroy" => {
                let k = key(match l.event {
                    "ctx-close" => "ctx",
                    "cq-destroy" => "cq",
                    "srq-destroy" => "srq",
                    _ => "id",
                });
                if l.event == "cq-destroy" {
                    self.cq_destroyed(&k, i);
                }
                if !self.destroy_fails(i, &k) {
                    self.objects.remove(&k);
                }
            }
            "pd-dealloc" => {
                let pd = key("pd");
                self.pd_dealloc(&pd, i);
                if !self.destroy_fails(i, &pd) {
                    self.objects.remove(&pd);
                }
            }
            "mr-reg" => {
                let mr = Mr {
                    pd: key("pd"),
                    addr: l.num("addr").unwrap_or(0),
                    len: l.num("len").unwrap_or(0),
                    lkey: l.num("lkey").unwrap_or(0) as u32,
                    created: i,
                };
                self.mrs.insert(key("mr"), mr);
            }
            "mr-dereg" => {
                let mr = key("mr");
                self.mr_dereg(&mr, i);
                if !self.destroy_fails(i, &mr) {
                    self.mrs.remove(&mr);
                }
            }
            "munmap" | "free" => {
                let (lo, len) = (l.num("addr").unwrap_or(0), l.num("len").unwrap_or(0));
                self.memory_gone(lo, len, i);
            }
            "qp-create" => {
                let qp = Qp {
                    qpn: l.num("qpn").unwrap_or(0) as u32,
                    srq: l
                        .get("srq")
                        .filter(|s| *s != "(nil)" && *s != "0x0")
                        .map(str::to_string),
                    pd: key("pd"),
                    cqs: [key("scq"), key("rcq")],
                    state: QPS_RESET,
                    created: i,
                    errored: None,
                    forced: false,
                    send: vec![],
                    recv: vec![],
                };
                self.dead_qpns.remove(&qp.qpn);
                self.qp_by_num.insert(qp.qpn, key("qp"));
                self.qps.insert(key("qp"), qp);
            }
            "fault" if l.get("what") == Some("qp-error") => {
                self.forcing.insert(key("qp"));
            }
            "qp-modify" => self.qp_modify(&key("qp"), &l, i),
            "qp-destroy" => {
                let qp = key("qp");
                if !self.destroy_fails(i, &qp) {
                    self.qp_destroy(&qp, i);
                } else if let Some(q) = self.qps.get(&qp) {
                    let created = q.created;
                    self.report(
                        "qp-destroyed-with-outstanding-wrs",
                        format!("destroying QP {qp} failed"),
                        vec![created, i],
                    );
                }
            }
            "post-send" | "post-recv" | "post-srq-recv" if self.data_truncated.is_none() => {
                self.post(&l, i)
            }
            "post-failed" if self.data_truncated.is_none() => self.post_failed(&l),
            "wc" if self.data_truncated.is_none() => self.completion(&l, i),
            "truncated" => {
                self.data_truncated.get_or_insert(i);
                self.report(
                    "trace-truncated",
                    format!(
                        "the verbs trace reached its size bound ({} of it): posts and completions after this line were not recorded, so the checks that need them stopped here (WRINGER_VERBS_TRACE_MAX raises the bound)",
                        l.get("what").unwrap_or("part")
                    ),
                    vec![i],
                );
            }
            "mark" => self.mark(&l, i),
            "exit" => self.exited = true,
            _ => {}
        }
    }

    fn object(&mut self, key: &str, kind: &'static str, parent: Option<String>, i: usize) {
        self.objects.insert(
            key.to_string(),
            Object {
                kind,
                parent,
                created: i,
            },
        );
    }

    /// Whether the destroy on line `i` failed: the observer writes `destroy-failed` on the
    /// same thread right after it. A failed destroy leaves the object alive.
    fn destroy_fails(&self, i: usize, key: &str) -> bool {
        let tid = self.lines[i].tid;
        self.lines[i + 1..]
            .iter()
            .take(256)
            .find(|l| l.tid == tid)
            .is_some_and(|l| l.event == "destroy-failed" && l.get("obj") == Some(key))
    }

    /// Every uncompleted WR, on any QP or SRQ, with the index of its QP (or SRQ) key.
    fn outstanding(&self) -> impl Iterator<Item = (&str, &Posted)> {
        self.qps
            .iter()
            .flat_map(|(k, q)| q.send.iter().chain(&q.recv).map(move |p| (k.as_str(), p)))
            .chain(
                self.srq_posted
                    .iter()
                    .flat_map(|(k, v)| v.iter().map(move |p| (k.as_str(), p))),
            )
    }

    fn mr_dereg(&mut self, mr: &str, i: usize) {
        let Some(m) = self.mrs.get(mr) else {
            return;
        };
        let (addr, len, lkey, created) = (m.addr, m.len, m.lkey, m.created);
        let under: Vec<(String, usize, u64)> = self
            .outstanding()
            .filter(|(_, p)| {
                p.sges
                    .iter()
                    .any(|s| s.lkey == lkey && s.addr >= addr && s.addr < addr + len.max(1))
            })
            .map(|(q, p)| (q.to_string(), p.line, p.wr))
            .collect();
        if let Some((qp, line, wr)) = under.first() {
            let message = format!(
                "MR {mr} (0x{addr:x}+{len}, lkey {lkey}) deregistered while {} posted WR(s) still reference it, first wr {wr} on {qp}",
                under.len()
            );
            self.report("mr-dereg-under-posted-wr", message, vec![created, *line, i]);
        }
    }

    fn memory_gone(&mut self, lo: u64, len: u64, i: usize) {
        let under: Vec<(usize, u64)> = self
            .outstanding()
            .filter(|(_, p)| {
                p.sges
                    .iter()
                    .any(|s| s.addr < lo + len && lo < s.addr + s.len)
            })
            .map(|(_, p)| (p.line, p.wr))
            .collect();
        if let Some((line, wr)) = under.first() {
            let message = format!(
                "memory 0x{lo:x}+{len} freed or unmapped while {} posted WR(s) still point into it, first wr {wr}",
                under.len()
            );
            self.report("memory-freed-under-posted-wr", message, vec![*line, i]);
        }
    }

    fn qp_modify(&mut self, qp: &str, l: &Line, i: usize) {
        if l.get("ret") != Some("0") {
            return;
        }
        let Some(state) = l.num("state").map(|s| s as u32) else {
            return;
        };
        let Some(q) = self.qps.get_mut(qp) else {
            return;
        };
        q.state = state;
        if state == QPS_ERR && self.forcing.remove(qp) {
            q.forced = true;
        } else if state == QPS_ERR {
            q.errored.get_or_insert(i);
        }
        if state == QPS_RESET {
            // A reset discards the queues without completions.
            let left: Vec<usize> = q.send.iter().chain(&q.recv).map(|p| p.line).collect();
            let (qpn, count) = (q.qpn, left.len());
            q.send.clear();
            q.recv.clear();
            q.errored = None;
            if let Some(&first) = left.first() {
                self.report(
                    "qp-destroyed-with-outstanding-wrs",
                    format!(
                        "QP {qp} (qpn {qpn}) reset with {count} WR(s) never completed or flushed"
                    ),
                    vec![first, i],
                );
            }
        }
    }

    fn qp_destroy(&mut self, qp: &str, i: usize) {
        let Some(q) = self.qps.remove(qp) else {
            return;
        };
        self.qp_by_num.remove(&q.qpn);
        self.dead_qpns.insert(q.qpn, i);
        let outstanding: Vec<&Posted> = q.send.iter().chain(&q.recv).collect();
        if let Some(first) = outstanding.first() {
            let recvs = q.recv.len();
            let message = format!(
                "QP {qp} (qpn {}) destroyed with {} WR(s) never completed or flushed ({recvs} receive(s), {} send(s)); first wr {}{}",
                q.qpn,
                outstanding.len(),
                q.send.len(),
                first.wr,
                if q.errored.is_some() {
                    ": it was in the error state, but its flushed completions were never polled"
                } else {
                    ": it was never moved to the error state to flush them"
                },
            );
            let mut at = vec![q.created, first.line, i];
            at.extend(q.errored);
            self.report("qp-destroyed-with-outstanding-wrs", message, at);
        }
    }

    fn cq_destroyed(&mut self, cq: &str, i: usize) {
        let users: Vec<(String, u32, usize)> = self
            .qps
            .iter()
            .filter(|(_, q)| q.cqs.iter().any(|c| c == cq))
            .map(|(k, q)| (k.clone(), q.qpn, q.created))
            .collect();
        if let Some((qp, qpn, created)) = users.first() {
            self.report(
                "cq-destroyed-before-qp",
                format!(
                    "CQ {cq} destroyed while {} QP(s) still use it, first {qp} (qpn {qpn})",
                    users.len()
                ),
                vec![*created, i],
            );
        }
    }

    fn pd_dealloc(&mut self, pd: &str, i: usize) {
        let mut children: Vec<(String, usize)> = self
            .mrs
            .iter()
            .filter(|(_, m)| m.pd == pd)
            .map(|(k, m)| (format!("MR {k}"), m.created))
            .collect();
        children.extend(
            self.qps
                .iter()
                .filter(|(_, q)| q.pd == pd)
                .map(|(k, q)| (format!("QP {k}"), q.created)),
        );
        children.extend(
            self.objects
                .iter()
                .filter(|(_, o)| o.kind == "SRQ" && o.parent.as_deref() == Some(pd))
                .map(|(k, o)| (format!("SRQ {k}"), o.created)),
        );
        if let Some((first, created)) = children.first() {
            let message = format!(
                "PD {pd} deallocated while {} object(s) made in it live, first {first}",
                children.len()
            );
            self.report("pd-dealloc-with-children", message, vec![*created, i]);
        }
    }

    fn post(&mut self, l: &Line, i: usize) {
        let recv = l.event != "post-send";
        let op = l.num("op").unwrap_or(0) as u32;
        let inline = !recv && l.num("flags").unwrap_or(0) as u32 & SEND_INLINE != 0;
        let posted = Posted {
            wr: l.num("wr").unwrap_or(0),
            line: i,
            call: l.num("call").unwrap_or(0),
            recv,
            sges: if inline {
                vec![]
            } else {
                parse_sges(l.get("sge").unwrap_or(""))
            },
            writes: recv || op == WR_RDMA_READ,
        };
        if posted.writes {
            self.reused(&posted, i);
        }
        if l.event == "post-srq-recv" {
            let srq = l.get("srq").unwrap_or("?").to_string();
            self.srq_posted.entry(srq).or_default().push(posted);
            return;
        }
        let key = l.get("qp").unwrap_or("?").to_string();
        let Some(q) = self.qps.get_mut(&key) else {
            return;
        };
        if let Some(errored) = q.errored {
            let (qpn, wr) = (q.qpn, posted.wr);
            self.report(
                "post-to-error-qp",
                format!("wr {wr} posted to QP {key} (qpn {qpn}), which is in the error state"),
                vec![errored, i],
            );
            let Some(q) = self.qps.get_mut(&key) else {
                return;
            };
            push(q, posted);
            return;
        }
        push(q, posted);
    }

    /// A receive (or RDMA READ target) posted into bytes another uncompleted one still targets.
    fn reused(&mut self, new: &Posted, i: usize) {
        let clash = self
            .outstanding()
            .find(|(_, p)| {
                p.writes
                    && p.sges.iter().any(|a| {
                        new.sges
                            .iter()
                            .any(|b| a.addr < b.addr + b.len && b.addr < a.addr + a.len)
                    })
            })
            .map(|(q, p)| (q.to_string(), p.line, p.wr));
        if let Some((owner, line, wr)) = clash {
            let message = format!(
                "wr {} posted into memory that wr {wr} on {owner}, still uncompleted, will also write: the memory was reused before its last WR completed",
                new.wr
            );
            self.report("memory-reused-under-posted-wr", message, vec![line, i]);
        }
    }

    fn post_failed(&mut self, l: &Line) {
        let call = l.num("call").unwrap_or(0);
        let from = l.num("from").unwrap_or(0) as usize;
        let drop_from = |v: &mut Vec<Posted>| {
            let mut k = 0;
            v.retain(|p| {
                if p.call != call {
                    return true;
                }
                k += 1;
                k <= from
            });
        };
        if let Some(q) = l.get("qp").and_then(|k| self.qps.get_mut(k)) {
            drop_from(&mut q.send);
            drop_from(&mut q.recv);
        }
        if let Some(v) = l.get("srq").and_then(|k| self.srq_posted.get_mut(k)) {
            drop_from(v);
        }
    }

    fn completion(&mut self, l: &Line, i: usize) {
        let qpn = l.num("qpn").unwrap_or(0) as u32;
        let wr = l.num("wr").unwrap_or(0);
        let status = l.num("status").unwrap_or(0) as u32;
        if let Some(&gone) = self.dead_qpns.get(&qpn) {
            if !self.qp_by_num.contains_key(&qpn) {
                self.report(
                    "completion-for-dead-qp",
                    format!("a completion (wr {wr}, status {}) polled for qpn {qpn}, whose QP was already destroyed", wc_status_name(status)),
                    vec![gone, i],
                );
                return;
            }
        }
        let Some(key) = self.qp_by_num.get(&qpn).cloned() else {
            return;
        };
        let recv_op = l.num("op").unwrap_or(0) as u32 >= WC_RECV;
        let mut first_post = None;
        if let Some(q) = self.qps.get_mut(&key) {
            // Queues complete in order: a send completion also retires the unsignaled sends
            // posted before it. Error completions may carry any opcode: try both queues.
            let queues: [&mut Vec<Posted>; 2] = if recv_op || status != WC_SUCCESS {
                [&mut q.recv, &mut q.send]
            } else {
                [&mut q.send, &mut q.recv]
            };
            for (n, queue) in queues.into_iter().enumerate() {
                if let Some(at) = queue.iter().position(|p| p.wr == wr) {
                    first_post = Some(queue[at].line);
                    let unsignaled_before = !queue[at].recv;
                    if unsignaled_before {
                        queue.drain(..=at);
                    } else {
                        queue.remove(at);
                    }
                    break;
                }
                if n == 0 && status == WC_SUCCESS && !recv_op {
                    break;
                }
            }
            if first_post.is_none() && (recv_op || status != WC_SUCCESS) {
                // A receive taken from the QP's shared receive queue.
                if let Some(v) = q.srq.as_ref().and_then(|s| self.srq_posted.get_mut(s)) {
                    if let Some(at) = v.iter().position(|p| p.wr == wr) {
                        first_post = Some(v.remove(at).line);
                    }
                }
            }
            if status != WC_SUCCESS && status != WC_WR_FLUSH_ERR {
                q.errored.get_or_insert(i);
            }
            if status == WC_WR_FLUSH_ERR && (q.state != QPS_ERR || q.forced) && q.errored.is_none()
            {
                q.errored = Some(i);
            }
        }
        if status != WC_SUCCESS && status != WC_WR_FLUSH_ERR {
            let e = self.errors.entry(status).or_insert((0, i));
            e.0 += 1;
            if e.0 == 1 {
                let mut at = vec![i];
                at.extend(first_post);
                let rnr = if status == 13 {
                    " (the peer had no receive posted for a SEND: receiver not ready)"
                } else {
                    ""
                };
                let t = self.lines[i].time;
                self.report(
                    "completion-error",
                    format!(
                        "{}{rnr}: first on wr {wr} of qpn {qpn} at {t:.6}",
                        wc_status_name(status)
                    ),
                    at,
                );
            }
        }
    }

    fn mark(&mut self, l: &Line, i: usize) {
        let mut words = l.text.split_whitespace().skip(3);
        let (what, step) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        match what {
            "step-start" => {
                self.marks_steps = true;
                self.running_step = Some((step.to_string(), i));
            }
            "step-end" => {
                if let Some((step, start)) = self.running_step.take() {
                    self.leaks(start, &format!("step {step}'s end"), i);
                }
            }
            _ => {}
        }
    }

    /// Objects made after line `since` and alive at line `at`.
    fn leaks(&mut self, since: usize, when: &str, at: usize) {
        let mut alive: Vec<(String, usize)> = self
            .objects
            .iter()
            .filter(|(_, o)| o.created > since)
            .map(|(k, o)| (format!("{} {k}", o.kind), o.created))
            .collect();
        alive.extend(
            self.mrs
                .iter()
                .filter(|(_, m)| m.created > since)
                .map(|(k, m)| (format!("MR {k}"), m.created)),
        );
        alive.extend(
            self.qps
                .iter()
                .filter(|(_, q)| q.created > since)
                .map(|(k, q)| (format!("QP {k} (qpn {})", q.qpn), q.created)),
        );
        if alive.is_empty() {
            return;
        }
        alive.sort_by_key(|(_, c)| *c);
        let names: Vec<&str> = alive.iter().take(6).map(|(n, _)| n.as_str()).collect();
        let mut lines: Vec<usize> = alive.iter().map(|(_, c)| *c).collect();
        lines.push(at);
        self.report(
            "verbs-leak",
            format!(
                "{} verbs object(s) still alive at {when}: {}{}",
                alive.len(),
                names.join(", "),
                if alive.len() > names.len() {
                    ", ..."
                } else {
                    ""
                }
            ),
            lines,
        );
    }

    fn finish(&mut self) {
        if !self.marks_steps && self.exited {
            let last = self.lines.len().saturating_sub(1);
            self.leaks(0, "the program's exit", last);
        }
    }
}

fn push(q: &mut Qp, p: Posted) {
    if p.recv {
        q.recv.push(p);
    } else {
        q.send.push(p);
    }
}

/// The checks' names, for documentation and known failures.
pub const CHECKS: &[&str] = &[
    "mr-dereg-under-posted-wr",
    "memory-freed-under-posted-wr",
    "memory-reused-under-posted-wr",
    "qp-destroyed-with-outstanding-wrs",
    "cq-destroyed-before-qp",
    "pd-dealloc-with-children",
    "completion-for-dead-qp",
    "post-to-error-qp",
    "completion-error",
    "verbs-leak",
    "trace-truncated",
];

#[cfg(test)]
mod tests;
