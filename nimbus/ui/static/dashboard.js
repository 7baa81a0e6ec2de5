// nimbus-ha dashboard: polls /api/v1/ui/dashboard every second and redraws.
// No framework and no build step; text from the cluster is only ever set as textContent.
"use strict";

const REFRESH_MS = 1000;
let refreshing = false;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function prettySecs(total) {
  let s = Math.max(0, Math.floor(total));
  const d = Math.floor(s / 86400); s %= 86400;
  const hr = Math.floor(s / 3600); s %= 3600;
  const m = Math.floor(s / 60); s %= 60;
  const parts = [];
  if (d) parts.push(d + "d");
  if (d || hr) parts.push(hr + "h");
  if (d || hr || m) parts.push(m + "m");
  parts.push(s + "s");
  return parts.join(" ");
}

// Records per second of the last minute as an inline SVG polyline.
function sparkline(points) {
  const width = 120, height = 24, ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  if (points.length > 1) {
    const max = Math.max(...points, 1e-9);
    const step = width / (points.length - 1);
    const coords = points.map((v, i) =>
      `${(i * step).toFixed(1)},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", coords.join(" "));
    svg.append(line);
  }
  return svg;
}

function replace(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function showBanner(text, ok) {
  const banner = document.getElementById("banner");
  banner.textContent = text;
  banner.className = ok ? "banner ok" : "banner";
  banner.hidden = !text;
}

async function act(topology, action) {
  let path = `/api/v1/topology/${encodeURIComponent(topology.id)}/${action}`;
  let body = null;
  if (action === "rebalance") {
    const answer = window.prompt(`Rebalance ${topology.name} to how many workers?`,
                                 String(topology.workersWanted || 1));
    if (answer === null) return;
    const workers = parseInt(answer, 10);
    if (!(workers >= 1)) { showBanner(`not a number of workers: ${answer}`, false); return; }
    if (!window.confirm(`Rebalance ${topology.name} to ${workers} worker(s)?`)) return;
    path += "/0";
    body = JSON.stringify({rebalanceOptions: {numWorkers: workers}});
  } else if (action === "kill") {
    if (!window.confirm(`Kill ${topology.name}? It is removed after its wait (30 s).`)) return;
    path += "/30";
  } else if (!window.confirm(`${action[0].toUpperCase() + action.slice(1)} ${topology.name}?`)) {
    return;
  }
  showBanner(`${action} ${topology.name}…`, true);
  try {
    const response = await fetch(path, {method: "POST", body,
                                        headers: {"Content-Type": "application/json"}});
    const answer = await response.json();
    showBanner(response.ok ? `${action} ${topology.name}: done`
                           : `${action} ${topology.name} failed: ${answer.errorMessage}`,
               response.ok);
  } catch (err) {
    showBanner(`${action} ${topology.name} failed: ${err}`, false);
  }
  refresh();
}

function actionButtons(t) {
  const killed = t.status === "KILLED";
  // mayChange: the UI's authorizer lets this caller change it (the server checks again).
  const refused = t.mayChange === false;
  const button = (action, label, disabled) =>
    h("button", {"data-action": action, "data-topology": t.id,
                 disabled: disabled || killed || refused,
                 title: refused ? "you may not change this topology" : null,
                 onclick: () => act(t, action)}, label);
  // REBALANCING (a rebalance's wait): only kill is allowed until it completes.
  const rebalancing = t.status === "REBALANCING";
  return [button("activate", "Activate", t.status === "ACTIVE" || rebalancing),
          button("deactivate", "Deactivate", t.status === "INACTIVE" || rebalancing),
          button("rebalance", "Rebalance", rebalancing), button("kill", "Kill")];
}

function drawTopologies(topologies) {
  document.getElementById("no-topologies").hidden = topologies.length > 0;
  replace(document.querySelector("#topologies tbody"), topologies.map((t) => {
    const low = t.status !== "KILLED" && t.replicationCount < t.replicationMin;
    const err = t.newestError;
    // A topology this caller may not read (nimbus.authorizer) comes without its numbers.
    const hidden = t.mayRead === false;
    const dash = () => h("span", {class: "muted", title: "you may not read this topology"}, "—");
    return h("tr", {"data-topology": t.id, class: hidden ? "unreadable" : null},
      h("td", {}, h("a", {href: `#/topology/${encodeURIComponent(t.id)}`, class: "topology-link"},
                    h("strong", {}, t.name)), h("br"), h("small", {class: "muted"}, t.id)),
      h("td", {}, h("span", {class: `badge status ${t.status}`}, t.status)),
      h("td", {class: "num"},
        `${hidden ? "—" : t.workersAlive} / ${t.workersTotal} / ${t.workersWanted}`,
        hidden ? null : notRunning(t.workerStates)),
      h("td", {class: "num" + (low ? " low" : ""), title: low ? "below the minimum" : null},
        `${t.replicationCount} / ${t.replicationMin}`),
      h("td", {class: "num"}, hidden ? dash()
        : [t.recordsPerSecond.toFixed(1), sparkline(t.history)]),
      h("td", {class: "num"}, hidden ? dash() : t.restarts),
      h("td", {class: "error", title: err ? err.error : null},
        err ? `${err.component}: ${err.error.split("\n")[0]}` : h("span", {class: "muted"}, "—"),
        t.errorCount > 1 ? h("small", {class: "muted"}, ` (+${t.errorCount - 1})`) : null),
      h("td", {}, actionButtons(t)));
  }));
}

