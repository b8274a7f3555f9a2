//! Draws `rkubelet inspect`'s pictures (`--output svg`): the node's pod network — the
//! host's network namespace with the bridge, each pod's network namespace and the veth
//! pair between them — and a pod's start-up timeline as a waterfall. Plain SVG text laid
//! out for a monospace font, so it needs no drawing library.

use std::fmt::{self, Display, Write};

use super::view::{BridgeView, NodeView, PodLink};
use crate::timeline::{PodTimeline, Step};

const FONT: &str = "ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace";
/// A monospace character's width, in ems.
const CHAR_EM: f64 = 0.6;
const MARGIN: f64 = 16.0;
const LINE: f64 = 16.0;
const INK: &str = "#24292f";
const MUTED: &str = r##"fill="#57606a""##;
const WARN: &str = r##"fill="#9a6700""##;
const HOST: &str = r##"rx="8" fill="#f6f8fa" stroke="#8c959f""##;
const BRIDGE: &str = r##"rx="4" fill="#dbe9f6" stroke="#4a79a5""##;
const POD: &str = r##"rx="6" fill="#fff8e8" stroke="#c8a15a""##;
const VETH: &str = r##"rx="3" fill="#e6f2e6" stroke="#5b8f5b""##;
const LINK: &str = r##"fill="none" stroke="#5b8f5b" stroke-width="1.5""##;
const BOLD: &str = r#"font-weight="bold""#;

/// Text put into XML: markup characters escaped, characters XML 1.0 cannot hold replaced.
struct Esc<'a>(&'a str);

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '&' => f.write_str("&amp;")?,
                '<' => f.write_str("&lt;")?,
                '>' => f.write_str("&gt;")?,
                '"' => f.write_str("&quot;")?,
                '\'' => f.write_str("&apos;")?,
                '\t' | '\n' | '\r' => f.write_char(c)?,
                c if c < ' ' || c == '\u{fffe}' || c == '\u{ffff}' => f.write_char('\u{fffd}')?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// How wide `s` is drawn at `size` px.
fn text_w(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * size * CHAR_EM
}

/// `s` cut to `max` characters, an ellipsis marking the cut.
fn fit(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut cut: String = s.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `n` things, in the plural unless one.
fn count(n: usize, thing: &str) -> String {
    match n {
        1 => format!("1 {thing}"),
        n if thing.ends_with('x') => format!("{n} {thing}es"),
        n => format!("{n} {thing}s"),
    }
}

/// An SVG document being drawn; it grows to hold what is drawn on it.
#[derive(Default)]
struct Svg {
    body: String,
    right: f64,
    bottom: f64,
}

impl Svg {
    fn put(&mut self, args: fmt::Arguments<'_>) {
        // Writing to a String cannot fail.
        let _ = self.body.write_fmt(args);
    }

    fn extend(&mut self, right: f64, bottom: f64) {
        self.right = self.right.max(right);
        self.bottom = self.bottom.max(bottom);
    }

    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, attrs: &str) {
        self.extend(x + w, y + h);
        self.put(format_args!(
            r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" {attrs}/>"#
        ));
    }

    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, attrs: &str) {
        self.extend(x1.max(x2), y1.max(y2));
        self.put(format_args!(
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" {attrs}/>"#
        ));
    }

    /// Text whose baseline starts at (`x`, `y`).
    fn text(&mut self, x: f64, y: f64, size: f64, attrs: &str, s: &str) {
        self.extend(x + text_w(s, size), y + size * 0.3);
        self.put(format_args!(
            r#"<text x="{x:.1}" y="{y:.1}" font-size="{size}" {attrs}>{}</text>"#,
            Esc(s)
        ));
    }

    /// The picture's title and a line under it.
    fn header(&mut self, title: &str, summary: &str) {
        self.text(MARGIN, 28.0, 16.0, BOLD, title);
        self.text(MARGIN, 48.0, POD_FONT, MUTED, summary);
    }

    fn open(&mut self, class: &str, data: &str, value: &str, title: &str) {
        self.put(format_args!(
            r#"<g class="{class}" data-{data}="{}"><title>{}</title>"#,
            Esc(value),
            Esc(title)
        ));
    }

    fn close(&mut self) {
        self.body.push_str("</g>\n");
    }

    fn finish(self, title: &str) -> String {
        let (w, h) = ((self.right + MARGIN).ceil(), (self.bottom + MARGIN).ceil());
        let mut out = String::with_capacity(self.body.len() + 512);
        let _ = write!(
            out,
            r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FONT}" fill="{INK}">
<title>{}</title>
<rect x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>
{}</svg>
"##,
            Esc(title),
            self.body
        );
        out
    }
}

