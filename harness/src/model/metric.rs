//! Typed evidence: the metrics a step records, the latency series it samples, and the bounds a
//! scenario's `expect` puts on them. The same types travel from a rank's step to the page.

use crate::model::invalid::Invalid;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A metric as a step kind declares it, in its own file (see [`declare_metrics!`]): its name
/// as YAML, JSON and the page spell it, its unit, and which way is better.
#[derive(Debug)]
pub struct MetricDef {
    pub name: &'static str,
    pub unit: Unit,
    pub better: Better,
}

/// What a metric's numbers count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unit {
    /// Events, frames, cases, attempts.
    Count,
    Bytes,
    Seconds,
    Milliseconds,
    Microseconds,
    GbitPerSecond,
    /// 1 or 0: it happened, or it did not.
    Flag,
}

impl Unit {
    /// How the page writes it after a number ("" for counts).
    pub fn symbol(self) -> &'static str {
        match self {
            Unit::Count | Unit::Flag => "",
            Unit::Bytes => "B",
            Unit::Seconds => "s",
            Unit::Milliseconds => "ms",
            Unit::Microseconds => "µs",
            Unit::GbitPerSecond => "Gbit/s",
        }
    }
}

/// Which direction of change is an improvement, for trends and regressions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Better {
    Lower,
    Higher,
    /// Neither: the count is what the scenario asked for (cycles, cases).
    Neither,
}

/// One declared metric. Two are the same metric when their names are the same; every name is
/// declared once (a test checks it).
#[derive(Clone, Copy, Debug)]
pub struct Metric(&'static MetricDef);

/// What [`declare_metrics!`] registers, so that a name read from a file finds its metric.
pub struct Declared(pub Metric);
inventory::collect!(Declared);

/// Declare metrics where they are recorded: one `const` each, registered for lookup by name.
///
/// ```ignore
/// declare_metrics! {
///     /// From the fault to the survivor's error.
///     pub DETECT_MS = "detect_ms", Milliseconds, Lower;
/// }
/// ```
#[macro_export]
macro_rules! declare_metrics {
    ($($(#[$doc:meta])* $vis:vis $id:ident = $name:literal, $unit:ident, $better:ident;)*) => {
        $(
            $(#[$doc])*
            $vis const $id: $crate::model::metric::Metric =
                $crate::model::metric::Metric::new(&$crate::model::metric::MetricDef {
                    name: $name,
                    unit: $crate::model::metric::Unit::$unit,
                    better: $crate::model::metric::Better::$better,
                });
            ::inventory::submit! { $crate::model::metric::Declared($id) }
        )*
    };
}

impl Metric {
    pub const fn new(def: &'static MetricDef) -> Metric {
        Metric(def)
    }

    /// The metric's name in YAML, JSON and on the page.
    pub fn as_str(self) -> &'static str {
        self.0.name
    }

    pub fn unit(self) -> Unit {
        self.0.unit
    }

    pub fn better(self) -> Better {
        self.0.better
    }

    /// Every declared metric, by name.
    pub fn all() -> Vec<Metric> {
        let mut all: Vec<Metric> = inventory::iter::<Declared>().map(|d| d.0).collect();
        all.sort();
        all
    }

    /// The declared metric of this name.
    pub fn named(name: &str) -> Option<Metric> {
        inventory::iter::<Declared>()
            .map(|d| d.0)
            .find(|m| m.as_str() == name)
    }
}

impl PartialEq for Metric {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}
impl Eq for Metric {}
impl PartialOrd for Metric {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Metric {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}
impl std::hash::Hash for Metric {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_str().hash(h)
    }
}

impl Serialize for Metric {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Metric {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Metric, D::Error> {
        let name = String::deserialize(d)?;
        Metric::named(&name).ok_or_else(|| {
            let near: Vec<&str> = Metric::all()
                .into_iter()
                .map(Metric::as_str)
                .filter(|m| close(m, &name))
                .collect();
            let hint = if near.is_empty() {
                "`wringer list --metrics` lists them".to_string()
            } else {
                format!("did you mean {}?", near.join(" or "))
            };
            serde::de::Error::custom(format!(
                "unknown metric `{name}`: no step kind declares it; {hint}"
            ))
        })
    }
}

/// Names a typo could have meant: the same words in another order, or one word apart.
fn close(declared: &str, typed: &str) -> bool {
    let words = |s: &str| {
        let mut w: Vec<String> = s.split('_').map(str::to_owned).collect();
        w.sort();
        w
    };
    let (a, b) = (words(declared), words(typed));
    if a == b {
        return true;
    }
    a.len() == b.len() && a.iter().zip(&b).filter(|(x, y)| x != y).count() == 1
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A typed bound that every observation of a metric must satisfy.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Bound {
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub equals: Option<f64>,
}

impl Bound {
    /// Whether any value can meet the bound: finite numbers, min not above max, and an
    /// `equals` inside both.
    pub fn satisfiable(&self) -> Result<(), Invalid> {
        let all = [self.min, self.max, self.equals];
        if all.iter().flatten().any(|v| !v.is_finite()) {
            return Err("bounds must be finite numbers (not NaN or infinity)".into());
        }
        if let (Some(lo), Some(hi)) = (self.min, self.max) {
            if lo > hi {
                return Err(format!("min {lo} is above max {hi}: no value can meet it").into());
            }
        }
        if let Some(e) = self.equals {
            if self.min.is_some_and(|lo| e < lo) || self.max.is_some_and(|hi| e > hi) {
                return Err(
                    format!("equals {e} lies outside min/max: no value can meet it").into(),
                );
            }
        }
        Ok(())
    }

    pub fn check(&self, value: f64) -> Result<(), Invalid> {
        if let Some(e) = self.equals {
            if value != e {
                return Err(format!("{value} != {e}").into());
            }
        }
        if let Some(m) = self.min {
            if value < m {
                return Err(format!("{value} < min {m}").into());
            }
        }
        if let Some(m) = self.max {
            if value > m {
                return Err(format!("{value} > max {m}").into());
            }
        }
        Ok(())
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = vec![];
        if let Some(v) = self.equals {
            parts.push(format!("= {v}"));
        }
        if let Some(v) = self.min {
            parts.push(format!(">= {v}"));
        }
        if let Some(v) = self.max {
            parts.push(format!("<= {v}"));
        }
        f.write_str(&parts.join(", "))
    }
}

/// A series of latency samples (µs, one-way), kept per message size.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Series {
    /// Ping-pong round trip / 2: TCP frames, RDMA SEND, GPU buffers.
    Latency,
    /// RDMA WRITE with immediate, round trip / 2.
    WriteLatency,
    /// RDMA WRITE into caller-registered regions, round trip / 2.
    RegionWriteLatency,
    /// RDMA SEND from a caller-registered region, received and echoed in place (no copy on
    /// either side), round trip / 2.
    InPlaceLatency,
}

impl Series {
    pub const ALL: [Series; 4] = [
        Series::Latency,
        Series::WriteLatency,
        Series::RegionWriteLatency,
        Series::InPlaceLatency,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Series::Latency => "latency",
            Series::WriteLatency => "write_latency",
            Series::RegionWriteLatency => "region_write_latency",
            Series::InPlaceLatency => "in_place_latency",
        }
    }

    /// What the page calls it.
    pub fn title(self) -> &'static str {
        match self {
            Series::Latency => "one-way latency",
            Series::WriteLatency => "RDMA WRITE one-way latency",
            Series::RegionWriteLatency => "RDMA WRITE (registered regions) one-way latency",
            Series::InPlaceLatency => "RDMA SEND in place (zero-copy) one-way latency",
        }
    }
}

/// One latency series at one message size: how samples are keyed from rank to page.
/// In JSON it is the text `series/size` (`latency/4096`); a bare size (`4096`), as reports
/// before schema 2 wrote it, reads as the `latency` series.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SampleKey {
    pub series: Series,
    pub size: u64,
}

impl fmt::Display for SampleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.series.as_str(), self.size)
    }
}

