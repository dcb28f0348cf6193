//! The demo's HTML report (`--report FILE`; the default demo writes `demo-report.html`): one
//! self-contained page, no script and nothing fetched, with a timeline per run and the summary.
//!
//! A [`Recorder`] samples the emulator while a run goes: every group's capacity as Azure holds
//! it, its Ready nodes and the pending pods when a simulated cluster runs, and, from the
//! emulator's journal of versions and its request log, when the controller wrote, when it met a
//! 412, when the rival wrote and when a write destroyed a version its writer never read (a lost
//! update). [`render`] draws each timeline as SVG with `plotters` (two panels on one time axis:
//! counts above, the writes as marks in rows below) and puts the tables beside them.

use super::*;
use crate::emulator::kube::KubeState;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use std::fmt::Write as _;

/// The groups' colours (Tableau's ten, readable on white).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// How often the recorder looks.
pub const SAMPLE: Duration = Duration::from_millis(200);

/// What happened at one moment of a run, as the emulator saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkKind {
    /// A write of another writer (the rival) was accepted.
    RivalWrite,
    /// A write of the controller was accepted (a capacity, or instances deleted by name).
    ControllerWrite,
    /// The controller's conditional write was refused with 412 Precondition Failed.
    Conflict,
    /// A write replaced a version its writer had never read.
    LostUpdate,
}

impl MarkKind {
    /// The marks' rows, bottom to top.
    pub const ALL: [MarkKind; 4] = [
        MarkKind::RivalWrite,
        MarkKind::ControllerWrite,
        MarkKind::Conflict,
        MarkKind::LostUpdate,
    ];

    /// The row's label.
    pub fn label(self) -> &'static str {
        match self {
            MarkKind::RivalWrite => "rival writes",
            MarkKind::ControllerWrite => "controller writes",
            MarkKind::Conflict => "412 answers",
            MarkKind::LostUpdate => "lost updates",
        }
    }

    fn row(self) -> usize {
        Self::ALL.iter().position(|k| *k == self).unwrap_or(0)
    }
}

/// One mark on a timeline.
#[derive(Debug, Clone)]
pub struct Mark {
    /// Seconds from the run's start (to the recorder's sampling period).
    pub at: f64,
    /// What it was.
    pub kind: MarkKind,
    /// The resource's name (a scale set, an agent pool, a managed cluster).
    pub resource: String,
}

/// One sample of the groups and the cluster.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds from the run's start.
    pub at: f64,
    /// Capacity per group as Azure holds it (in [`Timeline::groups`] order; None: not there).
    pub capacity: Vec<Option<i64>>,
    /// Ready Nodes per group (empty without a simulated cluster).
    pub ready: Vec<usize>,
    /// Pending pods (None without a simulated cluster).
    pub pending: Option<usize>,
}

/// One run, as the recorder saw it.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// The run's name, e.g. `ETags on`.
    pub title: String,
    /// The node groups, in the samples' order.
    pub groups: Vec<String>,
    /// The samples, oldest first.
    pub samples: Vec<Sample>,
    /// The marks, oldest first.
    pub marks: Vec<Mark>,
}

impl Timeline {
    /// Marks of one kind.
    pub fn count(&self, kind: MarkKind) -> usize {
        self.marks.iter().filter(|m| m.kind == kind).count()
    }

    fn duration(&self) -> f64 {
        self.samples.last().map_or(0.0, |s| s.at)
    }
}

/// Samples a run in the background until [`Recorder::finish`].
pub struct Recorder {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Timeline>,
}

/// Who is who among the emulator's writers.
#[derive(Debug, Clone)]
pub struct Writers {
    /// The controller's client ids (one per replica).
    pub controllers: Vec<String>,
    /// The rival's.
    pub rivals: Vec<String>,
}

