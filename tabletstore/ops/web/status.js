// tabletstore status page: draws the charts from /api/charts as inline SVG and refreshes the
// server-rendered sections ([data-live]) in place. Hand-written, no library, no network but
// this process. Data from the JSON is only ever set as text (textContent, attributes), never
// as HTML.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04",
  "#db2777", "#4b5563", "#65a30d"];
const W = 420, H = 170, LEFT = 52, RIGHT = 10, TOP = 10, BOTTOM = 24;

function el(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function fmt(v) {
  if (v >= 1000) return (v / 1000).toFixed(v >= 10000 ? 0 : 1) + "k";
  if (v >= 10 || v === 0) return v.toFixed(0);
  return v.toFixed(v >= 1 ? 1 : 2);
}

// The time axis spans from the oldest sample kept (at most ``window`` ago, at least a minute)
// to now, so a page opened soon after start-up is not a line squeezed against the right edge.
function timeSpan(series, now, window) {
  let oldest = now;
  for (const s of series) if (s.points.length) oldest = Math.min(oldest, s.points[0].at);
  return Math.min(window, Math.max(60, now - oldest));
}

function spanLabel(seconds) {
  return seconds >= 120 ? "-" + Math.round(seconds / 60) + " min" : "-" + Math.round(seconds) + " s";
}

function drawChart(figure, series, colors, now, window) {
  const field = figure.dataset.field;
  const svg = figure.querySelector("svg");
  svg.replaceChildren();
  const start = now - window;
  let max = 0, drawn = 0;
  for (const s of series) for (const p of s.points) if (p[field] != null) max = Math.max(max, p[field]);
  max = niceMax(max);
  const x = t => LEFT + (W - LEFT - RIGHT) * Math.max(0, (t - start) / window);
  const y = v => TOP + (H - TOP - BOTTOM) * (1 - v / max);
  for (const frac of [0, 0.5, 1]) {
    const yy = y(max * frac);
    svg.append(el("line", {x1: LEFT, x2: W - RIGHT, y1: yy, y2: yy, class: "gridline"}));
    svg.append(el("text", {x: LEFT - 6, y: yy + 4, class: "axis", "text-anchor": "end"}, fmt(max * frac)));
  }
  svg.append(el("text", {x: LEFT, y: H - 6, class: "axis"}, spanLabel(window)));
  svg.append(el("text", {x: W - RIGHT, y: H - 6, class: "axis", "text-anchor": "end"}, "now"));
  for (const s of series) {
    const pts = s.points.filter(p => p[field] != null && p.at >= start)
      .map(p => x(p.at).toFixed(1) + "," + y(p[field]).toFixed(1));
    if (pts.length < 2) continue;
    drawn += 1;
    svg.append(el("polyline", {points: pts.join(" "), class: "series", stroke: colors.get(s.process),
      "data-process": s.process}));
  }
  if (drawn === 0) {
    svg.append(el("text", {x: W / 2, y: H / 2, class: "empty", "text-anchor": "middle"},
      "collecting samples…"));
  }
}

function drawLegend(series, colors) {
  const legend = document.getElementById("legend");
  if (!legend) return;
  legend.replaceChildren();
  for (const s of series) {
    const item = document.createElement("li");
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = colors.get(s.process);
    item.append(swatch);
    if (s.page_url) {
      const a = document.createElement("a");
      a.href = s.page_url + "/";
      a.textContent = s.process;
      item.append(a);
    } else {
      item.append(document.createTextNode(s.process));
    }
    legend.append(item);
  }
}

async function refreshCharts() {
  const url = document.body.dataset.chartsUrl;
  const response = await fetch(url, {cache: "no-store"});
  if (!response.ok) throw new Error(url + " answered " + response.status);
  const charts = await response.json();
  const colors = new Map(charts.series.map((s, i) => [s.process, PALETTE[i % PALETTE.length]]));
  const now = Date.now() / 1000;
  const window = timeSpan(charts.series, now, charts.window_seconds);
  for (const figure of document.querySelectorAll("figure.chart")) {
    drawChart(figure, charts.series, colors, now, window);
  }
  drawLegend(charts.series, colors);
  document.body.dataset.chartsDrawn = String(Number(document.body.dataset.chartsDrawn || 0) + 1);
}

async function refreshSections() {
  const response = await fetch(location.pathname, {cache: "no-store"});
  if (!response.ok) return;
  const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
  for (const section of document.querySelectorAll("[data-live]")) {
    const next = fresh.getElementById(section.id);
    if (next) {
      // Keep the open/closed state of each table the reader chose.
      const closed = new Set([...section.querySelectorAll("details:not([open])")].map(d => d.dataset.table));
      section.replaceWith(next);
      for (const d of next.querySelectorAll("details")) if (closed.has(d.dataset.table)) d.open = false;
    }
  }
}

function every(seconds, task) {
  const run = () => task().catch(err => console.warn("status page refresh:", err));
  run();
  setInterval(run, seconds * 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  const seconds = Number(document.body.dataset.refreshSeconds) || 5;
  every(Math.min(seconds, 5), refreshCharts);
  setInterval(() => refreshSections().catch(err => console.warn("status page refresh:", err)),
    seconds * 1000);
});
