//! Implementation × scenario class: which transport (wringer's own, Gloo, libfabric, UCX,
//! perftest) went through which kind of trouble, and how it came out. Both are read from the
//! scenario's name, whose words follow one convention (`gloo-peer-death`, `tcp-teardown-cycles`):
//! the first word names the implementation, the rest the class. A scenario run against one
//! release of a library (`torch-2.15.0-gloo-allreduce`) gets a row for that release
//! (`torch-2.15.0-gloo`).

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::model::result::{ScenarioResult, Verdict};
use crate::model::scenario::version_order;

/// Implementations in the order the matrix shows them: (name prefix, row label).
pub const IMPLEMENTATIONS: &[(&str, &str)] = &[
    ("tcp-", "wringer-tcp"),
    ("rdma-", "wringer-rdma"),
    ("gpu-", "wringer-gpu"),
    ("gloo-", "gloo"),
    ("libfabric-", "libfabric"),
    ("ucx-", "ucx"),
    ("perftest-", "perftest"),
    ("rdmacm-", "rdmacm (rping)"),
    ("torch-", "torch-gloo"),
];

/// Release rows: `torch-VERSION-LIB-...` is row `torch-VERSION-LIB`, classed by the rest.
fn release_row(name: &str) -> Option<(String, &str)> {
    let rest = name.strip_prefix("torch-")?;
    let (version, rest) = rest.split_once('-')?;
    if !version.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let (library, rest) = rest.split_once('-')?;
    Some((format!("torch-{version}-{library}"), rest))
}

/// Classes in column order: (words in the name, column label). The first class whose word
/// appears in the name wins.
pub const CLASSES: &[(&[&str], &str)] = &[
    (
        &["host-death", "host-kill", "link", "rate-limit", "partition"],
        "host faults",
    ),
    (&["death", "exits", "kill"], "peer death"),
    (&["freeze", "stall"], "peer freeze"),
    (&["teardown", "shutdown", "close-during"], "teardown"),
    (&["lazy-connect", "listener", "connect"], "connect"),
    (
        &[
            "eof",
            "exact-reads",
            "receiver-error",
            "truncation",
            "handover",
            "mid-frame",
            "sees-end",
        ],
        "framing",
    ),
    (
        &[
            "pingpong",
            "allreduce",
            "latency",
            "stream",
            "send",
            "interop",
            "interface",
        ],
        "data path",
    ),
];

/// The row and column of a scenario; `None` when its name follows no convention.
pub fn cell(name: &str) -> Option<(Cow<'static, str>, &'static str)> {
    let (implementation, rest): (Cow<'static, str>, &str) = match release_row(name) {
        Some((row, rest)) => (row.into(), rest),
        None => {
            let (prefix, implementation) =
                IMPLEMENTATIONS.iter().find(|(p, _)| name.starts_with(p))?;
            ((*implementation).into(), &name[prefix.len()..])
        }
    };
    let class = CLASSES
        .iter()
        .find(|(words, _)| words.iter().any(|w| rest.contains(w)))
        .map(|(_, c)| *c)
        .unwrap_or("other");
    Some((implementation, class))
}

/// Verdict counts per (implementation, class), for every scenario that ran or was skipped.
pub type Cells = BTreeMap<(Cow<'static, str>, &'static str), BTreeMap<Verdict, usize>>;

pub fn tally<'a>(results: impl IntoIterator<Item = &'a ScenarioResult>) -> Cells {
    let mut cells = Cells::new();
    for r in results {
        let (i, c) = cell(&r.name).unwrap_or(("other".into(), "other"));
        *cells
            .entry((i, c))
            .or_default()
            .entry(r.verdict)
            .or_default() += 1;
    }
    cells
}

/// Rows and columns that hold anything, in the matrix's order (a library's release rows after
/// the fixed ones, oldest release first).
pub fn axes(cells: &Cells) -> (Vec<Cow<'static, str>>, Vec<&'static str>) {
    let fixed: Vec<Cow<'static, str>> = IMPLEMENTATIONS
        .iter()
        .map(|(_, r)| Cow::Borrowed(*r))
        .filter(|r| cells.keys().any(|(i, _)| i == r))
        .collect();
    let mut released: Vec<Cow<'static, str>> = cells
        .keys()
        .map(|(i, _)| i.clone())
        .filter(|i| release_row(&format!("{i}-x")).is_some())
        .collect();
    released.dedup();
    // By the row's version (`torch-VERSION-gloo`), so 2.8.0 comes before 2.15.0.
    released.sort_by_key(|r| version_order(r.split('-').nth(1).unwrap_or_default()));
    let other = cells
        .keys()
        .any(|(i, _)| i == "other")
        .then_some(Cow::Borrowed("other"));
    let rows = fixed.into_iter().chain(released).chain(other).collect();
    let cols = CLASSES
        .iter()
        .map(|(_, c)| *c)
        .chain(["other"])
        .filter(|c| cells.keys().any(|(_, k)| k == c))
        .collect();
    (rows, cols)
}

