//! How a comparison is measured on a shared, noisy machine: ours and the reference alternate in
//! short rounds, the order flipping every round so that a drift of the machine lands on both
//! sides alike; warm-up rounds are discarded; the figure is the median of the per-round ratios,
//! with its spread. Both sides get the same CPU placement.

use crate::model::bench::{CpuPinning, Round, Sample};

/// Rounds kept per measure, and rounds run first and discarded.
#[derive(Clone, Copy, Debug)]
pub struct Method {
    pub rounds: usize,
    pub warmup: usize,
}

impl Method {
    pub const FULL: Method = Method {
        rounds: 9,
        warmup: 1,
    };
    /// For CI: the fewest rounds that still give a median with a spread.
    pub const QUICK: Method = Method {
        rounds: 7,
        warmup: 1,
    };
}

/// A row whose per-round ratios spread wider than this (interquartile range over the median) is
/// marked unstable: two runs of it may disagree by more than the 15% the method promises.
pub const UNSTABLE_SPREAD: f64 = 0.15;

/// Which side failed, and why.
#[derive(Debug)]
pub enum Failed {
    Ours(String),
    Reference(String),
}

/// Run `warmup + rounds` rounds of both sides, alternating which goes first; the kept rounds.
/// The first failure on either side ends the measure.
pub fn alternate(
    method: Method,
    mut ours: impl FnMut() -> anyhow::Result<Sample>,
    mut theirs: impl FnMut() -> anyhow::Result<Sample>,
) -> Result<Vec<Round>, Failed> {
    let mut kept = vec![];
    for i in 0..method.warmup + method.rounds {
        let mut run_ours = || ours().map_err(|e| Failed::Ours(format!("{e:#}")));
        let (o, t) = if i % 2 == 0 {
            let o = run_ours()?;
            (
                o,
                theirs().map_err(|e| Failed::Reference(format!("{e:#}")))?,
            )
        } else {
            let t = theirs().map_err(|e| Failed::Reference(format!("{e:#}")))?;
            (run_ours()?, t)
        };
        if i >= method.warmup {
            // A tool's `inf` or `nan` parses as a number, and gave a ratio of 0 (perftest's
            // typical latency, once in the rxe VM) and a bench.json no reader takes back.
            if !o.value.is_finite() {
                return Err(Failed::Ours(format!(
                    "no usable figure in round {}: ours {}",
                    i + 1,
                    o.value
                )));
            }
            let ratio = o.value / t.value;
            if !ratio.is_finite() || !t.value.is_finite() {
                return Err(Failed::Reference(format!(
                    "no usable figure in round {}: ours {}, reference {}",
                    i + 1,
                    o.value,
                    t.value
                )));
            }
            kept.push(Round {
                ours: o,
                reference: t,
                ratio,
            });
        }
    }
    Ok(kept)
}

