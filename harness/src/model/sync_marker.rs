//! The sync observer's markers (`harness/sync-audit/wringer_sync.c`): each pthread operation
//! that orders threads is a `prctl(SYNC_MARKER, kind, object, site, aux)` on the calling
//! thread, so it lands in the syscall trace in that thread's own order among its descriptor
//! calls, whichever recorder wrote the trace.

/// prctl's first argument for a marker ("WSNC"); the kernel answers EINVAL and does nothing.
pub const SYNC_MARKER: u64 = 0x5753_4e43;

/// The kind of the marker the eBPF recorder writes before a call whose call site changed:
/// `prctl(SYNC_MARKER, CALL_SITE, syscall number, site, 0)`.
pub const CALL_SITE: u64 = 10;

/// The kind of the marker the harness writes before it starts a tool of its own inside an
/// audited rank (the watchdog's gdb): `prctl(SYNC_MARKER, TOOL, 0, 0, 0)`. The next process the
/// thread starts, and its children, are the harness's, not the program's.
pub const TOOL: u64 = 11;

/// The kind of the marker the sync observer writes once a process makes a futex call of its
/// own through libc's `syscall()` (Rust's std locks, channels and parking; C++20 atomic waits):
/// it may hand things over with nothing in the trace to show it.
pub const OWN_SYNC: u64 = 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// The observer is loaded in this process: its pthread operations are all reported.
    Attach,
    /// The thread is ordered after the object's releases so far.
    Acquire,
    /// What the thread did so far is ordered before the object's later acquires.
    Release,
    /// The thread starts a blocking wait on the object (join, condition, semaphore, barrier).
    Wait,
    /// The thread holds a (shared) lock from here.
    Hold,
    /// The thread lets a (shared) lock go.
    Drop,
    /// The thread ends (object: its pthread_t): a release its join acquires.
    End,
    /// The thread starts (object: its pthread_t): whom a join of that handle waits for.
    Start,
    /// Where the thread keeps its descriptor calls' site (for the eBPF recorder to read).
    SiteSlot,
    /// From the recorder: this thread's calls of one syscall (object: its number) are made
    /// from `site` (0: from no place the observer saw) until the next such marker.
    CallSite,
    /// From the harness: the next process this thread starts is its own tool.
    Tool,
    /// The process synchronizes through futexes of its own, which the observer cannot see.
    OwnSync,
}

/// What a `Wait` waits for (its `aux`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WaitKind {
    Join,
    Condition,
    Semaphore,
    Barrier,
    /// A lock that was busy: told only on contention, for a hang's wait-for cycle.
    Lock,
}

impl WaitKind {
    pub fn noun(self) -> &'static str {
        match self {
            WaitKind::Join => "a join of",
            WaitKind::Condition => "a condition wait on",
            WaitKind::Semaphore => "a semaphore wait on",
            WaitKind::Barrier => "a barrier wait on",
            WaitKind::Lock => "a wait for",
        }
    }
}

/// In a `Hold`'s or `Acquire`'s aux: the thread took the lock by a try (it never blocks on
/// it). In an `Acquire`'s: the releaser it names had taken it by a try.
const SELF_TRY: u64 = 1 << 62;
const PREV_TRY: u64 = 1 << 61;

impl SyncMarker {
    /// A `Hold` or `Acquire` by a try-lock.
    pub fn tried(&self) -> bool {
        self.aux & SELF_TRY != 0
    }

    /// For an `Acquire` whose release was not reported: the thread that released the lock
    /// last, and whether it had taken it by a try.
    pub fn releaser(&self) -> Option<(u64, bool)> {
        let tid = self.aux & !(SELF_TRY | PREV_TRY);
        (tid != 0).then_some((tid, self.aux & PREV_TRY != 0))
    }

    /// For a `Wait`: what it waits for, and whether it has a deadline.
    pub fn wait(&self) -> Option<(WaitKind, bool)> {
        let kind = match self.aux & 0xf {
            1 => WaitKind::Join,
            2 => WaitKind::Condition,
            3 => WaitKind::Semaphore,
            4 => WaitKind::Barrier,
            5 => WaitKind::Lock,
            _ => return None,
        };
        Some((kind, self.aux & 16 != 0))
    }
}

