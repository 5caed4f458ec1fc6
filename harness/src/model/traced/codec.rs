//! Typed events in the compact binary form the eBPF recorder writes beside its trace
//! (`TRACE.calls`) and the checker reads back: each record its length, then its fields,
//! little-endian. Text (strace's, or JSON) was slower to write and to read back than the
//! checker's whole pass over it (`harness/benches/audit_trace.rs`). Pure: bytes in, events out.

use crate::model::sync_marker::{self, SyncMarker};

use super::*;

/// What a typed-events file starts with (and which version of the form it holds).
pub const MAGIC: &[u8] = b"wringer-calls 1\n";

/// Append one event's record to `out`.
pub fn encode(t: &Traced, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend([0; 4]);
    put_u32(out, t.line as u32);
    put_u32(out, t.tid);
    match &t.event {
        Event::Call(c) => call(out, 0, c),
        Event::Started(c) => call(out, 1, c),
        Event::Resumed(c) => call(out, 2, c),
        Event::Exited => out.push(3),
        Event::Other => out.push(4),
    }
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// Every event of a typed-events file; `None` when it is not one or is cut short (a recorder
/// killed mid-write), so that the trace's text is read instead.
pub fn decode_all(b: &[u8]) -> Option<Vec<Traced>> {
    let mut r = Reader(b.strip_prefix(MAGIC)?);
    let mut events = Vec::new();
    while !r.0.is_empty() {
        let len = r.u32()? as usize;
        let mut body = Reader(r.take(len)?);
        events.push(body.traced()?);
        if !body.0.is_empty() {
            return None;
        }
    }
    Some(events)
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend(v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend(v.to_le_bytes());
}

fn put_i32(out: &mut Vec<u8>, v: i32) {
    out.extend(v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    out.extend((s.len() as u16).to_le_bytes());
    out.extend(s);
}

fn put_fds(out: &mut Vec<u8>, fds: &[i32]) {
    let fds = &fds[..fds.len().min(u16::MAX as usize)];
    out.extend((fds.len() as u16).to_le_bytes());
    for fd in fds {
        put_i32(out, *fd);
    }
}

fn call(out: &mut Vec<u8>, kind: u8, c: &Call) {
    out.push(kind);
    put_str(out, &c.name);
    match &c.ret {
        Ret::Unknown => out.push(0),
        Ret::Value(v) => {
            out.push(1);
            put_u64(out, *v as u64);
        }
        Ret::Error(e) => {
            out.push(2);
            put_str(out, e);
        }
    }
    out.push(c.cloexec as u8 | (c.unbounded as u8) << 1 | (c.thread as u8) << 2);
    put_fds(out, &c.fds);
    put_fds(out, &c.made);
    operand(out, &c.operand);
}

fn operand(out: &mut Vec<u8>, o: &Operand) {
    match o {
        Operand::None => out.push(0),
        Operand::Marker(m) => {
            out.push(1);
            for w in [m.kind.word(), m.object, m.site, m.aux] {
                put_u64(out, w);
            }
        }
        Operand::Receiver(fd) => {
            out.push(2);
            put_i32(out, *fd);
        }
        Operand::Futex { addr, op } => {
            out.push(3);
            put_u64(out, *addr);
            out.push(*op as u8);
        }
        Operand::Exec { path } => {
            out.push(4);
            out.push(path.is_some() as u8);
            put_str(out, path.as_deref().unwrap_or(""));
        }
        Operand::SetCloexec { fd, on } => {
            out.push(5);
            put_i32(out, *fd);
            out.push(*on as u8);
        }
        Operand::EpollCtl { epfd, op, fd } => {
            out.push(6);
            put_i32(out, *epfd);
            out.push(*op as u8);
            put_i32(out, *fd);
        }
        Operand::Close { fd } => {
            out.push(7);
            put_u64(out, *fd as u64);
        }
        Operand::CloseRange {
            first,
            last,
            cloexec,
        } => {
            out.push(8);
            put_u64(out, *first as u64);
            put_u64(out, *last as u64);
            out.push(*cloexec as u8);
        }
        Operand::Dup { old, new } => {
            out.push(9);
            put_u64(out, *old as u64);
            put_u64(out, *new as u64);
        }
        Operand::UringOp { fd, op, req } => {
            out.push(10);
            put_i32(out, *fd);
            put_str(out, op);
            put_u64(out, *req);
        }
        Operand::UringDone { req } => {
            out.push(11);
            put_u64(out, *req);
        }
        Operand::Step(m) => {
            out.push(12);
            out.push(*m as u8);
        }
    }
}

/// The bytes not read yet; every read is `None` past their end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(self.u32()? as i32)
    }

    fn i64(&mut self) -> Option<i64> {
        Some(self.u64()? as i64)
    }

    fn bool(&mut self) -> Option<bool> {
        match self.u8()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    fn str(&mut self) -> Option<String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }

    fn fds(&mut self) -> Option<Vec<i32>> {
        let n = self.u16()? as usize;
        (0..n).map(|_| self.i32()).collect()
    }

    fn traced(&mut self) -> Option<Traced> {
        let line = self.u32()? as usize;
        let tid = self.u32()?;
        let event = match self.u8()? {
            0 => Event::Call(self.call()?),
            1 => Event::Started(self.call()?),
            2 => Event::Resumed(self.call()?),
            3 => Event::Exited,
            4 => Event::Other,
            _ => return None,
        };
        Some(Traced { line, tid, event })
    }

    fn call(&mut self) -> Option<Call> {
        let name = self.str()?;
        let ret = match self.u8()? {
            0 => Ret::Unknown,
            1 => Ret::Value(self.i64()?),
            2 => Ret::Error(self.str()?),
            _ => return None,
        };
        let flags = self.u8()?;
        Some(Call {
            name,
            ret,
            cloexec: flags & 1 != 0,
            unbounded: flags & 2 != 0,
            thread: flags & 4 != 0,
            fds: self.fds()?,
            made: self.fds()?,
            operand: self.operand()?,
        })
    }

    fn operand(&mut self) -> Option<Operand> {
        Some(match self.u8()? {
            0 => Operand::None,
            1 => {
                let (kind, object, site, aux) =
                    (self.u64()?, self.u64()?, self.u64()?, self.u64()?);
                let m: SyncMarker = sync_marker::from_words(kind, object, site, aux)?;
                Operand::Marker(m)
            }
            2 => Operand::Receiver(self.i32()?),
            3 => Operand::Futex {
                addr: self.u64()?,
                op: match self.u8()? {
                    0 => FutexOp::Wait,
                    1 => FutexOp::Wake,
                    2 => FutexOp::Other,
                    _ => return None,
                },
            },
            4 => {
                let some = self.bool()?;
                let path = self.str()?;
                Operand::Exec {
                    path: some.then_some(path),
                }
            }
            5 => Operand::SetCloexec {
                fd: self.i32()?,
                on: self.bool()?,
            },
            6 => Operand::EpollCtl {
                epfd: self.i32()?,
                op: match self.u8()? {
                    0 => EpollOp::Add,
                    1 => EpollOp::Del,
                    2 => EpollOp::Other,
                    _ => return None,
                },
                fd: self.i32()?,
            },
            7 => Operand::Close { fd: self.i64()? },
            8 => Operand::CloseRange {
                first: self.i64()?,
                last: self.i64()?,
                cloexec: self.bool()?,
            },
            9 => Operand::Dup {
                old: self.i64()?,
                new: self.i64()?,
            },
            10 => Operand::UringOp {
                fd: self.i32()?,
                op: self.str()?,
                req: self.u64()?,
            },
            11 => Operand::UringDone { req: self.u64()? },
            12 => Operand::Step(match self.u8()? {
                0 => StepMark::Start,
                1 => StepMark::End,
                _ => return None,
            }),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sync_marker::SyncKind;

    fn every_kind() -> Vec<Traced> {
        let call = |name: &str, ret: Ret, operand: Operand| Call {
            name: name.into(),
            ret,
            operand,
            ..Call::default()
        };
        let operands = [
            Operand::None,
            Operand::Marker(SyncMarker {
                kind: SyncKind::Acquire,
                object: 0x5000,
                site: 0x6000,
                aux: 1 << 62,
            }),
            Operand::Receiver(7),
            Operand::Futex {
                addr: 0x10,
                op: FutexOp::Wake,
            },
            Operand::Exec {
                path: Some("/bin/sh".into()),
            },
            Operand::Exec { path: None },
            Operand::SetCloexec { fd: 3, on: true },
            Operand::EpollCtl {
                epfd: 5,
                op: EpollOp::Del,
                fd: 9,
            },
            Operand::Close { fd: -1 },
            Operand::CloseRange {
                first: 3,
                last: u32::MAX as i64,
                cloexec: false,
            },
            Operand::Dup { old: 4, new: 1 },
            Operand::UringOp {
                fd: 6,
                op: "RECV".into(),
                req: u64::MAX,
            },
            Operand::UringDone { req: 1 },
            Operand::Step(StepMark::End),
        ];
        let mut events: Vec<Traced> = operands
            .into_iter()
            .enumerate()
            .map(|(line, o)| Traced {
                line,
                tid: 100 + line as u32,
                event: Event::Call(call("x", Ret::Value(-3), o)),
            })
            .collect();
        let full = Call {
            name: "pipe2".into(),
            ret: Ret::Error("EMFILE".into()),
            fds: vec![1, 2, 3],
            made: vec![4, 5],
            cloexec: true,
            unbounded: true,
            thread: true,
            operand: Operand::None,
        };
        events.push(Traced {
            line: 20,
            tid: 1,
            event: Event::Started(full.clone()),
        });
        events.push(Traced {
            line: 21,
            tid: 1,
            event: Event::Resumed(call("read", Ret::Unknown, Operand::None)),
        });
        events.push(Traced {
            line: 22,
            tid: 1,
            event: Event::Exited,
        });
        events.push(Traced {
            line: 23,
            tid: 1,
            event: Event::Other,
        });
        events
    }

    #[test]
    fn every_kind_of_event_reads_back_as_it_was_written() {
        let events = every_kind();
        let mut b = MAGIC.to_vec();
        for e in &events {
            encode(e, &mut b);
        }
        assert_eq!(decode_all(&b), Some(events));
        assert_eq!(decode_all(MAGIC), Some(vec![]));
    }

    #[test]
    fn a_file_cut_short_or_of_another_kind_is_not_read() {
        let mut b = MAGIC.to_vec();
        for e in every_kind() {
            encode(&e, &mut b);
        }
        for cut in [b.len() - 1, b.len() - 5, MAGIC.len() + 3] {
            assert_eq!(decode_all(&b[..cut]), None, "cut at {cut}");
        }
        assert_eq!(decode_all(b"{\"line\":0}\n"), None);
        assert_eq!(decode_all(b""), None);
        // A record whose tags are wrong is refused, not guessed at.
        let mut bad = MAGIC.to_vec();
        bad.extend([9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
        assert_eq!(decode_all(&bad), None);
    }
}
