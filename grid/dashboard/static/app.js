// The shmgrid dashboard page: draws each snapshot and timeline event the server streams
// (grid/dashboard/server.py). No framework, no build step.
"use strict";

const token = new URLSearchParams(location.search).get("token") || "";
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
                 "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#17becf", "#8c564b", "#bcbd22"];
const colours = new Map();  // member uuid -> colour, kept for the page's life
let snapshot = null;

const $ = (selector) => document.querySelector(selector);
const el = (tag, attrs = {}, text = "") => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== "") node.textContent = text;
  return node;
};
const mib = (bytes) => bytes == null ? "" : (bytes / 1048576).toFixed(1) + " MiB";

function colour(uuid) {
  if (!uuid) return "#fff";
  if (!colours.has(uuid)) colours.set(uuid, PALETTE[colours.size % PALETTE.length]);
  return colours.get(uuid);
}

function renderHeader(s) {
  $("#cluster").textContent = s.cluster;
  const state = $("#state");
  state.textContent = s.state;
  state.className = "badge " + (s.state === "ACTIVE" ? "good" : "bad");
  const safe = $("#safe");
  safe.textContent = s.safe ? "safe" : `NOT SAFE (${s.table.short.length} short of backups)`;
  safe.className = "badge " + (s.safe ? "good" : "bad");
  $("#updated").textContent = "updated " + new Date(s.time * 1000).toLocaleTimeString();
}

function memberButtons(m) {
  const cell = el("td");
  if (m.process === "dead") return cell;
  const add = (label, action) => {
    const b = el("button", {"data-action": action, "data-member": m.name}, label);
    cell.append(b);
  };
  add("kill", "kill");
  if (m.process === "paused") add("resume", "resume"); else add("pause", "pause");
  if (m.in_cluster) add("stop", "stop-member");
  if (m.role === "lite" && m.in_cluster) add("promote", "promote");
  return cell;
}

function renderMembers(s) {
  const body = $("#members tbody");
  body.replaceChildren();
  for (const m of s.members) {
    const gone = !m.in_cluster && m.process !== "dead";
    const processText = m.process === "dead" ? "dead" :
      gone ? "removed (fenced)" : m.process === "paused" ? "paused" :
      m.answered ? "running" : "not answering";
    const row = el("tr", {"data-member": m.name, "data-process": m.process,
                          "class": m.process === "dead" ? "dead" : gone ? "out" : m.process});
    const swatch = el("span", {"class": "swatch"});
    swatch.style.background = m.in_cluster && m.role !== "lite" ? colour(m.uuid) : "#ddd";
    const first = el("td"); first.append(swatch);
    row.append(first, el("td", {}, m.name), el("td", {"class": "num"}, m.pid ?? ""),
      el("td", {}, m.role),
      el("td", {"class": "process " + (gone ? "out" : m.process)}, processText),
      el("td", {"class": "num"}, m.owned ?? ""), el("td", {"class": "num"}, m.backups ?? ""),
      el("td", {"class": "num"}, mib(m.shm_bytes)), el("td", {"class": "num"}, mib(m.rss)),
      el("td", {"class": "num"}, m.ops == null ? "" : Math.round(m.ops).toLocaleString()),
      memberButtons(m));
    body.append(row);
  }
}

function renderTable(s) {
  const t = s.table;
  const names = new Map(s.members.map((m) => [m.uuid, m.name]));
  const migrating = new Set(t.migrating), short = new Set(t.short), lost = new Set(t.lost);
  const showBackups = $("#show-backups").checked;
  const grid = $("#grid");
  grid.replaceChildren();
  for (let pid = 0; pid < t.partition_count; pid++) {
    const owner = t.owners[pid];
    const classes = ["cell"];
    if (!owner) classes.push("none");
    if (migrating.has(pid)) classes.push("migrating");
    if (short.has(pid)) classes.push("short");
    if (lost.has(pid)) classes.push("lost");
    const cell = el("div", {"class": classes.join(" "), "data-pid": pid});
    cell.style.background = colour(owner);
    const backups = t.backups[pid].map((u) => names.get(u) || u.slice(0, 8));
    cell.title = `partition ${pid}: owner ${names.get(owner) || "none"}; backups ` +
      (backups.length ? backups.join(", ") : "none") +
      (migrating.has(pid) ? "; migrating" : "") + (short.has(pid) ? "; short of backups" : "") +
      (lost.has(pid) ? "; lost (came back empty)" : "");
    if (showBackups && t.backups[pid].length) {
      const dot = el("span", {"class": "backup"});
      dot.style.background = colour(t.backups[pid][0]);
      cell.append(dot);
    }
    grid.append(cell);
  }
  $("#table-summary").textContent = `${t.partition_count} · ${t.migrating.length} migrating · ` +
    `${t.short.length} short of backups · ${t.lost.length} lost`;
  const legend = $("#legend");
  legend.replaceChildren();
  for (const m of s.members.filter((m) => m.in_cluster && m.role !== "lite")) {
    const item = el("span"), swatch = el("span", {"class": "swatch"});
    swatch.style.background = colour(m.uuid);
    item.append(swatch, m.name);
    legend.append(item);
  }
}

