//! Scenario files as a command reads them: files and folders expanded, names unique, one copy
//! per installed release.

use std::path::{Path, PathBuf};

use wringer::model::input::InputError;
use wringer::model::scenario;
use wringer::rank::steps::{self, Loaded};

pub fn load_all(paths: &[PathBuf]) -> anyhow::Result<Vec<Loaded>> {
    let files = scenario::discover(paths)?;
    if files.is_empty() {
        return Err(
            InputError::plain(Path::new(&paths[0]), "no scenario files (*.yaml) found").into(),
        );
    }
    let mut loaded = vec![];
    let mut names = std::collections::HashMap::new();
    for f in files {
        let l = steps::load(&f)?;
        if let Some(prev) = names.insert(l.scenario.name.clone(), f.clone()) {
            return Err(InputError::plain(
                &f,
                format!(
                    "scenario name `{}` is also used by {}",
                    l.scenario.name,
                    prev.display()
                ),
            )
            .into());
        }
        loaded.push(l);
    }
    expand_releases(loaded)
}

/// Scenarios with `releases:` become one scenario per installed release.
fn expand_releases(loaded: Vec<Loaded>) -> anyhow::Result<Vec<Loaded>> {
    let mut found = std::collections::BTreeMap::new();
    let mut out = vec![];
    for l in loaded {
        let Some(family) = l.scenario.releases else {
            out.push(l);
            continue;
        };
        let path = l.path.clone();
        let releases = match found.entry(family.as_str()) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => e.insert(
                wringer::hosts::releases::installed(family)
                    .map_err(|why| InputError::plain(&path, why.to_string()))?,
            ),
        };
        out.extend(steps::for_releases(l, releases).map_err(|why| InputError::plain(&path, why))?);
    }
    Ok(out)
}
