//! Small server-side SVG charts for the admin console: stacked bars or lines
//! over time buckets, with no JavaScript and no chart library.
//!
//! [`Chart::svg`] returns markup meant for an askama template's `|safe`: every
//! piece of text in it (title, unit, labels, series names) is escaped here.
//! Text is drawn in `currentColor`, so the chart takes the colour of the
//! surrounding HTML; series use a fixed colour-blind-friendly palette
//! (Okabe–Ito) by index, as presentation attributes, so no CSS is needed.
//!
//! For tests and scrapers, each series is a `<g class="series"
//! data-series="…">` and each point (a bar `<rect>` or a line `<circle>`)
//! carries `data-bucket` and `data-value`, also when the value is zero.

use std::fmt::Write as _;

/// How a chart draws its series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChartKind {
    StackedBars,
    Lines,
}

/// One named series: one value per bucket (same length as `Chart::buckets`).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub values: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Used as the element id: the <svg> gets id="chart-{id}". Only [a-z0-9-] are kept.
    pub id: String,
    pub title: String,
    /// Shown after values on the axis/tooltip, e.g. "jobs", "USD", "attempts", "s".
    pub unit: String,
    pub kind: ChartKind,
    /// Bucket labels in time order, e.g. "14:05", "2026-12-01".
    pub buckets: Vec<String>,
    pub series: Vec<Series>,
}

/// Okabe–Ito: distinguishable with the common colour-vision deficiencies.
const PALETTE: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#000000",
];

/// The viewBox width; the height grows only with the legend's rows.
const WIDTH: f64 = 440.0;
/// The height with a single legend row.
const BASE_HEIGHT: f64 = 240.0;
const PLOT_LEFT: f64 = 56.0;
const PLOT_RIGHT: f64 = 428.0;
const PLOT_TOP: f64 = 24.0;
const PLOT_BOTTOM: f64 = 190.0;
const X_LABEL_Y: f64 = 208.0;
/// Centre line of the first legend row.
const LEGEND_Y: f64 = 226.0;
const LEGEND_ROW: f64 = 18.0;
const LEGEND_LEFT: f64 = 8.0;
const FONT_SIZE: f64 = 12.0;
const MAX_X_LABELS: usize = 6;
/// Space between two x labels.
const LABEL_GAP: f64 = 12.0;
/// Longest x label and legend name drawn, in characters; the data attributes
/// and hover titles keep the whole text.
const MAX_LABEL_CHARS: usize = 16;
const MAX_LEGEND_CHARS: usize = 28;
const EMPTY_TEXT: &str = "No data in this period";

impl Chart {
    /// The SVG markup.
    pub fn svg(&self) -> String {
        let id = sanitize_id(&self.id);
        let values = self.effective_values();
        let empty = self.is_empty();
        let (legend, legend_rows) = self.legend();
        let height = BASE_HEIGHT + LEGEND_ROW * legend_rows.saturating_sub(1) as f64;

        let mut out = String::with_capacity(4096 + 160 * self.buckets.len() * self.series.len());
        let _ = write!(
            out,
            "<svg id=\"chart-{id}\" class=\"chart\" role=\"img\" \
             aria-labelledby=\"chart-{id}-title\" viewBox=\"0 0 {w} {h}\" \
             preserveAspectRatio=\"xMidYMid meet\" \
             xmlns=\"http://www.w3.org/2000/svg\" \
             font-family=\"system-ui, sans-serif\" font-size=\"{fs}\">",
            w = num(WIDTH),
            h = num(height),
            fs = num(FONT_SIZE),
        );
        let _ = write!(
            out,
            "<title id=\"chart-{id}-title\">{}</title>",
            escape(&self.title)
        );

        let (scale, ticks) = y_range(&values, empty);
        self.y_axis(&mut out, &scale, &ticks);
        axis_lines(&mut out);
        self.x_axis(&mut out);

        // The data.
        out.push_str("<g class=\"data\">");
        match self.kind {
            ChartKind::StackedBars => self.bars(&mut out, &values, &scale),
            ChartKind::Lines => self.lines(&mut out, &values, &scale, empty),
        }
        out.push_str("</g>");

        if empty {
            let _ = write!(
                out,
                "<text class=\"empty\" x=\"{x}\" y=\"{y}\" text-anchor=\"middle\" \
                 fill=\"currentColor\" fill-opacity=\"0.7\" font-size=\"14\">{EMPTY_TEXT}</text>",
                x = num((PLOT_LEFT + PLOT_RIGHT) / 2.0),
                y = num((PLOT_TOP + PLOT_BOTTOM) / 2.0 + 5.0),
            );
        }

        out.push_str(&legend);
        out.push_str("</svg>");
        out
    }

