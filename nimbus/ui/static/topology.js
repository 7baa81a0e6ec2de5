// nimbus-ha topology page (#/topology/<id>): polls /api/v1/topology/<id>/page and draws
// the topology's status and actions, its workers (state, code version, placement
// history, Spark UI), per component the charts of the last 15 minutes, Spark's newest
// progress and the checkpoint, and the newest errors (the Versions panel: versions.js).
// Uses h(), prettySecs(), actionButtons() and showBanner() of dashboard.js and
// timeChart() of charts.js. Text from the cluster (component names, offsets, errors) is
// only ever set as text (h() makes text nodes), never parsed as HTML.
"use strict";

const PAGE_REFRESH_MS = 2000;
const ERRORS_SHOWN = 10;
let pageTopology = null;   // the id shown, or null on the dashboard
let pageTimer = null;
let pageLoading = false;

function routeTopology() {
  const match = location.hash.match(/^#\/topology\/(.+)$/);
  let id = null;
  if (match) {
    try { id = decodeURIComponent(match[1]); } catch (err) { id = match[1]; }
  }
  pageTopology = id;
  document.body.dataset.page = id ? "topology" : "dashboard";
  document.getElementById("dashboard").hidden = Boolean(id);
  document.getElementById("topology-page").hidden = !id;
  clearTimeout(pageTimer);
  if (id) {
    document.getElementById("topology-page").dataset.topology = id;
    pageLoop();
  }
  // The dashboard's own loop goes on meanwhile: the header stays current.
}

function pageLoop() {
  const shown = pageTopology;
  loadTopology(shown).finally(() => {
    if (pageTopology === shown && shown !== null) pageTimer = setTimeout(pageLoop, PAGE_REFRESH_MS);
  });
}

async function loadTopology(id) {
  if (pageLoading || id === null) return;
  pageLoading = true;
  const state = document.getElementById("refresh-state");
  try {
    const response = await fetch(`/api/v1/topology/${encodeURIComponent(id)}/page`,
                                 {cache: "no-store"});
    const data = await response.json();
    if (pageTopology !== id) return;   // the user went elsewhere meanwhile
    if (response.ok) {
      drawTopologyPage(data);
      state.textContent = "updated " + new Date(data.generated_at * 1000).toLocaleTimeString();
    } else {
      drawTopologyMissing(id, data.errorMessage || response.statusText);
      state.textContent = data.errorMessage || response.statusText;
    }
  } catch (err) {
    state.textContent = "UI unreachable: " + err;
  } finally {
    pageLoading = false;
  }
}

function drawTopologyMissing(id, message) {
  document.getElementById("tp-name").textContent = id;
  const status = document.getElementById("tp-status");
  status.textContent = "";
  status.hidden = true;
  document.getElementById("tp-summary").textContent = message;
  for (const part of ["tp-actions", "tp-components", "tp-errors", "tp-switch"]) {
    document.getElementById(part).replaceChildren();
  }
  document.querySelector("#tp-version-list tbody").replaceChildren();
  document.querySelector("#tp-workers tbody").replaceChildren();
}

// <details> elements keep their open state across redraws (keyed by data-key).
function openDetails() {
  return new Set([...document.querySelectorAll("#topology-page details[open]")]
    .map((d) => d.dataset.key));
}

function drawTopologyPage(data) {
  const open = openDetails();
  document.getElementById("tp-name").textContent = data.name;
  const status = document.getElementById("tp-status");
  status.hidden = false;
  status.textContent = data.status;
  status.className = `badge status ${data.status}`;
  const running = data.workers.filter((w) => w.alive).length;
  document.getElementById("tp-summary").textContent =
    `${data.id} · owner ${data.owner || "—"} · up ${prettySecs(data.uptime_secs)} · ` +
    `workers ${running} running / ${data.workers.length} placed / ${data.num_workers} wanted`;
  document.getElementById("tp-actions").replaceChildren(...actionButtons({
    id: data.id, name: data.name, status: data.status, mayChange: data.may_change,
    workersWanted: data.num_workers}));
  drawWorkers(data.workers, open);
  drawComponents(data, open);
  drawErrors(data.errors, open);
  drawLogWorkers(data);   // logs.js
  drawVersions(data);     // versions.js
}

// -- workers --------------------------------------------------------------------------
function workerState(w) {
  const label = w.state === "restarting" ? `restarting (back-off ${w.backoff_secs}s)` : w.state;
  return h("span", {class: `badge state ${w.state}`, "data-state": w.state}, label);
}

// The code version a worker runs, "2 → 3" while it is assigned another (a switch).
function workerVersion(w) {
  if (w.assigned_version === undefined) return h("span", {class: "muted"}, "—");
  const runs = w.version === null ? "?" : String(w.version);
  return w.version === w.assigned_version ? runs : `${runs} → ${w.assigned_version}`;
}

function sparkUiLink(url) {
  // Checked by the supervisor and the reader already; an http(s) URL or nothing.
  if (!url || !/^https?:\/\//i.test(url)) return h("span", {class: "muted"}, "—");
  return h("a", {href: url, target: "_blank", rel: "noopener noreferrer",
                 class: "spark-ui"}, "Spark UI");
}

function placementList(w, open) {
  const key = `placements:${w.worker}`;
  const placements = w.placements || [];   // none from a nimbus of an earlier release
  if (!placements.length) return h("span", {class: "muted"}, "—");
  return h("details", {"data-key": key, open: open.has(key)},
    h("summary", {}, `${placements.length} placement${placements.length > 1 ? "s" : ""}`),
    h("ol", {class: "placements"}, placements.map((p) =>
      h("li", {"data-supervisor": p.supervisor_id, title: `supervisor ${p.supervisor_id}`},
        h("span", {class: "where"}, `${p.host}:${p.port}`), " ",
        h("span", {class: "when"},
          `${new Date(p.since_secs * 1000).toLocaleString()} → ` +
          (p.until_secs ? new Date(p.until_secs * 1000).toLocaleString() : "now"))))));
}

function drawWorkers(workers, open) {
  document.getElementById("tp-no-workers").hidden = workers.length > 0;
  document.querySelector("#tp-workers tbody").replaceChildren(...workers.map((w) =>
    h("tr", {"data-worker": w.worker},
      h("td", {}, w.worker, w.warm_start ? h("small", {class: "muted"}, " warm") : null),
      h("td", {}, `${w.host}:${w.port}`, h("br"), h("small", {class: "muted"}, w.supervisor_id)),
      h("td", {class: "state"}, workerState(w)),
      h("td", {class: "num version"}, workerVersion(w)),
      h("td", {class: "num"}, prettySecs(w.uptime_secs)),
      h("td", {class: "num"}, w.restarts),
      h("td", {class: "num"}, w.memory_bytes ? `${Math.round(w.memory_bytes / 1048576)} MiB` : "—"),
      h("td", {}, Object.keys(w.components).join(", ") || h("span", {class: "muted"}, "—")),
      h("td", {}, sparkUiLink(w.spark_ui_url)),
      h("td", {class: "error", title: w.last_error || null}, w.last_error || ""),
      h("td", {class: "placement-history"}, placementList(w, open)))));
}

// -- components ---------------------------------------------------------------------------
function fmt(value, digits = 1) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(digits);
  return String(value);
}

function table(cls, headers, rows) {
  return h("table", {class: `compact ${cls}`},
    h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))),
    h("tbody", {}, rows));
}

