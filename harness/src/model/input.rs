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
    /// A command-line flag's value: named by the flag, as a file's by its line and column.
    #[error("{flag}: {message}")]
    Flag { flag: String, message: String },
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

/// What a file is read as. Each kind has a size cap: no input of that kind is anywhere near
/// it, and a file over it (or a device that never ends) is refused before it fills memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Scenario,
    Profile,
    KnownFailures,
    /// An audit's suppressions file.
    Suppressions,
    /// A run's `results.json` (or `bench.json`), read back by `wringer report`.
    Results,
    /// `history.jsonl`, one line per run.
    History,
}

impl FileKind {
    pub fn cap(self) -> u64 {
        const MIB: u64 = 1 << 20;
        match self {
            FileKind::Scenario
            | FileKind::Profile
            | FileKind::KnownFailures
            | FileKind::Suppressions => MIB,
            FileKind::Results | FileKind::History => 256 * MIB,
        }
    }

    fn noun(self) -> &'static str {
        match self {
            FileKind::Scenario => "scenario",
            FileKind::Profile => "host profile",
            FileKind::KnownFailures => "known-failures",
            FileKind::Suppressions => "suppressions",
            FileKind::Results => "results",
            FileKind::History => "history",
        }
    }
}

/// What a file that is not a regular one is, for the error that refuses it.
fn what_it_is(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Why a file could not be opened as a regular one.
pub enum NotOpened {
    Io(std::io::Error),
    /// A FIFO, a device, a socket or a folder: what it is.
    NotRegular(&'static str),
}

/// Open a regular file for reading, and only one: a FIFO would block the open or the read, a
/// device may never end. Opened without blocking, and checked again once open, so a file
/// swapped for a FIFO in between cannot hang the caller. Returns the file and its length.
pub fn open_regular(file: &Path) -> Result<(std::fs::File, u64), NotOpened> {
    use std::os::unix::fs::OpenOptionsExt;
    let meta = std::fs::metadata(file).map_err(NotOpened::Io)?;
    if !meta.is_file() {
        return Err(NotOpened::NotRegular(what_it_is(meta.file_type())));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(file)
        .map_err(NotOpened::Io)?;
    let opened = f.metadata().map_err(NotOpened::Io)?;
    if !opened.is_file() {
        return Err(NotOpened::NotRegular(what_it_is(opened.file_type())));
    }
    Ok((f, opened.len()))
}

/// Read an input file, the one way every input is read: a regular file only (see
/// [`open_regular`]), at most its kind's cap.
pub fn read_bytes(file: &Path, kind: FileKind) -> Result<Vec<u8>, InputError> {
    use std::io::Read;
    let too_big = || {
        InputError::plain(
            file,
            format!(
                "is over {} MiB, more than any {} file needs: is it the right file?",
                kind.cap() >> 20,
                kind.noun()
            ),
        )
    };
    let (f, len) = open_regular(file).map_err(|e| match e {
        NotOpened::Io(e) => InputError::io(file, e),
        NotOpened::NotRegular(what) => InputError::plain(
            file,
            format!("is {what}, not a regular file: name a {} file", kind.noun()),
        ),
    })?;
    if len > kind.cap() {
        return Err(too_big());
    }
    let mut bytes = vec![];
    f.take(kind.cap() + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| InputError::io(file, e))?;
    if bytes.len() as u64 > kind.cap() {
        return Err(too_big());
    }
    Ok(bytes)
}

/// Read a text file of this kind; bytes that are not UTF-8 are an error at their line and
/// column.
pub fn read_text(file: &Path, kind: FileKind) -> Result<String, InputError> {
    let bytes = read_bytes(file, kind)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_their_cap_are_read() {
        let dir = std::env::temp_dir().join(format!("wringer-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let big = dir.join("big.yaml");
        std::fs::write(&big, vec![b'#'; (FileKind::Scenario.cap() + 1) as usize]).unwrap();
        let fine = dir.join("fine.yaml");
        std::fs::write(&fine, "name: x\n").unwrap();
        let kinds = [
            FileKind::Scenario,
            FileKind::Profile,
            FileKind::KnownFailures,
            FileKind::Results,
            FileKind::History,
        ];
        for kind in kinds {
            let started = std::time::Instant::now();
            let e = read_bytes(&fifo, kind).unwrap_err().to_string();
            assert!(
                e.contains("is a FIFO (named pipe), not a regular file"),
                "{e}"
            );
            let e = read_bytes(Path::new("/dev/zero"), kind)
                .unwrap_err()
                .to_string();
            assert!(e.contains("is a character device"), "{e}");
            let e = read_bytes(&dir, kind).unwrap_err().to_string();
            assert!(e.contains("is a folder"), "{e}");
            assert!(started.elapsed() < std::time::Duration::from_secs(1));
            assert_eq!(read_bytes(&fine, kind).unwrap(), b"name: x\n");
        }
        let e = read_text(&big, FileKind::Scenario).unwrap_err().to_string();
        assert!(
            e.contains("is over 1 MiB, more than any scenario file needs"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
