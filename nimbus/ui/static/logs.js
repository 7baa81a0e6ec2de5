// nimbus-ha topology page, Logs panel: the tail of one worker's log (refreshed every few
// seconds while shown) or the matches of a search in it, from
// /api/v1/topology/<id>/logs (the UI reads its supervisor's logviewer: docs/logs.md).
// Log text is tenant output: only ever set as text.
"use strict";

const LOG_REFRESH_MS = 5000;
let logMode = "tail";      // "tail" or "search"
let logTimer = null;
let logTopology = null;

// Called by drawTopologyPage: the worker choices, keeping the one chosen.
function drawLogWorkers(data) {
  const select = document.getElementById("tp-log-worker");
  const chosen = select.value;
  const wanted = data.workers.map((w) => String(w.index));
  const shown = [...select.options].map((o) => o.value);
  const changed = wanted.join(",") !== shown.join(",");
  if (changed) {
    select.replaceChildren(...data.workers.map((w) =>
      h("option", {value: String(w.index)}, `worker-${w.index} (${w.host}:${w.port}, ${w.state})`)));
    if (wanted.includes(chosen)) select.value = chosen;
  }
  if (logTopology !== data.id) {   // a new page: start with the first worker's tail
    logTopology = data.id;
    logMode = "tail";
    document.getElementById("tp-log-search").value = "";
    loadLog();
  } else if (changed && logMode === "tail") {   // a worker placed (or moved) since
    loadLog();
  }
}

async function loadLog() {
  clearTimeout(logTimer);
  const id = pageTopology;
  const worker = document.getElementById("tp-log-worker").value;
  const text = document.getElementById("tp-log-text");
  const where = document.getElementById("tp-log-where");
  if (id === null || worker === "") {
    text.textContent = "";
    where.textContent = "no worker placed";
    return;
  }
  const search = document.getElementById("tp-log-search").value;
  const query = new URLSearchParams({worker});
  if (logMode === "search") query.set("search", search);
  try {
    const response = await fetch(
      `/api/v1/topology/${encodeURIComponent(id)}/logs?${query}`, {cache: "no-store"});
    const data = await response.json();
    if (pageTopology !== id) return;
    if (!response.ok) {
      text.textContent = "";
      where.textContent = data.errorMessage || response.statusText;
    } else if (logMode === "search") {
      where.textContent = `${data.matches.length} match(es) of "${data.search}" in ${data.file}`;
      text.textContent = data.matches.map((m) =>
        `@${m.byteOffset}: ${m.beforeString.split("\n").pop()}${m.matchString}` +
        `${m.afterString.split("\n")[0]}`).join("\n") || "(no match)";
    } else {
      where.textContent = `${data.file} on ${data.logviewer} · last ${data.lines.length} ` +
        `line(s) of ${data.size} bytes`;
      const atEnd = text.scrollTop + text.clientHeight >= text.scrollHeight - 4;
      text.textContent = data.lines.join("\n") || "(nothing written yet)";
      if (atEnd) text.scrollTop = text.scrollHeight;
    }
  } catch (err) {
    where.textContent = "UI unreachable: " + err;
  }
  if (logMode === "tail" && pageTopology === id) logTimer = setTimeout(loadLog, LOG_REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("tp-log-form").addEventListener("submit", (event) => {
    event.preventDefault();
    logMode = document.getElementById("tp-log-search").value ? "search" : "tail";
    loadLog();
  });
  document.getElementById("tp-log-tail").addEventListener("click", () => {
    logMode = "tail";
    loadLog();
  });
  document.getElementById("tp-log-worker").addEventListener("change", loadLog);
});
window.addEventListener("hashchange", () => { if (!location.hash.startsWith("#/topology/")) logTopology = null; });
