//! `cargo xtask plot-bench SUMMARY.json OUT.svg`: the side-by-side GPU benchmark as a bar chart (GPU time per
//! decode step, log scale, one group per config and position, the HBM floor marked), from the `summary.json`
//! that `gpu/summarize.py` writes on the GPU machine (rows of an earlier run, added to it under the run name
//! "ours, zero-copy + CUDA graph, before issue 19", are drawn beside today's).

use std::path::Path;

use anyhow::{bail, Context};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

/// The chart's µs range.
const Y_MIN: f64 = 5.0;
const Y_MAX: f64 = 20000.0;

/// The runs drawn, in order, with their colours.
const RUNS: [(&str, RGBColor); 7] = [
    ("PyTorch eager, SDPA", RGBColor(190, 190, 190)),
    ("PyTorch CUDA graph, SDPA", RGBColor(120, 120, 120)),
    ("PyTorch CUDA graph + upstream copy-back", RGBColor(60, 60, 60)),
    ("ours, copy-back (upstream's layout)", RGBColor(253, 174, 97)),
    ("ours, zero-copy", RGBColor(116, 173, 209)),
    ("ours, zero-copy + CUDA graph, before issue 19", RGBColor(171, 217, 233)),
    ("ours, zero-copy + CUDA graph", RGBColor(33, 102, 172)),
];

pub fn run(summary: &Path, out: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(summary).with_context(|| format!("reading {}", summary.display()))?;
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&text).context("summary.json is not a JSON list")?;
    let groups = groups(&rows);
    if groups.is_empty() {
        bail!("{} has no benchmark rows", summary.display());
    }
    let root = SVGBackend::new(out, (1100, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = axes(&root, &groups)?;
    draw_bars(&mut chart, &rows, &groups)?;
    draw_floors(&mut chart, &groups)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    println!("wrote {}", out.display());
    Ok(())
}

/// One group of bars: a config at a position, with its HBM floor in µs.
struct Group {
    config: String,
    position: i64,
    floor_us: f64,
}

/// The chart: groups along x, µs per step on a log scale along y.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, LogCoord<f64>>>;

/// Groups in order of appearance: (config, position).
fn groups(rows: &[serde_json::Value]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for row in rows.iter().filter(|r| r["run"].is_string()) {
        let (config, position) =
            (row["config"].as_str().unwrap_or("?").to_owned(), row["position"].as_i64().unwrap_or(0));
        if !groups.iter().any(|g| (&g.config, g.position) == (&config, position)) {
            groups.push(Group { config, position, floor_us: row["floor_us"].as_f64().unwrap_or(0.0) });
        }
    }
    groups
}

/// The caption, the axes and one x label per group.
fn axes<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    groups: &[Group],
) -> anyhow::Result<Chart<'a, 'b>> {
    let n = groups.len();
    let mut chart = ChartBuilder::on(root)
        .caption(
            "GPU time per decode step, NVIDIA H200 (lower is better; dashes: HBM floor)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), (Y_MIN..Y_MAX).log_scale())?;
    let labels: Vec<String> =
        groups.iter().map(|g| format!("({}) position {}", g.config, g.position)).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("µs per step")
        .draw()?;
    Ok(chart)
}

/// One series of bars per run, one bar per group that has the run's row.
fn draw_bars(chart: &mut Chart<'_, '_>, rows: &[serde_json::Value], groups: &[Group]) -> anyhow::Result<()> {
    let value = |config: &str, position: i64, run: &str| {
        rows.iter()
            .find(|r| r["config"] == config && r["position"] == position && r["run"] == run)
            .and_then(|r| r["gpu_us"].as_f64())
    };
    let width = 0.9 / RUNS.len() as f64;
    for (series, (run, color)) in RUNS.iter().enumerate() {
        let bars: Vec<Rectangle<(f64, f64)>> = groups
            .iter()
            .enumerate()
            .filter_map(|(g, group)| {
                let v = value(&group.config, group.position, run)?;
                let x0 = g as f64 - 0.45 + series as f64 * width;
                Some(Rectangle::new([(x0, Y_MIN), (x0 + width * 0.9, v)], color.filled()))
            })
            .collect();
        chart
            .draw_series(bars)?
            .label(*run)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    Ok(())
}

/// Each group's HBM floor as a dashed line across its bars.
fn draw_floors(chart: &mut Chart<'_, '_>, groups: &[Group]) -> anyhow::Result<()> {
    for (g, group) in groups.iter().enumerate() {
        // A floor below the axis (config (a) reads a few KiB) is not drawn.
        if group.floor_us >= Y_MIN {
            let x = g as f64;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x - 0.47, group.floor_us), (x + 0.47, group.floor_us)],
                BLACK.stroke_width(2),
            )))?;
        }
    }
    Ok(())
}
