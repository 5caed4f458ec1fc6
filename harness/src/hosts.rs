//! Host profiles (`hosts/*.yaml`): where ranks run and what the hosts must have.

use std::path::Path;

use serde::Deserialize;

use crate::input::InputError;
use crate::probe::Requirement;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostProfile {
    pub name: String,
    pub description: String,
    pub kind: ProfileKind,
    /// Hardware this profile must have: a skip for one of these becomes a failure.
    #[serde(default)]
    pub must_have: Vec<Requirement>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ProfileKind {
    /// Every rank is a local process on loopback.
    Local,
}

impl HostProfile {
    pub fn hosts(&self) -> usize {
        match self.kind {
            ProfileKind::Local => 1,
        }
    }
}

pub fn load(path: &Path) -> Result<HostProfile, InputError> {
    let text = std::fs::read_to_string(path).map_err(|e| InputError::io(path, e))?;
    crate::input::parse_yaml(path, &text)
}
