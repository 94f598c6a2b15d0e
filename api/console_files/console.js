// The raftq console: one page, plain JavaScript, no build step.
//
// Live data comes from GET /v1/events (Server-Sent Events, read with fetch so
// that the bearer token travels as a header).  Writes and leader reads go to
// the node that served this page with X-Raftq-Forward: 1, so a follower
// forwards them to the leader and the page never leaves its origin.  When the
// serving node stops answering, the page moves itself to another node of the
// last cluster view (the token and the charts' history ride along in
// window.name, never in a URL).
"use strict";

const CONFIG_FIELDS = [
  ["lease_ms", "int"], ["max_deliveries", "optional int"], ["dead_letter", "optional name"],
  ["ttl_ms", "optional int"], ["max_length", "optional int"], ["max_bytes", "optional int"],
  ["overflow", "overflow"], ["dedup_window_ms", "int"], ["backoff", "optional json"],
  ["retention_ms", "optional int"], ["retention_bytes", "optional int"],
];
const QUOTAS = ["queues", "stored_bytes", "put_rate", "connections", "long_polls"];
// A group's position, as the CLI writes it: earliest, latest, seq:N or time:MS (docs/api.md)
function parsePosition(text) {
  text = text.trim();
  if (text === "earliest" || text === "latest") return text;
  const [kind, value] = text.split(":", 2);
  if ((kind === "seq" || kind === "time") && /^[0-9]+$/.test(value || "")) {
    return kind === "seq" ? {seq: Number(value)} : {time_ms: Number(value)};
  }
  throw new Error(`a position is earliest, latest, seq:N or time:MS, not "${text}"`);
}
function pausedText(g) {
  if (!g.paused) return "";
  return g.resume_at_ms === null ? "paused" : `paused until ${new Date(g.resume_at_ms).toLocaleTimeString()}`;
}
const HISTORY_POINTS = 120;
const HOP_AFTER_FAILURES = 3;

const state = {
  token: sessionStorage.getItem("raftq-token") || "",
  snapshot: null,
  history: new Map(),          // queue -> [{t, depth, put, ack}]
  failures: 0,
  servingDown: false,
  patchDirty: false,
  shownQueue: null,
  browseTimer: null,
  principalsTimer: null,
  sawDeadLetters: false,      // the browsed messages carry x-raftq-from-queue
};

const $ = (selector, root = document) => root.querySelector(selector);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function escapeHtml(value) {
  return String(value).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}

function show(value) {
  return value === null || value === undefined ? "–" : escapeHtml(value);
}

function toast(message, isError = false) {
  const box = $("#toast");
  box.textContent = message;
  box.className = isError ? "error" : "";
  box.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { box.hidden = true; }, isError ? 8000 : 4000);
}

// ---- talking to the node ------------------------------------------------------------

function headers(extra = {}) {
  const h = {"Accept": "application/json", "X-Raftq-Forward": "1", ...extra};
  if (state.token) h["Authorization"] = "Bearer " + state.token;
  return h;
}

async function api(method, path, body) {
  const init = {method, headers: headers(body === undefined ? {} : {"Content-Type": "application/json"})};
  if (body !== undefined) init.body = JSON.stringify(body);
  const reply = await fetch(path, init);
  const text = await reply.text();
  let data = {};     // an empty answer (204) is a success with nothing to say
  try { data = text ? JSON.parse(text) : {}; } catch (e) { data = null; }
  if (!reply.ok) {
    throw new Error(data && data.error ? `${data.error}: ${data.message}` : `HTTP ${reply.status}`);
  }
  return data;
}

async function act(what, call) {
  try {
    const result = await call();
    toast(what + " — done");
    return result;
  } catch (err) {
    toast(what + " failed: " + err.message, true);
    return null;
  }
}

function setConnection(text, kind) {
  const pill = $("#connection");
  pill.textContent = text;
  pill.className = "pill " + (kind || "");
}

