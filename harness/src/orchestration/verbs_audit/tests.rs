//! The checker on hand-written traces, in the observer's format: one correct lifecycle that
//! must stay clean, and one trace per invariant that must name it.

use super::*;

/// A trace from `body` lines (`<tid> <event> ...`), times made up in order.
fn trace(body: &str) -> String {
    let mut out = String::from("wringer-verbs 1 pid=7 exe=/bin/t cap=1000\n");
    for (i, l) in body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        out.push_str(&format!("1000.{:06} {l}\n", i + 1));
    }
    out
}

fn checks(body: &str) -> Vec<&'static str> {
    analyse(&trace(body)).iter().map(|v| v.check).collect()
}

/// Context, PD, CQ, QP (qpn 17) and an MR over 0x1000+4096 (lkey 5).
const SETUP: &str = "
    10 thread name=worker
    10 mark step-start 0
    10 ctx-open ctx=0xc dev=rxe0 by=program
    10 ctx-open ctx=0x5c dev=rxe1 by=librdmacm
    10 pd-alloc pd=0xd ctx=0xc
    10 cq-create cq=0xe ctx=0xc cqe=64 ex=0
    10 qp-create qp=0xf qpn=17 pd=0xd scq=0xe rcq=0xe srq=(nil) type=2 ex=1
    10 mr-reg mr=0xa pd=0xd addr=0x1000 len=4096 lkey=5 rkey=6 kind=host
    10 post-recv call=1 qp=0xf qpn=17 wr=0 sge=0x1000+1024/5
    10 post-recv call=1 qp=0xf qpn=17 wr=1 sge=0x1400+1024/5
";

/// The correct end: to the error state, both flushes polled, then QP, MR, CQ, PD, context.
const CLEAN_END: &str = "
    10 qp-modify qp=0xf qpn=17 state=6 timeout=-1 retry=-1 ret=0
    10 wc cq=0xe qpn=17 wr=0 status=5 op=128 len=0 vendor=0
    10 wc cq=0xe qpn=17 wr=1 status=5 op=128 len=0 vendor=0
    10 qp-destroy qp=0xf qpn=17
    10 mr-dereg mr=0xa
    10 cq-destroy cq=0xe
    10 pd-dealloc pd=0xd
    10 ctx-close ctx=0xc
    10 mark step-end 0
    10 exit
";

#[test]
fn a_correct_lifecycle_is_clean() {
    let body = format!(
        "{SETUP}
        10 post-send call=2 qp=0xf qpn=17 wr=9 op=2 flags=0 sge=0x1800+64/5
        10 post-send call=3 qp=0xf qpn=17 wr=10 op=2 flags=2 sge=0x1840+64/5
        10 wc cq=0xe qpn=17 wr=10 status=0 op=0 len=64 vendor=0
        10 wc cq=0xe qpn=17 wr=0 status=0 op=128 len=64 vendor=0
        10 post-recv call=4 qp=0xf qpn=17 wr=0 sge=0x1000+1024/5
        {CLEAN_END}"
    );
    assert_eq!(analyse(&trace(&body)), vec![]);
}

#[test]
fn an_mr_deregistered_under_a_posted_receive_is_named_with_its_lines() {
    let body = format!(
        "{SETUP}
        10 mr-dereg mr=0xa
        10 qp-destroy qp=0xf qpn=17"
    );
    let v = analyse(&trace(&body));
    let dereg = v
        .iter()
        .find(|v| v.check == "mr-dereg-under-posted-wr")
        .expect("flagged");
    assert!(dereg.message.contains("first wr 0"), "{dereg}");
    // The registration, the post and the deregistration, with the thread's name.
    assert_eq!(dereg.evidence.len(), 3, "{dereg}");
    assert!(dereg.evidence[2].1.contains("mr-dereg") && dereg.evidence[2].1.contains("worker"));
    assert!(v
        .iter()
        .any(|v| v.check == "qp-destroyed-with-outstanding-wrs"));
}

#[test]
fn a_qp_destroyed_with_receives_posted_says_whether_it_was_flushed() {
    let never = analyse(&trace(&format!("{SETUP}\n10 qp-destroy qp=0xf qpn=17")));
    let v = never
        .iter()
        .find(|v| v.check == "qp-destroyed-with-outstanding-wrs")
        .unwrap();
    assert!(
        v.message.contains("2 receive(s)") && v.message.contains("never moved to the error state"),
        "{v}"
    );
    let unpolled = analyse(&trace(&format!(
        "{SETUP}
        10 qp-modify qp=0xf qpn=17 state=6 timeout=-1 retry=-1 ret=0
        10 wc cq=0xe qpn=17 wr=0 status=5 op=128 len=0 vendor=0
        10 qp-destroy qp=0xf qpn=17"
    )));
    let v = unpolled
        .iter()
        .find(|v| v.check == "qp-destroyed-with-outstanding-wrs")
        .unwrap();
    assert!(
        v.message.contains("1 WR(s)") && v.message.contains("never polled"),
        "{v}"
    );
}