/// A cell's text: `✅ 2 ❌ 1`, or `·` when empty.
pub fn label(counts: Option<&BTreeMap<Verdict, usize>>) -> String {
    let Some(counts) = counts else {
        return "·".into();
    };
    Verdict::ALL
        .iter()
        .filter_map(|v| counts.get(v).map(|n| format!("{} {n}", symbol(*v))))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn symbol(v: Verdict) -> &'static str {
    match v {
        Verdict::Pass => "✅",
        Verdict::Fail => "❌",
        Verdict::Skip => "⏭️",
        Verdict::Xfail => "⚠️",
        Verdict::Xpass => "❔",
    }
}

/// The matrix as a Markdown table.
pub fn markdown<'a>(results: impl IntoIterator<Item = &'a ScenarioResult>) -> String {
    let cells = tally(results);
    let (rows, cols) = axes(&cells);
    if rows.is_empty() {
        return String::new();
    }
    let mut s = format!("| implementation | {} |\n|---|", cols.join(" | "));
    s.push_str(&"---|".repeat(cols.len()));
    s.push('\n');
    for r in rows {
        s.push_str(&format!("| {r} |"));
        for c in &cols {
            s.push_str(&format!(" {} |", label(cells.get(&(r.clone(), *c)))));
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn names_map_to_an_implementation_and_a_class() {
        let cell = |n: &str| cell(n).map(|(i, c)| (i.into_owned(), c));
        assert_eq!(cell("gloo-peer-death"), Some(("gloo".into(), "peer death")));
        assert_eq!(
            cell("torch-2.15.0-gloo-lazy-rank-exits"),
            Some(("torch-2.15.0-gloo".into(), "peer death"))
        );
        assert_eq!(
            cell("torch-2.8.0-gloo-allreduce"),
            Some(("torch-2.8.0-gloo".into(), "data path"))
        );
        assert_eq!(
            cell("torch-gloo-allreduce"),
            Some(("torch-gloo".into(), "data path"))
        );
        assert_eq!(
            cell("gloo-peer-freeze"),
            Some(("gloo".into(), "peer freeze"))
        );
        assert_eq!(
            cell("gloo-allreduce-8rank"),
            Some(("gloo".into(), "data path"))
        );
        assert_eq!(
            cell("tcp-xhost-peer-host-death"),
            Some(("wringer-tcp".into(), "host faults"))
        );
        assert_eq!(
            cell("tcp-teardown-cycles"),
            Some(("wringer-tcp".into(), "teardown"))
        );
        assert_eq!(
            cell("rdma-graceful-shutdown"),
            Some(("wringer-rdma".into(), "teardown"))
        );
        assert_eq!(
            cell("tcp-lazy-connect-deadline-race"),
            Some(("wringer-tcp".into(), "connect"))
        );
        assert_eq!(
            cell("libfabric-rdm-server-death"),
            Some(("libfabric".into(), "peer death"))
        );
        assert_eq!(
            cell("ucx-perftest-latency"),
            Some(("ucx".into(), "data path"))
        );
        assert_eq!(
            cell("tcp-exact-reads"),
            Some(("wringer-tcp".into(), "framing"))
        );
        for (name, class) in [
            ("tcp-handover-order", "framing"),
            ("tcp-xhost-mid-frame-deadlines", "framing"),
            ("tcp-caller-sees-end", "framing"),
            ("tcp-xhost-close-during-recv", "teardown"),
        ] {
            assert_eq!(cell(name), Some(("wringer-tcp".into(), class)), "{name}");
        }
        assert_eq!(cell("mine-something"), None);
    }

    fn result(name: &str, v: Verdict) -> ScenarioResult {
        ScenarioResult::not_run(name, Path::new("x.yaml"), v, String::new())
    }

    #[test]
    fn the_table_counts_verdicts_per_cell_and_leaves_empty_cells_dotted() {
        let rs = [
            result("gloo-peer-death", Verdict::Pass),
            result("gloo-peer-freeze", Verdict::Pass),
            result("ucx-server-death", Verdict::Xfail),
            result("tcp-teardown-cycles", Verdict::Fail),
            result("custom-thing", Verdict::Skip),
            result("torch-2.15.0-gloo-peer-freeze", Verdict::Xfail),
            result("torch-2.8.0-gloo-peer-freeze", Verdict::Pass),
        ];
        let md = markdown(&rs);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(
            lines[0],
            "| implementation | peer death | peer freeze | teardown | other |"
        );
        assert!(
            lines.contains(&"| wringer-tcp | · | · | ❌ 1 | · |"),
            "{md}"
        );
        assert!(lines.contains(&"| gloo | ✅ 1 | ✅ 1 | · | · |"), "{md}");
        assert!(lines.contains(&"| ucx | ⚠️ 1 | · | · | · |"), "{md}");
        assert!(lines.contains(&"| other | · | · | · | ⏭️ 1 |"), "{md}");
        // A row per release, the older first, after the fixed rows and before `other`.
        let at = |row: &str| lines.iter().position(|l| l.starts_with(row)).unwrap();
        assert!(
            lines.contains(&"| torch-2.15.0-gloo | · | ⚠️ 1 | · | · |"),
            "{md}"
        );
        assert!(at("| ucx") < at("| torch-2.8.0-gloo"), "{md}");
        assert!(at("| torch-2.8.0-gloo") < at("| torch-2.15.0-gloo"), "{md}");
        assert!(at("| torch-2.15.0-gloo") < at("| other"), "{md}");
    }
}