// Workers placed but not running, by state ("1 restarting, 1 dead"): a worker counts as
// alive only while its beat is fresh (docs/runtime.md, "What a worker's state means").
function notRunning(states) {
  const shown = ["starting", "frozen", "restarting", "dead"]
    .filter((s) => states && states[s] > 0).map((s) => `${states[s]} ${s}`);
  return shown.length ? [h("br"), h("small", {class: "worker-states muted"}, shown.join(", "))]
    : null;
}

function drawNimbuses(nimbuses) {
  replace(document.querySelector("#nimbuses tbody"), nimbuses.map((n) => {
    const complete = n.codeHeld === n.codeLive;
    return h("tr", {"data-nimbus": n.address, class: n.status === "Leader" ? "leader" : null},
      h("td", {}, n.address),
      h("td", {}, h("span", {class: `badge status ${n.status.replace(/ /g, "-")}`}, n.status)),
      h("td", {class: "num" + (complete ? "" : " low")}, `${n.codeHeld} / ${n.codeLive}`),
      h("td", {}, n.version || "—"),
      h("td", {class: "num"}, n.nimbusUpTime),
      h("td", {class: "num"}, dutyCycleAge(n)));
  }));
}

// The leader's last completed duty cycle: known only to a UI inside the leader.
function dutyCycleAge(n) {
  if (typeof n.dutyCycleAgeSecs !== "number") {
    return h("span", {class: "muted", title: n.status === "Leader"
      ? "shown by a UI running inside the leader (nimbus.ui.enabled)" : null}, "—");
  }
  return `${n.dutyCycleAgeSecs.toFixed(1)}s ago`;
}

function drawSupervisors(supervisors) {
  document.getElementById("no-supervisors").hidden = supervisors.length > 0;
  replace(document.querySelector("#supervisors tbody"), supervisors.map((s) => {
    const pct = s.slotsTotal ? (100 * s.slotsUsed / s.slotsTotal) : 0;
    return h("tr", {"data-supervisor": s.id},
      h("td", {}, h("small", {}, s.id)), h("td", {}, s.host),
      h("td", {class: "num"}, h("span", {class: "bar"}, h("span", {style: `width:${pct}%`})),
        `${s.slotsUsed} / ${s.slotsTotal}`),
      h("td", {class: "num"}, warmWorkers(s)),
      h("td", {class: "num"}, s.uptime));
  }));
}

function warmWorkers(s) {
  if (!s.warmReady && !s.warmStarting) return "—";
  const starting = s.warmStarting ? ` (+${s.warmStarting} starting)` : "";
  return `${s.warmReady} ready${starting} · ${Math.round(s.warmMemoryBytes / 1048576)} MiB`;
}

function drawTimeline(events) {
  replace(document.getElementById("timeline"), events.map((e) =>
    h("li", {"data-kind": e.kind},
      h("time", {}, new Date(e.time * 1000).toLocaleTimeString()),
      h("span", {class: "kind"}, e.kind), e.message)));
}

function draw(data) {
  const user = document.getElementById("user");
  user.textContent = data.user ? `signed in as ${data.user}` : "";
  user.hidden = !data.user;
  const leader = document.getElementById("leader");
  leader.textContent = data.leader || "none";
  leader.className = data.leader ? "" : "low";
  const c = data.cluster;
  document.getElementById("cluster-counts").textContent =
    ` · ${c.topologies} topologies · ${c.supervisors} supervisors · ` +
    `slots ${c.slotsUsed}/${c.slotsTotal} · v${c.stormVersion}`;
  drawTopologies(data.topologies);
  drawNimbuses(data.nimbuses);
  drawSupervisors(data.supervisors);
  drawTimeline(data.timeline);
  document.getElementById("refresh-state").textContent =
    "updated " + new Date(data.generatedAt * 1000).toLocaleTimeString();
}

async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    const response = await fetch("/api/v1/ui/dashboard", {cache: "no-store"});
    const data = await response.json();
    if (response.ok) draw(data);
    else document.getElementById("refresh-state").textContent = data.errorMessage;
  } catch (err) {
    document.getElementById("refresh-state").textContent = "UI unreachable: " + err;
  } finally {
    refreshing = false;
  }
}

function loop() {
  refresh().finally(() => setTimeout(loop, REFRESH_MS));
}

document.addEventListener("DOMContentLoaded", loop);