// Which token is wanted, and whether the one given was refused or there was none.
function tokenProblem(status) {
  const wanted = "a token that may read the cluster (the metrics action: [auth] admin or metrics in cluster.toml, " +
                 "or a principal's)";
  if (status === 403) return "this token may not see the cluster: it needs " + wanted;
  if (state.token) return "this token was rejected (or revoked): give " + wanted;
  return wanted + " is needed: enter it above";
}

// Who the token is, shown beside the connection.
async function whoami() {
  try {
    const me = await api("GET", "/v1/whoami");
    $("#whoami").textContent = `as ${me.name}`;
  } catch (err) {
    $("#whoami").textContent = "";
  }
}

async function follow() {
  for (;;) {
    try {
      const reply = await fetch("/v1/events?interval_ms=1000",
                                {headers: headers({"Accept": "text/event-stream"}), cache: "no-store"});
      if (reply.status === 401 || reply.status === 403) {
        // the node answers: the token is missing, wrong or lacks the admin role, nothing to move away from
        setConnection(tokenProblem(reply.status), "bad");
        await sleep(1500);
        continue;
      }
      if (!reply.ok) throw new Error("HTTP " + reply.status);
      const reader = reply.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, {stream: true});
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
          if (data) onSnapshot(JSON.parse(data));
        }
      }
      throw new Error("the stream ended");
    } catch (err) {
      state.failures += 1;
      state.servingDown = true;
      const node = state.snapshot ? state.snapshot.node : location.host;
      setConnection(`node ${node} is not answering`, "bad");
      render();
      if (state.failures >= HOP_AFTER_FAILURES && await hop()) return;
      await sleep(1000);
    }
  }
}

// ---- moving to another node -----------------------------------------------------------

async function answers(address) {
  // no-cors: the answer cannot be read, but a node that is down rejects the fetch
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), 1500);
  try {
    await fetch(`${location.protocol}//${address}/health/live`, {mode: "no-cors", signal: abort.signal});
    return true;
  } catch (e) {
    return false;
  } finally {
    clearTimeout(timer);
  }
}

async function hop() {
  if (!state.snapshot) return false;
  const here = state.snapshot.node;
  const leader = state.snapshot.cluster.leader;
  const others = state.snapshot.cluster.nodes.filter((n) => n.id !== here);
  others.sort((a, b) => (a.id === leader) - (b.id === leader));   // the old leader last
  for (const node of others) {
    if (await answers(node.http_addr)) {
      window.name = JSON.stringify({raftqToken: state.token, movedFrom: here, history: [...state.history]});
      location.href = `${location.protocol}//${node.http_addr}/ui/${location.hash}`;
      return true;
    }
  }
  return false;
}

function arrive() {
  if (!window.name.startsWith("{")) return;
  try {
    const carried = JSON.parse(window.name);
    if (carried.raftqToken !== undefined) {
      state.token = carried.raftqToken;
      sessionStorage.setItem("raftq-token", state.token);
    }
    if (Array.isArray(carried.history)) state.history = new Map(carried.history);   // the charts go on
    if (carried.movedFrom) {
      const banner = $("#banner");
      banner.textContent = `Node ${carried.movedFrom} stopped answering; the console moved to ${location.host}.`;
      banner.hidden = false;
    }
  } catch (e) { /* not ours */ }
  window.name = "";
}

// ---- live data ------------------------------------------------------------------------

function onSnapshot(snapshot) {
  state.snapshot = snapshot;
  state.failures = 0;
  state.servingDown = false;
  const names = new Set();
  for (const q of snapshot.queues) {
    names.add(q.name);
    const points = state.history.get(q.name) || [];
    points.push({t: snapshot.at_ms, depth: q.stats.depth, put: q.stats.put_total, ack: q.stats.acked_total});
    if (points.length > HISTORY_POINTS) points.shift();
    state.history.set(q.name, points);
  }
  for (const name of [...state.history.keys()]) if (!names.has(name)) state.history.delete(name);
  const leader = snapshot.cluster.leader;
  setConnection(leader ? `live · leader ${leader}` : "live · NO LEADER", leader ? "good" : "bad");
  $("#served-by").textContent = `served by ${snapshot.node} · applied ${snapshot.applied_index} · ` +
    new Date(snapshot.at_ms).toLocaleTimeString();
  render();
}

