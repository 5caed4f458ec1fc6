//! The HTML page: plain HTML, inline CSS and SVG; `<details>` keeps evidence one click away
//! without any script.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::svg::{escape as e, histogram, line_chart, number, Series};
use super::{series, HistoryEntry, Regression, Run, Trend};
use crate::model::result::{ScenarioResult, Verdict};

const CSS: &str = r#"
.kind{font:12px monospace;background:#eef;border:1px solid #ccd;border-radius:3px;padding:0 4px}
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2330;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #dde;padding-bottom:4px}
table{border-collapse:collapse}td,th{border:1px solid #ccd;padding:4px 8px;vertical-align:top;text-align:left}
td.pass{background:#d9f5dd}td.fail{background:#fbd5d5}td.skip{background:#eceff4}td.xfail{background:#fdebc8}td.xpass{background:#e3d7f7}td.none{background:#fff}
details summary{cursor:pointer;font-weight:600}pre{background:#f6f7f9;padding:8px;overflow:auto;max-height:420px;font-size:12px}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart,.hist{background:#fbfbfd;border:1px solid #e3e5ea}
.title{font-size:12px;font-weight:600;fill:#1d2330}.tick{font-size:10px;fill:#555}.grid{stroke:#e6e8ee}.bar{fill:#4c78a8}
.regression{color:#b00020;font-weight:600}.muted{color:#667}
"#;

fn verdict_class(v: Verdict) -> &'static str {
    v.as_str()
}

fn anchor(profile: &str, scenario: &str) -> String {
    format!("ev-{}-{}", profile, scenario)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

pub fn render(
    runs: &[Run],
    history: &[HistoryEntry],
    regressions: &[Regression],
    threshold: f64,
) -> String {
    let mut h = String::new();
    let _ = write!(h, "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>wringer report</title><style>{CSS}</style></head><body>");
    let ids: Vec<String> = runs.iter().map(|r| r.run_id.clone()).collect();
    let _ = write!(
        h,
        "<h1>wringer report</h1><p class=\"muted\">runs {} · {} earlier runs in the history</p>",
        e(&ids.join(", ")),
        history.len().saturating_sub(runs.len())
    );
    for r in runs {
        let c = |v| r.scenarios.iter().filter(|s| s.verdict == v).count();
        let state = if r.interrupted {
            " (interrupted: partial)"
        } else if !r.complete {
            " (incomplete)"
        } else {
            ""
        };
        let _ = write!(
            h,
            "<p id=\"counts-{}\"><b>{}</b>: {} passed, {} failed, {} skipped, {} known failures (xfail), {} unexpected passes (xpass) in {:.1} s{state}</p>",
            e(&r.host_profile),
            e(&r.host_profile),
            c(Verdict::Pass),
            c(Verdict::Fail),
            c(Verdict::Skip),
            c(Verdict::Xfail),
            c(Verdict::Xpass),
            r.duration_s
        );
    }
    regressions_section(&mut h, regressions, threshold);
    matrix(&mut h, runs);
    implementations(&mut h, runs);
    latency(&mut h, runs);
    bench(&mut h, runs);
    trends(&mut h, history);
    evidence(&mut h, runs);
    h.push_str("</body></html>\n");
    h
}

fn regressions_section(h: &mut String, regressions: &[Regression], threshold: f64) {
    let _ = write!(h, "<h2>Regressions</h2><p class=\"muted\">newest run against the median of up to ten earlier runs; flagged beyond {:.0}%</p>", threshold * 100.0);
    if regressions.is_empty() {
        h.push_str("<p id=\"no-regressions\">None flagged.</p>");
        return;
    }
    h.push_str("<table id=\"regressions\"><tr><th>profile</th><th>series</th><th>newest</th><th>baseline</th><th>change</th></tr>");
    for r in regressions {
        let _ = write!(
            h,
            "<tr class=\"regression\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:+.0}%</td></tr>",
            e(&r.profile),
            e(&r.series),
            number(r.latest),
            number(r.baseline),
            r.change * 100.0
        );
    }
    h.push_str("</table>");
}

fn matrix(h: &mut String, runs: &[Run]) {
    let names: BTreeSet<&str> = runs
        .iter()
        .flat_map(|r| r.scenarios.iter().map(|s| s.name.as_str()))
        .collect();
    h.push_str("<h2>Scenarios × host profiles</h2><table id=\"matrix\"><tr><th>scenario</th>");
    for r in runs {
        let _ = write!(h, "<th>{}</th>", e(&r.host_profile));
    }
    h.push_str("</tr>");
    // Each run's results by name, once: a search per cell made the page quadratic (100,000
    // scenarios took 85 s).
    let by_name: Vec<std::collections::HashMap<&str, &ScenarioResult>> = runs
        .iter()
        .map(|r| {
            let mut m = std::collections::HashMap::new();
            for s in &r.scenarios {
                m.entry(s.name.as_str()).or_insert(s);
            }
            m
        })
        .collect();
    for name in names {
        let _ = write!(h, "<tr><th>{}</th>", e(name));
        for (r, results) in runs.iter().zip(&by_name) {
            match results.get(name).copied() {
                None => h.push_str("<td class=\"none\">not run</td>"),
                Some(s) => {
                    let v = verdict_class(s.verdict);
                    let reason = s
                        .reason
                        .clone()
                        .unwrap_or_else(|| "all expectations met".into());
                    let _ = write!(
                        h,
                        "<td class=\"{v}\" data-scenario=\"{}\" data-profile=\"{}\" data-verdict=\"{v}\"><details><summary>{} · {:.1} s</summary><p>{}</p><a href=\"#{}\">evidence</a></details></td>",
                        e(name),
                        e(&r.host_profile),
                        v.to_uppercase(),
                        s.duration_s,
                        e(&reason),
                        anchor(&r.host_profile, name)
                    );
                }
            }
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
}

/// Implementation × scenario class, per host profile (see `outputs::matrix`).
fn implementations(h: &mut String, runs: &[Run]) {
    use crate::outputs::matrix;
    h.push_str("<h2>Implementation × scenario class</h2>");
    for r in runs {
        let cells = matrix::tally(&r.scenarios);
        let (rows, cols) = matrix::axes(&cells);
        let _ = write!(
            h,
            "<table class=\"implementations\" data-profile=\"{}\"><tr><th>{}</th>",
            e(&r.host_profile),
            e(&r.host_profile)
        );
        for c in &cols {
            let _ = write!(h, "<th>{}</th>", e(c));
        }
        h.push_str("</tr>");
        for row in rows {
            let _ = write!(h, "<tr><th>{}</th>", e(&row));
            for c in &cols {
                let counts = cells.get(&(row.clone(), *c));
                // The cell takes the colour of its worst verdict.
                let class = counts
                    .and_then(|m| {
                        [
                            Verdict::Fail,
                            Verdict::Xpass,
                            Verdict::Xfail,
                            Verdict::Pass,
                            Verdict::Skip,
                        ]
                        .into_iter()
                        .find(|v| m.contains_key(v))
                    })
                    .map(verdict_class)
                    .unwrap_or("none");
                let _ = write!(
                    h,
                    "<td class=\"{class}\">{}</td>",
                    e(&matrix::label(counts))
                );
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
    }
}

fn latency(h: &mut String, runs: &[Run]) {
    h.push_str("<h2>Latency</h2>");
    for r in runs {
        for (s, series) in r.scenarios.iter().flat_map(|s| {
            let mut kinds: Vec<_> = s.latency.keys().map(|k| k.series).collect();
            kinds.dedup();
            kinds.into_iter().map(move |k| (s, k))
        }) {
            let mut sizes: Vec<(u64, &crate::model::result::Latency)> = s
                .latency
                .iter()
                .filter(|(k, _)| k.series == series)
                .map(|(k, l)| (k.size, l))
                .collect();
            sizes.sort_by_key(|x| x.0);
            let p = |f: fn(&crate::model::result::Latency) -> f64| {
                sizes
                    .iter()
                    .map(|(k, l)| (*k as f64, f(l)))
                    .collect::<Vec<_>>()
            };
            let labels: Vec<(f64, String)> = sizes
                .iter()
                .map(|(k, _)| (*k as f64, size_label(*k)))
                .collect();
            let chart = line_chart(
                &format!(
                    "{} ({}): {} by message size",
                    s.name,
                    r.host_profile,
                    series.title()
                ),
                "µs",
                &[
                    Series {
                        name: "p50".into(),
                        color: "#4c78a8",
                        points: p(|l| l.p50_us),
                    },
                    Series {
                        name: "p99".into(),
                        color: "#e45756",
                        points: p(|l| l.p99_us),
                    },
                ],
                true,
                true,
                &labels,
            );
            let _ = write!(
                h,
                "<h3>{} · {} · {}</h3><div class=\"charts\">{chart}",
                e(&s.name),
                e(&r.host_profile),
                e(series.title())
            );
            for (size, l) in &sizes {
                h.push_str(&histogram(
                    &format!("{} · {} samples", size_label(*size), l.count),
                    &l.histogram,
                ));
            }
            h.push_str(
                "</div><table><tr><th>size</th><th>p50 µs</th><th>p99 µs</th><th>samples</th></tr>",
            );
            for (size, l) in &sizes {
                let _ = write!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    size_label(*size),
                    number(l.p50_us),
                    number(l.p99_us),
                    l.count
                );
            }
            h.push_str("</table>");
        }
    }
}

fn size_label(b: u64) -> String {
    match b {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1024 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn bench(h: &mut String, runs: &[Run]) {
    h.push_str("<h2>Bandwidth and benchmarks against the reference tools</h2>");
    let mut any = false;
    for r in runs {
        let Some(b) = &r.bench else { continue };
        any = true;
        let _ = write!(h, "<h3>{} ({} rounds kept per measure after {} discarded, {} s per side per round, alternating)</h3><table class=\"bench\"><tr><th>measure</th><th>wringer</th><th>reference</th><th>ratio (median ± half the interquartile range)</th><th>goal</th></tr>", e(&r.host_profile), b.rounds, b.warmup_rounds, b.seconds_per_round);
        for row in &b.rows {
            let c = row.cells();
            let goal = match c.goal {
                Some((g, Some(true))) => format!("{} met", e(&g)),
                Some((g, Some(false))) => {
                    format!("<span class=\"regression\">{} missed</span>", e(&g))
                }
                Some((g, None)) => e(&g),
                None => String::new(),
            };
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{goal}</td></tr>",
                e(&row.measure),
                e(&c.ours),
                e(&c.reference),
                e(&c.ratio)
            );
        }
        h.push_str("</table>");
    }
    if !any {
        h.push_str("<p class=\"muted\">No bench.json in these runs (run <code>wringer bench --out RUN_DIR</code>).</p>");
    }
}

fn trends(h: &mut String, history: &[HistoryEntry]) {
    h.push_str("<h2>Trends across runs</h2>");
    let mut profiles: Vec<&str> = history.iter().map(|e| e.host_profile.as_str()).collect();
    profiles.sort();
    profiles.dedup();
    for profile in profiles {
        let all = series(history, profile);
        let runs = history.iter().filter(|e| e.host_profile == profile).count();
        let _ = write!(
            h,
            "<h3>{} · {runs} runs</h3><div class=\"charts\">",
            e(profile)
        );
        // One chart per scenario duration, per latency series pair, and bandwidth.
        let mut grouped: BTreeMap<String, Vec<(String, &Trend)>> = BTreeMap::new();
        for (name, points) in &all {
            let (group, label) = if let Some(base) = name.strip_suffix(" p50 µs") {
                (format!("{base} latency µs"), "p50".to_string())
            } else if let Some(base) = name.strip_suffix(" p99 µs") {
                (format!("{base} latency µs"), "p99".to_string())
            } else {
                (name.clone(), "value".to_string())
            };
            grouped.entry(group).or_default().push((label, points));
        }
        for (group, lines) in grouped {
            let colors = ["#4c78a8", "#e45756", "#54a24b"];
            let series: Vec<Series> = lines
                .iter()
                .enumerate()
                .map(|(i, (label, pts))| Series {
                    name: label.clone(),
                    color: colors[i % colors.len()],
                    // x is the run's position, so runs are evenly spaced.
                    points: pts
                        .points
                        .iter()
                        .enumerate()
                        .map(|(n, p)| (n as f64 + 1.0, p.1))
                        .collect(),
                })
                .collect();
            h.push_str(&line_chart(&group, "", &series, false, false, &[]));
        }
        h.push_str("</div>");
    }
}

fn evidence(h: &mut String, runs: &[Run]) {
    h.push_str("<h2>Evidence</h2>");
    for r in runs {
        for s in &r.scenarios {
            let open = if s.verdict == Verdict::Fail {
                " open"
            } else {
                ""
            };
            let _ = write!(
                h,
                "<details id=\"{}\"{open}><summary>{} · {} · {}</summary>",
                anchor(&r.host_profile, &s.name),
                e(&s.name),
                e(&r.host_profile),
                verdict_class(s.verdict).to_uppercase()
            );
            scenario_evidence(h, s, &r.dir);
            h.push_str("</details>");
        }
    }
}

/// The last `TAIL` bytes of a rank log, read only if the log lies inside the run's folder (a
/// results file names its logs by path, and a page gets published: a path or a symlink that
/// leads out of the run must not copy another file into it), with a bounded seek.
const TAIL: u64 = 4096;

fn log_tail(log: &std::path::Path, run_dir: &std::path::Path) -> anyhow::Result<String> {
    use crate::model::input::{open_regular, NotOpened};
    use std::io::{Read, Seek, SeekFrom};
    let inside = match (log.canonicalize(), run_dir.canonicalize()) {
        (Ok(l), Ok(d)) => l.starts_with(&d),
        (Err(e), _) => return Err(e.into()),
        (_, Err(e)) => anyhow::bail!("the run's folder: {e}"),
    };
    if !inside {
        anyhow::bail!("is outside the run's folder, so it is not shown");
    }
    let (mut f, len) = open_regular(log).map_err(|e| match e {
        NotOpened::Io(e) => anyhow::Error::from(e),
        NotOpened::NotRegular(what) => anyhow::anyhow!("is {what}, so it is not shown"),
    })?;
    f.seek(SeekFrom::Start(len.saturating_sub(TAIL)))?;
    let mut tail = vec![];
    f.take(TAIL).read_to_end(&mut tail)?;
    Ok(String::from_utf8_lossy(&tail).into_owned())
}

fn scenario_evidence(h: &mut String, s: &ScenarioResult, run_dir: &std::path::Path) {
    if let Some(reason) = &s.reason {
        let _ = write!(h, "<p><b>reason:</b> {}</p>", e(reason));
    }
    let list = |h: &mut String, title: &str, items: &[String]| {
        if !items.is_empty() {
            let _ = write!(h, "<p><b>{title}</b></p><ul>");
            for i in items {
                let _ = write!(h, "<li>{}</li>", e(i));
            }
            h.push_str("</ul>");
        }
    };
    if !s.evidence.failures.is_empty() {
        h.push_str("<p><b>failures</b></p><ul>");
        for f in &s.evidence.failures {
            let _ = write!(
                h,
                "<li><span class=\"kind\">{}</span> {}</li>",
                e(f.failure.kind().as_str()),
                e(&f.to_string())
            );
        }
        h.push_str("</ul>");
    }
    list(h, "replay", &s.replay_lines());
    let reach: Vec<String> = s
        .evidence
        .reach
        .iter()
        .map(|r| {
            format!(
                "{}{}: reached in {} of {} repeats ({} times): {}",
                r.point,
                if r.required { " (required)" } else { "" },
                r.repeats_reached,
                r.repeats,
                r.times,
                r.meaning
            )
        })
        .collect();
    list(h, "reachability", &reach);
    let recorder: Vec<String> = s
        .evidence
        .audit_recorder
        .iter()
        .map(|r| format!("syscalls recorded by {r}"))
        .chain(
            s.evidence
                .perturbed_by
                .iter()
                .map(|p| format!("perturbed calls delayed by {p}")),
        )
        .collect();
    list(h, "audit", &recorder);
    list(h, "faults", &s.evidence.faults);
    list(h, "observations", &s.evidence.notes);
    if !s.metrics.is_empty() {
        h.push_str(
            "<table><tr><th>metric</th><th>min</th><th>max</th><th>mean</th><th>n</th></tr>",
        );
        for (k, m) in &s.metrics {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                e(&k.to_string()),
                number(m.min),
                number(m.max),
                number(m.mean),
                m.count
            );
        }
        h.push_str("</table>");
    }
    for st in &s.evidence.stacks {
        let _ = write!(
            h,
            "<p><b>stacks of rank {} (pid {}), repeat {}</b></p><pre>{}</pre>",
            st.rank,
            st.pid,
            st.repeat,
            e(&st.text)
        );
    }
    for log in &s.evidence.rank_logs {
        // Embed the tail, so the page stays readable without the run folder.
        match log_tail(log, run_dir) {
            Ok(t) if !t.trim().is_empty() => {
                let _ = write!(
                    h,
                    "<p><b>rank log</b> {}</p><pre>{}</pre>",
                    e(&log.display().to_string()),
                    e(&t)
                );
            }
            Ok(_) => {
                let _ = write!(
                    h,
                    "<p class=\"muted\">rank log {} is empty</p>",
                    e(&log.display().to_string())
                );
            }
            Err(err) => {
                let _ = write!(
                    h,
                    "<p class=\"muted\">rank log {}: {}</p>",
                    e(&log.display().to_string()),
                    e(&err.to_string())
                );
            }
        }
    }
}