#[test]
fn unmapped_and_reused_memory_under_a_posted_receive_are_violations() {
    assert!(checks(&format!("{SETUP}\n10 munmap addr=0x1000 len=8192"))
        .contains(&"memory-freed-under-posted-wr"));
    assert!(checks(&format!("{SETUP}\n10 free addr=0x1400 len=64"))
        .contains(&"memory-freed-under-posted-wr"));
    assert!(!checks(&format!("{SETUP}\n10 free addr=0x1800 len=64"))
        .contains(&"memory-freed-under-posted-wr"));
    // A second QP (another connection) posts into the first one's receive slot.
    let reuse = format!(
        "{SETUP}
        11 qp-create qp=0x2f qpn=18 pd=0xd scq=0xe rcq=0xe srq=(nil) type=2 ex=1
        11 mr-reg mr=0x2a pd=0xd addr=0x1000 len=4096 lkey=7 rkey=8 kind=host
        11 post-recv call=9 qp=0x2f qpn=18 wr=0 sge=0x1200+1024/7"
    );
    let v = analyse(&trace(&reuse));
    let r = v
        .iter()
        .find(|v| v.check == "memory-reused-under-posted-wr")
        .expect("flagged");
    assert!(r.message.contains("wr 0 on 0xf"), "{r}");
    // A send reading the same bytes as an outstanding receive is no reuse (only writers clash).
    let send =
        format!("{SETUP}\n10 post-send call=2 qp=0xf qpn=17 wr=5 op=2 flags=2 sge=0x1000+64/5");
    assert!(!checks(&send).contains(&"memory-reused-under-posted-wr"));
}

#[test]
fn destroy_order_errors_are_violations_even_when_the_library_refuses_them() {
    let cq_first = format!(
        "{SETUP}
        10 cq-destroy cq=0xe
        10 destroy-failed what=cq obj=0xe ret=16"
    );
    assert!(checks(&cq_first).contains(&"cq-destroyed-before-qp"));
    let pd_first = format!(
        "{SETUP}
        10 pd-dealloc pd=0xd
        10 destroy-failed what=pd obj=0xd ret=16
        10 mark step-end 0"
    );
    let found = checks(&pd_first);
    assert!(found.contains(&"pd-dealloc-with-children"), "{found:?}");
    // The refused deallocation left the PD alive: it is among the step's leaks.
    let v = analyse(&trace(&pd_first));
    let leak = v.iter().find(|v| v.check == "verbs-leak").unwrap();
    assert!(leak.message.contains("PD 0xd"), "{leak}");
}

#[test]
fn completions_for_a_dead_qp_and_posts_to_an_error_qp_are_violations() {
    let dead = format!(
        "{SETUP}
        10 qp-modify qp=0xf qpn=17 state=6 timeout=-1 retry=-1 ret=0
        10 qp-destroy qp=0xf qpn=17
        10 wc cq=0xe qpn=17 wr=0 status=5 op=128 len=0 vendor=0"
    );
    assert!(checks(&dead).contains(&"completion-for-dead-qp"));
    let to_error = format!(
        "{SETUP}
        10 qp-modify qp=0xf qpn=17 state=6 timeout=-1 retry=-1 ret=0
        10 post-recv call=5 qp=0xf qpn=17 wr=2 sge=0x1800+1024/5"
    );
    assert!(checks(&to_error).contains(&"post-to-error-qp"));
}

#[test]
fn a_qp_the_harness_forced_to_error_is_in_error_for_the_program_only_once_it_polled_a_flush() {
    let forced = format!(
        "{SETUP}
        11 thread name=wringer-qp-err
        11 fault what=qp-error qp=0xf qpn=17
        11 qp-modify qp=0xf qpn=17 state=6 timeout=-1 retry=-1 ret=0
        10 post-send call=2 qp=0xf qpn=17 wr=41 op=2 flags=2 sge=0x1800+64/5"
    );
    // The program could not know yet: posting is no violation.
    assert!(
        !checks(&forced).contains(&"post-to-error-qp"),
        "{:?}",
        checks(&forced)
    );
    let after_flush = format!(
        "{forced}
        10 wc cq=0xe qpn=17 wr=0 status=5 op=128 len=0 vendor=0
        10 post-send call=3 qp=0xf qpn=17 wr=42 op=2 flags=2 sge=0x1800+64/5"
    );
    assert!(checks(&after_flush).contains(&"post-to-error-qp"));
}

