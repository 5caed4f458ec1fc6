//! Values in host profiles that end up on command lines (ssh, srun, salloc, docker): only
//! characters that cannot start an option or mean anything to a shell, and no placeholders
//! left from the examples. Errors name the file, line and column.

use std::path::Path;

use serde_saphyr::Spanned;

use crate::model::input::{located, InputError};

#[derive(Clone, Copy)]
pub enum Charset {
    /// Host aliases, user names, device and interface names.
    Name,
    /// Host names and IP addresses.
    Address,
    Path,
    Image,
    /// Slurm node lists (`n[0-2],gpu7`).
    NodeList,
    /// Slurm times (`30`, `1:00:00`, `2-00:00:00`).
    Time,
    /// The value of an allowed `srun` option (`--gres=gpu:1`, `--cpu-bind=cores`).
    OptionValue,
}

pub fn placeholder(path: &Path, field: &str, v: &Spanned<String>) -> Result<(), InputError> {
    let s = &v.value;
    if s.contains('<') || s.contains('>') || s.contains("PLACEHOLDER") || s.contains("CHANGE-ME") {
        return Err(located(
            path,
            &v.referenced,
            format!(
                "`{field}` is still the placeholder `{s}`: put the real value there before running"
            ),
        ));
    }
    Ok(())
}

pub fn spanned(
    path: &Path,
    field: &str,
    v: &Spanned<String>,
    charset: Charset,
) -> Result<(), InputError> {
    placeholder(path, field, v)?;
    safe(path, Some(&v.referenced), field, &v.value, charset)
}

/// Only characters that cannot start an option or mean anything to a shell.
pub fn safe(
    path: &Path,
    at: Option<&serde_saphyr::Location>,
    field: &str,
    s: &str,
    charset: Charset,
) -> Result<(), InputError> {
    let extra: &[char] = match charset {
        Charset::Name => &['.', '_', '-'],
        Charset::Address => &['.', '_', '-', ':'],
        Charset::Path => &['.', '_', '-', '/', '~'],
        Charset::Image => &['.', '_', '-', '/', ':'],
        Charset::NodeList => &['.', '_', '-', '[', ']', ','],
        Charset::Time => &['-', ':'],
        Charset::OptionValue => &['.', '_', '-', ':', ',', '=', '/', '+'],
    };
    let ok = !s.is_empty()
        && !s.starts_with('-')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c));
    if ok {
        return Ok(());
    }
    let msg = format!("`{field}` value `{s}` is not allowed: use letters, digits and {} only, not starting with `-`", extra.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(" "));
    Err(match at {
        Some(at) => located(path, at, msg),
        None => InputError::plain(path, msg),
    })
}
