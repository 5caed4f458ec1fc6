//! Placeholders in an exec role's program, arguments and environment: `{rank}`, `{ranks}`,
//! `{host}`, `{port}`, `{rdma}`, `{iface}`, `{dir}`, `{seed}`, and `{host:N}`, `{port:N}`,
//! `{addr:N}`, `{rdma:N}` for rank N, and `{release}` (the folder of the release a scenario with
//! `releases:` runs against, put in when releases are expanded). `{{` and `}}` are literal braces. Templates are checked when the scenario loads, so a
//! typo is a located error, never a program started with a literal `{prot}`.

use crate::model::invalid::Invalid;
use std::collections::BTreeMap;

/// What the placeholders stand for on one rank.
#[derive(Clone, Debug, Default)]
pub struct Values {
    pub rank: u32,
    pub ranks: u32,
    pub iface: String,
    pub dir: String,
    pub seed: u64,
    /// Every rank's host address and exec port.
    pub hosts: Vec<String>,
    pub ports: Vec<u16>,
    /// Every rank's RoCE interface address, where it has one.
    pub rdma: Vec<Option<String>>,
}

pub const PLACEHOLDERS: &[(&str, &str)] = &[
    ("{rank}", "this rank's number"),
    ("{ranks}", "the world size"),
    ("{host}", "this rank's host address"),
    (
        "{port}",
        "a free TCP port reserved for this rank, fresh each repeat",
    ),
    (
        "{iface}",
        "the network interface that holds this rank's host address",
    ),
    (
        "{dir}",
        "a folder for this repeat, shared by the ranks of one host",
    ),
    ("{seed}", "the run's seed"),
    ("{host:N}", "rank N's host address"),
    ("{port:N}", "rank N's reserved port"),
    ("{addr:N}", "rank N's host:port"),
    (
        "{rdma}",
        "this rank's RoCE interface address (RDMA CM tools bind to it)",
    ),
    ("{rdma:N}", "rank N's RoCE interface address"),
    (
        "{release}",
        "the folder of the release this copy of the scenario runs against (scenarios with `releases:`)",
    ),
];

#[derive(Debug, PartialEq)]
enum Piece<'a> {
    Text(&'a str),
    Brace(char),
    Field(&'a str, Option<u32>),
}

fn pieces(t: &str) -> Result<Vec<Piece<'_>>, Invalid> {
    let mut out = vec![];
    let mut rest = t;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("{{") {
            out.push(Piece::Brace('{'));
            rest = r;
        } else if let Some(r) = rest.strip_prefix("}}") {
            out.push(Piece::Brace('}'));
            rest = r;
        } else if let Some(r) = rest.strip_prefix('{') {
            let end = r.find('}').ok_or_else(|| {
                format!("`{t}`: a `{{` without its `}}` (write `{{{{` for a brace)")
            })?;
            let inner = &r[..end];
            let (name, index) = match inner.split_once(':') {
                Some((n, i)) => (
                    n,
                    Some(i.parse::<u32>().map_err(|_| {
                        format!("`{t}`: `{{{inner}}}` needs a rank number after the colon")
                    })?),
                ),
                None => (inner, None),
            };
            let known = match index {
                None => [
                    "rank", "ranks", "host", "port", "rdma", "iface", "dir", "seed", "release",
                ]
                .contains(&name),
                Some(_) => ["host", "port", "addr", "rdma"].contains(&name),
            };
            if !known {
                let names: Vec<&str> = PLACEHOLDERS.iter().map(|(p, _)| *p).collect();
                return Err(format!(
                    "`{t}`: unknown placeholder `{{{inner}}}` (known: {})",
                    names.join(", ")
                )
                .into());
            }
            out.push(Piece::Field(name, index));
            rest = &r[end + 1..];
        } else if rest.starts_with('}') {
            return Err(format!("`{t}`: a lone `}}` (write `}}}}` for a brace)").into());
        } else {
            let end = rest.find(['{', '}']).unwrap_or(rest.len());
            out.push(Piece::Text(&rest[..end]));
            rest = &rest[end..];
        }
    }
    Ok(out)
}

/// Check a template against the world size: known names, rank numbers in range.
pub fn check(t: &str, ranks: u32) -> Result<(), Invalid> {
    for p in pieces(t)? {
        if let Piece::Field(name, Some(n)) = p {
            if n >= ranks {
                return Err(format!(
                    "`{t}`: `{{{name}:{n}}}` names rank {n}, the scenario has {ranks}"
                )
                .into());
            }
        }
    }
    Ok(())
}