#[test]
fn a_completion_error_names_its_status_and_first_wr_and_puts_the_qp_in_error() {
    let body = format!(
        "{SETUP}
        10 post-send call=2 qp=0xf qpn=17 wr=41 op=2 flags=2 sge=0x1800+64/5
        10 wc cq=0xe qpn=17 wr=41 status=12 op=0 len=0 vendor=0
        10 post-send call=3 qp=0xf qpn=17 wr=42 op=2 flags=2 sge=0x1800+64/5"
    );
    let v = analyse(&trace(&body));
    let e = v.iter().find(|v| v.check == "completion-error").unwrap();
    assert!(
        e.message
            .starts_with("RETRY_EXC_ERR: first on wr 41 of qpn 17"),
        "{e}"
    );
    assert!(e
        .evidence
        .iter()
        .any(|(_, l)| l.contains("post-send") && l.contains("wr=41")));
    assert!(v.iter().any(|v| v.check == "post-to-error-qp"));
    let rnr = body.replace("status=12", "status=13");
    let v = analyse(&trace(&rnr));
    assert!(v.iter().any(|v| v.message.contains("receiver not ready")));
}

#[test]
fn objects_left_at_a_steps_end_or_a_programs_exit_are_leaks() {
    let step = format!("{SETUP}\n10 mark step-end 0");
    let v = analyse(&trace(&step));
    let leak = v.iter().find(|v| v.check == "verbs-leak").unwrap();
    assert!(
        leak.message
            .starts_with("5 verbs object(s) still alive at step 0's end"),
        "{leak}"
    );
    // A program that marks no steps is judged at its exit; one that was killed is not judged.
    let external = SETUP.replace("10 mark step-start 0", "");
    assert!(checks(&format!("{external}\n10 exit")).contains(&"verbs-leak"));
    assert!(!checks(&external).contains(&"verbs-leak"));
}

#[test]
fn a_failed_post_is_not_outstanding_and_unsignaled_sends_retire_in_order() {
    let body = format!(
        "{SETUP}
        10 post-send call=2 qp=0xf qpn=17 wr=1 op=2 flags=0 sge=0x1800+64/5
        10 post-send call=2 qp=0xf qpn=17 wr=2 op=2 flags=2 sge=0x1840+64/5
        10 post-send call=3 qp=0xf qpn=17 wr=3 op=2 flags=2 sge=0x1880+64/5
        10 post-failed call=3 qp=0xf ret=12 from=0
        10 wc cq=0xe qpn=17 wr=2 status=0 op=0 len=64 vendor=0
        {CLEAN_END}"
    );
    assert_eq!(analyse(&trace(&body)), vec![]);
}

#[test]
fn a_truncated_trace_is_never_clean() {
    let body = format!("{SETUP}\n10 truncated what=data at=999\n{CLEAN_END}");
    assert!(checks(&body).contains(&"trace-truncated"));
}

#[test]
fn many_violations_of_one_kind_are_capped_and_counted() {
    let mut body = SETUP.to_string();
    for n in 0..10 {
        body.push_str(&format!(
            "\n10 wc cq=0xe qpn=99 wr={n} status=0 op=0 len=0 vendor=0"
        ));
    }
    body.push_str("\n10 qp-create qp=0x9 qpn=99 pd=0xd scq=0xe rcq=0xe srq=(nil) type=2 ex=0");
    body.push_str("\n10 qp-destroy qp=0x9 qpn=99");
    for n in 0..10 {
        body.push_str(&format!(
            "\n10 wc cq=0xe qpn=99 wr={n} status=0 op=0 len=0 vendor=0"
        ));
    }
    let v = analyse(&trace(&body));
    let dead: Vec<_> = v
        .iter()
        .filter(|v| v.check == "completion-for-dead-qp")
        .collect();
    assert_eq!(dead.len(), PER_CHECK + 1, "{v:#?}");
    assert!(dead.last().unwrap().message.starts_with("7 more"));
}

#[test]
fn a_receive_from_a_shared_receive_queue_completes_through_its_qp() {
    let body = format!(
        "{SETUP}
        10 srq-create srq=0x51 pd=0xd
        10 qp-create qp=0x2f qpn=18 pd=0xd scq=0xe rcq=0xe srq=0x51 type=2 ex=0
        10 post-srq-recv call=7 srq=0x51 qpn=0 wr=77 sge=0x1800+1024/5
        10 wc cq=0xe qpn=18 wr=77 status=0 op=128 len=10 vendor=0
        10 mr-dereg mr=0xa"
    );
    // The SRQ's receive completed (through QP 18), so only the ring of QP 17 is still under it.
    let v = analyse(&trace(&body));
    let d = v
        .iter()
        .find(|v| v.check == "mr-dereg-under-posted-wr")
        .unwrap();
    assert!(d.message.contains("while 2 posted WR(s)"), "{d}");
}
