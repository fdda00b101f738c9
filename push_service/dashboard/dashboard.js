// The imroute dashboard: logs in with the admin key, then polls GET /v1/admin/overview
// every POLL_MS and draws it. No library, no build step; served by the push service.

const POLL_MS = 1500;
const KEY = "imroute.adminKey";  // sessionStorage: this tab only, gone when it closes

const TILES = [
  ["p2p", "P2P pushes"], ["batch", "batch messages"], ["broadcast", "broadcasts"],
  ["multicast", "multicasts"], ["delivered", "delivered"], ["acked", "acked"],
  ["queued", "queued"], ["publishes", "bus publishes"], ["hedges", "hedges"],
  ["hedge_wins", "hedge wins"], ["p50", "latency p50 (ms)"], ["p99", "latency p99 (ms)"],
];
const CHARTS = [
  ["pushes/s (P2P + batch)", (p) => p.p2p + p.batch],
  ["delivered/s", (p) => p.delivered],
  ["acked/s", (p) => p.acked],
  ["queued/s", (p) => p.queued],
  ["bus publishes/s (hedges in red)", (p) => p.publishes, (p) => p.hedges],
  ["delivery latency ms: p50, p99 (red)", (p) => p.p50, (p) => p.p99],
];

const $ = (sel) => document.querySelector(sel);
let timer = null;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  return Number.isInteger(v) ? String(v) : v.toFixed(v < 10 ? 2 : 1);
}

function count(n, noun) {
  return `${n} ${noun}${n === 1 ? "" : "s"}`;
}

function say(text, error = false) {
  const m = $("#message");
  m.textContent = text;
  m.className = error ? "error" : "";
}

async function api(method, path) {
  const key = sessionStorage.getItem(KEY);
  return fetch(path, { method, headers: { Authorization: `Bearer ${key}` } });
}

async function errorOf(resp) {
  try {
    const body = await resp.json();
    const detail = Array.isArray(body.detail)
      ? body.detail.map((d) => `${d.field}: ${d.message}`).join("; ")
      : body.detail;
    return `${resp.status} ${body.error || ""}: ${detail || ""}`;
  } catch {
    return `${resp.status} ${resp.statusText}`;
  }
}

function showLogin(error = "") {
  clearTimeout(timer);
  $("#board").hidden = true;
  $("#logout").hidden = true;
  $("#login-view").hidden = false;
  $("#login-error").textContent = error;
  $("#status").textContent = "";
  $("#key").focus();
}

// Each poll takes a number: one overtaken by a newer poll (a login while it was in
// flight) or by a logout stops where it is, so one loop runs and a logout stays out.
let polls = 0;

async function poll() {
  clearTimeout(timer);
  const mine = ++polls;
  const current = () => mine === polls && sessionStorage.getItem(KEY) !== null;
  let resp;
  try {
    resp = await api("GET", "/v1/admin/overview");
  } catch (e) {
    if (!current()) return;
    $("#status").textContent = "the push service cannot be reached; retrying";
    timer = setTimeout(poll, POLL_MS);
    return;
  }
  if (!current()) return;
  if (resp.status === 401 || resp.status === 403) {
    const why = await errorOf(resp);
    if (!current()) return;
    sessionStorage.removeItem(KEY);
    showLogin(`Key refused (${why})`);
    return;
  }
  if (!resp.ok) {
    const why = await errorOf(resp);
    if (!current()) return;
    $("#status").textContent = `overview: ${why}; retrying`;
    timer = setTimeout(poll, POLL_MS);
    return;
  }
  try {
    const view = await resp.json();
    if (!current()) return;
    $("#login-view").hidden = true;
    $("#board").hidden = false;
    $("#logout").hidden = false;
    $("#status").textContent = `updated ${new Date(view.now_ms).toLocaleTimeString()}`;
    draw(view);
  } catch (e) {
    // An answer cut short, or one the board cannot draw: said, and polled again (a
    // throw here used to end the polling, leaving a stale board).
    if (!current()) return;
    $("#status").textContent = `overview could not be shown (${e.message || e}); retrying`;
  }
  timer = setTimeout(poll, POLL_MS);
}

function draw(view) {
  drawTiles(view.rates || {});
  drawCharts(view.series || []);
  drawGroups(view.groups);
  drawGateways(view.gateways);
  drawJobs(view.jobs);
}

function drawTiles(rates) {
  $("#tiles").replaceChildren(...TILES.map(([k, label]) =>
    el("div", { class: "tile", id: `rate-${k}` },
      el("div", { class: "v" }, fmt(rates[k])), el("div", { class: "k" }, label))));
}

function line(series, value, width, height, top) {
  const n = series.length;
  const pts = series.map((p, i) => {
    const v = value(p);
    const x = n > 1 ? (i / (n - 1)) * width : 0;
    const y = height - (v ? (v / top) * (height - 2) : 0) - 1;
    return `${x.toFixed(1)},${y.toFixed(1)}`;
  });
  return pts.join(" ");
}

function drawCharts(series) {
  const W = 300, H = 60, NS = "http://www.w3.org/2000/svg";
  $("#charts").replaceChildren(...CHARTS.map(([label, first, second]) => {
    const values = series.flatMap((p) => [first(p), second ? second(p) : 0]).filter((v) => v);
    const top = Math.max(1, ...values);
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("preserveAspectRatio", "none");
    for (const [fn, cls] of [[first, ""], [second, "second"]]) {
      if (!fn) continue;
      const pl = document.createElementNS(NS, "polyline");
      pl.setAttribute("points", line(series, fn, W, H, top));
      if (cls) pl.setAttribute("class", cls);
      svg.append(pl);
    }
    return el("div", { class: "chart" }, el("div", { class: "k" }, `${label} · max ${fmt(top)}`), svg);
  }));
}

