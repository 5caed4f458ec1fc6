//! The lines a report prints to rerun one attempt alone, or shrink it: the command, its
//! perturbations and faults spelled out, each word quoted for a shell.

use super::*;

/// The command a replay line starts with (`wringer run --hosts P`), and what ends it: the
/// scenario file (None) or, for `wringer audit`, `-- PROGRAM ARGS`.
#[derive(Clone, Debug, Default)]
pub struct Rerun {
    pub head: Vec<String>,
    pub tail: Option<Vec<String>>,
}

impl Rerun {
    /// The line that reruns attempt `attempt` of `seed` alone, with `perturb` and `faults`
    /// spelled out (`--shrink` makes it the shrink command).
    /// `release`: the variable and folder that pin the release the scenario ran against (a
    /// torch scenario runs once per installed release), put before the command.
    #[allow(clippy::too_many_arguments)]
    pub fn line(
        &self,
        file: &Path,
        release: Option<(&str, &Path)>,
        seed: u64,
        attempt: u32,
        perturb: &[Perturb],
        faults: &[Fault],
        shrink: bool,
    ) -> String {
        let mut w: Vec<String> = self.head.clone();
        if let Some(i) = w.iter().position(|x| x == "--hosts") {
            if let Some(h) = w.get_mut(i + 1) {
                *h = path_arg(Path::new(h.as_str()));
            }
        }
        w.extend(["--seed".into(), seed.to_string()]);
        w.extend(["--attempt".into(), attempt.to_string()]);
        for p in perturb {
            w.push("--perturb".into());
            w.push(flow_yaml(p));
        }
        for f in faults {
            w.push("--fault".into());
            w.push(flow_yaml(f));
        }
        if shrink {
            w.push("--shrink".into());
        }
        match &self.tail {
            Some(t) => w.extend(t.iter().cloned()),
            None => w.push(path_arg(file)),
        }
        let words = w.iter().map(|x| shell_word(x));
        // An assignment before the command: the variable's name bare, its value quoted.
        let env =
            release.map(|(var, root)| format!("{var}={}", shell_word(&root.display().to_string())));
        env.into_iter().chain(words).collect::<Vec<_>>().join(" ")
    }
}

/// The variable and folder that pin the release a scenario copy runs against, if any.
pub fn release_env<S>(l: &crate::model::scenario::Loaded<S>) -> Option<(&'static str, &Path)> {
    let family = l.scenario.releases?;
    let r = l.scenario.release.as_ref()?;
    Some((crate::hosts::releases::variable(family), r.root.as_path()))
}

/// A path as a command-line word that no parser reads as an option: `-x.yaml` is `./-x.yaml`.
pub fn path_arg(p: &Path) -> String {
    let s = p.display().to_string();
    if s.starts_with('-') {
        format!("./{s}")
    } else {
        s
    }
}

/// `x` as one line of YAML flow style: `{syscall: poll, delay_exit: 100us, when: 3+2}`.
pub fn flow_yaml<T: serde::Serialize>(x: &T) -> String {
    fn value(v: &serde_json::Value) -> String {
        use serde_json::Value as V;
        match v {
            V::Object(m) => {
                let items: Vec<String> = m
                    .iter()
                    .map(|(k, v)| format!("{k}: {}", value(v)))
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
            V::Array(a) => format!("[{}]", a.iter().map(value).collect::<Vec<_>>().join(", ")),
            // Plain unless YAML would read it as a number (or it holds other characters).
            V::String(s)
                if s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.+".contains(c))
                    && s.chars().any(|c| c.is_ascii_alphabetic() || c == '+') =>
            {
                s.clone()
            }
            other => other.to_string(),
        }
    }
    serde_json::to_value(x)
        .map(|v| value(&v))
        .unwrap_or_default()
}

/// `x` as one shell word: quoted when it holds anything but plain characters. A word with a
/// control or a bidirectional-text character is written `$'…'` with those escaped, so the
/// line shows what it runs (an override cannot reorder it on the screen) and pastes back the
/// same bytes.
pub fn shell_word(x: &str) -> String {
    let plain = !x.is_empty()
        && x.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c));
    if plain {
        x.to_string()
    } else if x.chars().any(hidden) {
        let mut out = String::from("$'");
        for c in x.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\'' => out.push_str("\\'"),
                // Byte by byte (`\xHH`): the same bytes whatever the shell's locale.
                c if hidden(c) => {
                    for b in c.to_string().bytes() {
                        out.push_str(&format!("\\x{b:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('\'');
        out
    } else {
        format!("'{}'", x.replace('\'', "'\\''"))
    }
}