function drawCharts(name, c) {
  if (!c.progress) return null;
  const history = c.history || [];
  const end = c.history_end_secs || (history.length ? history[history.length - 1][0]
                                                     : Math.floor(Date.now() / 1000));
  if (!history.length) {
    return h("p", {class: "muted no-history"}, "No batch ran in the last 15 minutes.");
  }
  const rates = timeChart({
    label: `${name}: input and processed rows per second`, endSecs: end, unit: "/s",
    series: [{name: "input", cls: "input", points: history.map((p) => [p[0], p[1]])},
             {name: "processed", cls: "processed", points: history.map((p) => [p[0], p[2]])}]});
  const durations = timeChart({
    label: `${name}: batch duration`, endSecs: end, unit: " ms",
    series: [{name: "duration", cls: "duration", points: history.map((p) => [p[0], p[3]])}]});
  return h("div", {class: "charts"},
    h("figure", {class: "chart-rates"}, rates,
      h("figcaption", {}, h("span", {class: "key input"}), "input rows/s ",
        h("span", {class: "key processed"}, ""), "processed rows/s")),
    h("figure", {class: "chart-duration"}, durations,
      h("figcaption", {}, h("span", {class: "key duration"}), "batch duration (slowest of each 10 s)")));
}

// Spark reports -1 output rows for sinks that do not count them (the file sink).
function rowsOut(n) {
  return n === null || n < 0 ? "rows out not counted by this sink" : `${n} rows out`;
}

