//! The README and docs/ say what the tools do: every `wringer` command line in them names a
//! subcommand and flags the CLI has, every `just` recipe is one the justfile has, and the
//! README's scenario is a valid scenario.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md and every file in docs/, with their text.
fn documents() -> Vec<(String, String)> {
    let mut files = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p.strip_prefix(repo()).unwrap().display().to_string(), text)
        })
        .collect()
}

/// Command lines for `tool`: lines of ```sh blocks and inline code spans that start with it.
fn command_lines(text: &str, tool: &str) -> Vec<String> {
    let prefix = format!("{tool} ");
    let mut out = vec![];
    let mut in_sh = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_sh = line.trim() == "```sh" || line.trim() == "```bash";
            continue;
        }
        if in_sh {
            let l = line.trim();
            if l.starts_with(&prefix) || l == tool {
                out.push(l.split('#').next().unwrap().trim().to_string());
            }
            continue;
        }
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 1 && (span.starts_with(&prefix) || span == tool) {
                out.push(span.to_string());
            }
        }
    }
    out
}

/// The justfile's recipe names.
fn recipes() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo().join("justfile")).unwrap();
    text.lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_lowercase()) && !l.starts_with("set "))
        .filter_map(|l| {
            let name: String = l
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            let rest = &l[name.len()..];
            // `name args: deps`, not `name := value`.
            (rest.contains(':') && !rest.trim_start().starts_with(":=")).then_some(name)
        })
        .collect()
}

fn wringer_help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_wringer"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "wringer {args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_just_recipe_the_docs_name_is_in_the_justfile() {
    let recipes = recipes();
    assert!(
        recipes.contains("test-local") && recipes.contains("test"),
        "{recipes:?}"
    );
    let mut checked = 0;
    for (file, text) in documents() {
        for line in command_lines(&text, "just") {
            let Some(recipe) = line.split_whitespace().nth(1) else {
                continue;
            };
            if recipe.starts_with('-') {
                continue;
            }
            assert!(
                recipes.contains(recipe),
                "{file}: `{line}` names recipe `{recipe}`, which the justfile does not have"
            );
            checked += 1;
        }
    }
    assert!(checked > 20, "only {checked} just command lines found");
}

#[test]
fn every_wringer_command_line_the_docs_give_the_cli_accepts() {
    let top = wringer_help(&[]);
    let subcommands: BTreeSet<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    assert!(subcommands.contains("run"), "{top}");
    let mut checked = 0;
    for (file, text) in documents() {
        for line in command_lines(&text, "wringer") {
            let Some(sub) = line.split_whitespace().nth(1) else {
                continue;
            };
            assert!(
                subcommands.contains(sub),
                "{file}: `{line}`: `wringer {sub}` is no subcommand ({subcommands:?})"
            );
            let help = wringer_help(&[sub]);
            // After ` -- ` the words are the audited program's own.
            let ours = line.split(" -- ").next().unwrap();
            for flag in ours
                .split(|c: char| c.is_whitespace() || c == '[' || c == ']' || c == '|')
                .filter(|w| w.starts_with("--"))
            {
                let flag = flag.split('=').next().unwrap();
                assert!(
                    help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                    "{file}: `{line}`: `wringer {sub}` has no `{flag}`"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 10, "only {checked} wringer command lines found");
}

#[test]
fn the_readme_scenario_is_a_valid_scenario() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let blocks: Vec<&str> = readme
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .filter(|b| b.starts_with("name:"))
        .collect();
    assert!(!blocks.is_empty(), "the README shows no scenario");
    for b in blocks {
        wringer::rank::steps::parse(&repo().join("README.md"), b)
            .unwrap_or_else(|e| panic!("the README's scenario does not load: {e}"));
    }
}

/// docs/layout.md names every module of both crates (step kinds excepted: "one file per step
/// kind", and unit-test files), so the map of the source tree stays whole.
#[test]
fn the_layout_names_every_module() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let layout = std::fs::read_to_string(root.join("docs/layout.md")).unwrap();
    let words: std::collections::BTreeSet<&str> = layout
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    let mut missing = vec![];
    let mut stack = vec![root.join("harness/src"), root.join("transport/src")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(&root).unwrap().display().to_string();
            let stem = p.file_stem().unwrap().to_string_lossy().to_string();
            if p.extension().is_none_or(|x| x != "rs")
                || stem == "tests"
                || (rel.starts_with("harness/src/rank/steps/") && stem != "mod")
                || (rel.starts_with("harness/src/model/faults/")
                    && !["mod", "wire"].contains(&stem.as_str()))
            {
                continue;
            }
            let name = if stem == "mod" {
                p.parent()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .to_string()
            } else {
                stem
            };
            if !words.contains(name.as_str()) {
                missing.push(rel);
            }
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "docs/layout.md does not name {missing:?}"
    );
}
