//! The timeline picture, hand-written SVG (no drawing library, no system fonts): one row
//! per key, a bar per holding coloured by worker, fault windows shaded, overlaps marked.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::checker::Holding;
use crate::nemesis::Injected;
use crate::store::{WriteOutcome, WriteRecord};

const WIDTH: f64 = 1400.0;
const LEFT: f64 = 150.0;
const TOP: f64 = 72.0;
const ROW: f64 = 26.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Draws the run from `start_ns` to `end_ns`.
///
/// ```
/// let svg = dlock_torture::timeline::render("run", 0, 1_000_000_000, 2, &[], &[], &[]);
/// assert!(svg.starts_with("<svg"));
/// ```
pub fn render(
    title: &str,
    start_ns: u64,
    end_ns: u64,
    workers: usize,
    holdings: &[Holding],
    records: &[WriteRecord],
    faults: &[Injected],
) -> String {
    let keys: BTreeSet<&str> = holdings
        .iter()
        .map(|h| h.acquired.key.as_str())
        .chain(records.iter().map(|r| r.key.as_str()))
        .collect();
    let keys: Vec<&str> = keys.into_iter().collect();
    let row_of = |key: &str| keys.iter().position(|k| *k == key).unwrap_or(0);
    let span = end_ns.saturating_sub(start_ns).max(1) as f64;
    let x =
        |t: u64| LEFT + (t.saturating_sub(start_ns) as f64 / span).min(1.0) * (WIDTH - LEFT - 20.0);
    let height = TOP + ROW * keys.len() as f64 + 60.0;
    let color = |w: usize| format!("hsl({},70%,45%)", (w * 360) / workers.max(1));
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="10" y="18" font-size="13">{}</text>"#,
        escape(title)
    );
    let _ = writeln!(
        svg,
        r#"<text x="10" y="34">bars: holdings, coloured by worker; grey: fault windows; orange dot: overlap rejected by fencing or abandoned; red cross: overlap with both writes accepted</text>"#
    );
    for w in 0..workers {
        let lx = LEFT + 90.0 * w as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{lx:.1}" y="40" width="10" height="10" fill="{}"/><text x="{:.1}" y="49">worker {w}</text>"#,
            color(w),
            lx + 14.0
        );
    }
    for f in faults {
        let (x0, x1) = (x(f.start_ns), x(f.end_ns).max(x(f.start_ns) + 1.0));
        let _ = writeln!(
            svg,
            r#"<rect x="{x0:.1}" y="{}" width="{:.1}" height="{:.1}" fill="black" fill-opacity="0.12"><title>{}</title></rect>"#,
            TOP - 12.0,
            x1 - x0,
            ROW * keys.len() as f64 + 12.0,
            escape(&f.to_string())
        );
        let _ = writeln!(
            svg,
            r#"<text x="{x0:.1}" y="{:.1}" font-size="9" transform="rotate(30 {x0:.1} {:.1})">{}</text>"#,
            TOP + ROW * keys.len() as f64 + 12.0,
            TOP + ROW * keys.len() as f64 + 12.0,
            escape(f.planned.kind.name())
        );
    }
    for (i, key) in keys.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        let _ = writeln!(
            svg,
            r#"<text x="10" y="{:.1}">{}</text><line x1="{LEFT}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="lightgrey"/>"#,
            y + ROW * 0.6,
            escape(key),
            WIDTH - 20.0,
            y + ROW,
            y + ROW
        );
    }
    for h in holdings {
        let y = TOP + ROW * row_of(&h.acquired.key) as f64 + 4.0;
        let end = h.end.map_or(end_ns, |(_, called, _)| called);
        let (x0, x1) = (x(h.acquired.returned), x(end));
        let opacity = if h.acquired.kind == crate::events::HoldKind::Permit {
            0.45
        } else {
            0.8
        };
        let _ = writeln!(
            svg,
            r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="{opacity}"><title>worker {} fence {:?}</title></rect>"#,
            (x1 - x0).max(0.5),
            ROW - 8.0,
            color(h.worker),
            h.worker,
            h.acquired.fence
        );
        if let Some(lost) = h.lost {
            let lx = x(lost);
            let _ = writeln!(
                svg,
                r#"<line x1="{lx:.1}" x2="{lx:.1}" y1="{y:.1}" y2="{:.1}" stroke="black" stroke-width="2"><title>lost() worker {}</title></line>"#,
                y + ROW - 8.0,
                h.worker
            );
        }
    }
    let by_id: std::collections::HashMap<u64, &WriteRecord> =
        records.iter().map(|r| (r.id, r)).collect();
    for r in records.iter().filter(|r| !r.overlaps.is_empty()) {
        let cy = TOP + ROW * row_of(&r.key) as f64 + ROW / 2.0;
        let cx = x(r.begin_ns);
        let unsafe_pair = r.outcome == WriteOutcome::Accepted
            && r.overlaps
                .iter()
                .filter_map(|id| by_id.get(id))
                .any(|o| o.outcome == WriteOutcome::Accepted);
        if unsafe_pair {
            let _ = writeln!(
                svg,
                r#"<path d="M{:.1} {:.1} L{:.1} {:.1} M{:.1} {:.1} L{:.1} {:.1}" stroke="red" stroke-width="3"><title>overlap, both writes accepted ({})</title></path>"#,
                cx - 6.0,
                cy - 6.0,
                cx + 6.0,
                cy + 6.0,
                cx - 6.0,
                cy + 6.0,
                cx + 6.0,
                cy - 6.0,
                escape(&r.worker)
            );
        } else {
            let _ = writeln!(
                svg,
                r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="4" fill="orange" stroke="black"><title>overlap, {} ({})</title></circle>"#,
                r.outcome.name(),
                escape(&r.worker)
            );
        }
    }
    let seconds = span / 1e9;
    let step = if seconds > 120.0 {
        60.0
    } else if seconds > 20.0 {
        5.0
    } else {
        1.0
    };
    let mut s = 0.0;
    while s <= seconds {
        let tx = LEFT + s / seconds * (WIDTH - LEFT - 20.0);
        let _ = writeln!(
            svg,
            r#"<text x="{tx:.1}" y="{:.1}" font-size="9">{s}s</text>"#,
            TOP - 16.0
        );
        s += step;
    }
    svg.push_str("</svg>\n");
    svg
}
