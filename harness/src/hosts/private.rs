//! Private places on a shared host. Every file wringer writes or reads back outside a report
//! folder lives in a folder only this user can enter, made fresh (`mkdtemp`, 0700) or at a name
//! nobody else can know first and checked (owner, mode, not a link) when it already exists. So
//! another local user can neither plant a file wringer then preloads, executes or reads as
//! evidence, nor point one of its names elsewhere with a symlink. See docs/trust.md.

use std::ffi::CString;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum PrivateError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The name exists and is not ours to use: someone else may have made it first.
    #[error("refusing {path}: {why} (another user may have placed it; remove it, or set TMPDIR to a folder only you can write)")]
    Untrusted { path: PathBuf, why: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PrivateError + '_ {
    move |source| PrivateError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A fresh folder under `$TMPDIR` that only this user can enter (`mkdtemp`: a name nobody
/// chose first, mode 0700). The caller removes it.
pub fn fresh_dir(prefix: &str) -> Result<PathBuf, PrivateError> {
    let template = std::env::temp_dir().join(format!("{prefix}.XXXXXXXX"));
    let c = CString::new(template.as_os_str().as_bytes()).map_err(|_| PrivateError::Untrusted {
        path: template.clone(),
        why: "the temporary folder's name holds a NUL byte".into(),
    })?;
    let mut buf = c.into_bytes_with_nul();
    // SAFETY: `buf` is a writable, NUL-terminated template ending in XXXXXX that lives across
    // the call; mkdtemp only rewrites those X's in place.
    let made = unsafe { libc::mkdtemp(buf.as_mut_ptr().cast()) };
    if made.is_null() {
        return Err(io(&template)(std::io::Error::last_os_error()));
    }
    buf.pop();
    Ok(PathBuf::from(
        <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(buf),
    ))
}

/// The folder at `path`, made 0700 when missing, or checked when it exists: a folder (not a
/// link to one), owned by this user, that nobody else can enter or write. Callers give names
/// another user cannot guess (derived from a run's secret), so a check failing means a plant.
pub fn ensure_dir(path: &Path) -> Result<(), PrivateError> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => check_dir(path),
        Err(e) => Err(io(path)(e)),
    }
}

/// Whether `path` is a folder only this user controls (see [`ensure_dir`]).
pub fn check_dir(path: &Path) -> Result<(), PrivateError> {
    let meta = std::fs::symlink_metadata(path).map_err(io(path))?;
    let why = if meta.file_type().is_symlink() {
        Some("it is a symbolic link".to_string())
    } else if !meta.is_dir() {
        Some("it is not a folder".to_string())
    } else {
        not_ours(&meta)
    };
    match why {
        Some(why) => Err(PrivateError::Untrusted {
            path: path.to_owned(),
            why,
        }),
        None => Ok(()),
    }
}

/// Why a file or folder is not this user's alone, if it is not.
fn not_ours(meta: &std::fs::Metadata) -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        Some(format!("it belongs to uid {}, not to uid {me}", meta.uid()))
    } else if meta.permissions().mode() & 0o077 != 0 {
        Some(format!(
            "its mode is {:o}: other users can reach it",
            meta.permissions().mode() & 0o7777
        ))
    } else {
        None
    }
}

/// Create `path` new with `bytes` and `mode`: never an existing file, never through a link
/// (`O_CREAT|O_EXCL|O_NOFOLLOW`).
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), PrivateError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))
}

/// A name for a run's private folder that only the run's own processes can compute: a digest
/// of its secret token (never the token itself: folder names in /tmp are visible to all).
pub fn run_folder_name(kind: &str, token: impl Hash) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    "wringer-private-folder".hash(&mut h);
    token.hash(&mut h);
    let a = h.finish();
    a.hash(&mut h);
    format!("wringer-{kind}-{a:016x}{:016x}", h.finish())
}

/// The shell words that make `$1` a private folder on a remote host, or accept it when it is
/// already one of ours (same checks as [`ensure_dir`]); exits non-zero, saying why, otherwise.
/// The path is an argument, never part of the script.
pub const ENSURE_DIR_SCRIPT: &str = "umask 077; mkdir -m 700 -- \"$1\" 2>/dev/null && exit 0; \
     if [ -L \"$1\" ] || [ ! -d \"$1\" ] || [ ! -O \"$1\" ] || [ \"$(stat -c %a -- \"$1\")\" != 700 ]; then \
     echo \"refusing $1: not a private folder of this user (another user may have placed it)\" >&2; exit 1; fi";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_dirs_are_private_and_distinct() {
        let a = fresh_dir("wringer-test").unwrap();
        let b = fresh_dir("wringer-test").unwrap();
        assert_ne!(a, b);
        let mode = std::fs::metadata(&a).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        check_dir(&a).unwrap();
        let _ = std::fs::remove_dir(&a);
        let _ = std::fs::remove_dir(&b);
    }

    #[test]
    fn a_planted_folder_or_link_is_refused() {
        let base = fresh_dir("wringer-test").unwrap();
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure_dir(&open).unwrap_err().to_string();
        assert!(err.contains("mode is 777"), "{err}");
        let link = base.join("link");
        std::os::unix::fs::symlink(&open, &link).unwrap();
        let err = ensure_dir(&link).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        let file = base.join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(ensure_dir(&file).is_err());
        let ok = base.join("ok");
        ensure_dir(&ok).unwrap();
        ensure_dir(&ok).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn write_new_never_follows_or_reuses() {
        let base = fresh_dir("wringer-test").unwrap();
        let target = base.join("target");
        std::fs::write(&target, b"mine").unwrap();
        let link = base.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(write_new(&link, b"x", 0o600).is_err());
        assert!(write_new(&target, b"x", 0o600).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"mine");
        write_new(&base.join("new"), b"x", 0o600).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn run_folder_names_hide_the_token_and_differ_per_token() {
        let a = run_folder_name("exec", 0x1234u128);
        assert_ne!(a, run_folder_name("exec", 0x1235u128));
        assert_eq!(a, run_folder_name("exec", 0x1234u128));
        assert!(!a.contains("1234"), "{a}");
    }

    #[test]
    fn the_remote_script_accepts_ours_and_refuses_a_plant() {
        let base = fresh_dir("wringer-test").unwrap();
        let run = |p: &Path| {
            std::process::Command::new("sh")
                .args(["-c", ENSURE_DIR_SCRIPT, "sh"])
                .arg(p)
                .output()
                .unwrap()
                .status
                .success()
        };
        let ours = base.join("ours");
        assert!(run(&ours) && run(&ours));
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!run(&open));
        let link = base.join("link");
        std::os::unix::fs::symlink(&ours, &link).unwrap();
        assert!(!run(&link));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