// The node's picture: a header, the host's box with the bridge across its top, one cell
// per pod below (the host end of its veth, the link down to its `eth0` and its network
// namespace's box), the host's routes at the bottom.
const PODS_MAX_WIDTH: f64 = 2200.0;
const POD_FONT: f64 = 12.0;
const CHIP_FONT: f64 = 11.0;
const CHIP_H: f64 = 22.0;
/// From the top of a cell to the top of its pod's box.
const POD_BOX_TOP: f64 = 56.0;
const POD_BOX_H: f64 = 82.0;
const CELL_H: f64 = POD_BOX_TOP + POD_BOX_H + 24.0;

/// The lines of a pod's box, under its `eth0`.
fn pod_lines(pod: &PodLink) -> [String; 4] {
    [
        format!("{}/{}", pod.namespace, pod.name),
        format!(
            "sandbox {}",
            pod.sandbox_id.get(..12).unwrap_or(&pod.sandbox_id)
        ),
        pod.pause_pid.map_or_else(
            || "pause pid ?".to_owned(),
            |pid| format!("pause pid {pid}"),
        ),
        format!("netns {}", pod.netns.as_deref().unwrap_or("?")),
    ]
}

fn eth0_label(pod: &PodLink) -> String {
    format!("eth0 {}", pod.ip.as_deref().unwrap_or("(no IP seen)"))
}

/// The host end of the pod's veth as its chip shows it, if there is one.
fn veth_label(pod: &PodLink, bridge: Option<&str>) -> Option<String> {
    let veth = pod.host_veth.as_deref()?;
    let index = pod
        .host_veth_index
        .map_or_else(String::new, |i| format!(" · if {i}"));
    let on = match pod.bridge.as_deref() {
        None => " (on no bridge)".to_owned(),
        Some(b) if Some(b) != bridge => format!(" (on {b})"),
        Some(_) => String::new(),
    };
    Some(format!("{veth}{index}{on}"))
}

fn pod_title(pod: &PodLink) -> String {
    let opt = |v: Option<&str>| v.unwrap_or("?").to_owned();
    format!(
        "pod {}/{}\nsandbox {}\npause pid {}\nnetns {}\neth0 {}\nhost veth {} (ifindex {}) on bridge {}",
        pod.namespace,
        pod.name,
        pod.sandbox_id,
        opt(pod.pause_pid.map(|p| p.to_string()).as_deref()),
        opt(pod.netns.as_deref()),
        opt(pod.ip.as_deref()),
        opt(pod.host_veth.as_deref()),
        opt(pod.host_veth_index.map(|i| i.to_string()).as_deref()),
        opt(pod.bridge.as_deref()),
    )
}

fn bridge_lines(bridge: &BridgeView) -> [String; 2] {
    [
        format!(
            "bridge {} · if {} · {}",
            bridge.name,
            bridge.index,
            bridge.addresses.join(", ")
        ),
        format!(
            "MAC {} · MTU {} · {}",
            bridge.mac.as_deref().unwrap_or("?"),
            bridge.mtu,
            count(bridge.ports.len(), "port")
        ),
    ]
}

/// How a node's pods are placed.
struct Grid {
    cols: usize,
    rows: usize,
    /// Room left of each cell for the links of the cells below it to pass down.
    gutter: f64,
    box_w: f64,
    cell_w: f64,
}

impl Grid {
    fn new(view: &NodeView) -> Self {
        let bridge = view.bridge.as_ref().map(|b| b.name.as_str());
        let chars = view
            .pods
            .iter()
            .flat_map(|p| {
                let mut texts = pod_lines(p).to_vec();
                texts.extend(veth_label(p, bridge));
                texts.push(eth0_label(p));
                texts
            })
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(28, 64);
        let box_w = chars as f64 * POD_FONT * CHAR_EM + 20.0;
        let n = view.pods.len();
        let fits = ((PODS_MAX_WIDTH / (box_w + 60.0)) as usize).max(1);
        let cols = n.clamp(1, fits);
        let rows = n.div_ceil(cols);
        let gutter = 6.0 * (rows as f64 + 1.0) + 4.0;
        Self {
            cols,
            rows,
            gutter,
            box_w,
            cell_w: gutter + box_w + 16.0,
        }
    }
}

