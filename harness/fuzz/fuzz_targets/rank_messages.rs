//! Any bytes as what a peer sends the rendezvous: lines decoded as rank messages, and every
//! decoded message fed to the coordinator's core (joins with any rank number, barriers,
//! points, results), which must never panic, whatever the order.
#![no_main]

use std::io::BufReader;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use wringer::model::scenario::{Fault, FaultAction};
use wringer::orchestration::coordinator::core::{Config, Core, Input};
use wringer::rank::protocol::{read_line, RankMsg};

fuzz_target!(|bytes: &[u8]| {
    let start = Instant::now();
    let mut core = Core::new(
        Config {
            ranks: 3,
            steps: vec![
                ("pingpong", Duration::from_secs(1)),
                ("stall", Duration::from_secs(1)),
            ],
            faults: vec![Fault {
                rank: 1,
                at: "p".into(),
                action: FaultAction::Sigkill,
            }],
            deadline: Duration::from_secs(10),
            join_timeout: Duration::from_secs(3),
            pids: None,
            host_of: vec![0, 1, 0],
        },
        start,
    );
    let mut reader = BufReader::new(bytes);
    let mut t = 0u64;
    // The first byte of each line picks who sends it (a rank in range or not).
    while let Ok(Some(msg)) = read_line::<_, RankMsg>(&mut reader) {
        t += 7;
        let now = start + Duration::from_millis(t);
        let input = match msg {
            RankMsg::Hello { rank, pid, .. } => Input::Joined { rank, pid },
            other => Input::Msg {
                rank: (t % 4) as u32,
                msg: other,
            },
        };
        let _ = core.handle(now, input);
        if core.is_over() {
            break;
        }
    }
    let _ = core.handle(start + Duration::from_secs(20), Input::Tick);
    let _ = serde_json::from_slice::<RankMsg>(bytes);
});