impl Recorder {
    /// Starts sampling `state` (and `kube`'s Nodes and pods, when a simulated cluster runs).
    /// The journal and the request log are read from where they are now: what happened before
    /// (seeding) is not drawn.
    pub fn start(
        title: &str,
        state: EmulatorState,
        kube: Option<KubeState>,
        groups: &[NodeGroupSpec],
        writers: Writers,
    ) -> Recorder {
        let stop = CancellationToken::new();
        let groups = groups.to_vec();
        let mut timeline = Timeline {
            title: title.to_string(),
            groups: groups.iter().map(|g| g.name.clone()).collect(),
            ..Timeline::default()
        };
        let (_, mut cursor) = state.changes_since(u64::MAX);
        let (_, mut logged) = state.requests_since(u64::MAX);
        let mut lost_seen = state.lost_updates().len();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                let mut tick = tokio::time::interval(SAMPLE);
                loop {
                    let done = tokio::select! {
                        _ = tick.tick() => false,
                        _ = stop.cancelled() => true,
                    };
                    let at = started.elapsed().as_secs_f64();
                    let (changes, next) = state.changes_since(cursor);
                    cursor = next;
                    for c in changes {
                        let kind = if writers.controllers.contains(&c.writer) {
                            MarkKind::ControllerWrite
                        } else if writers.rivals.contains(&c.writer) {
                            MarkKind::RivalWrite
                        } else {
                            continue;
                        };
                        timeline.marks.push(Mark {
                            at,
                            kind,
                            resource: last_segment(&c.resource),
                        });
                    }
                    let (requests, next) = state.requests_since(logged);
                    logged = next;
                    for r in requests {
                        let mine = r
                            .writer
                            .as_ref()
                            .is_some_and(|w| writers.controllers.contains(w));
                        if mine && r.status == 412 {
                            timeline.marks.push(Mark {
                                at,
                                kind: MarkKind::Conflict,
                                resource: last_segment(&r.path),
                            });
                        }
                    }
                    let lost = state.lost_updates();
                    for l in lost.iter().skip(lost_seen) {
                        timeline.marks.push(Mark {
                            at,
                            kind: MarkKind::LostUpdate,
                            resource: last_segment(&l.resource),
                        });
                    }
                    lost_seen = lost.len();
                    timeline
                        .samples
                        .push(sample(at, &state, kube.as_ref(), &groups));
                    if done {
                        return timeline;
                    }
                }
            })
        };
        Recorder { stop, task }
    }

    /// Stops sampling (after one last sample) and hands the timeline over.
    pub async fn finish(self) -> anyhow::Result<Timeline> {
        self.stop.cancel();
        self.task.await.context("the report's recorder failed")
    }
}

fn sample(
    at: f64,
    state: &EmulatorState,
    kube: Option<&KubeState>,
    groups: &[NodeGroupSpec],
) -> Sample {
    let capacity = groups.iter().map(|g| capacity_of(state, g)).collect();
    let Some(kube) = kube else {
        return Sample {
            at,
            capacity,
            ready: Vec::new(),
            pending: None,
        };
    };
    let mut ready = vec![0; groups.len()];
    for n in kube.list_all("v1", "nodes", None) {
        let Some(g) = pods::group_of_node(&n) else {
            continue;
        };
        if let Some(i) = groups.iter().position(|x| x.name.eq_ignore_ascii_case(&g)) {
            if pods::ready(&n) {
                ready[i] += 1;
            }
        }
    }
    Sample {
        at,
        capacity,
        ready,
        pending: Some(kube.pod_counts(None).pending),
    }
}

/// The name at the end of an ARM id or path (`.../virtualMachineScaleSets/general` -> `general`;
/// an instance delete's `.../general/delete` -> `general`).
fn last_segment(id: &str) -> String {
    let mut parts = id.trim_end_matches('/').rsplit('/');
    let last = parts.next().unwrap_or_default();
    match last {
        "delete" | "deletemachines" | "deleteMachines" => parts.next().unwrap_or(last),
        _ => last,
    }
    .to_string()
}

/// A table of the report: a header row and rows of cells.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// The header cells.
    pub header: Vec<String>,
    /// The rows.
    pub rows: Vec<Vec<String>>,
}

/// A chart of lines over one x axis (`demo --cost`: dollars per hour of each policy and the
/// lower bound).
#[derive(Debug, Clone, Default)]
pub struct LineChart {
    /// Its heading.
    pub title: String,
    /// What the x axis counts.
    pub x_desc: String,
    /// What the y axis counts.
    pub y_desc: String,
    /// `(name, points)`, one line each, in the palette's order.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    /// The caption under it.
    pub caption: String,
}

