//! What the wire faults share: the RoCE port, the nftables chain they drop or mangle in, the
//! seeded packet pattern, and the commands a wire plane runs. Pure: values in, text out.

use std::time::Duration;

/// The RoCE v2 UDP port: every RoCE packet, data and acknowledgement, goes to it.
pub const ROCE_PORT: u16 = 4791;

/// Longest netem delay a fault may ask for.
pub const MAX_DELAY: Duration = Duration::from_secs(10);

/// A wire fault's commands: for the struck host (its data NIC is `$D` there), and for its
/// peers (packets the struck host sends are dropped as they arrive there).
#[derive(Debug, PartialEq)]
pub struct WireScripts {
    pub struck: String,
    pub peer: Option<String>,
}

impl WireScripts {
    pub fn struck(struck: String) -> WireScripts {
        WireScripts { struck, peer: None }
    }
}

/// Every RoCE packet.
pub fn roce() -> String {
    format!("udp dport {ROCE_PORT}")
}

/// The RoCE packets `address` sends.
pub fn roce_from(address: &str) -> String {
    format!("ip saddr {address} udp dport {ROCE_PORT}")
}

/// An nftables chain `name` applying `rule` to what arrives. Every drop happens where a
/// packet arrives: one dropped on its way out makes the sender's ip_local_out fail, and rxe
/// resends such a packet at once, for ever (a busy loop of about 100,000 packets a second in
/// the VM), which no wire does.
pub fn arriving_chain(name: &str, rule: &str) -> String {
    format!(
        "nft -f - <<'EOF'\ntable inet wringer {{\n\
         chain {name} {{ type filter hook input priority 0; policy accept; {rule}; }}\n}}\nEOF\n"
    )
}

/// A netem qdisc on the struck host's data NIC, in place of any other.
pub fn netem(spec: &str) -> String {
    format!("tc qdisc replace dev $D root netem limit 100000 {spec}\n")
}

/// `count` distinct residues of 100 drawn from `seed` (stream `stream`), in order, as an
/// nftables set body: a packet-count pattern, so the same seed picks the same packets of the
/// same stream.
pub fn residues(seed: u64, stream: u64, count: u8) -> String {
    let mut state = seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64's sequence: each draw mixes the state, then the state steps on.
    let mut next = || {
        let z = crate::model::seed::splitmix(state);
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z
    };
    let mut all: Vec<u8> = (0..100).collect();
    for i in (1..all.len()).rev() {
        all.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    let mut picked = all[..count.min(100) as usize].to_vec();
    picked.sort_unstable();
    picked
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A percentage of packets a fault picks: some, never none or all (all: `roce-blackhole`).
pub fn check_percent(percent: u8) -> Result<(), crate::model::invalid::Invalid> {
    if (1..=99).contains(&percent) {
        return Ok(());
    }
    Err(format!("percent must be 1..=99, got {percent} (all packets: `roce-blackhole`)").into())
}

/// A netem delay a fault asks for.
pub fn check_delay(delay: Duration) -> Result<(), crate::model::invalid::Invalid> {
    if delay.is_zero() || delay > MAX_DELAY {
        return Err(
            format!("delay must be above 0 and at most {MAX_DELAY:?}, got {delay:?}").into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_loss_drops_the_same_packets_for_the_same_seed_and_others_for_another() {
        let one = residues(7, 1, 3);
        assert_eq!(one, residues(7, 1, 3));
        assert_eq!(one.split(", ").count(), 3);
        assert_ne!(one, residues(8, 1, 3));
        assert_ne!(one, residues(7, 2, 3));
        let all: Vec<u8> = residues(1, 1, 99)
            .split(", ")
            .map(|r| r.parse().unwrap())
            .collect();
        assert_eq!(all.len(), 99);
        assert!(all.windows(2).all(|w| w[0] < w[1]), "distinct and sorted");
    }

    #[test]
    fn percentages_and_delays_are_bounded() {
        assert!(check_percent(1).is_ok() && check_percent(99).is_ok());
        assert!(check_percent(0).is_err());
        assert!(check_percent(100)
            .unwrap_err()
            .0
            .contains("`roce-blackhole`"));
        assert!(check_delay(Duration::from_millis(5)).is_ok());
        assert!(check_delay(Duration::ZERO).is_err());
        assert!(check_delay(Duration::from_secs(11)).is_err());
    }
}
