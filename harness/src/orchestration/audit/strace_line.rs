//! One line of a trace as the checker reads it: strace's text, which the eBPF recorder writes too.

/// One line of an `strace -f -ttt` trace.
#[derive(Debug, PartialEq)]
pub(super) enum Event<'a> {
    /// A call that completed on this line.
    Call {
        name: &'a str,
        args: &'a str,
        ret: &'a str,
    },
    /// A call that started and did not finish yet.
    Started {
        name: &'a str,
        args: &'a str,
    },
    /// The rest of a call started earlier on this thread, with the arguments it printed at
    /// return (a pipe's fds: `<... pipe2 resumed>[3, 4], 0) = 0`).
    Resumed {
        name: &'a str,
        args: &'a str,
        ret: &'a str,
    },
    /// The thread ended.
    Exited,
    Other,
}

pub(super) fn parse_line(line: &str) -> Option<(u32, Event<'_>)> {
    let (tid, rest) = line.trim_start().split_once(' ')?;
    let tid: u32 = tid.trim().parse().ok()?;
    // Skip the timestamp when there is one (strace pads short pids with spaces).
    let rest = rest.trim_start();
    let rest = match rest.split_once(' ') {
        Some((ts, r)) if ts.contains('.') && ts.chars().all(|c| c.is_ascii_digit() || c == '.') => {
            r
        }
        _ => rest,
    };
    let rest = rest.trim_start();
    if rest.starts_with("+++ exited") || rest.starts_with("+++ killed") {
        return Some((tid, Event::Exited));
    }
    if let Some(r) = rest.strip_prefix("<... ") {
        let (name, after) = r.split_once(" resumed>")?;
        let args = after.rfind(") = ").map_or("", |i| &after[..i]);
        return Some((
            tid,
            Event::Resumed {
                name,
                args,
                ret: result_of(after),
            },
        ));
    }
    let open = rest.find('(')?;
    let name = &rest[..open];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Some((tid, Event::Other));
    }
    let body = &rest[open + 1..];
    if let Some(args) = body.strip_suffix(" <unfinished ...>") {
        return Some((tid, Event::Started { name, args }));
    }
    if matches!(name, "exit") {
        return Some((tid, Event::Exited));
    }
    Some((
        tid,
        Event::Call {
            name,
            args: body,
            ret: result_of(body),
        },
    ))
}

/// The text after the last ` = `, e.g. `0`, `-1 EBADF (Bad file descriptor)`, `?`.
pub(super) fn result_of(s: &str) -> &str {
    s.rfind(") = ")
        .map(|i| s[i + 4..].trim())
        .or_else(|| s.rfind(" = ").map(|i| s[i + 3..].trim()))
        .unwrap_or("")
}
