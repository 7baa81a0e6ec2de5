// Small time-series charts drawn as inline SVG: no library, no build step.
// timeChart() draws one or more series over a fixed time window (the topology page's
// last 15 minutes). Every point is a vertex of a polyline; a gap of more than two
// buckets (no batch ran) breaks the line instead of drawing a slope across it.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  return el;
}

// 1234 -> "1.2k"; small numbers keep a decimal.
function compactNumber(value) {
  const abs = Math.abs(value);
  if (abs >= 1e9) return (value / 1e9).toFixed(1).replace(/\.0$/, "") + "G";
  if (abs >= 1e6) return (value / 1e6).toFixed(1).replace(/\.0$/, "") + "M";
  if (abs >= 1e3) return (value / 1e3).toFixed(1).replace(/\.0$/, "") + "k";
  if (abs >= 10 || value === 0) return String(Math.round(value));
  return value.toFixed(1);
}

// The smallest of 1, 2, 2.5, 5 x 10^n at or above value (an axis's top).
function niceCeiling(value) {
  if (!(value > 0)) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (value <= step * power) return step * power;
  }
  return 10 * power;
}

function clockTime(secs) {
  return new Date(secs * 1000).toLocaleTimeString([], {hour: "2-digit", minute: "2-digit"});
}

// series: [{name, cls, points: [[timeSecs, value], ...]}] (values may be null: skipped).
// endSecs: the window's right edge; windowSecs: its width; gapSecs: a longer gap between
// two points breaks the line. Returns an <svg>; each series' polylines carry its cls.
function timeChart({label, series, endSecs, windowSecs = 900, gapSecs = 20, unit = ""}) {
  const width = 380, height = 150;
  const left = 46, right = 10, top = 10, bottom = 22;
  const plotW = width - left - right, plotH = height - top - bottom;
  const start = endSecs - windowSecs;
  const svg = svgEl("svg", {class: "chart", width, height, viewBox: `0 0 ${width} ${height}`,
                            role: "img", "aria-label": label});
  const title = svgEl("title");
  title.textContent = label;
  svg.append(title);
  const values = series.flatMap((s) => s.points.map((p) => p[1]))
    .filter((v) => typeof v === "number" && isFinite(v));
  const yMax = niceCeiling(Math.max(0, ...values));
  const x = (t) => left + ((t - start) / windowSecs) * plotW;
  const y = (v) => top + plotH - (v / yMax) * plotH;
  // Grid and the y axis' labels: 0, half, top.
  for (const fraction of [0, 0.5, 1]) {
    const gy = y(yMax * fraction);
    svg.append(svgEl("line", {class: "grid", x1: left, x2: width - right, y1: gy, y2: gy}));
    const tick = svgEl("text", {class: "tick", x: left - 4, y: gy + 3, "text-anchor": "end"});
    tick.textContent = compactNumber(yMax * fraction) + (fraction === 1 ? unit : "");
    svg.append(tick);
  }
  // The x axis: the window's start, middle and end on the worker host's clock.
  [[start, "start"], [start + windowSecs / 2, "middle"], [endSecs, "end"]].forEach(([t, a]) => {
    const tick = svgEl("text", {class: "tick", x: x(t), y: height - 6, "text-anchor": a});
    tick.textContent = clockTime(t);
    svg.append(tick);
  });
  let drawn = 0;
  for (const s of series) {
    const points = s.points.filter((p) => typeof p[1] === "number" && isFinite(p[1]) &&
                                          p[0] >= start && p[0] <= endSecs);
    drawn += points.length;
    const segments = [];
    let current = [];
    points.forEach((p, i) => {
      if (i > 0 && p[0] - points[i - 1][0] > gapSecs) { segments.push(current); current = []; }
      current.push(p);
    });
    if (current.length) segments.push(current);
    for (const segment of segments) {
      const coords = segment.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`);
      svg.append(svgEl("polyline", {class: `series ${s.cls}`, points: coords.join(" "),
                                    "data-series": s.name}));
      if (segment.length === 1) {  // a lone point: a dot, or it would not show
        svg.append(svgEl("circle", {class: `dot ${s.cls}`, r: 2,
                                    cx: x(segment[0][0]), cy: y(segment[0][1])}));
      }
    }
  }
  svg.setAttribute("data-points", String(drawn));
  return svg;
}