/// What the page shows: an introduction, a timeline per run, the summary.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The page's title.
    pub title: String,
    /// Paragraphs before the timelines.
    pub intro: Vec<String>,
    /// Line charts, after the introduction.
    pub lines: Vec<LineChart>,
    /// One chart each.
    pub timelines: Vec<Timeline>,
    /// The summary table (may be empty).
    pub table: Table,
    /// Text printed as the demo printed it (a summary that is not a table).
    pub preformatted: Option<String>,
    /// Paragraphs after the summary.
    pub notes: Vec<String>,
}

/// Writes `report` to `path` as one HTML file and says where (the absolute path, to open).
pub fn write(path: &std::path::Path, report: &Report) -> anyhow::Result<()> {
    let html = render(report)?;
    std::fs::write(path, html)
        .with_context(|| format!("writing the demo's report to {}", path.display()))?;
    let shown = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    println!("report: {}", shown.display());
    Ok(())
}

/// The page, self-contained (inline SVG and CSS, no script).
pub fn render(report: &Report) -> anyhow::Result<String> {
    let mut h = String::new();
    let title = escape(&report.title);
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\n\
         <style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #bbb;padding:.3em .7em}}\
         td:not(:first-child),th:not(:first-child){{text-align:right}}\
         figure{{margin:1em 0}}figcaption{{font-size:.9em;color:#555}}pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}</style>\n\
         </head><body>\n<h1>{title}</h1>\n"
    );
    for p in &report.intro {
        let _ = writeln!(h, "<p>{}</p>", escape(p));
    }
    for c in &report.lines {
        let mut svg = String::new();
        draw_lines(c, &mut svg)
            .map_err(|e| anyhow::anyhow!("drawing the chart {:?}: {e}", c.title))?;
        let _ = writeln!(
            h,
            "<h2>{}</h2>\n<figure class=\"lines\">{svg}<figcaption>{}</figcaption></figure>",
            escape(&c.title),
            escape(&c.caption)
        );
    }
    for t in &report.timelines {
        let svg = chart(t)?;
        let counts = MarkKind::ALL
            .iter()
            .map(|k| format!("{} {}", k.label(), t.count(*k)))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            h,
            "<h2>{}</h2>\n<figure class=\"timeline\">{svg}<figcaption>{}</figcaption></figure>",
            escape(&t.title),
            escape(&format!(
                "Above: each group's capacity as Azure holds it (thick){}. Below: {counts}.",
                if t.samples.iter().any(|s| s.pending.is_some()) {
                    ", its Ready nodes (thin) and the pending pods (black, right axis)"
                } else {
                    ""
                }
            ))
        );
    }
    if !report.table.rows.is_empty() {
        h.push_str("<h2>Summary</h2>\n<table>\n<tr>");
        for c in &report.table.header {
            let _ = write!(h, "<th>{}</th>", escape(c));
        }
        h.push_str("</tr>\n");
        for row in &report.table.rows {
            h.push_str("<tr>");
            for c in row {
                let _ = write!(h, "<td>{}</td>", escape(c));
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n");
    }
    if let Some(text) = &report.preformatted {
        let _ = writeln!(h, "<h2>Summary</h2>\n<pre>{}</pre>", escape(text));
    }
    for p in &report.notes {
        let _ = writeln!(h, "<p>{}</p>", escape(p));
    }
    h.push_str("</body></html>\n");
    Ok(h)
}

/// A line chart as SVG, with its legend.
fn draw_lines<'a>(
    c: &LineChart,
    svg: &'a mut String,
) -> Result<(), Box<dyn std::error::Error + 'a>> {
    let root = SVGBackend::with_string(svg, (960, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let points = c.series.iter().flat_map(|(_, p)| p.iter());
    let x_max = points.clone().map(|p| p.0).fold(1.0, f64::max);
    let y_max = points.map(|p| p.1).fold(0.0, f64::max).max(1e-3) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max.ceil(), 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc(c.x_desc.as_str())
        .y_desc(c.y_desc.as_str())
        .draw()?;
    for (i, (name, points)) in c.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// One timeline as SVG: counts above, marks below, one time axis.
fn chart(t: &Timeline) -> anyhow::Result<String> {
    let mut svg = String::new();
    draw(t, &mut svg).map_err(|e| anyhow::anyhow!("drawing the timeline {:?}: {e}", t.title))?;
    Ok(svg)
}

fn draw<'a>(t: &Timeline, svg: &'a mut String) -> Result<(), Box<dyn std::error::Error + 'a>> {
    const LABELS: u32 = 130;
    let root = SVGBackend::with_string(svg, (960, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(340);
    let x_max = t.duration().max(1.0);
    let top = |v: usize| v.max(1) as f64 * 1.1;
    let nodes_max = top(t
        .samples
        .iter()
        .flat_map(|s| {
            s.capacity
                .iter()
                .map(|c| c.unwrap_or(0).max(0) as usize)
                .chain(s.ready.iter().copied())
        })
        .max()
        .unwrap_or(0));
    let pods_max = top(t
        .samples
        .iter()
        .filter_map(|s| s.pending)
        .max()
        .unwrap_or(0));
    let cluster = t.samples.iter().any(|s| s.pending.is_some());
    let mut counts = ChartBuilder::on(&upper)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(LABELS)
        .right_y_label_area_size(if cluster { 60 } else { 0 })
        .build_cartesian_2d(0f64..x_max, 0f64..nodes_max)?
        .set_secondary_coord(0f64..x_max, 0f64..pods_max);
    counts
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(if cluster { "nodes" } else { "capacity" })
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    for (i, g) in t.groups.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        counts
            .draw_series(LineSeries::new(
                t.samples
                    .iter()
                    .filter_map(|s| s.capacity[i].map(|c| (s.at, c as f64))),
                color.stroke_width(3),
            ))?
            .label(format!("{g} capacity"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(3)));
        if cluster {
            counts
                .draw_series(LineSeries::new(
                    t.samples
                        .iter()
                        .filter_map(|s| s.ready.get(i).map(|r| (s.at, *r as f64))),
                    color.mix(0.8).stroke_width(1),
                ))?
                .label(format!("{g} Ready nodes"))
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.mix(0.8).stroke_width(1))
                });
        }
    }
    if cluster {
        counts
            .configure_secondary_axes()
            .y_desc("pending pods")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        counts
            .draw_secondary_series(LineSeries::new(
                t.samples
                    .iter()
                    .filter_map(|s| s.pending.map(|p| (s.at, p as f64))),
                BLACK.stroke_width(2),
            ))?
            .label("pending pods (right axis)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    }
    counts
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;

    let rows = MarkKind::ALL.len() as i32;
    let mut marks = ChartBuilder::on(&lower)
        .margin(10)
        .margin_right(if cluster { 70 } else { 10 })
        .x_label_area_size(30)
        .y_label_area_size(LABELS)
        .build_cartesian_2d(0f64..x_max, (0..rows).into_segmented())?;
    marks
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(rows as usize + 1)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => MarkKind::ALL
                .get(*i as usize)
                .map_or(String::new(), |k| k.label().to_string()),
            SegmentValue::Last => String::new(),
        })
        .x_desc("seconds")
        .draw()?;
    for m in &t.marks {
        let at = (m.at, SegmentValue::CenterOf(m.kind.row() as i32));
        match m.kind {
            MarkKind::RivalWrite => {
                marks.draw_series([Circle::new(at, 3, RGBColor(120, 120, 120).filled())])?;
            }
            MarkKind::ControllerWrite => {
                marks.draw_series([TriangleMarker::new(at, 6, BLUE.filled())])?;
            }
            MarkKind::Conflict => {
                marks.draw_series([Cross::new(at, 5, RGBColor(230, 120, 0).stroke_width(2))])?;
            }
            MarkKind::LostUpdate => {
                marks.draw_series([Cross::new(at, 7, RED.stroke_width(3))])?;
            }
        }
    }
    root.present()?;
    Ok(())
}

