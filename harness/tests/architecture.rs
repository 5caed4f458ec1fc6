//! The harness's shape, checked from its source: imports go one way through the layers with no
//! cycle between modules, and every step kind records only the evidence it declares.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

// `cli` is the binary's own (one module per subcommand), above every layer of the library.
const LAYERS: [&str; 7] = [
    "model",
    "hosts",
    "rank",
    "orchestration",
    "outputs",
    "bench",
    "cli",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `layer::module` for a file under src/ (None for lib.rs, main.rs and a layer's mod.rs).
fn module_of(rel: &Path) -> Option<(String, String)> {
    let parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    match parts.as_slice() {
        [layer, m] if m != "mod" => Some((layer.clone(), m.clone())),
        [layer, m, ..] => Some((layer.clone(), m.clone())),
        _ => None,
    }
}

/// Every `layer::module` this file refers to, through `crate::` or `super::`.
fn references(rel: &Path, text: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let words = |prefix: &str| -> Vec<Vec<String>> {
        code.match_indices(prefix)
            .map(|(i, _)| {
                code[i + prefix.len()..]
                    .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .next()
                    .unwrap_or("")
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .collect()
    };
    for path in words("crate::") {
        if path.len() >= 2 && LAYERS.contains(&path[0].as_str()) {
            out.insert((path[0].clone(), path[1].clone()));
        }
    }
    // `super::x` from a layer's direct child (layer/m.rs or layer/m/mod.rs) names a sibling.
    let parts: Vec<_> = rel.iter().collect();
    let direct_child = parts.len() == 2 || (parts.len() == 3 && parts[2] == "mod.rs");
    if direct_child {
        for path in words("super::") {
            if let Some(m) = path.first() {
                out.insert((parts[0].to_string_lossy().into(), m.clone()));
            }
        }
    }
    out
}

fn layer_index(layer: &str) -> usize {
    LAYERS.iter().position(|l| *l == layer).unwrap()
}

#[test]
fn imports_go_one_way_and_no_modules_form_a_cycle() {
    let mut files = vec![];
    rust_files(&src(), &mut files);
    let mut graph: BTreeMap<(String, String), BTreeSet<(String, String)>> = BTreeMap::new();
    let mut upward = vec![];
    for f in &files {
        let rel = f.strip_prefix(src()).unwrap();
        let Some(me) = module_of(rel) else { continue };
        let text = std::fs::read_to_string(f).unwrap();
        for dep in references(rel, &text) {
            if dep == me || !LAYERS.contains(&dep.0.as_str()) {
                continue;
            }
            if layer_index(&dep.0) > layer_index(&me.0) {
                upward.push(format!("{} imports {}::{}", rel.display(), dep.0, dep.1));
            }
            graph.entry(me.clone()).or_default().insert(dep);
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layer order:\n{}",
        upward.join("\n")
    );
    assert!(
        graph.len() > 20,
        "the scan found too few modules: {graph:?}"
    );

    // Depth-first search for a cycle.
    fn visit(
        n: &(String, String),
        g: &BTreeMap<(String, String), BTreeSet<(String, String)>>,
        state: &mut BTreeMap<(String, String), u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(1) => return Some(path.clone()),
            Some(2) => return None,
            _ => {}
        }
        state.insert(n.clone(), 1);
        path.push(format!("{}::{}", n.0, n.1));
        for d in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(d, g, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        let cycle = visit(n, &graph, &mut state, &mut vec![]);
        assert!(
            cycle.is_none(),
            "import cycle: {}",
            cycle.unwrap().join(" -> ")
        );
    }
}

/// `Kind::Name` words in `text`.
fn named(text: &str, kind: &str) -> BTreeSet<String> {
    let prefix = format!("{kind}::");
    text.match_indices(&prefix)
        .map(|(i, _)| {
            text[i + prefix.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric())
                .collect::<String>()
        })
        .filter(|w| w.chars().next().is_some_and(|c| c.is_uppercase()))
        .collect()
}

/// The body of `fn name` (up to the next `fn `), or "".
fn body<'a>(text: &'a str, name: &str) -> &'a str {
    let Some(start) = text.find(&format!("fn {name}(")) else {
        return "";
    };
    let rest = &text[start + 3..];
    &rest[..rest.find("fn ").unwrap_or(rest.len())]
}

/// The metric constants `declare_metrics!` blocks declare in `text`.
fn metric_consts(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("declare_metrics! {") {
        let block = &text[i..i + text[i..].find("\n}").unwrap_or(text.len() - i)];
        for line in block.lines() {
            let line = line.trim().trim_start_matches("pub ");
            if let Some((id, _)) = line.split_once(" = \"") {
                out.insert(id.trim().to_string());
            }
        }
    }
    out
}

/// Which of `consts` appear in `text` as whole words.
fn used(text: &str, consts: &BTreeSet<String>) -> BTreeSet<String> {
    let words: BTreeSet<&str> = text
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .collect();
    consts
        .iter()
        .filter(|c| words.contains(c.as_str()))
        .cloned()
        .collect()
}

/// `text` without its `declare_metrics!` blocks and `use` lines (which name, not record).
fn without_declarations(text: &str) -> String {
    let mut out = String::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.contains("declare_metrics! {") {
            in_block = true;
        }
        if !in_block && !line.trim_start().starts_with("use ") {
            out.push_str(line);
            out.push('\n');
        }
        if in_block && line == "}" {
            in_block = false;
        }
    }
    out
}

/// Each step source of `rank/steps` with its text: a file, or a folder module (its `mod.rs`
/// path, with the text of every file in it but its unit tests, since one kind split by concept
/// is still one kind).
fn step_sources() -> Vec<(PathBuf, String)> {
    let steps = src().join("rank/steps");
    let mut entries: Vec<_> = std::fs::read_dir(&steps)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    let mut out = vec![];
    for p in entries {
        if p.is_file() {
            let t = std::fs::read_to_string(&p).unwrap();
            out.push((p, t));
        } else if p.join("mod.rs").is_file() {
            let mut files = vec![];
            rust_files(&p, &mut files);
            files.sort();
            let text: String = files
                .iter()
                .filter(|f| !f.ends_with("tests.rs"))
                .map(|f| std::fs::read_to_string(f).unwrap())
                .collect::<Vec<_>>()
                .join("\n");
            out.push((p.join("mod.rs"), text));
        }
    }
    out
}

#[test]
fn every_step_kind_records_only_what_it_declares() {
    let texts = step_sources();
    let consts: BTreeSet<String> = texts.iter().flat_map(|(_, t)| metric_consts(t)).collect();
    assert!(
        consts.len() > 50,
        "too few metric constants found: {consts:?}"
    );
    // Helpers the kinds share, by function: what each records.
    let mut helpers: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for (path, text) in &texts {
        if text.contains("impl StepKind for") {
            continue;
        }
        let text = without_declarations(text);
        for (i, _) in text.match_indices("fn ") {
            let name: String = text[i + 3..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let b = body(&text, &name);
            helpers.insert(name, (used(b, &consts), named(b, "Series")));
        }
        let _ = path;
    }
    let mut kinds = 0;
    for (path, text) in &texts {
        if !text.contains("impl StepKind for") {
            continue;
        }
        kinds += 1;
        let declared_m = used(body(text, "metrics"), &consts);
        let declared_s = named(body(text, "series"), "Series");
        let rest = without_declarations(text)
            .replace(body(text, "metrics"), "")
            .replace(body(text, "series"), "");
        let mut recorded_m = used(&rest, &consts);
        let mut recorded_s = named(&rest, "Series");
        for (name, (m, s)) in &helpers {
            if rest.contains(&format!("{name}(")) {
                recorded_m.extend(m.iter().cloned());
                recorded_s.extend(s.iter().cloned());
            }
        }
        let file = path.file_name().unwrap().to_string_lossy();
        let stray_m: Vec<_> = recorded_m.difference(&declared_m).collect();
        let stray_s: Vec<_> = recorded_s.difference(&declared_s).collect();
        assert!(
            stray_m.is_empty(),
            "{file} records undeclared metrics {stray_m:?}"
        );
        assert!(
            stray_s.is_empty(),
            "{file} samples undeclared series {stray_s:?}"
        );
    }
    assert_eq!(
        kinds,
        wringer::rank::steps::Step::NAMES.len(),
        "every registered step kind is a file of its own"
    );
}

#[test]
fn every_registered_kind_has_its_own_file() {
    let registry = std::fs::read_to_string(src().join("rank/steps/mod.rs")).unwrap();
    let lines: Vec<&str> = registry
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_uppercase()) && l.contains(") = \""))
        .collect();
    assert_eq!(
        lines.len(),
        wringer::rank::steps::Step::NAMES.len(),
        "{lines:?}"
    );
    for l in lines {
        // `    Name(file::Name) = "kind-name",`
        let file = l.split('(').nth(1).unwrap().split("::").next().unwrap();
        let kind = l.split('"').nth(1).unwrap();
        assert_eq!(
            file.replace('_', "-"),
            kind,
            "kind `{kind}` lives in {file}.rs"
        );
        assert!(
            src().join(format!("rank/steps/{file}.rs")).is_file()
                || src().join(format!("rank/steps/{file}/mod.rs")).is_file(),
            "kind `{kind}` has no file {file}.rs or folder {file}/"
        );
    }
}

#[test]
fn every_step_kind_has_unit_tests_in_its_file() {
    let mut kinds = 0;
    for (path, text) in step_sources() {
        if !text.contains("impl StepKind for") {
            continue;
        }
        kinds += 1;
        // The tests sit in the kind's file, or in a folder of its name (`mod tests;`).
        let inline = text.contains("#[cfg(test)]") && text.contains("#[test]");
        let folder = if path.ends_with("mod.rs") {
            path.with_file_name("tests.rs")
        } else {
            path.with_extension("").join("tests.rs")
        };
        assert!(
            inline || (text.contains("#[cfg(test)]") && folder.is_file()),
            "{} has no unit tests",
            path.display()
        );
    }
    assert_eq!(kinds, wringer::rank::steps::Step::NAMES.len());
}

#[test]
fn no_backend_runs_wringer_run_again_on_its_hosts() {
    // A backend brings hosts up and hands them to the one runner; none starts a second
    // `wringer run` (with its own report) somewhere and reads its results back.
    for layer in ["hosts", "orchestration"] {
        let mut stack = vec![src().join(layer)];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let path = e.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(
                    !text.contains("\"--report-dir\""),
                    "{} passes --report-dir: a backend re-entering `wringer run`?",
                    path.display()
                );
            }
        }
    }
}

