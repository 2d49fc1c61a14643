"""The status page: plain HTML and a few lines of JS, no build step, no CDN (the box may be offline).

It polls ``/api/status`` every second for the table (per stream: state, health and why it is down, the age
of its last packet, marked STALE past the threshold, its line counters and its last error) and reloads each
stream's snapshot every two seconds (the server encodes at most a few JPEGs per stream per second, however
many pages are open). With ``cluster:`` on, a table of the nodes (their streams, lease ages) and this
node's recent moves sits above it."""

STATUS_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>streamd</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
  table { border-collapse: collapse; margin-bottom: 1.5em; }
  th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: right; }
  th:first-child, td:first-child, td.state { text-align: left; }
  .running { color: #080; } .reconnecting, .no_decoder { color: #b60; }
  .stalled, .failed, .down, .unresponsive, .restarting, .stale { color: #c00; font-weight: bold; }
  .ok { color: #080; } .starting { color: #666; } td.error { text-align: left; max-width: 40em; }
  td.lines { text-align: left; }
  #summary.degraded { color: #b60; } #summary.unhealthy { color: #c00; font-weight: bold; }
  .frames { display: flex; flex-wrap: wrap; gap: 12px; }
  figure { margin: 0; } figcaption { font-weight: bold; } img { max-width: 480px; border: 1px solid #ccc; }
</style>
</head>
<body>
<h1>streamd</h1>
<p id="summary">loading…</p>
<div id="cluster"></div>
<table id="streams">
  <thead><tr><th>stream</th><th>state</th><th>health</th><th>last packet</th><th>fps</th><th>decoded</th>
  <th>dropped</th><th>latency ms</th><th>reconnects</th><th>worker</th><th>lines (in / out)</th>
  <th>last error</th></tr></thead>
  <tbody></tbody>
</table>
<div class="frames" id="frames"></div>
<script>
"use strict";
function crossings(c) {  // {line: {class: {in: n, out: n}}} -> "street person 3 / 5; ..."
  const rows = [];
  for (const [line, byClass] of Object.entries(c || {})) {
    for (const [label, n] of Object.entries(byClass)) {
      rows.push(line + " " + label + " " + (n.in || 0) + " / " + (n.out || 0));
    }
  }
  return rows.length ? rows.join("; ") : null;
}
function clusterView(c) {  // cluster: on: nodes, their streams and leases, this node's recent moves
  const box = document.getElementById("cluster");
  if (!c) { box.replaceChildren(); return; }
  const lines = [["node", "capacity", "streams", "lease age s", "lease left s"]];
  for (const [name, n] of Object.entries(c.nodes || {})) {
    lines.push([name + (name === c.node ? " (this node)" : ""), n.capacity, n.streams.join(" "),
      n.lease_age_s, n.lease_left_s]);
  }
  const table = document.createElement("table"); table.id = "cluster-nodes";
  for (const [k, l] of lines.entries()) {
    const row = k ? table.insertRow() : table.createTHead().insertRow();
    for (const v of l) { cell(row, v); }
  }
  const moves = document.createElement("p"); moves.id = "cluster-moves";
  moves.textContent = "cluster: node " + c.node + (c.lease_valid ? "" : " — LEASE LOST (fenced)")
    + ", lease renewed " + c.lease_age_s + " s ago; recent moves: "
    + ((c.recent_moves || []).map(m => m.stream + " " + (m.from || "?") + "→" + (m.to || "?")
      + " (" + m.reason + ")").join("; ") || "none");
  box.replaceChildren(table, moves);
}
function cell(row, text, cls) {
  const td = row.insertCell(); td.textContent = text === null || text === undefined ? "–" : text;
  if (cls) td.className = cls;
}
async function refresh() {
  try {
    const s = await (await fetch("/api/status", {cache: "no-store"})).json();
    const down = Object.entries(s.down_streams || {});
    const summary = document.getElementById("summary");
    summary.textContent = s.results + " frames, up " + s.uptime_s + " s"
      + (s.stalled ? " — PIPELINE STALLED" : "")
      + (s.health && s.health !== "ok" ? " — " + s.health.toUpperCase() : "")
      + (down.length ? ": " + down.map(([id, why]) => id + " (" + why + ")").join(", ") : "");
    summary.className = s.health || "";
    clusterView(s.cluster);
    const body = document.querySelector("#streams tbody");
    body.replaceChildren();
    const frames = document.getElementById("frames");
    for (const r of s.streams) {
      const row = body.insertRow(); row.id = "stream-" + r.id;
      const state = r.stalled ? "stalled" : r.state;
      cell(row, r.id); cell(row, state, "state " + state);
      cell(row, r.health === "down" && r.reason ? "down: " + r.reason : r.health, "health " + r.health);
      const age = r.last_packet_age_s === null || r.last_packet_age_s === undefined
        ? null : r.last_packet_age_s + " s ago" + (r.stale ? " (STALE)" : "");
      cell(row, age, r.stale ? "age stale" : "age");
      cell(row, r.fps); cell(row, r.decoded);
      cell(row, r.dropped); cell(row, r.latency_ms); cell(row, r.reconnects); cell(row, r.worker);
      cell(row, crossings(r.crossings), "lines");
      cell(row, r.last_error, "error");
      if (!document.getElementById("frame-" + r.id)) {
        const fig = document.createElement("figure");
        const img = document.createElement("img");
        img.id = "frame-" + r.id; img.alt = "latest frame of " + r.id; img.dataset.stream = r.id;
        const cap = document.createElement("figcaption"); cap.textContent = r.id;
        fig.append(cap, img); frames.append(fig);
      }
    }
  } catch (e) {
    document.getElementById("summary").textContent = "streamd is not answering (" + e + ")";
  }
}
function reloadFrames() {
  for (const img of document.querySelectorAll("#frames img")) {
    img.src = "/streams/" + encodeURIComponent(img.dataset.stream) + "/snapshot.jpg?t=" + Date.now();
  }
}
refresh().then(reloadFrames);
setInterval(refresh, 1000);
setInterval(reloadFrames, 2000);
</script>
</body>
</html>
"""