/// The node's pod network: the host's namespace with the bridge, one box per pod's
/// network namespace linked to the bridge by its veth pair, the host's routes.
#[must_use]
pub fn node(view: &NodeView) -> String {
    let mut svg = Svg::default();
    let node_name = view.node_name.as_deref().unwrap_or("(unknown node)");
    let title = format!("pod network of node {node_name}");
    let summary = format!(
        "pod CIDR {} · CNI plugins run by: {} · {} on the pod network",
        view.pod_cidr.as_deref().unwrap_or("?"),
        view.network_owner,
        count(view.pods.len(), "pod sandbox")
    );
    svg.header(&title, &summary);

    let grid = Grid::new(view);
    let bridge_texts = view.bridge.as_ref().map(bridge_lines);
    let widest_text = bridge_texts
        .iter()
        .flatten()
        .map(|s| text_w(s, 13.0) + 24.0)
        .chain(view.routes.iter().map(|r| text_w(r, CHIP_FONT)))
        .fold(0.0, f64::max);
    let inner_w = (grid.cols as f64 * grid.cell_w).max(widest_text).max(360.0);
    let (host_x, host_y) = (MARGIN, 64.0);
    let x0 = host_x + 16.0;
    let bridge_y = host_y + 32.0;
    let bridge_bottom = bridge_y + 40.0;
    let pods_y = bridge_bottom + 36.0;
    let pods_h = if view.pods.is_empty() {
        32.0
    } else {
        grid.rows as f64 * CELL_H
    };
    let routes_y = pods_y + pods_h;
    let host_h = routes_y - host_y + 20.0 + LINE * view.routes.len().max(1) as f64;
    let host = "host (root network namespace)";
    svg.rect(host_x, host_y, inner_w + 32.0, host_h, HOST);
    svg.text(host_x + 12.0, host_y + 20.0, 13.0, BOLD, host);

    let bridge_name = view.bridge.as_ref().map(|b| b.name.as_str());
    match (&view.bridge, &bridge_texts) {
        (Some(bridge), Some([first, second])) => {
            let title = format!("{first}\n{second}\nports: {}", bridge.ports.join(", "));
            svg.open("bridge", "name", &bridge.name, &title);
            svg.rect(x0, bridge_y, inner_w, 40.0, BRIDGE);
            svg.text(x0 + 10.0, bridge_y + 17.0, 13.0, BOLD, first);
            svg.text(x0 + 10.0, bridge_y + 33.0, CHIP_FONT, "", second);
        }
        _ => {
            svg.open("bridge", "name", "", "no bridge seen");
            svg.rect(
                x0,
                bridge_y,
                inner_w,
                40.0,
                &format!(r#"{BRIDGE} stroke-dasharray="4 3" fill-opacity="0.3""#),
            );
            svg.text(x0 + 10.0, bridge_y + 25.0, 13.0, MUTED, "no bridge seen");
        }
    }
    svg.close();

    for (i, pod) in view.pods.iter().enumerate() {
        let (col, row) = (i % grid.cols, i / grid.cols);
        let cx = x0 + col as f64 * grid.cell_w;
        let cy = pods_y + row as f64 * CELL_H;
        let at = (cx, cy, row);
        draw_pod(&mut svg, &grid, pod, bridge_name, at, bridge_bottom);
    }
    if view.pods.is_empty() {
        let none = "no pod sandboxes on the pod network";
        svg.text(x0, pods_y + 4.0, POD_FONT, MUTED, none);
    }

    svg.text(x0, routes_y + 14.0, POD_FONT, BOLD, "routes (main table)");
    let routes = if view.routes.is_empty() {
        vec!["(none seen)".to_owned()]
    } else {
        view.routes.clone()
    };
    for (i, route) in routes.iter().enumerate() {
        let y = routes_y + 14.0 + LINE * (i as f64 + 1.0);
        svg.text(x0, y, CHIP_FONT, "", route);
    }
    for (i, note) in view.notes.iter().enumerate() {
        let y = host_y + host_h + 22.0 + LINE * i as f64;
        svg.text(MARGIN, y, POD_FONT, WARN, &format!("note: {note}"));
    }
    svg.finish(&title)
}

/// One pod's cell at (`cx`, `cy`), in row `row`: its link from the bridge, the host end
/// of its veth, the pair down to its `eth0` and its namespace's box.
fn draw_pod(
    svg: &mut Svg,
    grid: &Grid,
    pod: &PodLink,
    bridge: Option<&str>,
    (cx, cy, row): (f64, f64, usize),
    bridge_bottom: f64,
) {
    let key = format!("{}/{}", pod.namespace, pod.name);
    svg.open("pod", "pod", &key, &pod_title(pod));
    let x = cx + grid.gutter;
    let wire_x = x + 24.0;
    let box_y = cy + POD_BOX_TOP;
    match veth_label(pod, bridge) {
        Some(label) => {
            if pod.bridge.is_some() && pod.bridge.as_deref() == bridge {
                // Down the gutter (deeper rows further left, so no link crosses another),
                // then across to the veth.
                let gx = x - 6.0 * (row as f64 + 1.0);
                svg.put(format_args!(
                    r#"<path class="link" d="M{gx:.1},{bridge_bottom:.1} V{:.1} H{x:.1}" {LINK}/>"#,
                    cy + CHIP_H / 2.0
                ));
            }
            let chip_w = text_w(&label, CHIP_FONT) + 12.0;
            svg.rect(x, cy, chip_w, CHIP_H, VETH);
            svg.text(x + 6.0, cy + 15.0, CHIP_FONT, "", &label);
            svg.line(wire_x, cy + CHIP_H, wire_x, box_y - 9.0, LINK);
            let italic = format!(r#"{MUTED} font-style="italic""#);
            svg.text(wire_x + 6.0, cy + 39.0, 10.0, &italic, "veth pair");
        }
        None => {
            svg.text(x, cy + 15.0, CHIP_FONT, MUTED, "no veth seen on the host");
        }
    }
    svg.rect(x, box_y, grid.box_w, POD_BOX_H, POD);
    let eth0 = eth0_label(pod);
    let eth0_w = text_w(&eth0, CHIP_FONT) + 12.0;
    svg.rect(x + 8.0, box_y - 9.0, eth0_w, 18.0, VETH);
    svg.text(x + 14.0, box_y + 4.0, CHIP_FONT, "", &eth0);
    let max_chars = ((grid.box_w - 20.0) / (POD_FONT * CHAR_EM)) as usize;
    for (i, line) in pod_lines(pod).iter().enumerate() {
        let attrs = if i == 0 { BOLD } else { "" };
        let y = box_y + 25.0 + LINE * i as f64;
        svg.text(x + 10.0, y, POD_FONT, attrs, &fit(line, max_chars));
    }
    svg.close();
}

// The timeline's picture: a header, a time axis, one row per step (its label indented
// by depth on the left, its bar on the axis, its duration after the bar), the Ready
// marker and a legend.
const PLOT_W: f64 = 720.0;
const ROW_H: f64 = 18.0;
const INDENT: f64 = 14.0;
const LABEL_CHARS: usize = 56;
const KINDS: [(&str, &str); 8] = [
    ("sync", "#6e7781"),
    ("sandbox", "#4a79a5"),
    ("cni", "#5b8f5b"),
    ("image", "#b07d2b"),
    ("container", "#8250df"),
    ("probe", "#1b7c83"),
    ("status", "#cf222e"),
    ("other", "#afb8c1"),
];

/// The kind of a step, by its name or else by its label (`cri RunPodSandbox`), and its
/// color.
fn kind(step: &Step) -> (&'static str, &'static str) {
    let of = |s: &str| {
        let s = s.to_ascii_lowercase();
        let kind = if s.starts_with("probe") {
            "probe"
        } else if s.starts_with("status") {
            "status"
        } else {
            ["cni", "image", "pull", "sandbox", "container", "sync"]
                .into_iter()
                .find(|k| s.contains(k))
                .map(|k| if k == "pull" { "image" } else { k })?
        };
        KINDS.into_iter().find(|(k, _)| *k == kind)
    };
    of(&step.name)
        .or_else(|| of(&step.label()))
        .unwrap_or(KINDS[KINDS.len() - 1])
}

/// A millisecond count as text, with as many decimals as its size deserves.
fn ms(v: f64) -> String {
    match v {
        v if v >= 100.0 => format!("{v:.0} ms"),
        v if v >= 10.0 => format!("{v:.1} ms"),
        v => format!("{v:.2} ms"),
    }
}

/// A time axis for `total` ms: the distance between ticks (1, 2 or 5 times a power of
/// ten, about eight of them) and where the axis ends (the first tick at or after `total`).
fn axis(total: f64) -> (f64, f64) {
    let total = if total > 0.0 { total } else { 1.0 };
    let raw = total / 8.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let tick = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|t| *t >= raw)
        .unwrap_or(10.0 * magnitude);
    (tick, (total / tick).ceil() * tick)
}

/// A non-negative finite number, or zero.
fn finite(v: f64) -> f64 {
    if v.is_finite() { v.max(0.0) } else { 0.0 }
}

/// Where the timeline's time axis is drawn.
struct Plot {
    /// Where 0 ms is.
    x0: f64,
    /// Pixels per millisecond.
    scale: f64,
    /// The axis's line, above the rows.
    top: f64,
    /// Below the last row.
    bottom: f64,
}

impl Plot {
    /// Ticks and gridlines every `tick` ms up to `end`.
    fn axis(&self, svg: &mut Svg, tick: f64, end: f64) {
        let grid = r##"stroke="#d0d7de" stroke-width="1""##;
        let ticks = (end / tick).round() as usize;
        let decimals = if tick >= 1.0 {
            0
        } else {
            (-tick.log10()).ceil() as usize
        };
        for i in 0..=ticks {
            let v = tick * i as f64;
            let x = self.x0 + v * self.scale;
            svg.line(x, self.top, x, self.bottom, grid);
            let label = format!("{v:.decimals$}{}", if i == ticks { " ms" } else { "" });
            let lx = x - text_w(&label, 10.0) / 2.0;
            svg.text(lx, self.top - 6.0, 10.0, MUTED, &label);
        }
    }

    /// The marker at `at` ms, where the API acknowledged the pod Ready.
    fn ready(&self, svg: &mut Svg, at: f64) {
        let x = self.x0 + at * self.scale;
        let marker = r##"stroke="#cf222e" stroke-width="1.5" stroke-dasharray="5 3""##;
        svg.put(format_args!(r#"<g class="ready">"#));
        svg.line(x, self.top, x, self.bottom + 6.0, marker);
        let label = format!("Ready acknowledged · {}", ms(at));
        let lx = if at * self.scale > PLOT_W / 2.0 {
            x - text_w(&label, CHIP_FONT) - 4.0
        } else {
            x + 4.0
        };
        let red = r##"fill="#cf222e""##;
        svg.text(lx, self.bottom + 20.0, CHIP_FONT, red, &label);
        svg.close();
    }
}

/// A pod's start-up as a waterfall: one bar per step on a time axis from the moment the
/// agent saw the pod, and a marker where the API acknowledged it Ready.
#[must_use]
pub fn timeline(t: &PodTimeline) -> String {
    let mut svg = Svg::default();
    let pod = format!("{}/{}", t.namespace, t.name);
    let ready = t.ready_ms.map(finite);
    let end = t
        .steps
        .iter()
        .map(|s| finite(s.start_ms) + finite(s.duration_ms))
        .chain(ready)
        .fold(0.0, f64::max);
    let title = format!("start-up of pod {pod}");
    let ready_text = ready.map_or_else(
        || "not acknowledged Ready yet".to_owned(),
        |r| format!("Ready acknowledged at {}", ms(r)),
    );
    let summary = format!(
        "seen {} · {ready_text} · {}{}",
        if t.seen.is_empty() { "?" } else { &t.seen },
        count(t.steps.len(), "step"),
        if t.dropped_steps > 0 {
            format!(" (+{} not kept)", t.dropped_steps)
        } else {
            String::new()
        }
    );
    svg.header(&title, &summary);

    let labels: Vec<(f64, String)> = t
        .steps
        .iter()
        .map(|s| {
            (
                f64::from(s.depth.min(12)) * INDENT,
                fit(&s.label(), LABEL_CHARS),
            )
        })
        .collect();
    let label_w = labels
        .iter()
        .map(|(indent, l)| indent + text_w(l, POD_FONT))
        .fold(120.0, f64::max);
    let x0 = MARGIN + label_w + 16.0;
    let (tick, axis_end) = axis(end);
    let scale = PLOT_W / axis_end;
    let axis_y = 80.0;
    let rows_y = axis_y + 8.0;
    let rows_end = rows_y + ROW_H * t.steps.len().max(1) as f64;

    let plot = Plot {
        x0,
        scale,
        top: axis_y,
        bottom: rows_end,
    };
    for i in (1..t.steps.len()).step_by(2) {
        let y = rows_y + ROW_H * i as f64;
        let stripe = r##"fill="#f6f8fa""##;
        svg.rect(MARGIN, y, x0 + PLOT_W - MARGIN, ROW_H, stripe);
    }
    plot.axis(&mut svg, tick, axis_end);
    if let Some(r) = ready {
        plot.ready(&mut svg, r);
    }
    for (i, (step, (indent, label))) in t.steps.iter().zip(&labels).enumerate() {
        let y = rows_y + ROW_H * i as f64;
        let (name, color) = kind(step);
        let (start, duration) = (finite(step.start_ms), finite(step.duration_ms));
        let title = format!(
            "{}\nstarts at {}, takes {}",
            step.label(),
            ms(start),
            ms(duration)
        );
        svg.open("step", "name", &step.name, &title);
        svg.text(MARGIN + indent, y + 13.0, POD_FONT, "", label);
        let bx = x0 + start * scale;
        let bw = (duration * scale).max(1.0);
        let attrs = format!(r#"fill="{color}" data-kind="{name}""#);
        svg.rect(bx, y + 3.0, bw, ROW_H - 6.0, &attrs);
        // On a backdrop, to stay readable where it crosses the Ready marker.
        let took = ms(duration);
        let backdrop = r##"fill="#ffffff" fill-opacity="0.85""##;
        let took_w = text_w(&took, 10.0) + 4.0;
        svg.rect(bx + bw + 2.0, y + 4.0, took_w, 11.0, backdrop);
        svg.text(bx + bw + 4.0, y + 13.0, 10.0, MUTED, &took);
        svg.close();
    }
    if t.steps.is_empty() {
        let none = "no steps recorded";
        svg.text(x0 + 8.0, rows_y + 13.0, POD_FONT, MUTED, none);
    }
    let legend_y = rows_end + 44.0;
    let mut lx = x0;
    for (name, color) in KINDS {
        let fill = format!(r#"fill="{color}""#);
        svg.rect(lx, legend_y - 9.0, 10.0, 10.0, &fill);
        svg.text(lx + 14.0, legend_y, CHIP_FONT, "", name);
        lx += 14.0 + text_w(name, CHIP_FONT) + 18.0;
    }
    svg.finish(&title)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a sample picture to `$RK_SVG_SAMPLES/<name>` when that is set, to look at.
    fn sample(name: &str, svg: &str) {
        if let Some(dir) = std::env::var_os("RK_SVG_SAMPLES") {
            let dir = std::path::Path::new(&dir);
            std::fs::create_dir_all(dir).expect("samples dir");
            std::fs::write(dir.join(name), svg).expect("sample written");
        }
    }

    fn num(node: roxmltree::Node<'_, '_>, attr: &str) -> f64 {
        node.attribute(attr)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{attr} of {node:?}"))
    }

    /// The document's groups of `class`, after checking that every rectangle and line
    /// lies within the view box and that it is as large as its size.
    fn groups<'a>(doc: &'a roxmltree::Document<'a>, class: &str) -> Vec<roxmltree::Node<'a, 'a>> {
        let root = doc.root_element();
        let view_box: Vec<f64> = root
            .attribute("viewBox")
            .expect("viewBox")
            .split(' ')
            .map(|v| v.parse().expect("number"))
            .collect();
        let (w, h) = (view_box[2], view_box[3]);
        assert_eq!((num(root, "width"), num(root, "height")), (w, h));
        for n in root.descendants() {
            let (right, bottom) = match n.tag_name().name() {
                "rect" => (
                    num(n, "x") + num(n, "width"),
                    num(n, "y") + num(n, "height"),
                ),
                "line" => (
                    num(n, "x1").max(num(n, "x2")),
                    num(n, "y1").max(num(n, "y2")),
                ),
                _ => continue,
            };
            assert!(right <= w && bottom <= h, "{n:?} outside {w}x{h}");
        }
        root.descendants()
            .filter(|n| n.has_tag_name("g") && n.attribute("class") == Some(class))
            .collect()
    }

    fn pod(i: usize) -> PodLink {
        PodLink {
            namespace: "default".to_owned(),
            name: format!("nginx-6799fc88d8-{i:05}"),
            sandbox_id: format!("{i:02}{}", "ab12".repeat(15) + "cd"),
            pause_pid: Some(4000 + u32::try_from(i).expect("small")),
            netns: Some(format!(
                "/var/run/netns/cni-5b1c6c1f-7f0e-e21d-8c57-{i:012}"
            )),
            ip: Some(format!("10.88.0.{}/24", i + 2)),
            host_veth: Some(format!("veth{:08x}", i * 7919)),
            host_veth_index: Some(u32::try_from(i).expect("small") + 10),
            bridge: Some("cni0".to_owned()),
        }
    }

    fn node_view(pods: usize) -> NodeView {
        NodeView {
            node_name: Some("rk-node-1".to_owned()),
            pod_cidr: Some("10.88.0.0/24".to_owned()),
            network_owner: "agent".to_owned(),
            bridge: Some(BridgeView {
                name: "cni0".to_owned(),
                index: 3,
                mac: Some("5a:1e:2c:00:9f:01".to_owned()),
                mtu: 1500,
                addresses: vec!["10.88.0.1/24".to_owned()],
                ports: (0..pods)
                    .map(|i| pod(i).host_veth.unwrap_or_default())
                    .collect(),
            }),
            pods: (0..pods).map(pod).collect(),
            routes: vec![
                "default via 192.168.1.1 dev eth0 proto dhcp".to_owned(),
                "10.88.0.0/24 dev cni0 proto kernel scope link src 10.88.0.1".to_owned(),
            ],
            notes: Vec::new(),
            pod_network_routes: None,
        }
    }

    #[test]
    fn node_draws_one_group_per_pod_and_one_bridge_within_its_view_box() {
        for n in [0, 1, 25] {
            let view = node_view(n);
            let svg = node(&view);
            sample(&format!("node-{n}.svg"), &svg);
            let doc = roxmltree::Document::parse(&svg).expect("well-formed");
            let pods: Vec<_> = groups(&doc, "pod")
                .iter()
                .map(|g| g.attribute("data-pod").unwrap_or_default().to_owned())
                .collect();
            let want: Vec<_> = view
                .pods
                .iter()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect();
            assert_eq!(pods, want);
            assert_eq!(groups(&doc, "bridge").len(), 1);
            let links = doc
                .descendants()
                .filter(|n| n.attribute("class") == Some("link"));
            assert_eq!(links.count(), n, "each pod linked to the bridge");
        }
    }

    #[test]
    fn node_without_bridge_or_veths_draws_pods_unlinked_and_notes() {
        let mut view = node_view(3);
        view.bridge = None;
        view.pods[0].host_veth = None;
        view.pods[1].bridge = None;
        view.notes = vec!["netlink: permission denied".to_owned()];
        let long = "x".repeat(200);
        view.pods[2].name.clone_from(&long);
        let svg = node(&view);
        sample("node-degraded.svg", &svg);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed");
        let pods = groups(&doc, "pod");
        let full = format!("default/{long}");
        assert_eq!(pods[2].attribute("data-pod"), Some(full.as_str()));
        let cut = pods[2]
            .descendants()
            .filter_map(|n| n.text())
            .find(|t| t.starts_with("default/x"))
            .expect("the name");
        assert!(
            cut.ends_with("xx…") && cut.chars().count() <= 64,
            "cut to the box: {cut}"
        );
        assert_eq!(groups(&doc, "bridge").len(), 1, "a placeholder");
        assert!(!svg.contains(r#"class="link""#));
        assert!(svg.contains("no veth seen on the host"));
        assert!(svg.contains("(on no bridge)"));
        assert!(svg.contains("note: netlink: permission denied"));
    }

    #[test]
    fn markup_in_names_is_escaped() {
        let mut view = node_view(1);
        let nasty = r#"a<b>&"c'"#;
        view.pods[0].name = nasty.to_owned();
        view.node_name = Some(format!("n{nasty}\u{1}"));
        view.bridge.as_mut().expect("bridge").name = nasty.to_owned();
        view.pods[0].bridge = Some(nasty.to_owned());
        let svg = node(&view);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed");
        let g = groups(&doc, "pod");
        assert_eq!(
            g[0].attribute("data-pod"),
            Some(format!("default/{nasty}").as_str())
        );
        assert_eq!(
            groups(&doc, "bridge")[0].attribute("data-name"),
            Some(nasty)
        );
        assert!(
            doc.descendants()
                .any(|n| n.text() == Some(&format!("pod network of node n{nasty}\u{fffd}")))
        );

        let mut t = pod_timeline(Some(10.0));
        t.name = nasty.to_owned();
        t.steps[1]
            .fields
            .insert("container".to_owned(), nasty.to_owned());
        let svg = timeline(&t);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed");
        let label = format!("sync_pod {nasty}");
        assert!(doc.descendants().any(|n| n.text() == Some(&label)));
    }

    fn step(
        name: &str,
        field: Option<(&str, &str)>,
        start_ms: f64,
        duration_ms: f64,
        depth: u16,
    ) -> Step {
        Step {
            name: name.to_owned(),
            fields: field
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into_iter()
                .collect(),
            start_ms,
            duration_ms,
            depth,
        }
    }

    fn pod_timeline(ready_ms: Option<f64>) -> PodTimeline {
        PodTimeline {
            uid: "u1".to_owned(),
            namespace: "default".to_owned(),
            name: "nginx-6799fc88d8-x2x7q".to_owned(),
            seen: "2026-11-23T13:00:00.123Z".to_owned(),
            steps: vec![
                step("status_patch", Some(("outcome", "ok")), 0.4, 18.0, 0),
                step("sync_pod", None, 1.0, 1210.0, 0),
                step("make_data_dirs", None, 1.2, 0.3, 1),
                step("mount_volumes", None, 1.6, 4.1, 1),
                step("run_pod_sandbox", Some(("attempt", "1")), 6.0, 402.5, 1),
                step("cri", Some(("rpc", "RunPodSandbox")), 6.1, 401.0, 2),
                step("cni_plugin", Some(("plugin", "bridge")), 150.0, 88.0, 3),
                step("cni_plugin", Some(("plugin", "host-local")), 160.0, 12.0, 4),
                step("cni_plugin", Some(("plugin", "portmap")), 240.0, 0.0, 3),
                step("pull_image", Some(("image", "nginx")), 410.0, 600.0, 1),
                step("cri", Some(("rpc", "PullImage")), 411.0, 598.0, 2),
                step(
                    "start_container",
                    Some(("container", "nginx")),
                    1012.0,
                    190.0,
                    1,
                ),
                step("cri", Some(("rpc", "CreateContainer")), 1012.5, 60.0, 2),
                step("probe", Some(("kind", "readiness")), 1230.0, 3.2, 0),
                step("status_patch", Some(("outcome", "ok")), 1240.0, 21.0, 0),
            ],
            ready_ms,
            dropped_steps: 0,
        }
    }

    #[test]
    fn timeline_draws_one_group_per_step_in_order_and_the_ready_marker_iff_ready() {
        for ready in [Some(1261.0), None] {
            let t = pod_timeline(ready);
            let svg = timeline(&t);
            sample(&format!("timeline-ready-{}.svg", ready.is_some()), &svg);
            let doc = roxmltree::Document::parse(&svg).expect("well-formed");
            let names: Vec<_> = groups(&doc, "step")
                .iter()
                .map(|g| g.attribute("data-name").unwrap_or_default())
                .collect();
            let want: Vec<_> = t.steps.iter().map(|s| s.name.as_str()).collect();
            assert_eq!(names, want);
            assert_eq!(groups(&doc, "ready").len(), usize::from(ready.is_some()));
            // Every bar is at least 1px wide, and the longest step's bar the widest.
            let widths: Vec<f64> = groups(&doc, "step")
                .iter()
                .filter_map(|g| g.children().find(|n| n.attribute("data-kind").is_some()))
                .map(|bar| num(bar, "width"))
                .collect();
            assert_eq!(widths.len(), t.steps.len());
            assert!(widths.iter().all(|w| *w >= 1.0), "{widths:?}");
            let widest = widths.iter().copied().fold(0.0, f64::max);
            assert!(
                (widths[1] - widest).abs() < f64::EPSILON,
                "sync_pod: {widths:?}"
            );
        }
    }

    #[test]
    fn an_empty_timeline_is_still_a_picture() {
        let mut t = pod_timeline(None);
        t.steps.clear();
        let svg = timeline(&t);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed");
        assert!(groups(&doc, "step").is_empty());
    }

    #[test]
    fn steps_are_colored_by_kind() {
        let mut steps = pod_timeline(None).steps;
        steps.extend([
            step("image_status", None, 0.0, 1.0, 1),
            step("cri", Some(("rpc", "PodSandboxStatus")), 0.0, 1.0, 2),
            step("cri", Some(("rpc", "ContainerStatus")), 0.0, 1.0, 2),
            step("final_status", None, 0.0, 1.0, 0),
        ]);
        let kinds: Vec<_> = steps.iter().map(|s| kind(s).0).collect();
        let want = "status sync other other sandbox sandbox cni cni cni image image container \
                    container probe status image sandbox container other";
        assert_eq!(kinds, want.split_whitespace().collect::<Vec<_>>());
    }

    #[test]
    fn the_axis_ticks_at_round_values_past_the_end() {
        assert_eq!(axis(1261.0), (200.0, 1400.0));
        assert_eq!(axis(80.0), (10.0, 80.0));
        assert_eq!(axis(0.0), (0.2, 1.0));
        let (tick, end) = axis(0.43);
        assert!(
            (tick - 0.1).abs() < 1e-9 && (end - 0.5).abs() < 1e-9,
            "{tick} {end}"
        );
    }
}
