//! Small inline SVG charts: no scripts, no fonts to fetch, readable offline.

use std::fmt::Write;

pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
}

const W: f64 = 560.0;
const H: f64 = 250.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 40.0;

/// Text for HTML and SVG: markup escaped, and every control character but newline and tab
/// written escaped (an ANSI sequence from a program's output never reaches the page raw).
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\n' | '\t' => out.push(c),
            c if crate::model::name::hidden(c) => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Axis {
    fn new(values: impl Iterator<Item = f64>, log: bool) -> Axis {
        // Values beyond ±1e300 would make the axis span overflow to infinity (and every
        // coordinate NaN); they are left off the scale, as NaN and infinities are.
        let v: Vec<f64> = values
            .filter(|x| x.is_finite() && x.abs() <= 1e300 && (!log || *x > 0.0))
            .collect();
        let (mut lo, mut hi) = v
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                (a.min(*x), b.max(*x))
            });
        if !lo.is_finite() {
            (lo, hi) = (1.0, 10.0);
        }
        if log {
            (lo, hi) = (
                lo.log10().floor(),
                hi.log10().ceil().max(lo.log10().floor() + 1.0),
            );
        } else {
            if lo > 0.0 && lo < hi * 0.5 {
                lo = 0.0;
            }
            if hi <= lo {
                hi = lo + 1.0;
            }
            let pad = (hi - lo) * 0.08;
            (lo, hi) = (
                (lo - pad).max(if lo >= 0.0 { 0.0 } else { f64::NEG_INFINITY }),
                hi + pad,
            );
        }
        Axis { lo, hi, log }
    }

    fn frac(&self, x: f64) -> f64 {
        let x = if self.log { x.max(1e-12).log10() } else { x };
        let f = (x - self.lo) / (self.hi - self.lo);
        // A value off the scale (NaN, infinite, huge) is drawn at the edge, never as NaN.
        if f.is_nan() {
            0.0
        } else {
            f.clamp(0.0, 1.0)
        }
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            (self.lo as i32..=self.hi as i32)
                .map(|e| 10f64.powi(e))
                .collect()
        } else {
            (0..=4)
                .map(|i| self.lo + (self.hi - self.lo) * i as f64 / 4.0)
                .collect()
        }
    }
}

pub fn number(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        "n/a".into()
    } else if a >= 1e12 {
        format!("{v:.2e}")
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// A line chart. `x_labels` (value, text) replaces numeric x ticks when given.
pub fn line_chart(
    title: &str,
    y_label: &str,
    series: &[Series],
    log_x: bool,
    log_y: bool,
    x_labels: &[(f64, String)],
) -> String {
    let xs = Axis::new(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.0)),
        log_x,
    );
    let ys = Axis::new(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        log_y,
    );
    let px = |x: f64| LEFT + xs.frac(x) * (W - LEFT - RIGHT);
    let py = |y: f64| H - BOTTOM - ys.frac(y) * (H - TOP - BOTTOM);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{}">"#,
        escape(title)
    );
    let _ = write!(
        s,
        r#"<text x="{LEFT}" y="16" class="title">{}</text>"#,
        escape(title)
    );
    for t in ys.ticks() {
        let y = py(t);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" class="grid"/><text x="{}" y="{:.1}" class="tick" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            number(t)
        );
    }
    let x_ticks: Vec<(f64, String)> = if x_labels.is_empty() {
        xs.ticks().into_iter().map(|t| (t, number(t))).collect()
    } else {
        x_labels.to_vec()
    };
    for (t, label) in &x_ticks {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" class="tick" text-anchor="middle">{}</text>"#,
            px(*t),
            H - BOTTOM + 16.0,
            escape(label)
        );
    }
    let _ = write!(
        s,
        r#"<text x="14" y="{}" class="tick" transform="rotate(-90 14 {})" text-anchor="middle">{}</text>"#,
        H / 2.0,
        H / 2.0,
        escape(y_label)
    );
    // A point off any scale (NaN, infinite, beyond ±1e300, not positive on a log axis) is
    // left out of the drawing; the trend data keeps it.
    let drawable = |v: f64, log: bool| v.is_finite() && v.abs() <= 1e300 && (!log || v > 0.0);
    for (i, ser) in series.iter().enumerate() {
        let points: Vec<(f64, f64)> = ser
            .points
            .iter()
            .copied()
            .filter(|(x, y)| drawable(*x, log_x) && drawable(*y, log_y))
            .collect();
        let pts: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        if pts.len() > 1 {
            let _ = write!(
                s,
                r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
                ser.color,
                pts.join(" ")
            );
        }
        for (x, y) in &points {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"><title>{}: {}</title></circle>"#,
                px(*x),
                py(*y),
                ser.color,
                escape(&ser.name),
                number(*y)
            );
        }
        let lx = LEFT + 10.0 + i as f64 * 150.0;
        let _ = write!(
            s,
            r#"<rect x="{lx}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{}" class="tick">{}</text>"#,
            H - 14.0,
            ser.color,
            lx + 14.0,
            H - 5.0,
            escape(&ser.name)
        );
    }
    s.push_str("</svg>");
    s
}

