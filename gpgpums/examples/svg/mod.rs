//! What the examples' SVG plots share: the frame, the title, a series' line and its legend entry,
//! the colours, and escaping.

use std::fmt::Write as _;

/// One colour per series, in turn.
pub const COLOURS: [&str; 8] =
    ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];

/// Starts a `width` x `height` plot on white with `title` at `left`.
pub fn open(width: f64, height: f64, left: f64, title: &str) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{width}" height="{height}" fill="white"/>"#);
    let _ = writeln!(svg, r#"<text x="{left}" y="18">{}</text>"#, escape(title));
    svg
}

/// A series' line through `points` (`x,y` each), `dash` an SVG attribute or empty.
pub fn line(svg: &mut String, colour: &str, width: f64, dash: &str, points: &[String]) {
    let _ = writeln!(
        svg,
        r#"<polyline fill="none" stroke="{colour}" stroke-width="{width}"{dash} points="{}"/>"#,
        points.join(" ")
    );
}

/// A legend entry at (`x`, `y`): a short line of the series' colour and dash, then `label`.
pub fn legend(svg: &mut String, x: f64, y: f64, colour: &str, dash: &str, label: &str) {
    let _ = writeln!(
        svg,
        r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{colour}" stroke-width="3"{dash}/><text x="{}" y="{}">{}</text>"#,
        x + 20.0,
        x + 26.0,
        y + 4.0,
        escape(label)
    );
}

/// Ends the plot and writes it to `path`.
pub fn save(mut svg: String, path: &std::path::Path) -> Result<(), String> {
    svg.push_str("</svg>\n");
    std::fs::write(path, svg).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