function drawProgress(c, open, name) {
  const p = c.progress;
  if (!p) {
    return h("p", {class: "muted"}, "No Spark progress: a process topology's command, or a " +
             "worker of an earlier release.");
  }
  const sources = p.sources.length ? table("sources",
    ["Source", "Start offset", "End offset", "Latest offset", "Rows", "Input/s", "Processed/s"],
    p.sources.map((s) => h("tr", {},
      h("td", {class: "text"}, fmt(s.description)),
      h("td", {class: "offset"}, h("code", {}, fmt(s.start_offset))),
      h("td", {class: "offset"}, h("code", {}, fmt(s.end_offset))),
      h("td", {class: "offset"}, h("code", {}, fmt(s.latest_offset))),
      h("td", {class: "num"}, fmt(s.num_input_rows)),
      h("td", {class: "num"}, fmt(s.input_rows_per_second)),
      h("td", {class: "num"}, fmt(s.processed_rows_per_second)))))
    : h("p", {class: "muted"}, "No source reported yet.");
  const operators = p.state_operators.length ? table("state-operators",
    ["State operator", "Rows total", "Rows updated", "Memory", "Dropped by watermark"],
    p.state_operators.map((s) => h("tr", {},
      h("td", {}, fmt(s.operator_name)), h("td", {class: "num"}, fmt(s.num_rows_total)),
      h("td", {class: "num"}, fmt(s.num_rows_updated)),
      h("td", {class: "num"}, s.memory_used_bytes === null ? "—"
        : `${(s.memory_used_bytes / 1048576).toFixed(1)} MiB`),
      h("td", {class: "num"}, fmt(s.num_rows_dropped_by_watermark)))))
    : h("p", {class: "muted"}, "No state operators.");
  const durations = Object.entries(p.duration_ms);
  return h("div", {class: "progress"},
    h("p", {class: "muted"}, `Newest progress: batch ${fmt(p.batch_id)}` +
      (p.timestamp && !isNaN(Date.parse(p.timestamp))
        ? ` at ${new Date(p.timestamp).toLocaleTimeString()}` : "") +
      (c.live ? "" : " (its worker is not running: last known)") +
      (c.details_cut ? " · some details were dropped to keep its beat within 64 KiB" : "")),
    sources,
    h("p", {class: "sink"}, h("strong", {}, "Sink: "),
      p.sink ? `${fmt(p.sink.description)} · ${rowsOut(p.sink.num_output_rows)}` : "—"),
    operators,
    h("p", {class: "watermark"}, h("strong", {}, "Watermark: "), fmt(p.watermark)),
    durations.length ? h("details", {"data-key": `durations:${name}`, open: open.has(`durations:${name}`)},
      h("summary", {}, `Durations (trigger ${fmt(p.duration_ms.triggerExecution)} ms)`),
      h("ul", {class: "durations"}, durations.map(([k, v]) => h("li", {}, `${k}: ${fmt(v)} ms`))))
      : null);
}

function checkpointLine(data, name, c) {
  if (!c.progress) return null;
  return h("p", {class: "checkpoint"}, h("strong", {}, "Checkpoint: "),
    c.checkpoint ? h("code", {}, c.checkpoint)
      : h("span", {class: "muted"}, `not set in the topology's configuration: ` +
          `<storm.local.dir>/checkpoints/${data.id}/${name} on its supervisor's host ` +
          `(or the supervisor's own topology.spark.checkpoint.dir)`));
}

function drawComponents(data, open) {
  const names = Object.keys(data.components);
  document.getElementById("tp-components").replaceChildren(...(names.length ? names.map((name) => {
    const c = data.components[name];
    return h("article", {class: "component", "data-component": name},
      h("h3", {}, h("span", {class: "component-name"}, name), " ",
        h("small", {class: "muted"},
          `${c.reported_by || ""} · ${c.host_ports.join(", ")} · batch ${fmt(c.batch_id)} · ` +
          `${fmt(c.input_rows_per_second)} in/s · ${fmt(c.processed_rows_per_second)} processed/s`)),
      drawCharts(name, c), drawProgress(c, open, name), checkpointLine(data, name, c));
  }) : [h("p", {class: "muted"}, "No component has reported yet.")]));
}

// -- errors ---------------------------------------------------------------------------------
function drawErrors(errors, open) {
  const all = Object.entries(errors).flatMap(([component, kept]) =>
    kept.map((e) => ({component, ...e})));
  all.sort((a, b) => b.time_secs - a.time_secs);
  const shown = all.slice(0, ERRORS_SHOWN);
  document.getElementById("tp-errors").replaceChildren(...(shown.length ? shown.map((e, i) => {
    const key = `error:${e.component}:${e.time_secs}:${i}`;
    const first = e.error.split("\n")[0];
    return h("li", {"data-component": e.component},
      h("time", {}, new Date(e.time_secs * 1000).toLocaleString()), " ",
      h("span", {class: "badge"}, e.component), " ",
      h("small", {class: "muted"}, e.host ? `${e.host}:${e.port}` : ""),
      h("details", {"data-key": key, open: open.has(key)},
        h("summary", {class: "error-text"}, first),
        h("pre", {class: "error-full"}, e.error)));
  }) : [h("li", {class: "muted"}, "No errors.")]));
}

window.addEventListener("hashchange", routeTopology);
document.addEventListener("DOMContentLoaded", routeTopology);