impl FromStr for SampleKey {
    type Err = Invalid;

    fn from_str(s: &str) -> Result<SampleKey, Invalid> {
        let (series, size) = match s.split_once('/') {
            Some((name, size)) => {
                let series = Series::ALL
                    .into_iter()
                    .find(|x| x.as_str() == name)
                    .ok_or_else(|| format!("unknown latency series `{name}`"))?;
                (series, size)
            }
            None => (Series::Latency, s),
        };
        let size = size
            .parse()
            .map_err(|_| format!("`{s}`: the size is not a number of bytes"))?;
        Ok(SampleKey { series, size })
    }
}

impl Serialize for SampleKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SampleKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SampleKey, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_keys_round_trip_and_read_the_old_bare_size() {
        for series in Series::ALL {
            let k = SampleKey { series, size: 4096 };
            assert_eq!(k.to_string().parse::<SampleKey>(), Ok(k));
        }
        assert_eq!(
            "64".parse::<SampleKey>(),
            Ok(SampleKey {
                series: Series::Latency,
                size: 64
            })
        );
        assert!("nope/64".parse::<SampleKey>().is_err());
        assert!("latency/x".parse::<SampleKey>().is_err());
    }

    crate::declare_metrics! {
        /// Only for these tests.
        TEST_WAIT_MS = "test_wait_ms", Milliseconds, Lower;
        TEST_RATE_GBPS = "test_rate_gbps", GbitPerSecond, Higher;
    }

    #[test]
    fn a_declared_metric_is_found_by_name_with_its_unit_and_direction() {
        assert_eq!(TEST_WAIT_MS.as_str(), "test_wait_ms");
        assert_eq!(Metric::named("test_wait_ms"), Some(TEST_WAIT_MS));
        assert_eq!(TEST_WAIT_MS.unit().symbol(), "ms");
        assert_eq!(TEST_RATE_GBPS.better(), Better::Higher);
        let back: Metric = serde_json::from_str("\"test_rate_gbps\"").unwrap();
        assert_eq!(back.unit(), Unit::GbitPerSecond);
        let e = serde_json::from_str::<Metric>("\"test_ms_wait\"").unwrap_err();
        assert!(e.to_string().contains("did you mean test_wait_ms?"), "{e}");
        let e = serde_json::from_str::<Metric>("\"nothing_like_it\"").unwrap_err();
        assert!(
            e.to_string().contains("unknown metric `nothing_like_it`"),
            "{e}"
        );
    }

    #[test]
    fn every_metric_name_is_declared_once_in_snake_case() {
        let all = Metric::all();
        let names: Vec<&str> = all.iter().map(|m| m.as_str()).collect();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names, unique, "a metric name is declared twice");
        for n in names {
            assert!(
                !n.is_empty()
                    && n.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "`{n}` is not snake_case"
            );
        }
    }
}