function rates(name) {
  const points = state.history.get(name) || [];
  const out = {put: [], ack: [], depth: points.map((p) => p.depth)};
  for (let i = 1; i < points.length; i++) {
    const seconds = Math.max(0.001, (points[i].t - points[i - 1].t) / 1000);
    out.put.push(Math.max(0, (points[i].put - points[i - 1].put) / seconds));
    out.ack.push(Math.max(0, (points[i].ack - points[i - 1].ack) / seconds));
  }
  return out;
}

function spark(canvas, values, color) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  ctx.strokeStyle = "#dde1e8";
  ctx.beginPath(); ctx.moveTo(0, h - 0.5); ctx.lineTo(w, h - 0.5); ctx.stroke();
  if (!values.length) return;
  const top = Math.max(1, ...values);
  const step = w / Math.max(1, HISTORY_POINTS - 1);
  const x0 = w - step * (values.length - 1);
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  values.forEach((v, i) => {
    const x = x0 + i * step, y = h - 2 - (v / top) * (h - 12);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = "#404859";
  ctx.font = "10px system-ui, sans-serif";
  ctx.fillText(`max ${formatRate(top)}`, 2, 10);
}

function formatRate(value) {
  return value >= 100 ? value.toFixed(0) : value.toFixed(1).replace(/\.0$/, "");
}

function last(values) {
  return values.length ? formatRate(values[values.length - 1]) : "…";
}

// ---- pages ------------------------------------------------------------------------------

function route() {
  if (location.hash === "#/principals") return {page: "principals"};
  const match = location.hash.match(/^#\/queue\/(.+)$/);
  return match ? {page: "queue", queue: decodeURIComponent(match[1])} : {page: "overview"};
}

function render() {
  const where = route();
  $("#overview-page").hidden = where.page !== "overview";
  $("#queue-page").hidden = where.page !== "queue";
  $("#principals-page").hidden = where.page !== "principals";
  if (!state.snapshot) return;
  if (where.page === "overview") renderOverview();
  else if (where.page === "principals") renderAudit();
  else renderQueue(where.queue);
}

// ---- principals -------------------------------------------------------------------------

function rulesText(rules) {
  return rules.map((r) => `${r.actions.join(",")}:${r.queues.join(",")}`).join("; ");
}

async function refreshPrincipals() {
  clearTimeout(state.principalsTimer);
  if (route().page !== "principals") return;
  try {
    const listing = await api("GET", "/v1/principals");
    $("#principals-problem").hidden = true;
    $("#principals tbody").innerHTML = listing.principals.map((p) => `<tr data-principal="${escapeHtml(p.name)}">
        <td><b>${escapeHtml(p.name)}</b>${p.role ? ` <span class="muted">(SQS key of role ${escapeHtml(p.role)})</span>` : ""}</td>
        <td>${escapeHtml(rulesText(p.rules))}</td>
        <td>${escapeHtml(Object.entries(p.quotas).map(([k, v]) => `${k}=${v}`).join(" ")) || "–"}</td>
        <td>${p.token ? "yes" : "–"}</td><td>${p.sqs_keys.map(escapeHtml).join(" ") || "–"}</td>
        <td><button class="danger" data-revoke="${escapeHtml(p.name)}">revoke</button></td></tr>`).join("")
      || `<tr><td colspan="6" class="muted">none yet: only cluster.toml's tokens</td></tr>`;
  } catch (err) {
    $("#principals-problem").textContent = err.message;
    $("#principals-problem").hidden = false;
  }
  state.principalsTimer = setTimeout(refreshPrincipals, 2000);
}

function renderAudit() {
  const s = state.snapshot;
  $("#audit").innerHTML = (s.audit || []).slice().reverse().map((e) =>
    `<li>${new Date(e.at_ms).toLocaleTimeString()} · <b>${escapeHtml(e.principal)}</b> ${escapeHtml(e.change)}` +
    (e.by ? ` by ${escapeHtml(e.by)}` : "") + (e.rules ? ` · ${escapeHtml(rulesText(e.rules))}` : "") + "</li>").join("")
    || "<li class=muted>none (or this token may not see them: they need the cluster action)</li>";
  $("#refusals").innerHTML = (s.refusals || []).slice().reverse().map((r) =>
    `<li>${new Date(r.at_ms).toLocaleTimeString()} · <b>${escapeHtml(r.principal)}</b> may not ${escapeHtml(r.action)}` +
    (r.queue ? ` on ${escapeHtml(r.queue)}` : "") + (r.client ? ` · from ${escapeHtml(r.client)}` : "") + "</li>").join("")
    || "<li class=muted>none</li>";
}

function readRules(text) {
  return text.split("\n").map((line) => line.trim()).filter(Boolean).map((line) => {
    const [actions, patterns] = line.split(":");
    const rule = {actions: actions.split(",").map((a) => a.trim()).filter(Boolean)};
    if (patterns) rule.queues = patterns.split(",").map((p) => p.trim()).filter(Boolean);
    return rule;
  });
}

// With several Raft groups (issue 24): how many, how many each node leads, and how full the
// catalog of queue names is (past its limit no queue of a new name can be made).
function raftGroupsSummary(groups, catalog) {
  if (groups.length < 2) return "";
  const led = {};
  for (const g of groups) if (g.leader) led[g.leader] = (led[g.leader] || 0) + 1;
  return ` · ${groups.length} Raft groups, led: ` +
    Object.entries(led).sort().map(([node, count]) => `${node} ${count}`).join(", ") +
    (catalog ? ` · catalog: ${catalog.names} of ${catalog.limit} queue names` : "");
}

// A node's free disk space, and its disk alarm (api/disk.py): writes to its Raft groups refused.
function diskCell(disk) {
  if (!disk) return show(null);
  const free = sizeText(disk.free_bytes);
  return disk.alarm
    ? `<span class="badge bad" title="below its watermark of ${sizeText(disk.watermark_bytes)}: writes to the ` +
      `Raft groups it holds are refused (507) until space returns">DISK ALARM</span> ${free} free`
    : `${free} free`;
}

function sizeText(count) {
  for (const [unit, scale] of [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
    if (count >= scale) return `${(count / scale).toFixed(1)} ${unit}`;
  }
  return `${count} B`;
}

function renderOverview() {
  const s = state.snapshot, cluster = s.cluster;
  const healthy = cluster.nodes.filter((n) => n.healthy && !(state.servingDown && n.id === s.node)).length;
  const alarms = cluster.nodes.filter((n) => n.disk && n.disk.alarm).map((n) => n.id);
  $("#cluster-summary").textContent =
    `${cluster.nodes.length} voters · ${healthy} healthy · term ${cluster.term} · commit ${cluster.commit_index}` +
    ` · leader ${cluster.leader || "none"}` + raftGroupsSummary(cluster.groups || [], cluster.catalog) +
    (alarms.length ? ` · disk alarm on ${alarms.join(", ")}: writes to their Raft groups are refused` : "");
  const commit = cluster.commit_index || 0;
  $("#nodes tbody").innerHTML = cluster.nodes.map((n) => {
    const down = !n.healthy || (state.servingDown && n.id === s.node);
    const role = state.servingDown && n.id === s.node ? "not answering" : n.role;
    const lag = n.applied_index === null || n.applied_index === undefined ? null : Math.max(0, commit - n.applied_index);
    const heard = s.node === cluster.leader && n.last_contact_ms !== null && n.last_contact_ms !== undefined
      ? `${Math.round(n.last_contact_ms)} ms` : null;
    const canLead = !down && n.id !== cluster.leader && cluster.leader;
    return `<tr class="${down ? "down" : ""}" data-node="${escapeHtml(n.id)}">
      <td><b>${escapeHtml(n.id)}</b></td>
      <td><span class="badge ${n.id === cluster.leader && !down ? "leader" : ""}">${escapeHtml(role)}</span></td>
      <td class="num">${show(n.term)}</td><td class="num">${show(n.commit_index)}</td>
      <td class="num">${show(n.applied_index)}</td><td class="num">${show(lag)}</td><td class="num">${show(heard)}</td>
      <td><span class="badge ${down ? "bad" : "good"}">${down ? "DOWN" : "healthy"}</span></td>
      <td>${diskCell(n.disk)}</td>
      <td>${show(n.fsync_policy)}</td><td>${escapeHtml(n.http_addr)}</td>
      <td>${canLead ? `<button data-lead="${escapeHtml(n.id)}">make leader</button>` : ""}</td></tr>`;
  }).join("");
  $("#elections").innerHTML = [...s.elections].reverse().map((e) =>
    `<li>term ${e.term}: <b>${escapeHtml(e.leader)}</b> leads · ${new Date(e.at_ms).toLocaleTimeString()}</li>`).join("")
    || "<li class=muted>none seen yet</li>";
  const rows = s.queues.map((q) => {
    const r = rates(q.name), st = q.stats;
    return `<tr data-queue="${escapeHtml(q.name)}">
      <td><a href="#/queue/${encodeURIComponent(q.name)}">${escapeHtml(q.name)}</a></td>
      <td class="num depth">${st.depth}</td><td class="num">${st.in_flight}</td><td class="num">${st.delayed}</td>
      <td class="num">${st.dead_lettered_total}</td><td class="num">${last(r.put)}</td><td class="num">${last(r.ack)}</td>
      <td><canvas class="spark" data-chart="depth" width="140" height="30"></canvas></td>
      <td><canvas class="spark" data-chart="put" width="110" height="30"></canvas></td>
      <td><canvas class="spark" data-chart="ack" width="110" height="30"></canvas></td>
      <td>${Object.entries(st.groups).map(([g, s]) => escapeHtml(g) + (s.paused ? " (paused)" : "")).join(", ")}</td></tr>`;
  });
  $("#queues tbody").innerHTML = rows.join("") || `<tr><td colspan="11" class="muted">no queues yet</td></tr>`;
  for (const row of document.querySelectorAll("#queues tbody tr[data-queue]")) {
    const r = rates(row.dataset.queue);
    spark($("[data-chart=depth]", row), r.depth, "#2f6fde");
    spark($("[data-chart=put]", row), r.put, "#1f8a4c");
    spark($("[data-chart=ack]", row), r.ack, "#b7791f");
  }
}

function queueInfo(name) {
  return state.snapshot ? state.snapshot.queues.find((q) => q.name === name) : null;
}

function renderQueue(name) {
  const info = queueInfo(name);
  $("#queue-title").textContent = name;
  $("#queue-missing").hidden = !!info;
  if (state.shownQueue !== name) {
    state.shownQueue = name;
    state.patchDirty = false;
    state.sawDeadLetters = false;
    refreshMessages();
  }
  if (!info) return;
  const st = info.stats;
  $("#queue-stats").innerHTML = [
    ["depth", st.depth], ["in flight", st.in_flight], ["delayed", st.delayed], ["bytes", st.bytes],
    ["retained", st.retained], ["retained bytes", st.retained_bytes],
    ["seqs", `${show(st.first_seq)}…${show(st.last_seq)}`], ["put", st.put_total], ["acked", st.acked_total],
    ["redelivered", st.redelivered_total], ["dead-lettered", st.dead_lettered_total],
    ["redriven", st.redriven_total], ["expired", st.expired_total], ["dropped", st.dropped_total],
  ].map(([label, value]) => `<div><span class="muted">${label}</span><b data-stat="${label}">${value}</b></div>`).join("");
  const r = rates(name);
  spark($("#chart-depth"), r.depth, "#2f6fde");
  spark($("#chart-put"), r.put, "#1f8a4c");
  spark($("#chart-ack"), r.ack, "#b7791f");
  if (!state.patchDirty) fillConfig($("#patch-form"), info.config);
  $("#groups tbody").innerHTML = Object.entries(st.groups).map(([group, g]) => `<tr data-group="${escapeHtml(group)}"
      class="${g.paused ? "paused" : ""}">
      <td>${escapeHtml(group)}</td><td class="num">${g.depth}</td><td class="num">${g.in_flight}</td>
      <td class="num">${g.cursor}</td><td class="pause">${escapeHtml(pausedText(g))}</td>
      <td class="num rate">${g.rate_limit === null ? "" : g.rate_limit + "/s"}</td>
      <td><button data-pause-group="${escapeHtml(group)}" data-paused="${g.paused}">${g.paused ? "resume" : "pause"}</button>
      <button data-rate-group="${escapeHtml(group)}">rate…</button>
      <button data-seek-group="${escapeHtml(group)}">seek…</button>
      <button data-delete-group="${escapeHtml(group)}">delete</button></td></tr>`).join("");
  const groupSelect = $("#browse-form select[name=group]");
  const groups = Object.keys(st.groups);
  if ([...groupSelect.options].map((o) => o.value).join() !== groups.join()) {
    const chosen = groupSelect.value;
    groupSelect.innerHTML = groups.map((g) => `<option>${escapeHtml(g)}</option>`).join("");
    if (groups.includes(chosen)) groupSelect.value = chosen;
  }
  const sources = state.snapshot.queues.filter((q) => q.config.dead_letter === name).map((q) => q.name);
  const section = $("#dead-letters");
  section.hidden = sources.length === 0 && !state.sawDeadLetters;
  $("#dead-letter-sources").textContent = sources.length
    ? `This is the dead-letter queue of ${sources.join(", ")}. Redrive puts dead letters back where they died.`
    : "These messages carry x-raftq-from-queue: redrive puts them back where they died.";
  const fromSelect = $("#redrive-form select[name=from_queue]");
  const options = ["", ...sources];
  if ([...fromSelect.options].map((o) => o.value).join() !== options.join()) {
    fromSelect.innerHTML = options.map((q) => `<option value="${escapeHtml(q)}">${q ? "from " + escapeHtml(q) : "from every queue"}</option>`).join("");
  }
  const target = info.config.dead_letter;
  $("#dead-letter-target").innerHTML = target
    ? `Messages that run out of deliveries move to <a href="#/queue/${encodeURIComponent(target)}">${escapeHtml(target)}</a>.`
    : "";
}

function preview(message) {
  if (message.body_b64 !== undefined) {
    const bytes = atob(message.body_b64);
    return `(${bytes.length} bytes) ` + [...bytes.slice(0, 48)].map((c) => {
      const code = c.charCodeAt(0);
      return code >= 32 && code < 127 ? c : ".";
    }).join("");
  }
  const text = typeof message.body === "string" ? message.body : JSON.stringify(message.body);
  return text.length > 160 ? text.slice(0, 160) + "…" : text;
}

async function refreshMessages() {
  clearTimeout(state.browseTimer);
  const where = route();
  if (where.page !== "queue") return;
  const form = $("#browse-form");
  const group = form.group.value || "default";
  const query = `group=${encodeURIComponent(group)}&from_seq=${Number(form.from_seq.value) || 0}` +
                `&limit=${Number(form.limit.value) || 50}`;
  try {
    const page = await api("GET", `/v1/queues/${encodeURIComponent(where.queue)}/messages?${query}`);
    state.sawDeadLetters = page.messages.some((m) => m.headers && m.headers["x-raftq-from-queue"]);
    $("#messages tbody").innerHTML = page.messages.map((m) => `<tr data-seq="${m.seq}">
        <td class="num">${m.seq}</td><td class="num">${m.priority}</td><td>${show(m.key)}</td>
        <td class="num">${m.deliveries}</td><td>${new Date(m.put_at_ms).toLocaleTimeString()}</td>
        <td>${m.next_ready_at_ms === null ? "" : new Date(m.next_ready_at_ms).toLocaleTimeString()}</td>
        <td>${Object.entries(m.headers || {}).map(([k, v]) =>
          `<code class="header ${k.startsWith("x-raftq-") ? "raftq" : ""}">${escapeHtml(k)}: ${escapeHtml(v)}</code>`).join("")}</td>
        <td class="body" title="${escapeHtml(preview(m))}">${escapeHtml(preview(m))}</td></tr>`).join("")
      || `<tr><td colspan="8" class="muted">no stored messages for this group</td></tr>`;
    if (state.sawDeadLetters) $("#dead-letters").hidden = false;
  } catch (err) {
    $("#messages tbody").innerHTML = `<tr><td colspan="8" class="bad">${escapeHtml(err.message)}</td></tr>`;
  }
  state.browseTimer = setTimeout(refreshMessages, 2000);
}

// ---- forms ------------------------------------------------------------------------------

function buildConfigFields(form) {
  $(".config-fields", form).innerHTML = CONFIG_FIELDS.map(([field, kind]) => {
    const input = kind === "overflow"
      ? `<select name="${field}"><option value=""></option><option>reject</option><option>drop_oldest</option></select>`
      : `<input name="${field}" ${kind.includes("int") ? 'inputmode="numeric"' : ""} placeholder="${escapeHtml(
          kind === "optional json" ? 'none, or {"initial_ms": 1000, "factor": 2}' : kind.startsWith("optional") ? "none" : "default")}">`;
    return `<label>${field}${input}</label>`;
  }).join("");
}

function fillConfig(form, config) {
  for (const [field] of CONFIG_FIELDS) {
    const value = config[field];
    form.elements[field].value = value === null || value === undefined ? ""
      : typeof value === "object" ? JSON.stringify(value) : value;
  }
}

function readConfig(form, {blankMeansNull}) {
  const config = {};
  for (const [field, kind] of CONFIG_FIELDS) {
    const raw = form.elements[field].value.trim();
    if (raw === "") {
      if (blankMeansNull && kind.startsWith("optional")) config[field] = null;
      continue;
    }
    config[field] = kind.includes("int") ? Number(raw) : kind.includes("json") ? JSON.parse(raw) : raw;
  }
  return config;
}

function wirePrincipals() {
  $(".quota-fields", $("#principal-form")).innerHTML = QUOTAS.map((q) =>
    `<label>${q}<input name="quota-${q}" inputmode="numeric" placeholder="no limit"></label>`).join("");
  $("#principal-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.target;
    const quotas = {};
    for (const q of QUOTAS) if (form.elements[`quota-${q}`].value.trim()) quotas[q] = Number(form.elements[`quota-${q}`].value);
    const body = {name: form.elements.name.value.trim(), rules: readRules(form.elements.rules.value), quotas,
                  sqs: form.elements.sqs.checked};
    const made = await act(`make principal ${body.name}`, () => api("POST", "/v1/principals", body));
    if (made) {
      const lines = [`export RAFTQ_TOKEN=${made.token}`];
      if (made.sqs) lines.push(`export AWS_ACCESS_KEY_ID=${made.sqs.access_key}`,
                               `export AWS_SECRET_ACCESS_KEY=${made.sqs.secret_key}`);
      $("#new-credentials-text").textContent = lines.join("\n");
      $("#new-credentials").hidden = false;
      form.reset();
      refreshPrincipals();
    }
  });
  $("#principals").addEventListener("click", async (event) => {
    const name = event.target.dataset.revoke;
    if (!name || !confirm(`Revoke principal ${name}? Every node refuses it within a second.`)) return;
    if (await act(`revoke principal ${name}`, () => api("DELETE", `/v1/principals/${encodeURIComponent(name)}`))) {
      refreshPrincipals();
    }
  });
}

function wire() {
  buildConfigFields($("#create-form"));
  buildConfigFields($("#patch-form"));
  wirePrincipals();
  $("#token").value = state.token;
  $("#token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.token = $("#token").value.trim();
    sessionStorage.setItem("raftq-token", state.token);
    toast("token kept for this browser tab");
    whoami();
  });
  $("#create-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.target;
    const name = form.elements.name.value.trim();
    const created = await act(`create queue ${name}`,
                              () => api("PUT", `/v1/queues/${encodeURIComponent(name)}`, readConfig(form, {blankMeansNull: false})));
    if (created) form.reset();
  });
  $("#patch-form").addEventListener("input", () => { state.patchDirty = true; });
  $("#patch-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const name = route().queue;
    const info = queueInfo(name);
    let wanted;
    try {
      wanted = readConfig(event.target, {blankMeansNull: true});
    } catch (err) {
      toast(`patch queue ${name}: ${err.message}`, true);
      return;
    }
    const changed = Object.fromEntries(Object.entries(wanted).filter(
      ([k, v]) => !info || JSON.stringify(info.config[k]) !== JSON.stringify(v)));
    if (await act(`patch queue ${name}`, () => api("PATCH", `/v1/queues/${encodeURIComponent(name)}`, changed))) {
      state.patchDirty = false;
    }
  });
  $("#group-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.target, name = route().queue, group = form.group.value.trim();
    let start;
    try {
      start = parsePosition(form.start.value);
    } catch (err) {
      toast(`add group ${group}: ${err.message}`, true);
      return;
    }
    if (await act(`add group ${group}`, () => api("PUT", `/v1/queues/${encodeURIComponent(name)}/groups/${encodeURIComponent(group)}`,
                                                  {start}))) form.reset();
  });
  $("#groups").addEventListener("click", async (event) => {
    const data = event.target.dataset, name = route().queue;
    const path = (group) => `/v1/queues/${encodeURIComponent(name)}/groups/${encodeURIComponent(group)}`;
    if (data.deleteGroup) {
      await act(`delete group ${data.deleteGroup}`, () => api("DELETE", path(data.deleteGroup)));
    } else if (data.pauseGroup) {
      const pause = data.paused !== "true";
      await act(`${pause ? "pause" : "resume"} group ${data.pauseGroup}`,
                () => api("PATCH", path(data.pauseGroup), {paused: pause}));
    } else if (data.rateGroup) {
      const answer = prompt(`Deliveries a second to group ${data.rateGroup} (blank: no limit)`, "");
      if (answer === null) return;
      const rate = answer.trim() === "" ? null : Number(answer);
      await act(`rate limit of group ${data.rateGroup}`, () => api("PATCH", path(data.rateGroup), {rate_limit: rate}));
    } else if (data.seekGroup) {
      const answer = prompt(`Move group ${data.seekGroup} to (earliest, latest, seq:N, time:MS); it replays the ` +
                            "stored messages from there", "earliest");
      if (answer === null) return;
      let to;
      try {
        to = parsePosition(answer);
      } catch (err) {
        toast(`seek group ${data.seekGroup}: ${err.message}`, true);
        return;
      }
      const moved = await act(`seek group ${data.seekGroup}`, () => api("POST", path(data.seekGroup) + "/seek", {to}));
      if (moved) refreshMessages();
    }
  });
  $("#redrive-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.target, name = route().queue;
    const body = {id: crypto.randomUUID ? crypto.randomUUID() : String(Date.now()) + Math.random()};
    if (form.from_queue.value) body.from_queue = form.from_queue.value;
    if (form.max.value) body.max = Number(form.max.value);
    const result = await act(`redrive ${name}`, () => api("POST", `/v1/queues/${encodeURIComponent(name)}/redrive`, body));
    if (result) {
      const moved = Object.entries(result.to).map(([q, n]) => `${n} to ${q}`).join(", ") || "nothing";
      toast(`redrive ${name}: moved ${moved}`);
      refreshMessages();
    }
  });
  $("#browse-form").addEventListener("change", refreshMessages);
  $("#delete-queue").addEventListener("click", async () => {
    const name = route().queue;
    if (!confirm(`Delete queue ${name} and every message in it?`)) return;
    if (await act(`delete queue ${name}`, () => api("DELETE", `/v1/queues/${encodeURIComponent(name)}`))) location.hash = "#/";
  });
  $("#nodes").addEventListener("click", async (event) => {
    const to = event.target.dataset.lead;
    if (!to) return;
    event.target.disabled = true;
    const result = await act(`transfer leadership to ${to}`, () => api("POST", "/v1/cluster/leader", {to}));
    if (result && !result.moved) toast(`leadership did not move (leader: ${result.leader || "none"})`, true);
  });
  window.addEventListener("hashchange", () => {
    state.shownQueue = null;
    $("#new-credentials").hidden = true;
    render();
    refreshPrincipals();
  });
}

arrive();
wire();
render();
whoami();
refreshPrincipals();
follow();
