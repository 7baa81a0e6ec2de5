// nimbus-ha topology page, Versions panel: the topology's code versions (number, state,
// when and by whom submitted, sha256, recorded error) from /api/v1/topology/<id>/history,
// the switch under way from the page's data, and a picker with a Switch button that
// POSTs /api/v1/topology/<id>/version/<n> (the leader's rollbackTopology, as
// `nimbus-ha rollback NAME --to N`). Errors and submitters are tenant text: only ever
// set as text (h() makes text nodes).
// Uses h(), showBanner() of dashboard.js and pageTopology of topology.js.
"use strict";

const HISTORY_EVERY_MS = 15000;   // the history is asked again at least this often
let versionsKey = null;           // what the page said of versions when last fetched
let versionsFetchedAt = 0;
let versionsLoading = false;
let versionsHistory = null;       // the newest history shown
let versionsPage = null;          // the newest page data (name, status, may_change)

// Called by drawTopologyPage: the running version, the switch under way, and the
// history again when either changed (or every HISTORY_EVERY_MS).
function drawVersions(data) {
  versionsPage = data;
  const running = data.code_version === undefined ? null : data.code_version;
  document.getElementById("tp-version-running").textContent =
    running === null ? "" : `version ${running} runs`;
  drawSwitch(data.switch || null, data.workers.length);
  const key = JSON.stringify([data.id, running, data.switch || null,
                              (data.code_versions || []).map((v) => [v.version, v.state])]);
  if (key !== versionsKey || Date.now() - versionsFetchedAt > HISTORY_EVERY_MS) {
    versionsKey = key;
    loadHistory(data.id);
  } else {
    drawPicker();
  }
}

function drawSwitch(sw, workers) {
  const line = document.getElementById("tp-switch");
  line.hidden = !sw;
  if (!sw) { line.replaceChildren(); return; }
  const switched = sw.switched || [];
  line.replaceChildren(
    h("strong", {}, `${sw.kind === "rollback" ? "Rollback" : "Upgrade"} under way: `),
    `version ${sw.from} → ${sw.to} (${sw.strategy === "rolling" ? "one worker at a time" : "all workers at once"}), `,
    h("span", {class: "switched", "data-switched": switched.length},
      `${switched.length} of ${workers} workers switched`),
    switched.length ? ` (${switched.join(", ")})` : "",
    sw.deadline_secs ? ` · rolled back if not done by ${new Date(sw.deadline_secs * 1000).toLocaleTimeString()}` : "",
    sw.by ? ` · asked by ${sw.by}` : "");
}

async function loadHistory(id) {
  if (versionsLoading) return;
  versionsLoading = true;
  const note = document.getElementById("tp-version-note");
  try {
    const response = await fetch(`/api/v1/topology/${encodeURIComponent(id)}/history`,
                                 {cache: "no-store"});
    const data = await response.json();
    if (pageTopology !== id) return;
    versionsFetchedAt = Date.now();
    if (response.ok) {
      versionsHistory = data;
      note.textContent = "";
      drawVersionList(data);
    } else {
      versionsHistory = null;
      document.querySelector("#tp-version-list tbody").replaceChildren();
      note.textContent = `history unavailable: ${data.errorMessage || response.statusText}`;
    }
    drawPicker();
  } catch (err) {
    note.textContent = "history unavailable: " + err;
  } finally {
    versionsLoading = false;
  }
}

function shortTime(secs) {
  return secs ? new Date(secs * 1000).toLocaleString() : "—";
}

function drawVersionList(history) {
  document.querySelector("#tp-version-list tbody").replaceChildren(...history.versions.map((v) =>
    h("tr", {"data-version": v.version, "data-state": v.state,
             class: v.version === history.running ? "running-version" : null},
      h("td", {class: "num"}, v.version),
      h("td", {}, h("span", {class: `badge version-state ${v.state.replace(/ /g, "-")}`}, v.state)),
      h("td", {}, shortTime(v.created_secs)),
      h("td", {class: "submitter"}, v.submitter || "—"),
      h("td", {}, h("code", {title: v.sha256 || null}, (v.sha256 || "—").slice(0, 12))),
      h("td", {class: "error version-error", title: v.error || null}, v.error || ""))));
}

// The kept versions other than the running one, keeping the one chosen.
function drawPicker() {
  const select = document.getElementById("tp-version-pick");
  const button = document.getElementById("tp-version-switch");
  const chosen = select.value;
  const history = versionsHistory;
  const choices = history ? history.versions.filter((v) => v.version !== history.running) : [];
  const wanted = choices.map((v) => String(v.version));
  if (wanted.join(",") !== [...select.options].map((o) => o.value).join(",")) {
    select.replaceChildren(...choices.map((v) =>
      h("option", {value: String(v.version)}, `version ${v.version} (${v.state})`)));
    if (wanted.includes(chosen)) select.value = chosen;
  }
  const page = versionsPage || {};
  const refused = page.may_change === false;
  button.disabled = !choices.length || refused || page.status === "KILLED";
  button.title = refused ? "you may not change this topology"
    : choices.length ? null : "no other version is kept";
  select.disabled = !choices.length;
}

async function switchVersion(event) {
  event.preventDefault();
  const page = versionsPage;
  const version = document.getElementById("tp-version-pick").value;
  if (!page || !version) return;
  if (!window.confirm(`Switch ${page.name} to version ${version}? Each worker stops at a ` +
                      `batch boundary and starts version ${version} from the same checkpoint.`)) {
    return;
  }
  showBanner(`switch ${page.name} to version ${version}…`, true);
  try {
    const response = await fetch(
      `/api/v1/topology/${encodeURIComponent(page.id)}/version/${encodeURIComponent(version)}`,
      {method: "POST", headers: {"Content-Type": "application/json"}});
    const answer = await response.json();
    showBanner(response.ok ? `switch ${page.name} to version ${version}: under way`
                           : `switch ${page.name} to version ${version} failed: ${answer.errorMessage}`,
               response.ok);
  } catch (err) {
    showBanner(`switch ${page.name} to version ${version} failed: ${err}`, false);
  }
  versionsKey = null;   // fetch the history again on the next draw
  if (pageTopology === page.id) loadHistory(page.id);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("tp-version-form").addEventListener("submit", switchVersion);
});