function renderSide(s) {
  const g = s.migrations || {};
  $("#migrations").textContent = g.active ?
    `${g.running} in flight (partitions ${(g.in_flight || []).join(", ")}), ${g.remaining} to ` +
    `go of ${g.planned} planned, ${g.failed} failed` :
    `none in flight; the last plan completed ${g.completed ?? 0} of ${g.planned ?? 0}`;
  const body = $("#maps tbody");
  body.replaceChildren();
  for (const [name, size] of Object.entries(s.maps)) {
    const row = el("tr");
    row.append(el("td", {}, name), el("td", {"class": "num"}, size.toLocaleString()));
    body.append(row);
  }
  if (!Object.keys(s.maps).length) body.append(el("tr", {}, "no maps yet"));
}

function describe(e) {
  switch (e.type) {
    case "member_joined": return `${e.member} joined${e.lite ? " (lite)" : ""}`;
    case "member_removed": return `${e.members.join(", ")} removed (${e.reason}); ` +
      `${e.promoted} partitions promoted`;
    case "master_changed": return `${e.master} is master` +
      (e.gone.length ? ` (${e.gone.join(", ")} gone)` : "");
    case "state_changed": return `state ${e.from} → ${e.to}`;
    case "migration_started": return `migration plan: ${e.planned} migrations`;
    case "migration_finished": return `migration plan done: ${e.completed} of ${e.planned}` +
      (e.failed ? `, ${e.failed} failed` : "");
    case "partition_lost": return `partition ${e.partition_id} lost all ` +
      `${e.lost_replicas} replicas`;
    case "cluster_safe": return `safe again after ${e.after_s.toFixed(2)} s`;
    default: return JSON.stringify(e);
  }
}

let lastSeq = 0;  // a reconnected stream sends the timeline again

function addEvent(e) {
  if (e.seq <= lastSeq) return;
  lastSeq = e.seq;
  const item = el("li", {"class": e.type, "data-type": e.type});
  item.append(el("time", {}, new Date(e.time * 1000).toLocaleTimeString()), describe(e));
  $("#timeline").prepend(item);
  while ($("#timeline").children.length > 500) $("#timeline").lastChild.remove();
}

async function act(button) {
  const body = {action: button.dataset.action};
  if (button.dataset.member) body.member = button.dataset.member;
  if (button.dataset.lite) body.lite = true;
  if (body.action === "state") body.state = $("#new-state").value;
  const what = [body.action, body.member, body.lite ? "lite" : "", body.state]
    .filter(Boolean).join(" ");
  if (!confirm(`Really ${what}?`)) return;
  $("#action-output").textContent = `${what}…`;
  const reply = await fetch("api/action", {method: "POST", body: JSON.stringify(body),
    headers: {"Content-Type": "application/json", "X-Token": token}});
  const result = await reply.json();
  $("#action-output").textContent = `${result.command || what}: ` +
    `${result.ok ? "done" : "failed"}\n${result.output}`;
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-action]");
  if (button) act(button);
});
$("#show-backups").addEventListener("change", () => snapshot && renderTable(snapshot));

function connect() {
  const stream = new EventSource("api/stream");
  const link = $("#link");
  stream.onopen = () => { link.textContent = "live"; link.className = "badge good"; };
  stream.onerror = () => { link.textContent = "reconnecting"; link.className = "badge bad"; };
  stream.addEventListener("snapshot", (message) => {
    snapshot = JSON.parse(message.data);
    renderHeader(snapshot);
    renderMembers(snapshot);
    renderTable(snapshot);
    renderSide(snapshot);
  });
  stream.addEventListener("event", (message) => addEvent(JSON.parse(message.data)));
}
connect();