/// Every place the harness hands a script to a shell (`sh -c`) says, in a `// shell:` comment
/// just above it, why nothing it runs can be re-read as a command: values go as positional
/// arguments ("$1"), are quoted, or the script is a constant. Test code is exempt.
#[test]
fn every_shell_call_site_says_why_it_is_safe() {
    let mut files = vec![];
    rust_files(&src(), &mut files);
    let mut unexplained = vec![];
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        // Code after the first test module is test code.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let lines: Vec<&str> = code.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let prev = if i > 0 { lines[i - 1].trim() } else { "" };
            let calls_sh = line.contains("\"sh\", \"-c\"")
                || (line.trim() == "\"-c\"," && prev == "\"sh\",")
                || (line.contains("\"-c\"") && prev.contains("Command::new(\"sh\")"))
                || line.contains("Command::new(\"sh\")");
            if !calls_sh {
                continue;
            }
            let explained = lines[i.saturating_sub(12)..i]
                .iter()
                .any(|l| l.trim_start().starts_with("// shell:"));
            if !explained {
                unexplained.push(format!(
                    "{}:{}",
                    f.strip_prefix(src()).unwrap().display(),
                    i + 1
                ));
            }
        }
    }
    assert!(
        unexplained.is_empty(),
        "`sh -c` without a `// shell:` comment saying why it is safe: {unexplained:#?}"
    );
}

