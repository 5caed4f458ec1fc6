//! Implementation × scenario class: which transport (wringer's own, Gloo, libfabric, UCX,
//! perftest) went through which kind of trouble, and how it came out. Both are read from the
//! scenario's name, whose words follow one convention (`gloo-peer-death`, `tcp-teardown-cycles`):
//! the first word names the implementation, the rest the class.

use std::collections::BTreeMap;

use crate::model::result::{ScenarioResult, Verdict};

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
];

/// Classes in column order: (words in the name, column label). The first class whose word
/// appears in the name wins.
pub const CLASSES: &[(&[&str], &str)] = &[
    (
        &["host-death", "host-kill", "link", "rate-limit", "partition"],
        "host faults",
    ),
    (&["death", "exits", "kill"], "peer death"),
    (&["freeze", "stall"], "peer freeze"),
    (&["teardown", "shutdown"], "teardown"),
    (&["lazy-connect", "listener", "connect"], "connect"),
    (
        &["eof", "exact-reads", "receiver-error", "truncation"],
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
pub fn cell(name: &str) -> Option<(&'static str, &'static str)> {
    let (prefix, implementation) = IMPLEMENTATIONS.iter().find(|(p, _)| name.starts_with(p))?;
    let rest = &name[prefix.len()..];
    let class = CLASSES
        .iter()
        .find(|(words, _)| words.iter().any(|w| rest.contains(w)))
        .map(|(_, c)| *c)
        .unwrap_or("other");
    Some((implementation, class))
}

/// Verdict counts per (implementation, class), for every scenario that ran or was skipped.
pub type Cells = BTreeMap<(&'static str, &'static str), BTreeMap<Verdict, usize>>;

pub fn tally<'a>(results: impl IntoIterator<Item = &'a ScenarioResult>) -> Cells {
    let mut cells = Cells::new();
    for r in results {
        let (i, c) = cell(&r.name).unwrap_or(("other", "other"));
        *cells
            .entry((i, c))
            .or_default()
            .entry(r.verdict)
            .or_default() += 1;
    }
    cells
}

/// Rows and columns that hold anything, in the matrix's order.
pub fn axes(cells: &Cells) -> (Vec<&'static str>, Vec<&'static str>) {
    let rows = IMPLEMENTATIONS
        .iter()
        .map(|(_, r)| *r)
        .chain(["other"])
        .filter(|r| cells.keys().any(|(i, _)| i == r))
        .collect();
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
            s.push_str(&format!(" {} |", label(cells.get(&(r, c)))));
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
        assert_eq!(cell("gloo-peer-death"), Some(("gloo", "peer death")));
        assert_eq!(cell("gloo-peer-freeze"), Some(("gloo", "peer freeze")));
        assert_eq!(cell("gloo-allreduce-8rank"), Some(("gloo", "data path")));
        assert_eq!(
            cell("tcp-xhost-peer-host-death"),
            Some(("wringer-tcp", "host faults"))
        );
        assert_eq!(
            cell("tcp-teardown-cycles"),
            Some(("wringer-tcp", "teardown"))
        );
        assert_eq!(
            cell("rdma-graceful-shutdown"),
            Some(("wringer-rdma", "teardown"))
        );
        assert_eq!(
            cell("tcp-lazy-connect-deadline-race"),
            Some(("wringer-tcp", "connect"))
        );
        assert_eq!(
            cell("libfabric-rdm-server-death"),
            Some(("libfabric", "peer death"))
        );
        assert_eq!(cell("ucx-perftest-latency"), Some(("ucx", "data path")));
        assert_eq!(cell("tcp-exact-reads"), Some(("wringer-tcp", "framing")));
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
    }
}