pub fn fill(t: &str, v: &Values) -> Result<String, Invalid> {
    let mut out = String::new();
    let at = |list: &[String], n: u32| list.get(n as usize).cloned();
    for p in pieces(t)? {
        let piece = match p {
            Piece::Text(s) => Some(s.to_string()),
            Piece::Brace(c) => Some(c.to_string()),
            Piece::Field("rank", None) => Some(v.rank.to_string()),
            Piece::Field("ranks", None) => Some(v.ranks.to_string()),
            Piece::Field("iface", None) => Some(v.iface.clone()),
            Piece::Field("dir", None) => Some(v.dir.clone()),
            Piece::Field("seed", None) => Some(v.seed.to_string()),
            Piece::Field("host", i) => at(&v.hosts, i.unwrap_or(v.rank)),
            Piece::Field("port", i) => v
                .ports
                .get(i.unwrap_or(v.rank) as usize)
                .map(|p| p.to_string()),
            Piece::Field("rdma", i) => {
                let n = i.unwrap_or(v.rank);
                match v.rdma.get(n as usize) {
                    Some(Some(a)) => Some(a.clone()),
                    _ => return Err(format!("`{t}`: rank {n} has no RoCE interface").into()),
                }
            }
            Piece::Field("addr", Some(n)) => match (at(&v.hosts, n), v.ports.get(n as usize)) {
                (Some(h), Some(p)) if h.contains(':') => Some(format!("[{h}]:{p}")),
                (Some(h), Some(p)) => Some(format!("{h}:{p}")),
                _ => None,
            },
            Piece::Field("release", None) => {
                return Err(format!(
                    "`{t}`: `{{release}}` is filled only in a scenario with `releases:`"
                )
                .into())
            }
            Piece::Field(name, _) => return Err(format!("`{t}`: no value for `{name}`").into()),
        };
        out.push_str(&piece.ok_or_else(|| format!("`{t}`: names a rank this run does not have"))?);
    }
    Ok(out)
}

/// Whether the template names `{release}`.
pub fn uses_release(t: &str) -> bool {
    pieces(t).is_ok_and(|ps| ps.contains(&Piece::Field("release", None)))
}

/// The template with `{release}` replaced by `root` and every other placeholder kept as it was,
/// so the rank fills the rest as usual.
pub fn put_release(t: &str, root: &str) -> Result<String, Invalid> {
    let mut out = String::new();
    for p in pieces(t)? {
        match p {
            Piece::Text(s) => out.push_str(s),
            Piece::Brace(c) => {
                out.push(c);
                out.push(c);
            }
            Piece::Field("release", None) => {
                out.push_str(&root.replace('{', "{{").replace('}', "}}"))
            }
            Piece::Field(name, None) => out.push_str(&format!("{{{name}}}")),
            Piece::Field(name, Some(n)) => out.push_str(&format!("{{{name}:{n}}}")),
        }
    }
    Ok(out)
}

/// Fill every value of a map (the environment).
pub fn fill_map(
    m: &BTreeMap<String, String>,
    v: &Values,
) -> Result<Vec<(String, String)>, Invalid> {
    m.iter()
        .map(|(k, t)| Ok((k.clone(), fill(t, v)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Values {
        Values {
            rank: 1,
            ranks: 2,
            iface: "lo".into(),
            dir: "/tmp/run".into(),
            seed: 7,
            hosts: vec!["127.0.0.1".into(), "10.0.0.2".into()],
            ports: vec![4000, 4001],
            rdma: vec![Some("10.213.0.1".into()), None],
        }
    }

    #[test]
    fn every_placeholder_is_filled() {
        let v = values();
        let t =
            "{rank}/{ranks} {host} {port} {iface} {dir} {seed} {host:0} {port:0} {addr:0} {{x}}";
        assert_eq!(
            fill(t, &v).unwrap(),
            "1/2 10.0.0.2 4001 lo /tmp/run 7 127.0.0.1 4000 127.0.0.1:4000 {x}"
        );
        assert_eq!(fill("plain", &v).unwrap(), "plain");
        assert_eq!(fill("{rdma:0}", &v).unwrap(), "10.213.0.1");
        assert!(fill("{rdma}", &v)
            .unwrap_err()
            .contains("rank 1 has no RoCE interface"));
    }

    #[test]
    fn typos_and_out_of_range_ranks_are_refused_with_what_to_fix() {
        assert!(check("{prot}", 2)
            .unwrap_err()
            .contains("unknown placeholder `{prot}`"));
        assert!(check("{port:2}", 2).unwrap_err().contains("names rank 2"));
        assert!(check("{port:x}", 2).unwrap_err().contains("rank number"));
        assert!(check("{rank:0}", 2).unwrap_err().contains("unknown"));
        assert!(check("{port", 2).unwrap_err().contains("without"));
        assert!(check("a}b", 2).unwrap_err().contains("lone"));
        assert!(check("{port:1} {{literal}}", 2).is_ok());
    }

    #[test]
    fn a_release_goes_in_before_the_rank_fills_the_rest() {
        let t = "{release}/bin/python {rank} {addr:1} {{x}}";
        assert!(uses_release(t));
        assert!(!uses_release("{rank} {{release}}"));
        let put = put_release(t, "/opt/torch {2}").unwrap();
        assert_eq!(put, "/opt/torch {{2}}/bin/python {rank} {addr:1} {{x}}");
        assert_eq!(
            fill(&put, &values()).unwrap(),
            "/opt/torch {2}/bin/python 1 10.0.0.2:4001 {x}"
        );
        // Left unfilled, it says where it belongs rather than starting a program with it.
        assert!(fill(t, &values())
            .unwrap_err()
            .contains("only in a scenario with `releases:`"));
    }
}
