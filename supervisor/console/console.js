// toolhost console: a client of the kernel protocol over the gateway's WebSocket (docs/console.md).
// Plain JavaScript, no framework, no request to any other origin. Every text that comes from the
// host (tool names, stderr, reasons) is put in the page with textContent, never parsed as HTML.
"use strict";

(function () {
  const TOKEN_KEY = "toolhost.token";
  const OP_TOKEN_KEY = "toolhost.operatorToken";
  const WINDOW_MS = 15 * 60 * 1000;
  const BUCKET_MS = 30 * 1000;
  const BUCKETS = WINDOW_MS / BUCKET_MS;
  const MAX_LOG_LINES = 500;
  const MAX_FAILURES = 20;
  const MAX_ACTIVITY = 50;
  const MAX_SAMPLES = 400; // latencies kept per tool and bucket

  const $ = (id) => document.getElementById(id);

  /** Build an element: el("td", {class: "x", "data-pid": 3}, "text", child, ...). */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "onclick") node.addEventListener("click", v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  /** Re-render ``box`` with ``nodes``, keeping keyboard focus on the control with the same
   * ``data-key`` (live updates must not throw a keyboard user out). */
  function swap(box, nodes) {
    const active = document.activeElement;
    const key = active && box.contains(active) ? active.getAttribute("data-key") : null;
    box.replaceChildren(...nodes);
    if (key) {
      const again = box.querySelector('[data-key="' + CSS.escape(key) + '"]');
      if (again) again.focus();
    }
  }

  function svg(tag, attrs) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }

  function badge(state) {
    return el("span", { class: "badge s-" + String(state).replace(/[^a-z-]/g, "") }, state);
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "-";
    if (ms < 1000) return Math.round(ms) + " ms";
    const s = ms / 1000;
    if (s < 60) return s.toFixed(1) + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + " min " + Math.floor(s % 60) + " s";
    const h = Math.floor(m / 60);
    return h + " h " + (m % 60) + " min";
  }

  function bytes(n) {
    if (!n) return "-";
    if (n < 1024 * 1024) return (n / 1024).toFixed(0) + " KiB";
    return (n / 1024 / 1024).toFixed(1) + " MiB";
  }

  // -- state -------------------------------------------------------------------------------

  const state = {
    ws: null,
    nextId: 1,
    pending: new Map(), // request id -> {resolve, reject}
    opened: false,
    catalog: null, // capability.catalog.get result
    tools: new Map(), // name -> descriptor
    stats: null,
    statsAt: 0,
    prevCpu: new Map(), // pid -> [cpuSeconds, at]
    cpu: new Map(), // pid -> percent
    health: null,
    healthAt: 0,
    inflight: new Map(), // callId -> {tool, sidecar, at}
    failures: [],
    series: new Map(), // tool -> Map(bucket -> {n, samples})
    approvals: [],
    approvalsSig: "",
    approvalSource: "kernel",
    logSidecar: "",
    logLines: [],
    timers: [],
    refetch: null,
    ticks: 0,
  };

  // -- connection --------------------------------------------------------------------------

  function wsUrl() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return scheme + "//" + location.host + "/ws";
  }

  function request(method, params) {
    return new Promise((resolve, reject) => {
      const ws = state.ws;
      if (!ws || ws.readyState !== WebSocket.OPEN) {
        reject(new Error("not connected"));
        return;
      }
      const id = state.nextId++;
      state.pending.set(id, { resolve, reject });
      ws.send(JSON.stringify({ id: id, method: method, params: params || {} }));
    });
  }

  function connect(token) {
    $("login-error").textContent = "";
    $("conn").textContent = "connecting…";
    let ws;
    try {
      // A browser cannot set Authorization on a WebSocket: the token travels as a subprotocol
      // value in the handshake (never in the URL); the gateway answers "toolhost.v1".
      ws = new WebSocket(wsUrl(), ["toolhost.v1", "toolhost.bearer." + token]);
    } catch (e) {
      showLogin("This token cannot be sent (it has characters a token never has).");
      return;
    }
    state.ws = ws;
    state.opened = false;
    ws.onopen = () => {
      state.opened = true;
      sessionStorage.setItem(TOKEN_KEY, token);
      start().catch((e) => notice("Could not load the host's state: " + e.message));
    };
    ws.onmessage = (m) => {
      let msg;
      try {
        msg = JSON.parse(m.data);
      } catch (e) {
        return;
      }
      if (msg.event) onEvent(msg.event, msg.data);
      else if (msg.id !== undefined && state.pending.has(msg.id)) {
        const p = state.pending.get(msg.id);
        state.pending.delete(msg.id);
        if (msg.error) p.reject(Object.assign(new Error(msg.error.message), msg.error));
        else p.resolve(msg.result);
      }
    };
    ws.onclose = () => {
      for (const p of state.pending.values()) p.reject(new Error("connection closed"));
      state.pending.clear();
      stopTimers();
      if (state.ws !== ws) return;
      state.ws = null;
      if (!state.opened) {
        refused();
        return;
      }
      $("conn").textContent = "disconnected: reconnecting…";
      setTimeout(() => {
        const t = sessionStorage.getItem(TOKEN_KEY);
        if (t && !state.ws) connect(t);
      }, 2000);
    };
  }

  /** The handshake failed: tell a refused token from a host that is down. */
  function refused() {
    fetch("/healthz", { cache: "no-store" })
      .then((r) => {
        if (r.ok || r.status === 503) {
          sessionStorage.removeItem(TOKEN_KEY);
          showLogin("The gateway refused this token. Check host.ws.tokenFile and try again.");
        } else {
          showLogin("The gateway answered HTTP " + r.status + ".");
        }
      })
      .catch(() => showLogin("The host does not answer; is `toolhost serve` running?"));
  }

  function showLogin(message) {
    $("app").hidden = true;
    $("health").hidden = true;
    $("top-actions").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("token").value = "";
    $("token").focus();
  }

  async function start() {
    const hello = await request("server.hello", { client: { name: "toolhost-console", version: "1" } });
    $("login").hidden = true;
    $("app").hidden = false;
    $("health").hidden = false;
    $("top-actions").hidden = false;
    $("conn").textContent = "live";
    setCatalog(hello.kits);
    await request("capability.catalog.subscribe", {});
    await request("events.subscribe", { topics: ["workers", "calls", "logs"] });
    await Promise.all([refreshHealth(), refreshStats(), refreshApprovals()]);
    pickLogSidecar();
    state.timers.push(setInterval(refreshHealth, 2000));
    state.timers.push(setInterval(refreshStats, 2000));
    state.timers.push(setInterval(refreshApprovals, 1500));
    state.timers.push(setInterval(refreshCatalog, 5000));
    state.timers.push(setInterval(tick, 1000));
    activity("connected to toolhost " + hello.server.version);
  }

  function stopTimers() {
    for (const t of state.timers) clearInterval(t);
    state.timers = [];
  }

  // -- refreshes ---------------------------------------------------------------------------

  async function refreshCatalog() {
    try {
      setCatalog(await request("capability.catalog.get", {}));
    } catch (e) {
      /* the connection dropped; onclose handles it */
    }
  }

  function soonCatalog() {
    if (state.refetch) return;
    state.refetch = setTimeout(() => {
      state.refetch = null;
      refreshCatalog();
    }, 150);
  }

  async function refreshHealth() {
    try {
      state.health = await request("system.health", {});
      state.healthAt = Date.now();
      renderHealth();
    } catch (e) {
      /* ignored: see refreshCatalog */
    }
  }

  async function refreshStats() {
    try {
      const stats = await request("system.stats", {});
      const now = Date.now();
      for (const sc of Object.values(stats.sidecars || {})) {
        for (const w of sc.workerStats || []) {
          if (!w.pid) continue;
          const prev = state.prevCpu.get(w.pid);
          if (prev && now > prev[1]) {
            state.cpu.set(w.pid, (100 * (w.cpuSeconds - prev[0]) * 1000) / (now - prev[1]));
          }
          state.prevCpu.set(w.pid, [w.cpuSeconds, now]);
        }
      }
      state.stats = stats;
      state.statsAt = now;
      renderSidecars();
    } catch (e) {
      /* ignored */
    }
  }

  async function refreshApprovals() {
    try {
      const r = await request("approvals.list", {});
      state.approvalSource = r.approvalSource;
      state.approvals = r.pending || [];
      renderApprovals();
    } catch (e) {
      /* ignored */
    }
  }

  function setCatalog(cat) {
    const old = new Map(((state.catalog && state.catalog.sidecars) || []).map((s) => [s.id, s]));
    for (const sc of cat.sidecars) {
      const before = old.get(sc.id);
      const ready = (sc.workers || []).some((w) => w.state === "ready");
      if (before && before._restarting && !ready) sc._restarting = true;
    }
    state.catalog = cat;
    state.tools = new Map(cat.tools.map((d) => [d.name, d]));
    renderSidecars();
    renderTools();
    fillLogChoices();
  }

  // -- events ------------------------------------------------------------------------------

  function onEvent(name, data) {
    switch (name) {
      case "catalog.changed":
        for (const d of data.tools || []) state.tools.set(d.name, d);
        for (const n of data.removed || []) state.tools.delete(n);
        if (state.catalog) state.catalog.tools = Array.from(state.tools.values());
        renderTools();
        soonCatalog();
        break;
      case "worker.changed": {
        const w = data.worker;
        if (w.state === "exited") {
          activity("worker " + w.pid + " of " + data.sidecar + " exited");
        } else if (w.state === "ready") {
          activity("worker " + w.pid + " of " + data.sidecar + " is ready");
        }
        applyWorker(data.sidecar, w);
        soonCatalog();
        break;
      }
      case "call.started":
        state.inflight.set(data.callId, { tool: data.tool, sidecar: data.sidecar, at: Date.now() });
        renderInflight();
        break;
      case "call.ended":
        state.inflight.delete(data.callId);
        record(data);
        if (data.status !== "success") {
          state.failures.unshift(Object.assign({ at: Date.now() }, data));
          state.failures.length = Math.min(state.failures.length, MAX_FAILURES);
          renderFailures();
        }
        renderInflight();
        break;
      case "log.line":
        if (data.sidecar === state.logSidecar) appendLog(data.line);
        break;
      case "events.dropped":
        notice("The host dropped " + data.count + " events this page did not read in time.");
        soonCatalog();
        break;
      default:
        break;
    }
  }

  /** A worker event changes the sidecar's row at once (the catalog follows). */
  function applyWorker(sidecar, w) {
    if (!state.catalog) return;
    const sc = state.catalog.sidecars.find((s) => s.id === sidecar);
    if (!sc) return;
    const workers = (sc.workers || []).filter((x) => x.pid !== w.pid && (x.pid || !w.pid));
    if (w.state !== "exited") workers.push(w);
    else sc._restarting = true;
    if (w.state === "ready") sc._restarting = false;
    sc.workers = workers;
    renderSidecars();
  }

  function record(ev) {
    let series = state.series.get(ev.tool);
    if (!series) {
      series = new Map();
      state.series.set(ev.tool, series);
    }
    const b = Math.floor(Date.now() / BUCKET_MS);
    let bucket = series.get(b);
    if (!bucket) {
      bucket = { n: 0, samples: [] };
      series.set(b, bucket);
      for (const k of series.keys()) if (k <= b - BUCKETS) series.delete(k);
    }
    bucket.n += 1;
    if (bucket.samples.length < MAX_SAMPLES) bucket.samples.push(ev.durationMs);
    else bucket.samples[Math.floor(Math.random() * MAX_SAMPLES)] = ev.durationMs;
  }

  // -- actions -----------------------------------------------------------------------------

  function confirmAction(text, okLabel) {
    return new Promise((resolve) => {
      const dialog = $("confirm");
      $("confirm-text").textContent = text;
      $("confirm-ok").textContent = okLabel || "Confirm";
      dialog.returnValue = "";
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
      dialog.showModal();
      $("confirm-cancel").focus();
    });
  }

  async function restartSidecar(id) {
    const running = Array.from(state.inflight.values()).filter((c) => c.sidecar === id).length;
    const text =
      "Restart " + id + "? Every worker is replaced now" +
      (running ? "; " + running + " call(s) in flight will fail." : ".");
    if (!(await confirmAction(text, "Restart " + id))) return;
    try {
      const r = await request("sidecar.restart", { sidecar: id, force: true });
      const pids = (r.replaced || []).join(", ") || "none";
      notice("Restarted " + id + " (replaced worker pid " + pids + ").");
      activity("restarted " + id + ", replaced " + pids);
      soonCatalog();
    } catch (e) {
      notice("Restart of " + id + " failed: " + e.message);
    }
  }

  async function reloadRegistry() {
    if (!(await confirmAction("Reload the registry from disk now?", "Reload"))) return;
    try {
      const r = await request("registry.reload", {});
      const parts = [];
      for (const k of ["added", "removed", "restarted"]) {
        if (r[k] && r[k].length) parts.push(k + " " + r[k].join(", "));
      }
      if (r.errors && r.errors.length) parts.push(r.errors.length + " problem(s): " + r.errors.join("; "));
      const text = r.applied
        ? "Registry reloaded (revision " + r.revision + ")" + (parts.length ? ": " + parts.join("; ") : ", nothing changed.")
        : "The registry was not applied: " + (r.errors || []).join("; ");
      notice(text);
      activity(text);
      refreshCatalog();
    } catch (e) {
      notice("Reload failed: " + e.message);
    }
  }

  async function decide(item, granted) {
    const verb = granted ? "Approve" : "Deny";
    const token = $("op-token").value.trim();
    if (!token) {
      notice("Type the operator token first (operator.token next to the socket).");
      $("op-token").focus();
      return;
    }
    const ok = await confirmAction(verb + " " + item.tool + " (" + item.callId + ")?", verb);
    if (!ok) return;
    sessionStorage.setItem(OP_TOKEN_KEY, token);
    try {
      const by = $("op-name").value.trim() || "console";
      await request("approvals.decide", { callId: item.callId, token: token, by: by, granted: granted });
      const text = (granted ? "Approved " : "Denied ") + item.tool + " (" + item.callId + ")";
      notice(text + ".");
      activity(text);
      refreshApprovals();
    } catch (e) {
      notice(verb + " failed: " + e.message);
    }
  }

  // -- rendering ---------------------------------------------------------------------------

  function notice(text) {
    $("notice").textContent = text;
  }

  function activity(text) {
    const list = $("activity");
    list.prepend(el("li", {}, new Date().toLocaleTimeString() + " " + text));
    while (list.children.length > MAX_ACTIVITY) list.lastChild.remove();
  }

  function renderHealth() {
    const h = state.health;
    if (!h) return;
    const status = $("health-status");
    status.textContent = h.status;
    status.className = "badge s-" + h.status;
    $("health-uptime").textContent = "up " + duration(h.uptimeMs + (Date.now() - state.healthAt));
    const t = h.tools || {};
    $("health-counts").textContent =
      "tools: " + (t.available || 0) + " available, " + (t.degraded || 0) + " degraded, " +
      (t.unavailable || 0) + " unavailable, " + (t.disabled || 0) + " disabled";
  }

  function sidecarState(sc) {
    const ready = (sc.workers || []).some((w) => w.state === "ready");
    const starting = (sc.workers || []).some((w) => w.state === "starting");
    if (sc.runtime === "stopped") return "stopped";
    if (!ready && (sc._restarting || sc.nextRestartMs !== undefined || (starting && sc.restarts))) {
      return "restarting";
    }
    return sc.runtime;
  }

  function renderSidecars() {
    const box = $("sidecars");
    const cat = state.catalog;
    if (!cat) return;
    const stats = (state.stats && state.stats.sidecars) || {};
    const nodes = [];
    if (!cat.sidecars.length) nodes.push(el("p", { class: "muted" }, "No sidecar is running."));
    for (const sc of cat.sidecars) {
      const st = stats[sc.id] || {};
      const byPid = new Map((st.workerStats || []).map((w) => [w.pid, w]));
      const label = sidecarState(sc);
      const head = el(
        "div",
        { class: "sidecar-head" },
        el("h3", {}, sc.id),
        badge(label),
        el("span", { class: "muted small" }, sc.protocol + (sc.mode ? " / " + sc.mode : "")),
        el("button", { type: "button", class: "quiet", "aria-label": "Restart sidecar " + sc.id, "data-restart": sc.id, "data-key": "restart:" + sc.id, onclick: () => restartSidecar(sc.id) }, "Restart"),
        el("button", { type: "button", class: "quiet", "aria-label": "Show stderr of " + sc.id, "data-key": "logs:" + sc.id, onclick: () => showLogs(sc.id) }, "Logs"),
      );
      const facts = el(
        "div",
        { class: "facts" },
        el("span", {}, "queue " + (sc.queued || 0)),
        el("span", {}, "restarts " + (sc.restarts || 0)),
        sc.confinement ? el("span", { "data-confinement": sc.confinement, title: "kernel confinement (PROTOCOL 7): what its worker has, read from it" }, "confined " + sc.confinement) : null,
        sc.nextRestartMs !== undefined ? el("span", {}, "next restart in " + duration(sc.nextRestartMs)) : null,
        sc.lastExitReason ? el("span", {}, "last exit: " + sc.lastExitReason + (sc.lastExitCode !== undefined ? " (status " + sc.lastExitCode + ")" : "")) : null,
        st.calls !== undefined ? el("span", {}, "calls " + st.calls + ", failed " + (st.failed || 0)) : null,
      );
      const rows = (sc.workers || []).map((w) => {
        const ws = byPid.get(w.pid) || {};
        const cpu = state.cpu.get(w.pid);
        return el(
          "tr",
          { "data-sidecar": sc.id, "data-pid": w.pid, "data-state": w.state },
          el("td", { "data-label": "pid", class: "mono" }, w.pid || "-"),
          el("td", { "data-label": "state" }, badge(w.state)),
          el("td", { "data-label": "started by" }, w.startedBy || "-"),
          el("td", { "data-label": "uptime" }, duration(w.uptimeMs)),
          el("td", { "data-label": "calls" }, w.calls || 0),
          el("td", { "data-label": "in flight" }, w.inflight || 0),
          el("td", { "data-label": "RSS" }, bytes(ws.rssBytes)),
          el("td", { "data-label": "CPU" }, cpu === undefined ? "-" : cpu.toFixed(1) + " %"),
        );
      });
      const table = rows.length
        ? el(
            "div",
            { class: "scroll" },
            el(
              "table",
              { class: "stack", "aria-label": "workers of " + sc.id },
              el("thead", {}, el("tr", {}, ...["pid", "state", "started by", "uptime", "calls", "in flight", "RSS", "CPU"].map((h) => el("th", { scope: "col" }, h)))),
              el("tbody", {}, ...rows),
            ),
          )
        : el("p", { class: "muted small" }, "No worker right now.");
      nodes.push(el("div", { class: "sidecar", "data-sidecar": sc.id, "data-state": label }, head, facts, table));
    }
    swap(box, nodes);
  }

  function reasonText(r) {
    const what = r.message || r.code;
    return r.hint ? [what, el("span", { class: "hint" }, " What to do: " + r.hint)] : [what];
  }

  function renderTools() {
    const box = $("tools");
    const q = $("filter").value.trim().toLowerCase();
    const all = Array.from(state.tools.values()).sort((a, b) => a.name.localeCompare(b.name));
    const shown = all.filter((d) => {
      if (!q) return true;
      const hay = [d.name, d.sidecar || "", d.stability.effective, d.stability.runtime].join(" ").toLowerCase();
      return hay.includes(q);
    });
    $("tool-count").textContent = shown.length + " of " + all.length + " tools";
    const rows = shown.map((d) => {
      const s = d.stability;
      const fields = ["discovery", "manifest", "path", "version", "probe", "runtime", "sandbox", "upgrade"]
        .map((f) => f + " " + s[f])
        .join(" · ");
      const reasons = s.reasons && s.reasons.length
        ? el("ul", { class: "reasons" }, ...s.reasons.map((r) => el("li", { "data-code": r.code }, ...reasonText(r))))
        : null;
      return el(
        "tr",
        { "data-tool": d.name, "data-effective": s.effective },
        el("td", { "data-label": "tool" }, el("strong", {}, d.name), el("div", { class: "muted small" }, d.sidecar || "no sidecar")),
        el("td", { "data-label": "state" }, badge(s.effective), d.visible ? null : el("div", { class: "muted small" }, "not visible to the model")),
        el("td", { "data-label": "stability" }, el("div", { class: "fields" }, fields), reasons),
        el("td", { "data-label": "latency", class: "chart" }, chart(d.name)),
      );
    });
    box.replaceChildren(
      rows.length
        ? el(
            "div",
            { class: "scroll" },
            el(
              "table",
              { class: "stack", "aria-label": "tools" },
              el("thead", {}, el("tr", {}, ...["tool", "state", "stability (nine fields) and reasons", "last 15 minutes"].map((h) => el("th", { scope: "col" }, h)))),
              el("tbody", {}, ...rows),
            ),
          )
        : el("p", { class: "muted" }, q ? "No tool matches." : "No tools."),
    );
  }

  function quantile(sorted, q) {
    if (!sorted.length) return null;
    return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
  }

  /** p50/p99 lines and a calls/s bar per 30 s bucket over 15 minutes, as inline SVG. */
  function chart(tool) {
    const series = state.series.get(tool);
    const W = 150;
    const H = 36;
    const now = Math.floor(Date.now() / BUCKET_MS);
    const p50 = [];
    const p99 = [];
    const rate = [];
    let maxLat = 0;
    let maxRate = 0;
    let total = 0;
    let last50 = null;
    let last99 = null;
    for (let i = 0; i < BUCKETS; i++) {
      const b = series && series.get(now - BUCKETS + 1 + i);
      if (b) {
        const s = b.samples.slice().sort((x, y) => x - y);
        const a = quantile(s, 0.5);
        const c = quantile(s, 0.99);
        p50.push(a);
        p99.push(c);
        rate.push(b.n / (BUCKET_MS / 1000));
        maxLat = Math.max(maxLat, c);
        maxRate = Math.max(maxRate, b.n / (BUCKET_MS / 1000));
        total += b.n;
        last50 = a;
        last99 = c;
      } else {
        p50.push(null);
        p99.push(null);
        rate.push(0);
      }
    }
    const label = total
      ? tool + ": " + total + " calls in 15 minutes, latest p50 " + duration(last50) + ", p99 " + duration(last99) + ", peak " + maxRate.toFixed(2) + " calls/s"
      : tool + ": no calls seen in the last 15 minutes";
    const root = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": label });
    const title = svg("title", {});
    title.textContent = label;
    root.append(title);
    root.append(svg("rect", { x: 0, y: 0, width: W, height: H, fill: "#f3f5f7" }));
    const step = W / BUCKETS;
    rate.forEach((r, i) => {
      if (!r) return;
      const h = Math.max(1, (r / maxRate) * (H / 2));
      root.append(svg("rect", { x: i * step, y: H - h, width: Math.max(1, step - 1), height: h, fill: "#b9c9e6" }));
    });
    const line = (vals, attrs) => {
      let d = "";
      vals.forEach((v, i) => {
        if (v === null || !maxLat) return;
        const x = i * step + step / 2;
        const y = H - 2 - (v / maxLat) * (H - 4);
        d += (d ? " L" : "M") + x.toFixed(1) + " " + y.toFixed(1);
      });
      if (d) root.append(svg("path", Object.assign({ d: d, fill: "none" }, attrs)));
    };
    line(p99, { stroke: "#b3261e", "stroke-width": 1, "stroke-dasharray": "3 2" });
    line(p50, { stroke: "#1f5fbf", "stroke-width": 1.5 });
    return el("div", {}, root, el("div", { class: "muted small" }, total ? "p50 " + duration(last50) + " · p99 " + duration(last99) : "no calls"));
  }

  function renderInflight() {
    const box = $("inflight");
    const now = Date.now();
    const calls = Array.from(state.inflight.entries()).sort((a, b) => a[1].at - b[1].at);
    if (!calls.length) {
      box.replaceChildren(el("p", { class: "muted" }, "No calls are running."));
      return;
    }
    box.replaceChildren(
      el(
        "div",
        { class: "scroll" },
        el(
          "table",
          { class: "stack", "aria-label": "calls in flight" },
          el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "call"), el("th", { scope: "col" }, "tool"), el("th", { scope: "col" }, "sidecar"), el("th", { scope: "col" }, "age"))),
          el("tbody", {}, ...calls.slice(0, 100).map(([id, c]) => el("tr", { "data-call": id }, el("td", { "data-label": "call" }, "#" + id), el("td", { "data-label": "tool" }, c.tool), el("td", { "data-label": "sidecar" }, c.sidecar), el("td", { "data-label": "age" }, duration(now - c.at))))),
        ),
      ),
      calls.length > 100 ? el("p", { class: "muted small" }, "and " + (calls.length - 100) + " more") : null,
    );
  }

  function renderFailures() {
    const box = $("failures");
    box.replaceChildren(
      ...state.failures.map((f) =>
        el(
          "div",
          { class: "sidecar", "data-failure": f.code || f.status },
          el("div", { class: "sidecar-head" }, badge(f.status), el("strong", {}, f.tool), el("span", { class: "mono" }, f.code || ""), el("span", { class: "muted small" }, new Date(f.at).toLocaleTimeString() + " · " + duration(f.durationMs))),
          f.message ? el("div", {}, f.message) : null,
          f.stderr ? el("details", {}, el("summary", {}, "stderr tail"), el("pre", { class: "tail" }, f.stderr)) : null,
        ),
      ),
    );
  }

  function renderApprovals() {
    $("approvals-config").hidden = state.approvalSource !== "operator";
    const box = $("approvals");
    // Re-render only when the waiting calls change: a button must not move under a pointer.
    const sig = state.approvalSource + ":" + state.approvals.map((a) => a.callId).join(",");
    if (sig === state.approvalsSig) return;
    state.approvalsSig = sig;
    if (state.approvalSource !== "operator") {
      box.replaceChildren(el("p", { class: "muted" }, "Approvals come from the kernel (host.approvalSource is \"kernel\"): nothing waits here."));
      return;
    }
    if (!state.approvals.length) {
      box.replaceChildren(el("p", { class: "muted" }, "Nothing is waiting."));
      return;
    }
    swap(
      box,
      state.approvals.map((a) =>
        el(
          "div",
          { class: "sidecar", "data-approval": a.callId },
          el("div", { class: "sidecar-head" }, el("strong", {}, a.tool), el("span", { class: "muted small" }, (a.sidecar || "") + " · " + a.callId + " · must be decided within " + duration(a.deadlineInMs))),
          el("pre", { class: "tail" }, a.input),
          el(
            "div",
            { class: "row" },
            el("button", { type: "button", "data-approve": a.callId, "data-key": "approve:" + a.callId, "aria-label": "Approve " + a.tool + " " + a.callId, onclick: () => decide(a, true) }, "Approve"),
            el("button", { type: "button", class: "danger", "data-deny": a.callId, "data-key": "deny:" + a.callId, "aria-label": "Deny " + a.tool + " " + a.callId, onclick: () => decide(a, false) }, "Deny"),
          ),
        ),
      ),
    );
  }

  // -- logs --------------------------------------------------------------------------------

  function fillLogChoices() {
    const select = $("log-sidecar");
    const ids = (state.catalog ? state.catalog.sidecars : []).map((s) => s.id);
    const current = Array.from(select.options).map((o) => o.value);
    if (current.join("\n") === ids.join("\n")) return;
    select.replaceChildren(...ids.map((id) => el("option", { value: id }, id)));
    if (ids.includes(state.logSidecar)) select.value = state.logSidecar;
  }

  function pickLogSidecar() {
    const select = $("log-sidecar");
    if (select.value) loadLogs(select.value);
  }

  function showLogs(id) {
    $("log-sidecar").value = id;
    loadLogs(id);
    $("log").focus();
  }

  async function loadLogs(id) {
    state.logSidecar = id;
    state.logLines = [];
    $("log").textContent = "";
    try {
      const r = await request("sidecar.logs", { sidecar: id, bytes: 16384 });
      if (state.logSidecar !== id) return;
      const lines = r.stderr ? r.stderr.replace(/\n$/, "").split("\n") : [];
      state.logLines = lines.slice(-MAX_LOG_LINES).concat(state.logLines);
      renderLog();
    } catch (e) {
      $("log").textContent = "(no stderr: " + e.message + ")";
    }
  }

  function appendLog(line) {
    state.logLines.push(line);
    if (state.logLines.length > MAX_LOG_LINES) state.logLines.splice(0, state.logLines.length - MAX_LOG_LINES);
    renderLog();
  }

  function renderLog() {
    const pre = $("log");
    pre.textContent = state.logLines.join("\n");
    if ($("log-follow").checked) pre.scrollTop = pre.scrollHeight;
  }

  // -- every second --------------------------------------------------------------------------

  function tick() {
    renderHealth();
    renderInflight();
    if (++state.ticks % 5 === 0) renderTools(); // the charts move on
  }

  // -- wiring --------------------------------------------------------------------------------

  function init() {
    $("login-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const token = $("token").value.trim();
      if (token) connect(token);
    });
    $("signout").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      sessionStorage.removeItem(OP_TOKEN_KEY);
      const ws = state.ws;
      state.ws = null;
      stopTimers();
      if (ws) ws.close();
      showLogin("Signed out: the token was removed from this tab.");
    });
    $("reload").addEventListener("click", reloadRegistry);
    $("filter").addEventListener("input", renderTools);
    $("log-sidecar").addEventListener("change", (e) => loadLogs(e.target.value));
    $("op-token").value = sessionStorage.getItem(OP_TOKEN_KEY) || "";
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) connect(token);
    else showLogin("");
  }

  init();
})();