/// One marker, as the trace holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncMarker {
    pub kind: SyncKind,
    /// The lock, condition, semaphore or barrier's address; a thread's handle (pthread_t) for
    /// its end and its join; the pid for `Attach`.
    pub object: u64,
    /// The return address in the program: where the call was made.
    pub site: u64,
    /// For an `Acquire` whose release was not reported (the lock was not shared until now):
    /// the thread that released it last.
    pub aux: u64,
}

/// The marker in a traced `prctl`'s arguments, as strace prints them
/// (`0x57534e43 /* PR_??? */, 0x2, 0x55d0…, 0x55d0…, 0`); `None` for any other prctl.
pub fn parse(args: &str) -> Option<SyncMarker> {
    let mut words = args.split(',').map(str::trim);
    let first = words.next()?;
    let magic = number(first.split_whitespace().next()?)?;
    if magic != SYNC_MARKER {
        return None;
    }
    let mut next = || words.next().and_then(number);
    let kind = next()?;
    let object = next()?;
    from_words(kind, object, next().unwrap_or(0), next().unwrap_or(0))
}

impl SyncKind {
    /// The word a marker of this kind carries (`from_words`' inverse).
    pub fn word(self) -> u64 {
        match self {
            SyncKind::Attach => 1,
            SyncKind::Acquire => 2,
            SyncKind::Release => 3,
            SyncKind::Wait => 4,
            SyncKind::Hold => 5,
            SyncKind::Drop => 6,
            SyncKind::End => 7,
            SyncKind::Start => 8,
            SyncKind::SiteSlot => 9,
            SyncKind::CallSite => CALL_SITE,
            SyncKind::Tool => TOOL,
            SyncKind::OwnSync => OWN_SYNC,
        }
    }
}

/// The marker a `prctl(SYNC_MARKER, kind, object, site, aux)` makes; `None` for an unknown kind.
pub fn from_words(kind: u64, object: u64, site: u64, aux: u64) -> Option<SyncMarker> {
    let kind = match kind {
        1 => SyncKind::Attach,
        2 => SyncKind::Acquire,
        3 => SyncKind::Release,
        4 => SyncKind::Wait,
        5 => SyncKind::Hold,
        6 => SyncKind::Drop,
        7 => SyncKind::End,
        8 => SyncKind::Start,
        9 => SyncKind::SiteSlot,
        CALL_SITE => SyncKind::CallSite,
        TOOL => SyncKind::Tool,
        OWN_SYNC => SyncKind::OwnSync,
        _ => return None,
    };
    Some(SyncMarker {
        kind,
        object,
        site,
        aux,
    })
}

/// `0x1f`, `31` or `0`; the last argument may run on into the call's result
/// (`0x2a4a) = -1 EINVAL (Invalid argument)`).
fn number(w: &str) -> Option<u64> {
    let w = w.split(')').next()?.trim();
    match w.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => w.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_read_back_as_strace_prints_them() {
        let m =
            parse("0x57534e43 /* PR_??? */, 0x2, 0x5575ad7d9060, 0x5575ad7d6206, 0x24d4").unwrap();
        assert_eq!(m.kind, SyncKind::Acquire);
        assert_eq!(m.object, 0x5575ad7d9060);
        assert_eq!(m.site, 0x5575ad7d6206);
        assert_eq!(m.aux, 0x24d4);
        let whole =
            "0x57534e43 /* PR_??? */, 0x2, 0x10, 0x20, 0x2a4a) = -1 EINVAL (Invalid argument)";
        assert_eq!(parse(whole).unwrap().aux, 0x2a4a);
        let a = parse("0x57534e43 /* PR_??? */, 0x1, 0x24d3, 0, 0").unwrap();
        assert_eq!((a.kind, a.object), (SyncKind::Attach, 0x24d3));
    }

    #[test]
    fn every_kind_makes_its_word_back() {
        for w in 1..=12 {
            let m = from_words(w, 1, 2, 3).unwrap();
            assert_eq!(m.kind.word(), w);
        }
        assert_eq!(from_words(13, 1, 2, 3), None);
    }

    #[test]
    fn other_prctls_and_unknown_kinds_are_not_markers() {
        assert_eq!(parse("PR_SET_NAME, \"wringer-rx-7\""), None);
        assert_eq!(parse("0x57534e43 /* PR_??? */, 0xd, 0x1, 0, 0"), None);
        assert_eq!(parse("0x1234 /* PR_??? */, 0x2, 0x1, 0, 0"), None);
    }
}