    /// Grid and y axis labels, and the unit.
    fn y_axis(&self, out: &mut String, scale: &Scale, ticks: &[f64]) {
        out.push_str("<g class=\"y-axis\" fill=\"currentColor\" text-anchor=\"end\">");
        for &t in ticks {
            let y = scale.y(t);
            let _ = write!(
                out,
                "<line x1=\"{x1}\" y1=\"{y}\" x2=\"{x2}\" y2=\"{y}\" stroke=\"currentColor\" \
                 stroke-opacity=\"{op}\"/>\
                 <text x=\"{tx}\" y=\"{ty}\" data-tick=\"{v}\">{label}</text>",
                x1 = num(PLOT_LEFT),
                x2 = num(PLOT_RIGHT),
                y = num(y),
                op = if t == 0.0 { "0.5" } else { "0.15" },
                tx = num(PLOT_LEFT - 6.0),
                ty = num(y + FONT_SIZE * 0.35),
                v = format_value(t),
                label = escape(&tick_label(t)),
            );
        }
        if !self.unit.is_empty() {
            let _ = write!(
                out,
                "<text x=\"{x}\" y=\"{y}\" text-anchor=\"start\" class=\"unit\">{}</text>",
                escape(&truncate(&self.unit, MAX_LEGEND_CHARS)),
                x = num(LEGEND_LEFT),
                y = num(PLOT_TOP - 10.0),
            );
        }
        out.push_str("</g>");
    }

    /// X labels, thinned.
    fn x_axis(&self, out: &mut String) {
        out.push_str("<g class=\"x-axis\" fill=\"currentColor\" text-anchor=\"middle\">");
        for (i, text, x) in x_labels(&self.buckets) {
            let _ = write!(
                out,
                "<text x=\"{x}\" y=\"{y}\" data-index=\"{i}\">{}</text>",
                escape(&text),
                x = num(x),
                y = num(X_LABEL_Y),
            );
        }
        out.push_str("</g>");
    }

    /// Whether every value of every series is zero (or there are no buckets).
    ///
    /// Values are taken as drawn: non-finite values count as zero, and so do
    /// negative ones in a [`ChartKind::StackedBars`] chart.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
            || self
                .effective_values()
                .iter()
                .all(|s| s.values.iter().all(|&v| v == 0.0))
    }

    /// Every series' values as drawn, exactly one per bucket.
    fn effective_values(&self) -> Vec<Clean> {
        let n = self.buckets.len();
        self.series
            .iter()
            .map(|s| {
                let values: Vec<f64> = (0..n)
                    .map(|i| {
                        let v = s.values.get(i).copied().unwrap_or(0.0);
                        let v = if v.is_finite() { v } else { 0.0 };
                        match self.kind {
                            ChartKind::StackedBars => v.max(0.0),
                            ChartKind::Lines => v,
                        }
                    })
                    .collect();
                let (min, max) = match self.kind {
                    // The stack's total is what the axis must reach.
                    ChartKind::StackedBars => (0.0, 0.0),
                    ChartKind::Lines => values
                        .iter()
                        .fold((0.0_f64, 0.0_f64), |(lo, hi), &v| (lo.min(v), hi.max(v))),
                };
                Clean { values, min, max }
            })
            .chain(self.stack_totals(n))
            .collect()
    }

    /// For stacked bars, a pseudo-series holding the stack totals' range (it
    /// is the last element, and has no values).
    fn stack_totals(&self, n: usize) -> Option<Clean> {
        if self.kind != ChartKind::StackedBars {
            return None;
        }
        let max = (0..n)
            .map(|i| {
                self.series
                    .iter()
                    .map(|s| {
                        let v = s.values.get(i).copied().unwrap_or(0.0);
                        if v.is_finite() {
                            v.max(0.0)
                        } else {
                            0.0
                        }
                    })
                    .sum::<f64>()
            })
            .fold(0.0_f64, |a, b| {
                a.max(if b.is_finite() { b } else { f64::MAX })
            });
        Some(Clean {
            values: Vec::new(),
            min: 0.0,
            max,
        })
    }

    fn bars(&self, out: &mut String, values: &[Clean], scale: &Scale) {
        let n = self.buckets.len();
        let band = band_width(n);
        let width = if band >= 4.0 {
            (band * 0.8).min(48.0)
        } else {
            band
        };
        let mut stack = vec![0.0_f64; n];
        for (si, series) in self.series.iter().enumerate() {
            self.open_series(out, si, &series.name);
            for (i, bucket) in self.buckets.iter().enumerate() {
                let v = values[si].values[i];
                let bottom = stack[i];
                let top = bottom + v;
                stack[i] = top;
                let (y_top, y_bottom) = (scale.y(top), scale.y(bottom));
                // Rounded edges, so that stacked rects meet exactly.
                let (y_top, y_bottom) = (round2(y_top), round2(y_bottom));
                let _ = write!(
                    out,
                    "<rect x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{h}\" \
                     data-bucket=\"{b}\" data-value=\"{v}\">",
                    x = num(band_center(i, n) - width / 2.0),
                    y = num(y_top),
                    w = num(width),
                    h = num((y_bottom - y_top).max(0.0)),
                    b = escape(bucket),
                    v = format_value(v),
                );
                self.point_title(out, &series.name, bucket, v);
                out.push_str("</rect>");
            }
            out.push_str("</g>");
        }
    }

    fn lines(&self, out: &mut String, values: &[Clean], scale: &Scale, empty: bool) {
        let n = self.buckets.len();
        let radius = (band_width(n) * 0.35).clamp(1.0, 3.0);
        for (si, series) in self.series.iter().enumerate() {
            self.open_series(out, si, &series.name);
            let vals = &values[si].values;
            if !empty && n > 0 {
                let mut points = String::new();
                for (i, &v) in vals.iter().enumerate() {
                    if i > 0 {
                        points.push(' ');
                    }
                    let _ = write!(points, "{},{}", num(band_center(i, n)), num(scale.y(v)));
                }
                let dash = if si >= PALETTE.len() {
                    " stroke-dasharray=\"6 3\""
                } else {
                    ""
                };
                let _ = write!(
                    out,
                    "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" \
                     stroke-linejoin=\"round\"{dash} points=\"{points}\"/>",
                    c = colour(si),
                );
            }
            for (i, bucket) in self.buckets.iter().enumerate() {
                let v = vals[i];
                let _ = write!(
                    out,
                    "<circle cx=\"{x}\" cy=\"{y}\" r=\"{r}\" data-bucket=\"{b}\" data-value=\"{v}\">",
                    x = num(band_center(i, n)),
                    y = num(scale.y(v)),
                    r = if empty { "0".to_owned() } else { num(radius) },
                    b = escape(bucket),
                    v = format_value(v),
                );
                self.point_title(out, &series.name, bucket, v);
                out.push_str("</circle>");
            }
            out.push_str("</g>");
        }
    }

    fn open_series(&self, out: &mut String, index: usize, name: &str) {
        let _ = write!(
            out,
            "<g class=\"series\" data-series=\"{}\" fill=\"{}\">",
            escape(name),
            colour(index)
        );
    }

    fn point_title(&self, out: &mut String, series: &str, bucket: &str, value: f64) {
        let text = format!(
            "{series} \u{b7} {bucket}: {} {}",
            format_value(value),
            self.unit
        );
        let _ = write!(out, "<title>{}</title>", escape(text.trim_end()));
    }

    /// The legend's markup and its number of rows.
    fn legend(&self) -> (String, usize) {
        if self.series.is_empty() {
            return (String::new(), 0);
        }
        let mut out = String::from("<g class=\"legend\" fill=\"currentColor\">");
        let mut row = 0usize;
        let mut x = LEGEND_LEFT;
        for (si, series) in self.series.iter().enumerate() {
            let name = truncate(&series.name, MAX_LEGEND_CHARS);
            let item = 10.0 + 5.0 + text_width(&name);
            if x > LEGEND_LEFT && x + item > WIDTH - LEGEND_LEFT {
                row += 1;
                x = LEGEND_LEFT;
            }
            let cy = LEGEND_Y + LEGEND_ROW * row as f64;
            let _ = write!(
                out,
                "<rect x=\"{x}\" y=\"{sy}\" width=\"10\" height=\"10\" fill=\"{c}\"/>\
                 <text x=\"{tx}\" y=\"{ty}\" data-legend=\"{si}\">{}</text>",
                escape(&name),
                x = num(x),
                sy = num(cy - 5.0),
                c = colour(si),
                tx = num(x + 15.0),
                ty = num(cy + FONT_SIZE * 0.35),
            );
            x += item + 16.0;
        }
        out.push_str("</g>");
        (out, row + 1)
    }
}

