//! Installed releases of the programs scenarios run against one release at a time (torch):
//! the venvs `just external-torch` puts under `target/torch/VERSION/`, or the folders that
//! WRINGER_TORCH names (a user's own torch build, colon-separated). A release's version is read
//! from its `torch/version.py`, so a folder's name does not have to say it.

use std::path::{Path, PathBuf};

use crate::model::name;
use crate::model::scenario::{version_order, Release, ReleaseFamily};

/// The environment variable that replaces the installed releases with the folders it names.
pub fn variable(family: ReleaseFamily) -> &'static str {
    match family {
        ReleaseFamily::Torch => "WRINGER_TORCH",
    }
}

/// The recipe that installs the pinned releases.
pub fn recipe(family: ReleaseFamily) -> &'static str {
    match family {
        ReleaseFamily::Torch => "just external-torch",
    }
}

/// Why a scenario of this family cannot run: nothing is installed.
pub fn none_installed(family: ReleaseFamily) -> String {
    format!(
        "no {f} release is installed (looked in {} and {}): run `{}`, or set {} to a venv with {f}",
        default_folder().display(),
        variable(family),
        recipe(family),
        variable(family),
        f = family.as_str()
    )
}

/// Where the recipe installs releases: `torch/` in the build tree the binary runs from.
fn default_folder() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("../torch")))
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .unwrap_or_else(|| PathBuf::from("target/torch"))
}

/// The installed releases, oldest first. A folder that WRINGER_TORCH names and that holds no
/// torch is an error (it says which); an incomplete install under the default folder is passed
/// over, so a half-finished `just external-torch` never becomes a failure.
pub fn installed(family: ReleaseFamily) -> anyhow::Result<Vec<Release>> {
    let named = std::env::var(variable(family))
        .ok()
        .filter(|v| !v.trim().is_empty());
    let mut found = vec![];
    match named {
        Some(list) => {
            for folder in list.split(':').filter(|f| !f.is_empty()) {
                let why =
                    |why: String| anyhow::anyhow!("{}={list}: {folder}: {why}", variable(family));
                // Absolute, so the same path holds on container hosts (bind-mounted there).
                let root = std::fs::canonicalize(folder)
                    .map_err(|e| why(format!("cannot be opened ({e})")))?;
                let version = torch_version(&root).map_err(|e| why(e.to_string()))?;
                found.push(Release { version, root });
            }
        }
        None => {
            let Ok(entries) = std::fs::read_dir(default_folder()) else {
                return Ok(vec![]);
            };
            for e in entries.flatten() {
                let root = e.path();
                if let Ok(version) = torch_version(&root) {
                    found.push(Release { version, root });
                }
            }
        }
    }
    found.sort_by_key(|a| version_order(&a.version));
    for pair in found.windows(2) {
        if pair[0].version == pair[1].version {
            anyhow::bail!(
                "two {} releases have version {}: {} and {}",
                family.as_str(),
                pair[0].version,
                pair[0].root.display(),
                pair[1].root.display()
            );
        }
    }
    Ok(found)
}

/// A small text file, the bounded way: a regular file only (a FIFO planted or named there
/// would block), at most 64 KiB (torch's version.py is a few hundred bytes).
fn read_small(file: &Path) -> anyhow::Result<String> {
    use std::io::Read;
    let (f, _) = crate::model::input::open_regular(file).map_err(|e| match e {
        crate::model::input::NotOpened::Io(e) => anyhow::Error::from(e),
        crate::model::input::NotOpened::NotRegular(what) => {
            anyhow::anyhow!("is {what}, not a regular file")
        }
    })?;
    let mut bytes = vec![];
    f.take(64 << 10).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The version of the torch that `root` (a venv or a Python prefix) holds, as a name part:
/// `2.15.0+cu132` is `2.15.0` (the local build tag is the same Gloo), anything outside a
/// name's characters becomes `_`.
fn torch_version(root: &Path) -> anyhow::Result<String> {
    if !root.join("bin/python").exists() {
        anyhow::bail!("has no bin/python (name a venv or a Python prefix)");
    }
    let lib = root.join("lib");
    let entries = std::fs::read_dir(&lib)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", lib.display()))?;
    let file = entries
        .flatten()
        .map(|e| e.path().join("site-packages/torch/version.py"))
        .find(|f| f.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!("holds no torch (no lib/python*/site-packages/torch/version.py)")
        })?;
    let text = read_small(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let raw = text
        .lines()
        .find_map(|l| l.strip_prefix("__version__"))
        .and_then(|rest| rest.split(['\'', '"']).nth(1))
        .ok_or_else(|| anyhow::anyhow!("{} has no __version__", file.display()))?;
    let public = raw.split('+').next().unwrap_or(raw);
    let version: String = public
        .chars()
        .take(40)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    name::check(&format!("v{version}")).map_err(|why| anyhow::anyhow!("version `{raw}`: {why}"))?;
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_venv(root: &Path, version: &str) {
        let site = root.join("lib/python3.11/site-packages/torch");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::write(root.join("bin/python"), "").unwrap();
        std::fs::write(
            site.join("version.py"),
            format!("__version__ = '{version}'\ngit_version = 'x'\n"),
        )
        .unwrap();
    }

    #[test]
    fn versions_come_from_torch_itself_and_sort_as_numbers() {
        let dir = std::env::temp_dir().join(format!("wringer-releases-{}", std::process::id()));
        let (a, b, c) = (dir.join("new"), dir.join("old"), dir.join("mine"));
        fake_venv(&a, "2.15.0+cu132");
        fake_venv(&b, "2.8.0");
        fake_venv(&c, "2.10.0a0+git1234");
        assert_eq!(torch_version(&a).unwrap(), "2.15.0");
        assert_eq!(torch_version(&c).unwrap(), "2.10.0a0");
        // Only one test sets the variable, so no other test sees it change.
        std::env::set_var("WRINGER_TORCH", format!("{}:{}", a.display(), b.display()));
        let found = installed(ReleaseFamily::Torch).unwrap();
        let versions: Vec<&str> = found.iter().map(|r| r.version.as_str()).collect();
        assert_eq!(versions, ["2.8.0", "2.15.0"]);
        assert_eq!(found[1].root, std::fs::canonicalize(&a).unwrap());
        // A folder without torch is an error that names it, not a silent skip.
        std::env::set_var("WRINGER_TORCH", dir.join("nothing").display().to_string());
        let e = installed(ReleaseFamily::Torch).unwrap_err().to_string();
        assert!(e.contains("nothing: cannot be opened"), "{e}");
        std::env::set_var("WRINGER_TORCH", dir.display().to_string());
        let e = installed(ReleaseFamily::Torch).unwrap_err().to_string();
        assert!(e.contains("has no bin/python"), "{e}");
        std::env::set_var("WRINGER_TORCH", format!("{}:{}", a.display(), a.display()));
        assert!(installed(ReleaseFamily::Torch)
            .unwrap_err()
            .to_string()
            .contains("two torch releases"));
        std::env::remove_var("WRINGER_TORCH");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_reason_for_none_names_the_recipe_and_the_variable() {
        let why = none_installed(ReleaseFamily::Torch);
        assert!(why.contains("`just external-torch`"), "{why}");
        assert!(why.contains("WRINGER_TORCH"), "{why}");
    }
}
