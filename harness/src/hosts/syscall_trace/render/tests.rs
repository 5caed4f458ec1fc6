use super::*;

fn ev(tid: u32, kind: Kind, name: &str, args: [u64; 6], ret: i64) -> Event {
    Event::of(tid, kind, name, args, ret)
}

fn started(r: &mut Renderer, out: &mut Out) {
    let mut e = ev(100, Kind::Exit, "execve", [0; 6], 0);
    e.tgid = 100;
    r.feed(e, out);
}

#[test]
fn a_call_alone_is_one_line_and_an_interleaved_one_is_split_as_strace_splits_it() {
    let mut r = Renderer::new(100, 0);
    let mut out = Out::default();
    started(&mut r, &mut out);
    let mut clone = ev(100, Kind::Enter, "clone3", [0x5000, 88, 0, 0, 0, 0], 0);
    clone.captures[0] = (libc::CLONE_VM as u64 | libc::CLONE_THREAD as u64)
        .to_ne_bytes()
        .to_vec();
    r.feed(clone, &mut out);
    r.feed(ev(100, Kind::Exit, "clone3", [0; 6], 101), &mut out);
    r.feed(
        ev(100, Kind::Enter, "close", [5, 0, 0, 0, 0, 0], 0),
        &mut out,
    );
    r.feed(ev(100, Kind::Exit, "close", [0; 6], 0), &mut out);
    r.feed(
        ev(101, Kind::Enter, "read", [7, 0, 16, 0, 0, 0], 0),
        &mut out,
    );
    r.feed(
        ev(100, Kind::Enter, "close", [7, 0, 0, 0, 0, 0], 0),
        &mut out,
    );
    r.feed(ev(100, Kind::Exit, "close", [0; 6], 0), &mut out);
    r.feed(
        ev(101, Kind::Exit, "read", [0; 6], -(libc::EBADF as i64)),
        &mut out,
    );
    let lines: Vec<&str> = out.lines().skip(2).collect();
    assert_eq!(lines[0], "100 1.000000 close(5) = 0");
    assert_eq!(lines[1], "101 1.000000 read(7, 0, 16 <unfinished ...>");
    assert_eq!(lines[2], "100 1.000000 close(7) = 0");
    assert_eq!(
        lines[3],
        "101 1.000000 <... read resumed>) = -1 EBADF (Bad file descriptor)"
    );
}

#[test]
fn the_tracers_child_is_recorded_from_its_exec() {
    let mut r = Renderer::new(100, 0);
    let mut out = Out::default();
    r.feed(
        ev(100, Kind::Enter, "close", [3, 0, 0, 0, 0, 0], 0),
        &mut out,
    );
    r.feed(ev(100, Kind::Exit, "close", [0; 6], 0), &mut out);
    assert!(out.is_empty(), "{out}");
    started(&mut r, &mut out);
    r.feed(
        ev(100, Kind::Enter, "close", [3, 0, 0, 0, 0, 0], 0),
        &mut out,
    );
    assert_eq!(out.lines().count(), 1, "pending until its return");
    r.drained(1_000_000_000 + 10_000_000, &mut out);
    assert_eq!(out.lines().count(), 1, "10 ms is not long");
    r.drained(1_000_000_000 + 60_000_000, &mut out);
    assert!(out.ends_with("close(3 <unfinished ...>\n"), "{out}");
}