/// A series' values as drawn, and their range.
struct Clean {
    values: Vec<f64>,
    min: f64,
    max: f64,
}

/// Maps values to y coordinates in the plot.
struct Scale {
    lo: f64,
    hi: f64,
}

impl Scale {
    fn y(&self, v: f64) -> f64 {
        let span = self.hi - self.lo;
        if !(span.is_finite() && span > 0.0 && v.is_finite()) {
            return PLOT_BOTTOM;
        }
        let f = ((v - self.lo) / span).clamp(0.0, 1.0);
        PLOT_BOTTOM - f * (PLOT_BOTTOM - PLOT_TOP)
    }
}

/// The y axis's scale and ticks: nice ticks around every value and zero,
/// or 0 to 1 with none for an empty chart.
fn y_range(values: &[Clean], empty: bool) -> (Scale, Vec<f64>) {
    if empty {
        return (Scale { lo: 0.0, hi: 1.0 }, Vec::new());
    }
    let (min, max) = values.iter().fold((0.0_f64, 0.0_f64), |(lo, hi), v| {
        (lo.min(v.min), hi.max(v.max))
    });
    let ticks = nice_ticks(min, max);
    let lo = ticks.first().copied().unwrap_or(0.0);
    let hi = ticks.last().copied().unwrap_or(1.0);
    (Scale { lo, hi }, ticks)
}

/// The axis lines.
fn axis_lines(out: &mut String) {
    let _ = write!(
        out,
        "<g class=\"axes\" stroke=\"currentColor\" stroke-opacity=\"0.6\">\
         <line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{b}\"/>\
         <line x1=\"{l}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\"/></g>",
        l = num(PLOT_LEFT),
        t = num(PLOT_TOP),
        b = num(PLOT_BOTTOM),
        r = num(PLOT_RIGHT),
    );
}

fn colour(index: usize) -> &'static str {
    PALETTE[index % PALETTE.len()]
}

fn band_width(n: usize) -> f64 {
    (PLOT_RIGHT - PLOT_LEFT) / n.max(1) as f64
}

fn band_center(i: usize, n: usize) -> f64 {
    PLOT_LEFT + band_width(n) * (i as f64 + 0.5)
}