/// Every Rust source file of the workspace is as rustfmt writes it, the ones only a macro
/// reaches included: `cargo fmt --check` follows `mod` declarations, and a file that a macro
/// declares, or that nothing declares, escapes it.
#[test]
fn every_source_file_is_formatted() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![];
    for dir in [
        "harness/src",
        "harness/tests",
        "harness/benches",
        "transport/src",
        "transport/tests",
        "transport/benches",
        "transport/examples",
        "harness/fuzz/fuzz_targets",
        "transport/fuzz/fuzz_targets",
    ] {
        let dir = root.join(dir);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        }
    }
    files.extend(
        ["harness/build.rs", "transport/build.rs"]
            .iter()
            .map(|f| root.join(f))
            .filter(|f| f.is_file()),
    );
    assert!(files.len() > 100, "only {} files found", files.len());
    let out = std::process::Command::new("rustfmt")
        .args(["--check", "--edition", "2021"])
        .args(&files)
        .output()
        .expect("rustfmt runs (rustup component add rustfmt)");
    assert!(
        out.status.success(),
        "files rustfmt would change (run cargo fmt, or rustfmt on a file no `mod` reaches):\n{}",
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("Diff in"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// One concept per file: no source file of either crate grows past 1,000 lines (split it by
/// concept, as `rdma/rc/` and `orchestration/audit/` are).
#[test]
fn no_source_file_is_over_a_thousand_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![];
    rust_files(&root.join("harness/src"), &mut files);
    rust_files(&root.join("transport/src"), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 1000).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "split by concept: {long:?}");
}