/// Text as HTML.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline() -> Timeline {
        let samples = (0..50)
            .map(|i| Sample {
                at: i as f64 * 0.2,
                capacity: vec![Some(1 + i / 10), None],
                ready: vec![(i / 12) as usize, 0],
                pending: Some(if i < 25 { 10 } else { 0 }),
            })
            .collect();
        let marks = [
            (1.0, MarkKind::RivalWrite),
            (1.4, MarkKind::RivalWrite),
            (2.0, MarkKind::ControllerWrite),
            (2.2, MarkKind::Conflict),
            (3.0, MarkKind::LostUpdate),
        ]
        .into_iter()
        .map(|(at, kind)| Mark {
            at,
            kind,
            resource: "general".into(),
        })
        .collect();
        Timeline {
            title: "ETags <on> & \"quoted\"".into(),
            groups: vec!["general".into(), "gpu".into()],
            samples,
            marks,
        }
    }

    #[test]
    fn the_page_draws_every_series_and_every_mark_and_escapes_what_it_is_given() {
        let report = Report {
            title: "demo <report>".into(),
            intro: vec!["a & b".into()],
            lines: vec![LineChart {
                title: "Dollars per hour".into(),
                x_desc: "hour".into(),
                y_desc: "USD per hour".into(),
                series: vec![
                    ("policy <a>".into(), vec![(0.5, 2.0), (1.5, 3.0)]),
                    ("lower bound".into(), vec![(0.5, 1.0), (1.5, 1.5)]),
                ],
                caption: "cost & bound".into(),
            }],
            timelines: vec![timeline()],
            table: Table {
                header: vec!["".into(), "ETags on".into()],
                rows: vec![vec!["lost updates".into(), "0".into()]],
            },
            preformatted: None,
            notes: vec![],
        };
        let html = render(&report).expect("renders");
        assert!(html.starts_with("<!doctype html>"));
        assert!(html.contains("<h1>demo &lt;report&gt;</h1>"), "{html}");
        assert!(html.contains("<h2>ETags &lt;on&gt; &amp; &quot;quoted&quot;</h2>"));
        assert!(html.contains("<p>a &amp; b</p>"));
        assert!(!html.contains("<script"), "self-contained, no script");
        assert!(
            !html.contains(" src=") && !html.contains("<link") && !html.contains("@import"),
            "nothing fetched"
        );
        assert_eq!(
            html.matches("<svg").count(),
            2,
            "one chart per timeline and per line chart"
        );
        // The line chart: its heading, both series in the legend (escaped), its caption.
        assert!(html.contains("<h2>Dollars per hour</h2>"));
        assert!(html.contains("policy &lt;a&gt;") && html.contains("lower bound"));
        assert!(html.contains("<figcaption>cost &amp; bound</figcaption>"));
        // Two capacity lines (the second group has none: no points, an empty path), two Ready
        // lines, pending pods, and the legend's samples.
        for label in [
            "general capacity",
            "gpu capacity",
            "general Ready nodes",
            "pending pods",
            "rival writes",
            "controller writes",
            "412 answers",
            "lost updates",
        ] {
            assert!(html.contains(label), "no {label:?} in the chart");
        }
        // Marks: 2 circles for the rival, a triangle (a polygon) for the controller's write,
        // crosses (two lines each) for the 412 and the lost update.
        assert!(html.matches("<circle").count() >= 2, "rival marks");
        assert!(html.matches("<polygon").count() >= 1, "controller mark");
        assert!(html.contains("<td>lost updates</td><td>0</td>"));
        assert!(html.contains("rival writes 2, controller writes 1, 412 answers 1, lost updates 1"));
    }

    #[test]
    fn an_empty_run_still_renders_a_chart() {
        let t = Timeline {
            title: "nothing".into(),
            groups: vec!["a".into()],
            ..Timeline::default()
        };
        let html = render(&Report {
            timelines: vec![t],
            ..Report::default()
        })
        .expect("renders");
        assert_eq!(html.matches("<svg").count(), 1);
    }

    #[test]
    fn marks_name_the_resource_at_the_end_of_an_id_or_an_action() {
        assert_eq!(
            last_segment("/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/general"),
            "general"
        );
        assert_eq!(
            last_segment("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/gpu/delete"),
            "gpu"
        );
        assert_eq!(
            last_segment(".../managedClusters/aks/agentPools/pool1/deleteMachines"),
            "pool1"
        );
    }
}