/// The x labels to draw, as (bucket index, text, centre x): at most
/// [`MAX_X_LABELS`], fewer if long labels would overlap, spread evenly and
/// always with the first and the last bucket.
fn x_labels(buckets: &[String]) -> Vec<(usize, String, f64)> {
    let n = buckets.len();
    let mut placed = Vec::new();
    for k in (n.min(2)..=n.min(MAX_X_LABELS)).rev() {
        placed = label_indices(n, k)
            .into_iter()
            .map(|i| {
                let text = truncate(&buckets[i], MAX_LABEL_CHARS);
                let half = text_width(&text) / 2.0;
                // Inside the viewBox even at the edges.
                let x = band_center(i, n).clamp(half + 2.0, (WIDTH - half - 2.0).max(half + 2.0));
                (i, text, x)
            })
            .collect();
        let apart = placed.windows(2).all(|w| {
            w[1].2 - w[0].2 >= (text_width(&w[0].1) + text_width(&w[1].1)) / 2.0 + LABEL_GAP
        });
        if apart {
            break;
        }
    }
    placed
}

/// `k` of `n` indices spread evenly, with the first and the last.
fn label_indices(n: usize, k: usize) -> Vec<usize> {
    if k >= n {
        return (0..n).collect();
    }
    if k <= 1 {
        return vec![0];
    }
    let mut out: Vec<usize> = (0..k)
        .map(|j| ((j * (n - 1)) as f64 / (k - 1) as f64).round() as usize)
        .collect();
    out.dedup();
    out
}

/// Round y axis ticks covering `[min, max]` (min ≤ 0 ≤ max): 3 to 5 multiples
/// of a step of 1, 2 or 5 × 10ⁿ, from 0 or below `min` to at least `max`.
fn nice_ticks(min: f64, max: f64) -> Vec<f64> {
    let (min, max) = (min.min(0.0), max.max(0.0));
    let span = max - min;
    if !(span.is_finite() && span > 0.0) {
        return vec![0.0, 1.0];
    }
    // The step can only be larger than span / 4: start one decade below.
    let mut magnitude = 10f64.powf((span / 4.0).log10().floor() - 1.0);
    if !(magnitude.is_finite() && magnitude > 0.0) {
        return vec![min, max];
    }
    for _ in 0..4 {
        for m in [1.0, 2.0, 5.0] {
            let step = m * magnitude;
            let first = (min / step + 1e-9).floor();
            let last = (max / step - 1e-9).ceil();
            let intervals = last - first;
            if intervals <= 4.0 {
                let (first, last) = (first as i64, last as i64);
                let ticks: Vec<f64> = (first..=last)
                    .map(|k| {
                        let t = k as f64 * step;
                        // Keep 0.30000000000000004 from showing up.
                        round_sig(t)
                    })
                    .collect();
                if ticks.iter().all(|t| t.is_finite()) && ticks.len() >= 2 {
                    return ticks;
                }
                return vec![min, max];
            }
        }
        magnitude *= 10.0;
    }
    vec![min, max]
}

/// Rounds to 12 significant digits.
fn round_sig(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let text = format!("{v:.11e}");
    text.parse().unwrap_or(v)
}

/// `id` with only `[a-z0-9-]` kept.
fn sanitize_id(id: &str) -> String {
    id.chars()
        .filter(|c| matches!(c, 'a'..='z' | '0'..='9' | '-'))
        .collect()
}

/// Escapes text for XML content and attribute values; drops characters XML
/// does not allow.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' | '\r' => out.push(c),
            '\u{0}'..='\u{1f}' | '\u{7f}' | '\u{fffe}' | '\u{ffff}' => {}
            _ => out.push(c),
        }
    }
    out
}

/// At most `max` characters, with an ellipsis when cut.
fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('\u{2026}');
    out
}

/// A rough width of text at [`FONT_SIZE`], for layout.
fn text_width(text: &str) -> f64 {
    text.chars()
        .map(|c| if c.is_ascii() { 7.5 } else { 12.0 })
        .sum()
}

/// A value for `data-value` and hover text: up to 6 decimals (6 significant
/// digits below 1), no trailing zeros: `3`, `0.25`, `12.5`, `0.333333`.
fn format_value(v: f64) -> String {
    if !v.is_finite() || v == 0.0 {
        return "0".to_owned();
    }
    let decimals = if v.abs() >= 1.0 {
        6
    } else {
        // 0.0123 → floor(log10) = -2 → 7 decimals → 0.0123000.
        ((5.0 - v.abs().log10().floor()) as usize).min(15)
    };
    trim_zeros(format!("{v:.decimals$}"))
}

fn trim_zeros(mut text: String) -> String {
    if text.contains('.') {
        let keep = text.trim_end_matches('0').trim_end_matches('.').len();
        text.truncate(keep);
    }
    if text == "-0" {
        text = "0".to_owned();
    }
    text
}

