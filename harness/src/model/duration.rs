//! Human durations in YAML ("500ms", "30s", "2m"), typed instead of bare numbers.

use crate::model::invalid::Invalid;
use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

/// The longest duration a file may give: a week. Nothing a scenario waits for is longer, and the
/// bound keeps every sum of deadlines far from what `Duration` and `Instant` can hold.
pub const MAX: Duration = Duration::from_secs(7 * 24 * 3600);

impl HumanDuration {
    pub fn parse(s: &str) -> Result<HumanDuration, Invalid> {
        let s = s.trim();
        let split = s
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let value: f64 = num
            .parse()
            .map_err(|_| format!("`{s}` is not a duration like 500ms, 30s or 2m"))?;
        let secs = match unit.trim() {
            "ms" => value / 1e3,
            "s" => value,
            "m" => value * 60.0,
            "us" | "µs" => value / 1e6,
            "" => return Err(format!("`{s}` has no unit: write 500ms, 30s or 2m").into()),
            other => {
                return Err(format!(
                    "unknown duration unit `{other}` in `{s}` (use us, ms, s or m)"
                )
                .into())
            }
        };
        if !(secs.is_finite() && secs > 0.0) {
            return Err(
                format!("duration `{s}` must be above zero (there is no 'forever')").into(),
            );
        }
        if secs > MAX.as_secs_f64() {
            return Err(format!(
                "duration `{s}` is over the limit of 7 days (168h): no scenario waits that long"
            )
            .into());
        }
        Ok(HumanDuration(Duration::from_secs_f64(secs)))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_secs_f64() * 1e3;
        if ms < 1.0 {
            write!(f, "{}us", self.0.as_micros())
        } else if ms < 10_000.0 {
            write!(f, "{ms}ms")
        } else {
            write!(f, "{}s", self.0.as_secs_f64())
        }
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<HumanDuration, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration like 500ms, 30s or 2m")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                HumanDuration::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_beyond_a_week_are_refused_before_any_arithmetic() {
        for huge in [
            "99999999999999999999999999999s",
            "1e400s",
            "10081m",
            "604801s",
        ] {
            let e = HumanDuration::parse(huge).unwrap_err();
            assert!(
                e.contains("7 days") || e.contains("unknown duration unit"),
                "{huge}: {e}"
            );
        }
        assert_eq!(HumanDuration::parse("10080m").unwrap().0, MAX);
    }

    #[test]
    fn parses_units_and_rejects_zero_and_bare_numbers() {
        assert_eq!(
            HumanDuration::parse("250ms").unwrap().0,
            Duration::from_millis(250)
        );
        assert_eq!(
            HumanDuration::parse("2m").unwrap().0,
            Duration::from_secs(120)
        );
        assert_eq!(
            HumanDuration::parse("1.5s").unwrap().0,
            Duration::from_millis(1500)
        );
        assert!(HumanDuration::parse("0s")
            .unwrap_err()
            .contains("above zero"));
        assert!(HumanDuration::parse("30").unwrap_err().contains("no unit"));
        assert!(HumanDuration::parse("3h")
            .unwrap_err()
            .contains("unknown duration unit"));
        for d in ["250ms", "90s", "20us"] {
            let parsed = HumanDuration::parse(d).unwrap();
            assert_eq!(HumanDuration::parse(&parsed.to_string()).unwrap(), parsed);
        }
    }
}