/// The median and the quartiles of `xs` (linear interpolation); `None` for no values.
pub fn quartiles(xs: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| {
        let pos = q * (v.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
    };
    Some((at(0.25), at(0.5), at(0.75)))
}

/// The median of `xs`.
pub fn median(xs: &[f64]) -> Option<f64> {
    quartiles(xs).map(|(_, m, _)| m)
}

/// The interquartile range relative to the median.
pub fn spread(xs: &[f64]) -> Option<f64> {
    quartiles(xs)
        .filter(|(_, m, _)| *m != 0.0)
        .map(|(q1, m, q3)| (q3 - q1) / m.abs())
}

impl CpuPinning {
    pub fn detect() -> Option<CpuPinning> {
        CpuPinning::halves(&allowed_cpus(), crate::hosts::programs::runnable("taskset"))
    }

    fn halves(cpus: &[usize], taskset: bool) -> Option<CpuPinning> {
        if cpus.len() < 4 || !taskset {
            return None;
        }
        let (server, client) = cpus.split_at(cpus.len() / 2);
        Some(CpuPinning {
            server_cpus: server.to_vec(),
            client_cpus: client.to_vec(),
        })
    }
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most `size_of` bytes into it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed, for the kernel to fill.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return vec![];
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE, the set's size.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Pin the calling thread (and the threads it starts afterwards, which inherit it) to `cpus`.
pub fn pin_this_thread(cpus: Option<&[usize]>) -> anyhow::Result<()> {
    let Some(cpus) = cpus else { return Ok(()) };
    // SAFETY: cpu_set_t is plain data; CPU_SET is given indices below CPU_SETSIZE (checked).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        anyhow::ensure!(cpu < libc::CPU_SETSIZE as usize, "cpu {cpu} out of range");
        // SAFETY: `cpu` is below CPU_SETSIZE (checked just above).
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    anyhow::ensure!(
        rc == 0,
        "sched_setaffinity({cpus:?}): {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// `cmd` behind `taskset -c LIST` when CPUs are given.
pub fn on_cpus(cpus: Option<&[usize]>, cmd: &[&str]) -> Vec<String> {
    let mut out = vec![];
    if let Some(c) = cpus {
        let list: Vec<String> = c.iter().map(|c| c.to_string()).collect();
        out.extend(["taskset".to_string(), "-c".into(), list.join(",")]);
    }
    out.extend(cmd.iter().map(|s| s.to_string()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: f64) -> Sample {
        Sample {
            value: v,
            ..Sample::default()
        }
    }

    #[test]
    fn warmup_rounds_are_discarded_and_the_order_alternates() {
        let order = std::cell::RefCell::new(String::new());
        let mut n = 0.0;
        let rounds = alternate(
            Method {
                rounds: 3,
                warmup: 2,
            },
            || {
                order.borrow_mut().push('o');
                n += 1.0;
                Ok(s(n * 10.0))
            },
            || {
                order.borrow_mut().push('t');
                Ok(s(10.0))
            },
        )
        .unwrap();
        assert_eq!(order.into_inner(), "ottoottoot");
        // Rounds 3, 4, 5 kept: ours was 30, 40, 50 against 10.
        let ratios: Vec<f64> = rounds.iter().map(|r| r.ratio).collect();
        assert_eq!(ratios, vec![3.0, 4.0, 5.0]);
    }

    #[test]
    fn a_failing_side_is_named() {
        let e = alternate(
            Method::QUICK,
            || Ok(s(1.0)),
            || Err(anyhow::anyhow!("gone")),
        )
        .unwrap_err();
        assert!(matches!(e, Failed::Reference(w) if w == "gone"));
        let e = alternate(Method::QUICK, || anyhow::bail!("broken"), || Ok(s(1.0))).unwrap_err();
        assert!(matches!(e, Failed::Ours(w) if w == "broken"));
        // A zero reference gives no ratio: an error, never an infinite figure.
        let e = alternate(Method::QUICK, || Ok(s(1.0)), || Ok(s(0.0))).unwrap_err();
        assert!(matches!(e, Failed::Reference(w) if w.contains("no usable figure")));
        // Nor does an infinite one (ours over it would be 0), nor a figure that is no number.
        let e = alternate(Method::QUICK, || Ok(s(1.0)), || Ok(s(f64::INFINITY))).unwrap_err();
        assert!(matches!(e, Failed::Reference(w) if w.contains("reference inf")));
        let e = alternate(Method::QUICK, || Ok(s(f64::NAN)), || Ok(s(1.0))).unwrap_err();
        assert!(matches!(e, Failed::Ours(w) if w.contains("ours NaN")));
    }

    #[test]
    fn median_and_spread_ignore_one_outlier() {
        let xs = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 9.0];
        assert_eq!(median(&xs), Some(1.0));
        let sp = spread(&xs).unwrap();
        assert!(sp < 0.05, "{sp}");
        assert_eq!(quartiles(&[2.0]), Some((2.0, 2.0, 2.0)));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN]), None);
        assert!(spread(&[1.0, 2.0, 3.0, 4.0]).unwrap() > UNSTABLE_SPREAD);
    }

    #[test]
    fn taskset_wraps_a_command_only_when_pinned() {
        assert_eq!(on_cpus(None, &["a", "b"]), vec!["a", "b"]);
        assert_eq!(
            on_cpus(Some(&[2, 3]), &["a"]),
            vec!["taskset", "-c", "2,3", "a"]
        );
    }

    #[test]
    fn each_end_gets_half_the_cpus_and_two_are_too_few() {
        assert_eq!(CpuPinning::halves(&[0, 1], true), None);
        assert_eq!(CpuPinning::halves(&[0, 1, 2, 3], false), None);
        let p = CpuPinning::halves(&[0, 1, 2, 3, 4], true).unwrap();
        assert_eq!((p.server_cpus, p.client_cpus), (vec![0, 1], vec![2, 3, 4]));
    }
}