// The share bar's width, set through the CSSOM: the page's CSP refuses style attributes.
function fill(share) {
  const bar = el("span", { class: "fill" });
  bar.style.width = `${(share * 100).toFixed(1)}%`;
  return bar;
}

function drawGroups(groups) {
  $("#groups").replaceChildren(...groups.map((g) =>
    el("div", { class: "bar", "data-group": g.group_id },
      el("span", { class: "name" }, g.group_id),
      el("span", { class: "track" }, fill(g.share)),
      el("span", { class: "n" }, count(g.connections, "connection") +
        (g.max_connections ? ` of ${g.max_connections}` : "") +
        ` · ${count(g.gateways, "gateway")}${g.draining ? `, ${g.draining} draining` : ""}` +
        ` · ${(g.share * 100).toFixed(0)}%`))));
}

function drawGateways(gateways) {
  const rows = gateways
    .slice()
    .sort((a, b) => a.group_id.localeCompare(b.group_id) || a.gateway_id.localeCompare(b.gateway_id))
    .map((g) => {
      const state = g.draining ? "draining" : "live";
      const button = el("button", { onclick: () => drain(g.gateway_id) }, "Drain");
      if (g.draining) button.disabled = true;
      return el("tr", { "data-gateway": g.gateway_id },
        el("td", {}, g.gateway_id), el("td", {}, g.group_id), el("td", {}, g.zone || ""),
        el("td", { class: `state-${state}` }, state),
        el("td", { class: `circuit-${g.circuit}` }, g.circuit.replace("_", "-")),
        el("td", {}, g.max_connections ? `${g.connections} / ${g.max_connections}` : g.connections),
        el("td", {}, g.heartbeat_age_s === null ? "–" : `${fmt(g.heartbeat_age_s)} s ago`),
        el("td", {}, fmt(g.calls_per_s)), el("td", {}, fmt(g.batches_per_s)),
        el("td", {}, fmt(g.errors_per_s)), el("td", {}, button));
    });
  $("#gateways tbody").replaceChildren(...rows);
}

function drawJobs(jobs) {
  $("#jobs tbody").replaceChildren(...jobs.map((j) => {
    const link = el("a", { href: `#${j.push_id}`, title: `GET /v1/pushes/${j.push_id}`,
      onclick: (e) => { e.preventDefault(); showJob(j); } }, j.push_id.slice(0, 12));
    return el("tr", { "data-job": j.push_id },
      el("td", {}, link), el("td", {}, j.mode), el("td", {}, j.status),
      el("td", {}, j.recipients), el("td", {}, `${j.published} / ${j.batches}`),
      el("td", {}, j.delivered), el("td", {}, j.acked), el("td", {}, j.queued));
  }));
}

function showJob(job) {
  const pre = $("#job-detail");
  pre.hidden = false;
  pre.textContent = `GET /v1/pushes/${job.push_id}\n${JSON.stringify(job, null, 2)}`;
}

async function drain(gatewayId) {
  if (!confirm(`Drain gateway ${gatewayId}? Its clients are told to reconnect elsewhere.`)) return;
  let resp;
  try {
    resp = await api("POST", `/v1/gateways/${encodeURIComponent(gatewayId)}/drain`);
  } catch (e) {
    say(`drain ${gatewayId}: the push service cannot be reached`, true);
    return;
  }
  if (resp.status === 202) say(`draining ${gatewayId}`);
  else say(`drain ${gatewayId} refused: ${await errorOf(resp)}`, true);
  poll();
}

// The test client: the browser client the push service serves, connected as the user
// whose token is pasted; what it receives is listed (the last 20).
let testClient = null;

async function testConnect(e) {
  e.preventDefault();
  const token = $("#tc-token").value.trim();
  if (!token || testClient) return;
  const { ImrouteClient } = await import("/client/imroute.js");
  const log = $("#tc-log");
  const note = (text) => {
    log.prepend(el("li", {}, text));
    while (log.children.length > 20) log.lastChild.remove();
  };
  testClient = new ImrouteClient({
    apiUrl: location.origin,
    token,
    onMessage: (f) => note(`push ${f.msg_id.slice(0, 8)}: ${JSON.stringify(f.content)}`),
    onRecovered: (f) => note(`recovered ${f.count}${f.complete ? "" : " (incomplete)"}`),
    onState: (state, d) => {
      $("#tc-state").textContent = `${state}${d && d.gateway ? ` to ${d.gateway}` : ""}`;
    },
    onError: (err) => { $("#tc-state").textContent = String(err); },
  });
  $("#tc-connect").disabled = true;
  $("#tc-close").disabled = false;
  try {
    await testClient.connect();
  } catch (err) {
    testClose();
  }
}

function testClose() {
  if (testClient) testClient.close();
  testClient = null;
  $("#tc-connect").disabled = false;
  $("#tc-close").disabled = true;
}

function start() {
  $("#tc-form").addEventListener("submit", testConnect);
  $("#tc-close").addEventListener("click", testClose);
  $("#login").addEventListener("submit", (e) => {
    e.preventDefault();
    const key = $("#key").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY, key);
    $("#key").value = "";
    poll();
  });
  $("#logout").addEventListener("click", () => { sessionStorage.removeItem(KEY); showLogin(); });
  if (sessionStorage.getItem(KEY)) poll(); else showLogin();
}

start();
