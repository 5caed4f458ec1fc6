//! Bad input as a typed error that names the file, line and column, and says what to fix.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_saphyr::Location;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum InputError {
    #[error("{file}:{line}:{column}: {message}")]
    Located {
        file: PathBuf,
        line: u64,
        column: u64,
        message: String,
    },
    #[error("{file}: {message}")]
    Plain { file: PathBuf, message: String },
}

impl InputError {
    pub fn plain(file: &Path, message: impl Into<String>) -> InputError {
        InputError::Plain {
            file: file.to_owned(),
            message: message.into(),
        }
    }

    pub fn io(file: &Path, e: std::io::Error) -> InputError {
        InputError::plain(file, format!("cannot read: {e}"))
    }
}

/// Read a text file; bytes that are not UTF-8 are an error at their line and column.
pub fn read_text(file: &Path) -> Result<String, InputError> {
    let bytes = std::fs::read(file).map_err(|e| InputError::io(file, e))?;
    String::from_utf8(bytes).map_err(|e| {
        let good = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = good.iter().filter(|b| **b == b'\n').count() as u64 + 1;
        let start = good.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&good[start..]).chars().count() as u64 + 1;
        InputError::Located {
            file: file.to_owned(),
            line,
            column,
            message: "this byte is not UTF-8: save the file as UTF-8 text".into(),
        }
    })
}

pub fn located(file: &Path, at: &Location, message: String) -> InputError {
    InputError::Located {
        file: file.to_owned(),
        line: at.line(),
        column: at.column(),
        message,
    }
}

/// Parse YAML into `T`, mapping parser and schema errors to a located [`InputError`].
pub fn parse_yaml<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, InputError> {
    serde_saphyr::from_str::<T>(text).map_err(|e| {
        // The library's message starts with its own "line L column C:" prefix and appends a
        // snippet; keep the first line's message and put our file:line:column in front.
        let full = e.to_string();
        let first = full
            .lines()
            .next()
            .unwrap_or("")
            .trim_start_matches("error: ")
            .to_string();
        let message = match first.split_once(": ") {
            Some((prefix, rest)) if prefix.starts_with("line ") => rest.to_string(),
            _ => first,
        };
        match e.location() {
            Some(at) => located(file, &at, message),
            None => InputError::plain(file, message),
        }
    })
}