/// A y axis label: compact for large values (`15k`, `2.5M`).
fn tick_label(v: f64) -> String {
    let a = v.abs();
    let units = [
        (1e12, 1e12, "T"),
        (1e9, 1e9, "G"),
        (1e6, 1e6, "M"),
        (1e4, 1e3, "k"),
    ];
    for (from, scale, suffix) in units {
        if a >= from {
            if a >= 1e15 {
                return format!("{v:e}");
            }
            return format!("{}{suffix}", format_value(round_sig(v / scale)));
        }
    }
    format_value(v)
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// A coordinate: at most 2 decimals, no trailing zeros.
fn num(v: f64) -> String {
    if !v.is_finite() {
        return "0".to_owned();
    }
    trim_zeros(format!("{v:.2}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(kind: ChartKind, buckets: &[&str], series: &[(&str, &[f64])]) -> Chart {
        Chart {
            id: "test".into(),
            title: "Test".into(),
            unit: "jobs".into(),
            kind,
            buckets: buckets.iter().map(|b| b.to_string()).collect(),
            series: series
                .iter()
                .map(|(name, values)| Series {
                    name: name.to_string(),
                    values: values.to_vec(),
                })
                .collect(),
        }
    }

    /// The value of `name="…"` in a start tag.
    fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
        let key = format!(" {name}=\"");
        let start = tag.find(&key)? + key.len();
        let len = tag[start..].find('"')?;
        Some(&tag[start..start + len])
    }

    /// The start tags of every element named `name`.
    fn tags<'a>(svg: &'a str, name: &str) -> Vec<&'a str> {
        let open = format!("<{name} ");
        let mut out = Vec::new();
        let mut rest = svg;
        while let Some(at) = rest.find(&open) {
            let tag = &rest[at..];
            let end = tag.find('>').expect("an unterminated tag");
            out.push(&tag[..=end]);
            rest = &tag[end..];
        }
        out
    }

    /// Each series group's name and its body (up to its closing `</g>`;
    /// series groups hold no nested groups).
    fn series_groups(svg: &str) -> Vec<(String, &str)> {
        let mut out = Vec::new();
        let mut rest = svg;
        while let Some(at) = rest.find("<g class=\"series\"") {
            let group = &rest[at..];
            let open_end = group.find('>').unwrap();
            let name = attr(&group[..=open_end], "data-series").unwrap().to_owned();
            let close = group.find("</g>").unwrap();
            out.push((name, &group[..close]));
            rest = &group[close..];
        }
        out
    }

    /// (bucket, value, tag) of each data point, in order.
    fn points<'a>(body: &'a str, element: &str) -> Vec<(&'a str, &'a str, &'a str)> {
        tags(body, element)
            .into_iter()
            .filter_map(|t| Some((attr(t, "data-bucket")?, attr(t, "data-value")?, t)))
            .collect()
    }

    fn f(tag: &str, name: &str) -> f64 {
        attr(tag, name).unwrap().parse().unwrap()
    }

    fn ticks(svg: &str) -> Vec<f64> {
        tags(svg, "text")
            .into_iter()
            .filter_map(|t| attr(t, "data-tick"))
            .map(|v| v.parse().unwrap())
            .collect()
    }

    fn drawn_x_labels(svg: &str) -> Vec<String> {
        let start = svg.find("<g class=\"x-axis\"").unwrap();
        let group = &svg[start..start + svg[start..].find("</g>").unwrap()];
        group
            .split("<text ")
            .skip(1)
            .map(|t| {
                let body = &t[t.find('>').unwrap() + 1..];
                body[..body.find("</text>").unwrap()].to_owned()
            })
            .collect()
    }

    #[test]
    fn hostile_text_is_escaped_everywhere() {
        let evil = "<script>&\"'";
        let mut c = chart(ChartKind::StackedBars, &[evil, "b"], &[(evil, &[1.0, 2.0])]);
        c.title = evil.into();
        c.unit = evil.into();
        for kind in [ChartKind::StackedBars, ChartKind::Lines] {
            c.kind = kind;
            let svg = c.svg();
            assert!(!svg.contains("<script"), "{svg}");
            assert!(!svg.contains("&\""));
            assert!(!svg.contains("'"), "no raw apostrophe anywhere: {svg}");
            let escaped = "&lt;script&gt;&amp;&quot;&#39;";
            assert!(svg.contains(&format!("<title id=\"chart-test-title\">{escaped}</title>")));
            assert!(svg.contains(&format!("data-series=\"{escaped}\"")));
            assert!(svg.contains(&format!("data-bucket=\"{escaped}\"")));
            // Bucket, series and unit in the hover text.
            assert!(svg.contains(&format!(
                "<title>{escaped} \u{b7} {escaped}: 1 {escaped}</title>"
            )));
            // Every `&` starts an entity.
            for (i, _) in svg.match_indices('&') {
                let rest = &svg[i..];
                assert!(
                    ["&lt;", "&gt;", "&amp;", "&quot;", "&#39;"]
                        .iter()
                        .any(|e| rest.starts_with(e)),
                    "bare & at {i}"
                );
            }
        }
    }

    #[test]
    fn every_series_and_bucket_appears_once_with_its_value() {
        let buckets = ["14:00", "14:05", "14:10", "14:15"];
        let series: &[(&str, &[f64])] = &[
            ("succeeded", &[3.0, 0.0, 12.5, 1.0]),
            ("failed", &[0.25, 0.0, 0.0, 2.0 / 3.0]),
            ("all zero", &[0.0, 0.0, 0.0, 0.0]),
        ];
        let expected = [
            ["3", "0", "12.5", "1"],
            ["0.25", "0", "0", "0.666667"],
            ["0", "0", "0", "0"],
        ];
        for (kind, element) in [
            (ChartKind::StackedBars, "rect"),
            (ChartKind::Lines, "circle"),
        ] {
            let svg = chart(kind, &buckets, series).svg();
            let groups = series_groups(&svg);
            let names: Vec<&str> = groups.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["succeeded", "failed", "all zero"]);
            for ((_, body), want) in groups.iter().zip(expected) {
                let got: Vec<(&str, &str)> = points(body, element)
                    .iter()
                    .map(|(b, v, _)| (*b, *v))
                    .collect();
                let want: Vec<(&str, &str)> = buckets.iter().copied().zip(want).collect();
                assert_eq!(got, want, "{kind:?}");
            }
            // No data point outside a series group.
            assert_eq!(svg.matches("data-bucket=").count(), 12);
            // Hover text.
            assert!(svg.contains("<title>failed \u{b7} 14:15: 0.666667 jobs</title>"));
        }
    }

    #[test]
    fn missing_and_odd_values_are_zero() {
        let c = chart(
            ChartKind::StackedBars,
            &["a", "b", "c", "d"],
            &[("s", &[f64::NAN, -4.0, f64::INFINITY])],
        );
        assert!(c.is_empty());
        let svg = c.svg();
        let got: Vec<&str> = points(&svg, "rect").iter().map(|p| p.1).collect();
        assert_eq!(got, ["0", "0", "0", "0"]);
        assert!(svg.contains(EMPTY_TEXT));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));

        // Lines keep negative values.
        let c = chart(ChartKind::Lines, &["a", "b"], &[("s", &[-3.0, f64::NAN])]);
        assert!(!c.is_empty());
        let svg = c.svg();
        let got: Vec<&str> = points(&svg, "circle").iter().map(|p| p.1).collect();
        assert_eq!(got, ["-3", "0"]);
        assert_eq!(ticks(&svg), [-3.0, -2.0, -1.0, 0.0]);
    }

    #[test]
    fn stacked_bars_add_up() {
        let buckets = ["a", "b", "c"];
        let series: &[(&str, &[f64])] = &[
            ("x", &[1.0, 0.0, 3.3]),
            ("y", &[2.0, 0.0, 0.0]),
            ("z", &[4.0, 5.0, 1.1]),
        ];
        let svg = chart(ChartKind::StackedBars, &buckets, series).svg();
        let top = *ticks(&svg).last().unwrap();
        assert_eq!(top, 8.0);
        let per_unit = (PLOT_BOTTOM - PLOT_TOP) / top;
        let groups = series_groups(&svg);
        for (i, bucket) in buckets.iter().enumerate() {
            let rects: Vec<&str> = groups
                .iter()
                .map(|(_, body)| {
                    let p = points(body, "rect");
                    assert_eq!(p[i].0, *bucket);
                    p[i].2
                })
                .collect();
            // Each rect starts where the one below ends, from the axis up.
            let mut bottom = PLOT_BOTTOM;
            let mut sum = 0.0;
            for rect in &rects {
                let (y, h) = (f(rect, "y"), f(rect, "height"));
                assert!(h >= 0.0);
                assert!((y + h - bottom).abs() < 0.011, "{rect}");
                assert!(
                    (h - f(rect, "data-value") * per_unit).abs() < 0.02,
                    "{rect}"
                );
                bottom = y;
                sum += f(rect, "data-value");
            }
            // The top of the stack is the sum.
            assert!((PLOT_BOTTOM - bottom - sum * per_unit).abs() < 0.02);
        }
        // The highest stack (7) fits under the top tick.
        assert!(PLOT_BOTTOM - 7.0 * per_unit >= PLOT_TOP);
    }

    #[test]
    fn y_ticks_are_round() {
        assert_eq!(nice_ticks(0.0, 7.0), [0.0, 2.0, 4.0, 6.0, 8.0]);
        assert_eq!(nice_ticks(0.0, 10.0), [0.0, 5.0, 10.0]);
        assert_eq!(nice_ticks(0.0, 1.0), [0.0, 0.5, 1.0]);
        assert_eq!(nice_ticks(0.0, 0.3), [0.0, 0.1, 0.2, 0.3]);
        assert_eq!(nice_ticks(0.0, 1234.0), [0.0, 500.0, 1000.0, 1500.0]);
        assert_eq!(nice_ticks(-3.0, 0.0), [-3.0, -2.0, -1.0, 0.0]);
        assert_eq!(nice_ticks(-7.0, 0.0), [-8.0, -6.0, -4.0, -2.0, 0.0]);
        assert_eq!(nice_ticks(-3.0, 5.0), [-5.0, 0.0, 5.0]);
        for max in [
            1e-9, 0.0007, 0.013, 0.999, 1.0, 1.5, 3.0, 7.0, 9.99, 11.0, 99.0, 101.0, 12345.0,
            7.7e8, 1e300,
        ] {
            let t = nice_ticks(0.0, max);
            assert!((3..=5).contains(&t.len()), "{max}: {t:?}");
            assert_eq!(t[0], 0.0);
            assert!(*t.last().unwrap() >= max, "{max}: {t:?}");
            let step = t[1];
            let mantissa = step / 10f64.powf(step.log10().floor());
            assert!(
                [1.0, 2.0, 5.0].iter().any(|m| (mantissa - m).abs() < 1e-6),
                "{max}: step {step}"
            );
            for w in t.windows(2) {
                assert!(((w[1] - w[0]) / step - 1.0).abs() < 1e-9, "{max}: {t:?}");
            }
        }
        // Degenerate input never panics.
        assert_eq!(nice_ticks(0.0, 0.0), [0.0, 1.0]);
        assert_eq!(nice_ticks(f64::NAN, f64::NAN), [0.0, 1.0]);
        assert_eq!(nice_ticks(0.0, f64::MAX).len(), 2);

        let svg = chart(ChartKind::Lines, &["a"], &[("s", &[7.0])]).svg();
        assert_eq!(ticks(&svg), [0.0, 2.0, 4.0, 6.0, 8.0]);
        let svg = chart(ChartKind::StackedBars, &["a"], &[("s", &[25_000.0])]).svg();
        assert!(svg.contains(">30k</text>"), "{svg}");
        assert_eq!(tick_label(2500.0), "2500");
        assert_eq!(tick_label(10_000.0), "10k");
        assert_eq!(tick_label(2_500_000.0), "2.5M");
        assert_eq!(tick_label(0.05), "0.05");
    }

    #[test]
    fn x_labels_are_thinned_keeping_first_and_last() {
        assert_eq!(label_indices(0, 6), Vec::<usize>::new());
        assert_eq!(label_indices(1, 6), [0]);
        assert_eq!(label_indices(6, 6), [0, 1, 2, 3, 4, 5]);
        assert_eq!(label_indices(7, 6), [0, 1, 2, 4, 5, 6]);
        assert_eq!(label_indices(7, 2), [0, 6]);
        for n in 7..=1500 {
            let idx = label_indices(n, MAX_X_LABELS);
            assert_eq!(idx.len(), MAX_X_LABELS, "{n}");
            assert_eq!(idx[0], 0);
            assert_eq!(*idx.last().unwrap(), n - 1);
            assert!(idx.windows(2).all(|w| w[0] < w[1]), "{n}: {idx:?}");
        }

        let buckets: Vec<String> = (0..288)
            .map(|i| format!("{:02}:{:02}", i / 12, i % 12 * 5))
            .collect();
        let refs: Vec<&str> = buckets.iter().map(String::as_str).collect();
        let values = vec![1.0; 288];
        let svg = chart(ChartKind::StackedBars, &refs, &[("s", &values)]).svg();
        let labels = drawn_x_labels(&svg);
        assert_eq!(labels.len(), 6);
        assert_eq!(labels.first().unwrap(), "00:00");
        assert_eq!(labels.last().unwrap(), "23:55");
        // Labels stay inside the viewBox.
        for t in tags(&svg, "text") {
            let x = f(t, "x");
            assert!((0.0..=WIDTH).contains(&x), "{t}");
        }

        // Long labels: fewer of them, still first and last, not overlapping.
        for n in [2, 3, 6, 7, 48, 1500] {
            let buckets: Vec<String> = (0..n)
                .map(|i| format!("2026-12-{:02} {:02}:00", 1 + i / 24 % 28, i % 24))
                .collect();
            let placed = x_labels(&buckets);
            assert!(placed.len() >= 2 && placed.len() <= MAX_X_LABELS, "{n}");
            assert_eq!(placed[0].0, 0);
            assert_eq!(placed.last().unwrap().0, n - 1);
            for (_, text, x) in &placed {
                let half = text_width(text) / 2.0;
                assert!(x - half >= 0.0 && x + half <= WIDTH, "{n}: {text} at {x}");
            }
            for w in placed.windows(2) {
                let right_of_first = w[0].2 + text_width(&w[0].1) / 2.0;
                let left_of_second = w[1].2 - text_width(&w[1].1) / 2.0;
                assert!(right_of_first < left_of_second, "{n}: {placed:?}");
            }
            if n >= 6 {
                assert!(
                    placed.len() < MAX_X_LABELS,
                    "16 characters do not fit 6 times"
                );
            }
        }
        let one = x_labels(&["only".to_owned()]);
        assert_eq!(one.len(), 1);
        assert!(x_labels(&[]).is_empty());
    }

    #[test]
    fn empty_charts_say_so() {
        let none = chart(ChartKind::Lines, &[], &[]);
        assert!(none.is_empty());
        let zeros = chart(ChartKind::StackedBars, &["a", "b"], &[("s", &[0.0, 0.0])]);
        assert!(zeros.is_empty());
        let no_series = chart(ChartKind::StackedBars, &["a", "b"], &[]);
        assert!(no_series.is_empty());
        let short = chart(ChartKind::Lines, &["a", "b"], &[("s", &[])]);
        assert!(short.is_empty());
        for c in [&none, &zeros, &no_series, &short] {
            let svg = c.svg();
            assert_eq!(svg.matches(EMPTY_TEXT).count(), 1, "{svg}");
            assert!(svg.contains("<g class=\"axes\""));
            assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>"));
            assert!(!svg.contains("<polyline"));
        }
        // Zeros are still machine-readable.
        assert_eq!(points(&zeros.svg(), "rect").len(), 2);
        assert_eq!(points(&short.svg(), "circle").len(), 2);

        let some = chart(ChartKind::StackedBars, &["a", "b"], &[("s", &[0.0, 0.5])]);
        assert!(!some.is_empty());
        assert!(!some.svg().contains(EMPTY_TEXT));
        let lines = chart(ChartKind::Lines, &["a", "b"], &[("s", &[0.0, 0.5])]).svg();
        assert_eq!(lines.matches("<polyline").count(), 1);
    }

    #[test]
    fn ids_are_sanitised() {
        let mut c = chart(ChartKind::Lines, &["a"], &[("s", &[1.0])]);
        c.id = "Jobs per-hour\"><script>1".into();
        let svg = c.svg();
        let root = tags(&svg, "svg")[0];
        assert_eq!(attr(root, "id"), Some("chart-obsper-hourscript1"));
        assert_eq!(
            attr(root, "aria-labelledby"),
            Some("chart-obsper-hourscript1-title")
        );
        assert!(svg.contains("<title id=\"chart-obsper-hourscript1-title\">"));
        assert_eq!(sanitize_id("ok-1_2 é"), "ok-12");
    }

    #[test]
    fn root_element_is_responsive() {
        let svg = chart(ChartKind::Lines, &["a"], &[("s", &[1.0])]).svg();
        let root = tags(&svg, "svg")[0];
        assert_eq!(attr(root, "class"), Some("chart"));
        assert_eq!(attr(root, "role"), Some("img"));
        assert_eq!(attr(root, "viewBox"), Some("0 0 440 240"));
        assert_eq!(attr(root, "preserveAspectRatio"), Some("xMidYMid meet"));
        // Sized by the stylesheet (`svg.chart`): the CSP refuses inline styles.
        assert_eq!(attr(root, "style"), None);
        // No text smaller than 11 units.
        for size in svg.split("font-size=\"").skip(1) {
            let size: f64 = size[..size.find('"').unwrap()].parse().unwrap();
            assert!(size >= 11.0);
        }
    }

    #[test]
    fn legend_wraps_and_colours_follow_the_index() {
        let names: Vec<String> = (0..16).map(|i| format!("provider-number-{i}")).collect();
        let series: Vec<(&str, &[f64])> = names.iter().map(|n| (n.as_str(), &[1.0][..])).collect();
        let c = chart(ChartKind::StackedBars, &["a"], &series);
        let svg = c.svg();
        let legend_start = svg.find("<g class=\"legend\"").unwrap();
        let legend = &svg[legend_start..];
        let items = tags(legend, "text");
        assert_eq!(items.len(), 16);
        let rows: std::collections::BTreeSet<String> = items
            .iter()
            .map(|t| attr(t, "y").unwrap().to_owned())
            .collect();
        assert!(rows.len() > 1, "the legend wraps");
        for t in &items {
            let name = &names[attr(t, "data-legend").unwrap().parse::<usize>().unwrap()];
            assert!(f(t, "x") + text_width(name) <= WIDTH - LEGEND_LEFT, "{t}");
        }
        // The viewBox grows with the rows, never the width.
        let root = tags(&svg, "svg")[0];
        let height = BASE_HEIGHT + LEGEND_ROW * (rows.len() - 1) as f64;
        assert_eq!(
            attr(root, "viewBox"),
            Some(format!("0 0 440 {}", num(height)).as_str())
        );
        let last_row: f64 = rows
            .iter()
            .map(|r| r.parse::<f64>().unwrap())
            .fold(0.0, f64::max);
        assert!(last_row < height);
        // Colours by index, cycling after 8.
        let groups = tags(&svg, "g");
        let fills: Vec<&str> = groups
            .iter()
            .filter(|g| g.contains("class=\"series\""))
            .map(|g| attr(g, "fill").unwrap())
            .collect();
        assert_eq!(fills.len(), 16);
        assert_eq!(&fills[..8], &PALETTE[..]);
        assert_eq!(&fills[8..], &PALETTE[..]);
    }

    #[test]
    fn values_are_formatted_briefly() {
        assert_eq!(format_value(3.0), "3");
        assert_eq!(format_value(0.25), "0.25");
        assert_eq!(format_value(12.5), "12.5");
        assert_eq!(format_value(1.0 / 3.0), "0.333333");
        assert_eq!(format_value(0.000_123_456_789), "0.000123457");
        assert_eq!(format_value(1_234_567.0), "1234567");
        assert_eq!(format_value(-0.0), "0");
        assert_eq!(format_value(-2.5), "-2.5");
        assert_eq!(format_value(1e-300), "0");
        assert_eq!(format_value(f64::NAN), "0");
    }

    #[test]
    fn output_is_deterministic_and_bounded() {
        let buckets: Vec<String> = (0..1500).map(|i| format!("b{i}")).collect();
        let refs: Vec<&str> = buckets.iter().map(String::as_str).collect();
        let values: Vec<f64> = (0..1500).map(|i| (i % 7) as f64).collect();
        let series: Vec<(&str, &[f64])> = (0..16).map(|_| ("s", &values[..])).collect();
        for kind in [ChartKind::StackedBars, ChartKind::Lines] {
            let c = chart(kind, &refs, &series);
            let a = c.svg();
            assert_eq!(a, c.svg());
            assert_eq!(a.matches("data-bucket=").count(), 1500 * 16);
        }
        let huge = chart(
            ChartKind::StackedBars,
            &["a"],
            &[("s", &[f64::MAX]), ("t", &[f64::MAX])],
        );
        let svg = huge.svg();
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
    }
}