/// A histogram of (bucket upper bound, count).
pub fn histogram(title: &str, buckets: &[(f64, u64)]) -> String {
    let bars: Vec<&(f64, u64)> = buckets
        .iter()
        .filter(|b| b.1 > 0 && b.0.is_finite())
        .collect();
    let max = bars.iter().map(|b| b.1).max().unwrap_or(1) as f64;
    let (w, h) = (280.0, 150.0);
    let bw = (w - 20.0) / bars.len().max(1) as f64;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="hist" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{}">"#,
        escape(title)
    );
    let _ = write!(
        s,
        r#"<text x="10" y="14" class="title">{}</text>"#,
        escape(title)
    );
    for (i, (upper, count)) in bars.iter().enumerate() {
        let bh = (*count as f64 / max) * (h - 50.0);
        let x = 10.0 + i as f64 * bw;
        let _ = write!(
            s,
            r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" class="bar"><title>≤ {} µs: {count}</title></rect>"#,
            h - 30.0 - bh,
            (bw - 2.0).max(1.0),
            number(*upper)
        );
        if i % 2 == 0 || bars.len() < 8 {
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{}" class="tick" text-anchor="middle">{}</text>"#,
                x + bw / 2.0,
                h - 16.0,
                number(*upper)
            );
        }
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" class="tick" text-anchor="end">µs (bucket upper bound)</text></svg>"#,
        w - 4.0,
        h - 2.0
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_text_holds_no_markup_and_no_raw_control_character() {
        assert_eq!(escape("a\u{202e}b"), "a\\u{202e}b");
        let t = escape("<b>\u{1b}[31mred\u{7}</b> & \"q\"\nnext\tcol");
        assert_eq!(
            t,
            "&lt;b&gt;\\u{1b}[31mred\\u{7}&lt;/b&gt; &amp; &quot;q&quot;\nnext\tcol"
        );
    }

    #[test]
    fn extreme_values_never_put_nan_or_infinity_into_a_chart() {
        let nasty = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e308,
            -1e308,
            0.0,
            5.0,
        ];
        let points: Vec<(f64, f64)> = nasty.iter().map(|v| (*v, *v)).collect();
        for (lx, ly) in [(false, false), (true, true)] {
            let svg = line_chart(
                "t",
                "y",
                &[Series {
                    name: "s".into(),
                    color: "#000",
                    points: points.clone(),
                }],
                lx,
                ly,
                &[],
            );
            assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        }
        let h = histogram("h", &[(f64::NAN, 1), (1e308, 2), (3.0, u64::MAX)]);
        assert!(!h.contains("NaN") && !h.contains("inf"), "{h}");
    }
}