#[test]
fn sets_strings_and_returned_pairs_are_spelled_out() {
    let mut r = Renderer::new(100, 0);
    let mut out = Out::default();
    started(&mut r, &mut out);
    let mut poll = ev(100, Kind::Enter, "ppoll", [0x1000, 2, 0, 0, 8, 0], 0);
    let mut fds = vec![];
    for fd in [7i32, 9] {
        fds.extend(fd.to_ne_bytes());
        fds.extend(1i16.to_ne_bytes());
        fds.extend(0i16.to_ne_bytes());
    }
    poll.captures[0] = fds;
    r.feed(poll, &mut out);
    r.feed(ev(100, Kind::Exit, "ppoll", [0; 6], 1), &mut out);
    assert!(
        out.contains("ppoll([{fd=7, events=0x1}, {fd=9, events=0x1}], 2, NULL, NULL, 8) = 1"),
        "{out}"
    );
    r.feed(
        ev(100, Kind::Enter, "write", [4, 0x2000, 200, 0, 0, 0], 0),
        &mut out,
    );
    let mut w = ev(100, Kind::Exit, "write", [4, 0x2000, 200, 0, 0, 0], 200);
    w.captures[0] = b"{\"step-start\"\n".to_vec();
    r.feed(w, &mut out);
    assert!(
        out.contains(r#"write(4, "{\"step-start\"\n"..., 200) = 200"#),
        "{out}"
    );
    r.feed(
        ev(100, Kind::Enter, "pipe2", [0x3000, 0x80000, 0, 0, 0, 0], 0),
        &mut out,
    );
    let mut ret = ev(100, Kind::Exit, "pipe2", [0x3000, 0x80000, 0, 0, 0, 0], 0);
    ret.captures[0] = [5i32.to_ne_bytes(), 6i32.to_ne_bytes()].concat();
    r.feed(ret, &mut out);
    // Close-on-exec is spelt as strace spells it: the checker follows it across execve.
    assert!(out.contains("pipe2([5, 6], O_CLOEXEC) = 0"), "{out}");
    let mut sel = ev(100, Kind::Enter, "pselect6", [10, 0x4000, 0, 0, 0, 0], 0);
    sel.captures[0] = {
        let mut b = vec![0u8; 128];
        b[0] = 0b0010_1000;
        b
    };
    r.feed(sel, &mut out);
    r.feed(ev(100, Kind::Exit, "pselect6", [0; 6], 0), &mut out);
    assert!(
        out.contains("pselect6(10, [3 5], NULL, NULL, NULL, NULL) = 0"),
        "{out}"
    );
}

#[test]
fn a_record_of_the_kernel_sides_size_decodes_and_a_short_one_does_not() {
    let mut b = vec![0u8; EVENT_SIZE];
    b[8..12].copy_from_slice(&42u32.to_ne_bytes());
    b[16..20].copy_from_slice(&1u32.to_ne_bytes());
    b[72..80].copy_from_slice(&(-9i64).to_ne_bytes());
    b[80..84].copy_from_slice(&3u32.to_ne_bytes());
    b[88..91].copy_from_slice(b"abc");
    let e = Event::decode(&b).unwrap();
    assert_eq!((e.tid, e.kind, e.ret), (42, Kind::Exit, -9));
    assert_eq!(e.captures[0], b"abc");
    assert!(Event::decode(&b[..100]).is_none());
}

#[test]
fn a_call_site_is_told_before_a_call_when_it_changes_and_only_then() {
    let mut r = Renderer::new(100, 0);
    let mut out = Out::default();
    started(&mut r, &mut out);
    let call = |r: &mut Renderer, out: &mut Out, site: u64| {
        let mut e = ev(101, Kind::Enter, "read", [7, 0, 8, 0, 0, 0], 0);
        e.site = site;
        r.feed(e, out);
        r.feed(ev(101, Kind::Exit, "read", [7, 0, 8, 0, 0, 0], 1), out);
    };
    call(&mut r, &mut out, 0x55aa);
    call(&mut r, &mut out, 0x55aa);
    call(&mut r, &mut out, 0x66bb);
    call(&mut r, &mut out, 0);
    call(&mut r, &mut out, 0);
    let nr = table::recorded(true).find(|s| s.name == "read").unwrap().nr;
    let lines: Vec<&str> = out.lines().skip(1).collect();
    let marker = |site: &str| {
        format!("101 1.000000 prctl(0x57534e43 /* PR_??? */, 0xa, {nr}, {site}, 0) = -1 EINVAL (Invalid argument)")
    };
    assert_eq!(lines.len(), 8, "{out}");
    assert_eq!(lines[0], marker("0x55aa"));
    assert!(
        lines[1].contains("read(7") && lines[2].contains("read(7"),
        "{out}"
    );
    assert_eq!(lines[3], marker("0x66bb"));
    assert_eq!(lines[5], marker("0x0"));
    assert!(
        lines[6].contains("read(7") && lines[7].contains("read(7"),
        "{out}"
    );
    // A thread's told sites end with it.
    r.feed(ev(101, Kind::ThreadExit, "read", [0; 6], 0), &mut out);
    assert!(r.sites.is_empty());
}
