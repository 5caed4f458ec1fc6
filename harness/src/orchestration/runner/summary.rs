//! A scenario's metric summaries and latency percentiles.

use super::*;

/// Metric summaries and latency percentiles, per metric and per series and size.
pub(crate) fn summarise(result: &mut ScenarioResult, seen: Observed) {
    for (k, v) in seen.metrics {
        let count = v.len();
        let (min, max) = v
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                (a.min(*x), b.max(*x))
            });
        result.metrics.insert(
            k,
            MetricSummary {
                min,
                max,
                mean: v.iter().sum::<f64>() / count as f64,
                count,
            },
        );
    }
    for (k, v) in seen.samples {
        result.latency.insert(k, latency(&v));
    }
}

/// Percentiles and a log-bucket histogram of latency samples (µs).
pub fn latency(samples: &[f64]) -> Latency {
    let mut h = Histogram::<u64>::new(3).expect("3 significant digits is valid");
    for x in samples {
        let _ = h.record((x * 1000.0).max(1.0) as u64);
    }
    Latency {
        p50_us: h.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: h.value_at_quantile(0.99) as f64 / 1e3,
        count: h.len(),
        histogram: h
            .iter_log(1000, 2.0)
            .map(|b| {
                (
                    b.value_iterated_to() as f64 / 1e3,
                    b.count_since_last_iteration(),
                )
            })
            .collect(),
    }
}
