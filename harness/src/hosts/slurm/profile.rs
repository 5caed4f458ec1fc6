//! The `slurm:` section of a host profile: the allocation (partition, nodes, time limit,
//! account, QoS), how steps are laid out, and the `srun` options a user may add, from an
//! allow-list. Every value is checked before anything is submitted: none can become an option
//! or shell syntax, and each error names its file, line and column.

use crate::model::invalid::Invalid;
use std::path::Path;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::hosts::values::{safe, spanned, Charset};
use crate::model::input::{located, InputError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmSpec {
    #[serde(default)]
    pub partition: Option<Spanned<String>>,
    /// A count (`3`) or a node list (`gpu[01-04]`).
    pub nodes: Spanned<Nodes>,
    /// Ranks per node, in blocks (rank r on node r / N); without it ranks go round-robin over
    /// the nodes (rank r on node r % nodes), as the scenario's own placement expects.
    #[serde(default)]
    pub tasks_per_node: Option<Spanned<u32>>,
    /// The allocation's time limit, in Slurm's format (`30`, `1:00:00`, `1-00:00:00`).
    pub time_limit: Spanned<String>,
    #[serde(default)]
    pub account: Option<Spanned<String>>,
    #[serde(default)]
    pub qos: Option<Spanned<String>>,
    /// More `srun` options, from [`ALLOWED`] only (`--name` or `--name=value`).
    #[serde(default)]
    pub srun_options: Vec<Spanned<String>>,
    /// Where this build of wringer lies on the nodes (a shared filesystem). Default: the path
    /// it has here. The test cluster gets it copied.
    #[serde(default)]
    pub exe: Option<Spanned<String>>,
    /// The interface whose IPv4 address ranks bind to on each node. Default: the address the
    /// node's own name resolves to there.
    #[serde(default)]
    pub data_interface: Option<Spanned<String>>,
    /// How long to wait for an allocation when wringer must obtain one (seconds).
    #[serde(default = "default_allocation_wait")]
    pub allocation_wait_s: u32,
    /// Start a Slurm cluster of containers for the run (slurmctld and `nodes` slurmd
    /// containers, `just setup-slurm` builds the image), and use it instead of the caller's.
    #[serde(default)]
    pub test_cluster: Option<TestCluster>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Nodes {
    Count(u32),
    List(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestCluster {
    #[serde(default = "default_image")]
    pub image: String,
}

fn default_allocation_wait() -> u32 {
    120
}

fn default_image() -> String {
    "wringer-slurm:local".into()
}

/// The `srun` options a profile may add: (name, takes a value, also asked of an allocation
/// wringer obtains). Everything else is wringer's to set (placement, I/O, environment,
/// signals, the job itself) or could run a command (prologs).
pub const ALLOWED: &[(&str, bool, bool)] = &[
    ("exclusive", false, true),
    ("mpi", true, false),
    ("cpu-bind", true, false),
    ("cpus-per-task", true, true),
    ("mem", true, true),
    ("mem-per-cpu", true, true),
    ("gres", true, true),
    ("gpus-per-node", true, true),
    ("gpus-per-task", true, true),
    ("constraint", true, true),
    ("reservation", true, true),
    ("hint", true, false),
    ("network", true, false),
    ("switches", true, true),
    ("licenses", true, true),
    ("wckey", true, true),
];

impl SlurmSpec {
    pub fn node_count(&self) -> usize {
        match &self.nodes.value {
            Nodes::Count(n) => *n as usize,
            Nodes::List(l) => expand_nodelist(l).map_or(0, |v| v.len()),
        }
    }

    /// The time limit in whole minutes (rounded up).
    pub fn time_limit_minutes(&self) -> u64 {
        minutes(&self.time_limit.value).unwrap_or(1)
    }

    /// The allowed options that an allocation wringer obtains must carry too.
    pub fn allocation_options(&self) -> Vec<String> {
        self.srun_options
            .iter()
            .filter(|o| option_rule(&o.value).is_some_and(|(_, _, alloc)| alloc))
            .map(|o| o.value.clone())
            .collect()
    }

    pub fn check(&self, path: &Path) -> Result<(), InputError> {
        let at = |v: &serde_saphyr::Location, why: String| Err(located(path, v, why));
        for (field, v) in [
            ("slurm.partition", &self.partition),
            ("slurm.account", &self.account),
            ("slurm.qos", &self.qos),
            ("slurm.data_interface", &self.data_interface),
        ] {
            if let Some(v) = v {
                spanned(path, field, v, Charset::Name)?;
            }
        }
        if let Some(e) = &self.exe {
            spanned(path, "slurm.exe", e, Charset::Path)?;
            if !e.value.starts_with('/') {
                return at(
                    &e.referenced,
                    format!("slurm.exe `{}` must be an absolute path", e.value),
                );
            }
        }
        match &self.nodes.value {
            Nodes::Count(n) if !(1..=4096).contains(n) => {
                return at(
                    &self.nodes.referenced,
                    format!("slurm.nodes must be 1..=4096, got {n}"),
                )
            }
            Nodes::Count(_) => {}
            Nodes::List(l) => {
                safe(
                    path,
                    Some(&self.nodes.referenced),
                    "slurm.nodes",
                    l,
                    Charset::NodeList,
                )?;
                if let Err(why) = expand_nodelist(l) {
                    return at(&self.nodes.referenced, format!("slurm.nodes `{l}`: {why}"));
                }
            }
        }
        if let Some(t) = &self.tasks_per_node {
            if t.value == 0 {
                return at(
                    &t.referenced,
                    "slurm.tasks_per_node must be at least 1".into(),
                );
            }
        }
        spanned(path, "slurm.time_limit", &self.time_limit, Charset::Time)?;
        if minutes(&self.time_limit.value).is_none_or(|m| m == 0) {
            return at(
                &self.time_limit.referenced,
                format!(
                    "slurm.time_limit `{}` is not a Slurm time: use MINUTES, HH:MM:SS or D-HH:MM:SS, at least a minute",
                    self.time_limit.value
                ),
            );
        }
        for o in &self.srun_options {
            if let Err(why) = check_option(&o.value) {
                return at(&o.referenced, why.0);
            }
            if let Some((_, v)) = o.value.split_once('=') {
                safe(
                    path,
                    Some(&o.referenced),
                    "slurm.srun_options",
                    v,
                    Charset::OptionValue,
                )?;
            }
        }
        if !(1..=3600).contains(&self.allocation_wait_s) {
            return Err(InputError::plain(
                path,
                format!(
                    "slurm.allocation_wait_s must be 1..=3600, got {}",
                    self.allocation_wait_s
                ),
            ));
        }
        if let Some(c) = &self.test_cluster {
            safe(
                path,
                None,
                "slurm.test_cluster.image",
                &c.image,
                Charset::Image,
            )?;
            if !matches!(self.nodes.value, Nodes::Count(1..=8)) {
                return at(
                    &self.nodes.referenced,
                    "a test cluster has 1..=8 nodes, given as a count".into(),
                );
            }
        }
        Ok(())
    }
}

fn option_rule(option: &str) -> Option<(&'static str, bool, bool)> {
    let name = option.strip_prefix("--")?.split('=').next()?;
    ALLOWED.iter().copied().find(|(n, _, _)| *n == name)
}

fn check_option(option: &str) -> Result<(), Invalid> {
    let allowed = || {
        ALLOWED
            .iter()
            .map(|(n, v, _)| format!("--{n}{}", if *v { "=..." } else { "" }))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some((_, takes_value, _)) = option_rule(option) else {
        return Err(format!(
            "srun option `{option}` is not allowed (wringer sets placement, I/O, environment, signals and the job itself); allowed: {}",
            allowed()
        ).into());
    };
    match (takes_value, option.split_once('=')) {
        (true, Some((_, v))) if !v.is_empty() => Ok(()),
        (true, _) => Err(format!("srun option `{option}` needs a value: `{option}=...`").into()),
        (false, None) => Ok(()),
        (false, Some(_)) => Err(format!("srun option `{option}` takes no value").into()),
    }
}

/// Slurm's time format in whole minutes, rounded up: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`,
/// `D-H:M:S`.
pub fn minutes(t: &str) -> Option<u64> {
    let num = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.len() <= 6 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let seconds = match t.split_once('-') {
        Some((days, rest)) => {
            let parts: Vec<&str> = rest.split(':').collect();
            let hms: Vec<u64> = parts.iter().map(|p| num(p)).collect::<Option<_>>()?;
            let (h, m, s) = match hms[..] {
                [h] => (h, 0, 0),
                [h, m] => (h, m, 0),
                [h, m, s] => (h, m, s),
                _ => return None,
            };
            num(days)? * 86_400 + h * 3600 + m * 60 + s
        }
        None => {
            let parts: Vec<u64> = t.split(':').map(num).collect::<Option<_>>()?;
            match parts[..] {
                [m] => m * 60,
                [m, s] => m * 60 + s,
                [h, m, s] => h * 3600 + m * 60 + s,
                _ => return None,
            }
        }
    };
    Some(seconds.div_ceil(60))
}

/// The most nodes a list may name, and the longest a node's name may be (a host name's limit).
const MAX_NODES: u64 = 4096;
const MAX_NAME: usize = 253;

/// Expand a Slurm node list (`n[0-2],gpu07,a[1,3-4]b`) into names, in order. Every bound is
/// checked before anything is expanded: a short list can name gigabytes of nodes.
pub fn expand_nodelist(list: &str) -> Result<Vec<String>, Invalid> {
    let mut names = vec![];
    let mut rest = list;
    while !rest.is_empty() {
        // One item: up to a comma outside brackets.
        let mut depth = 0;
        let end = rest
            .char_indices()
            .find(|(_, c)| {
                match c {
                    '[' => depth += 1,
                    ']' => depth -= 1,
                    _ => {}
                }
                *c == ',' && depth == 0
            })
            .map_or(rest.len(), |(i, _)| i);
        let item = &rest[..end];
        rest = rest.get(end + 1..).unwrap_or("");
        if item.is_empty() {
            return Err("an empty name".into());
        }
        match item.split_once('[') {
            None if item.contains(']') => return Err(format!("`{item}`: `]` without `[`").into()),
            None if item.len() > MAX_NAME => {
                return Err(format!(
                    "a node name has at most {MAX_NAME} characters, one has {}",
                    item.len()
                )
                .into())
            }
            None => names.push(item.to_string()),
            Some((prefix, tail)) => {
                let (ranges, suffix) = tail
                    .split_once(']')
                    .ok_or_else(|| format!("`{item}`: `[` without `]`"))?;
                if suffix.contains('[') || suffix.contains(']') {
                    return Err(format!("`{item}`: one bracket group per name only").into());
                }
                for r in ranges.split(',') {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    let (x, y) = (a.parse::<u64>(), b.parse::<u64>());
                    let (Ok(x), Ok(y)) = (x, y) else {
                        return Err(format!("`{item}`: `{r}` is not a number or a range").into());
                    };
                    if x > y {
                        return Err(format!("`{item}`: `{r}` is not an ascending range").into());
                    }
                    if names.len() as u64 + (y - x + 1) > MAX_NODES {
                        return Err(format!("more than {MAX_NODES} nodes").into());
                    }
                    let longest = prefix.len() + a.len().max(b.len()) + suffix.len();
                    if longest > MAX_NAME {
                        return Err(format!(
                            "`{}…`: a node name has at most {MAX_NAME} characters",
                            item.chars().take(40).collect::<String>()
                        )
                        .into());
                    }
                    for n in x..=y {
                        // Zero-padded as written (`01-04`).
                        names.push(format!("{prefix}{n:0w$}{suffix}", w = a.len()));
                    }
                }
            }
        }
        if names.len() as u64 > MAX_NODES {
            return Err(format!("more than {MAX_NODES} nodes").into());
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_list_that_names_too_much_is_refused_before_it_is_expanded() {
        // Many ranges of 4,096 in one bracket: each alone is within the cap, together far over.
        let many = format!("n[{}]", vec!["0-4095"; 10_000].join(","));
        let started = std::time::Instant::now();
        assert_eq!(
            expand_nodelist(&many).unwrap_err(),
            "more than 4096 nodes".into()
        );
        assert!(started.elapsed() < std::time::Duration::from_millis(200));
        // A zero-padded width that would make every name huge.
        let wide = format!("n[{}1-{}9]", "0".repeat(100_000), "0".repeat(100_000));
        assert!(expand_nodelist(&wide)
            .unwrap_err()
            .contains("at most 253 characters"));
        assert!(expand_nodelist(&"x".repeat(300))
            .unwrap_err()
            .contains("at most 253"));
        assert_eq!(expand_nodelist("n[0-4095]").unwrap().len(), 4096);
        assert!(expand_nodelist("n[0-4095],m").is_err());
    }

    #[test]
    fn node_lists_expand_as_slurm_writes_them() {
        assert_eq!(expand_nodelist("n[0-2]").unwrap(), ["n0", "n1", "n2"]);
        assert_eq!(
            expand_nodelist("gpu[01-02,7],login").unwrap(),
            ["gpu01", "gpu02", "gpu7", "login"]
        );
        assert_eq!(expand_nodelist("a[1-2]b").unwrap(), ["a1b", "a2b"]);
        for bad in ["n[0-2", "n]", "n[2-1]", "n[x]", "a,,b", "n[0-1][2]"] {
            assert!(expand_nodelist(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn times_read_as_slurm_reads_them() {
        assert_eq!(minutes("30"), Some(30));
        assert_eq!(minutes("1:30"), Some(2));
        assert_eq!(minutes("1:00:00"), Some(60));
        assert_eq!(minutes("2-00:00:00"), Some(2880));
        assert_eq!(minutes("1-2"), Some(1560));
        for bad in ["", ":", "1:2:3:4", "a", "1--2", "-5", "9999999"] {
            assert_eq!(minutes(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_allowed_srun_options_pass() {
        assert!(check_option("--exclusive").is_ok());
        assert!(check_option("--gres=gpu:1").is_ok());
        for bad in [
            "--export=ALL",
            "--task-prolog=/bin/x",
            "--jobid=5",
            "--input=all",
            "-n4",
            "--gres",
            "--exclusive=yes",
            "--gres=",
        ] {
            assert!(check_option(bad).is_err(), "{bad} was accepted");
        }
        let why = check_option("--export=ALL").unwrap_err();
        assert!(why.contains("--gres=..."), "{why}");
    }
}
