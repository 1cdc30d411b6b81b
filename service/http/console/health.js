// health.js - the Health view: readiness (/readyz), the partitions this
// process serves (/v1/partitions), free disk and the reserve (/metrics), and
// three charts the page draws from /metrics samples it takes every 2 s:
// events accepted per second, commands per synced commit group, and the p99
// of request latency over every method and transport.

import * as api from "./api.js";
import { clear, el, errorBox, fields, fmtBytes, section, table } from "./ui.js";

const SAMPLE_MS = 2000;
const POINTS_MAX = 90; // three minutes of samples

// Prometheus text: [{name, labels: {k: v}, value}] (comments skipped).
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) {
      continue;
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)/.exec(line);
    if (!m) {
      continue;
    }
    const labels = {};
    for (const [, k, v] of (m[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) {
      labels[k] = v;
    }
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

function total(samples, name) {
  return samples.filter((s) => s.name === name).reduce((a, s) => a + s.value, 0);
}

// Cumulative request-latency bucket counts by upper bound, summed over
// every method and transport: [[le, count], ...] ascending.
function latencyBuckets(samples) {
  const by = new Map();
  for (const s of samples) {
    if (s.name === "keyflow_request_duration_seconds_bucket") {
      const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
      by.set(le, (by.get(le) || 0) + s.value);
    }
  }
  return [...by.entries()].sort((a, b) => a[0] - b[0]);
}

// The p99 (ms) of the requests between two samples, as the upper bound of
// the bucket it falls in; null when none finished.
function p99(before, after) {
  const a = latencyBuckets(after);
  const b = new Map(latencyBuckets(before));
  const deltas = a.map(([le, c]) => [le, c - (b.get(le) || 0)]);
  const count = deltas.length ? deltas[deltas.length - 1][1] : 0;
  if (count <= 0) {
    return null;
  }
  for (const [le, c] of deltas) {
    if (c >= 0.99 * count) {
      return le === Infinity ? null : le * 1000;
    }
  }
  return null;
}

class Chart {
  constructor(id, title, unit) {
    this.points = [];
    this.unit = unit;
    this.value = el("span", { class: "chart-value", id: id + "-value" }, "-");
    this.canvas = el("canvas", { id, height: 120 });
    this.node = el("figure", { class: "chart" },
      el("figcaption", {}, title, " ", this.value), this.canvas);
  }

  push(v) {
    this.points.push(v);
    if (this.points.length > POINTS_MAX) {
      this.points.shift();
    }
    this.value.textContent = v === null ? "none" : format(v) + " " + this.unit;
    this.canvas.dataset.points = String(this.points.length);
    this.draw();
  }

  draw() {
    const c = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const w = Math.max(c.clientWidth, 100);
    const h = 120;
    c.width = Math.round(w * ratio);
    c.height = Math.round(h * ratio);
    const g = c.getContext("2d");
    g.scale(ratio, ratio);
    g.clearRect(0, 0, w, h);
    const vals = this.points.filter((v) => v !== null);
    const max = Math.max(1e-9, ...vals) * 1.1;
    g.strokeStyle = "#d7dde3";
    g.lineWidth = 1;
    g.beginPath();
    g.moveTo(0, h - 0.5);
    g.lineTo(w, h - 0.5);
    g.stroke();
    g.fillStyle = "#5c6b78";
    g.font = "11px system-ui, sans-serif";
    g.fillText(format(max) + " " + this.unit, 4, 12);
    g.strokeStyle = "#1f5f8b";
    g.lineWidth = 2;
    g.beginPath();
    let drawing = false;
    const step = w / (POINTS_MAX - 1);
    this.points.forEach((v, i) => {
      const x = w - (this.points.length - 1 - i) * step;
      if (v === null) {
        drawing = false;
        return;
      }
      const y = h - 2 - (v / max) * (h - 18);
      if (drawing) {
        g.lineTo(x, y);
      } else {
        g.moveTo(x, y);
        drawing = true;
      }
    });
    g.stroke();
  }
}

function format(v) {
  if (v >= 100) {
    return v.toFixed(0);
  }
  return v >= 10 ? v.toFixed(1) : v.toFixed(2);
}

export async function view(main, ctx) {
  const ready = el("div", { id: "readiness" });
  const parts = el("div", { id: "partitions" });
  const disk = el("div", { id: "disk" });
  const charts = [
    new Chart("chart-events", "Events accepted", "/s"),
    new Chart("chart-group", "Commit group size", "commands"),
    new Chart("chart-p99", "Request latency p99", "ms"),
  ];
  main.append(el("h1", {}, "Health"),
    section("Readiness", ready), section("Partitions", parts), section("Disk", disk),
    section("Live", ctx.can("metrics:read")
      ? el("div", { class: "charts" }, charts.map((c) => c.node))
      : el("p", { class: "muted" }, "This API key cannot read /metrics (metrics:read).")));

  ctx.every(SAMPLE_MS, async () => {
    // /readyz answers 503 with the reason when not ready.
    try {
      await api.get("/readyz");
      clear(ready).append(el("p", { class: "ok", id: "ready-state" }, "Ready"));
    } catch (err) {
      clear(ready).append(el("p", { class: "error", id: "ready-state" }, "Not ready: " + err.message));
    }
    try {
      const p = await api.get("/v1/partitions");
      clear(parts).append(fields([
        ["Partitions in the data set", p.partitionCount || 1],
        ["Served here", p.served || ""],
        ["Node", p.node || ""],
      ]), table([
        { label: "Partition", cell: (r) => r.partition || 0, cls: "num" },
        { label: "Ready", cell: (r) => el("span", { class: r.ready ? "ok" : "error" }, r.ready ? "ready" : "not ready") },
        { label: "Reason", cell: (r) => r.reason || "" },
        { label: "Directory id", cell: (r) => r.id || "", cls: "mono" },
      ], p.partitions || [], { cls: "partitions" }),
      (p.nodes || []).length ? table([
        { label: "Node", cell: (n) => n.name },
        { label: "Partitions", cell: (n) => n.partitions },
        { label: "gRPC", cell: (n) => n.grpcAddress, cls: "mono" },
        { label: "HTTP", cell: (n) => n.httpAddress || "", cls: "mono" },
      ], p.nodes) : "");
    } catch (err) {
      clear(parts).append(errorBox(err));
    }
  });

  if (!ctx.can("metrics:read")) {
    disk.append(el("p", { class: "muted" }, "Needs metrics:read."));
    return;
  }
  let last = null; // {at, samples}
  ctx.every(SAMPLE_MS, async () => {
    const text = await api.call("GET", "/metrics", undefined, { text: true });
    const now = { at: performance.now(), samples: parseMetrics(text) };
    const s = now.samples;
    clear(disk).append(fields([
      ["Free", fmtBytes(total(s, "keyflow_disk_free_bytes"))],
      ["Reserve", total(s, "keyflow_disk_reserve_reached") > 0
        ? el("span", { class: "error" }, "reached: new writes are refused")
        : el("span", { class: "ok", id: "reserve-state" }, "not reached")],
      ["Refused for the reserve", String(total(s, "keyflow_rejected_disk_reserve_total"))],
    ]));
    if (last) {
      const secs = (now.at - last.at) / 1000;
      const d = (name) => total(s, name) - total(last.samples, name);
      charts[0].push(Math.max(0, d("keyflow_events_accepted_total")) / secs);
      const groups = d("keyflow_commit_group_commands_count");
      charts[1].push(groups > 0 ? d("keyflow_commit_group_commands_sum") / groups : null);
      charts[2].push(p99(last.samples, s));
    }
    last = now;
  });
}
