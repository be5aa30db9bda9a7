// SEMQ web console: the dashboard's live part. Polls /api/dashboard and
// draws the charts (uPlot) and tables. Every value is set as text
// (textContent), never as HTML.
"use strict";
(function () {
  const POLL_MS = 5000;
  const SERIES = [
    ["queued", "#1f5fbf"], ["sent", "#7a4fd1"], ["received", "#1e7a34"],
    ["confirmed", "#0b8a8a"], ["failed", "#b3261e"],
  ];
  let rates = null, latency = null;
  // Both charts show the last hour, whatever their points (one point, or
  // several in the same second, would otherwise stretch the axis to years).
  let span = [0, 1];
  const hour = { x: { time: true, range: () => span } };

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function ts(ms) { return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) + "Z" : ""; }
  function age(ms, now) {
    if (!ms) return "";
    const s = Math.max(0, (now - ms) / 1000);
    return s < 120 ? s.toFixed(0) + " s" : s < 7200 ? (s / 60).toFixed(0) + " min" : (s / 3600).toFixed(1) + " h";
  }
  function fill(id, rows) {
    const t = document.getElementById(id);
    if (!t) return;
    const body = t.tBodies[0];
    body.replaceChildren();
    for (const cells of rows) {
      const tr = document.createElement("tr");
      for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
      body.appendChild(tr);
    }
    if (!rows.length) {
      const tr = document.createElement("tr");
      const td = el("td", "none", "note");
      td.colSpan = t.tHead.rows[0].cells.length;
      tr.appendChild(td);
      body.appendChild(tr);
    }
  }
  function docLink(lk0) {
    const td = document.createElement("td");
    if (!lk0) return td;
    const a = el("a", lk0, "mono");
    a.href = "/doc?lk0=" + encodeURIComponent(lk0);
    td.appendChild(a);
    return td;
  }
  function width(div) { return Math.max(300, div.clientWidth - 10); }
  // A y axis as wide as its widest tick label: uPlot's fixed 50 px would let
  // a label such as "300,000" run into the axis title beside it.
  function axisSize(u, values, axisIdx, cycleNum) {
    const axis = u.axes[axisIdx];
    if (cycleNum > 1) return axis._size;
    let size = axis.ticks.size + axis.gap;
    const longest = (values || []).reduce((a, v) => (String(v).length > a.length ? String(v) : a), "");
    if (longest) {
      u.ctx.font = axis.font[0];
      size += u.ctx.measureText(longest).width / devicePixelRatio;
    }
    return Math.ceil(size) + 6;
  }
  function msText(v) { return v >= 1000 ? (v / 1000).toLocaleString("en") + " s" : v.toLocaleString("en") + " ms"; }

  function drawRates(d) {
    const div = document.getElementById("chart-rates");
    const r = d.rates || {};
    const x = (r.start || []).map((v) => v / 1000);
    const data = [x].concat(SERIES.map(([k]) => r[k] || x.map(() => 0)));
    if (!rates) {
      rates = new uPlot({
        width: width(div), height: 240,
        series: [{}].concat(SERIES.map(([k, c]) => ({ label: k, stroke: c, width: 2 }))),
        scales: hour, axes: [{}, { label: "documents per minute", size: axisSize }],
      }, data, div);
      div.semqChart = rates;
    } else rates.setData(data);
  }
  function drawLatency(d) {
    const div = document.getElementById("chart-latency");
    if (!div) return;  // (the platform's dashboard has none)
    const l = d.latency || { ts: [], p50: [], p99: [] };
    document.getElementById("latency-none").classList.toggle("hidden", l.p99.some((v) => v !== null));
    const data = [l.ts.map((v) => v / 1000), l.p50, l.p99];
    if (!latency) {
      latency = new uPlot({
        width: width(div), height: 240,
        series: [{}, { label: "p50 (ms)", stroke: "#1f5fbf", width: 2, points: { show: true, size: 5 } },
                 { label: "p99 (ms)", stroke: "#b3261e", width: 2, points: { show: true, size: 5 } }],
        scales: hour,
        axes: [{}, { label: "latency (at most)", size: axisSize, values: (u, vals) => vals.map(msText) }],
      }, data, div);
      div.semqChart = latency;
    } else latency.setData(data);
  }

  function render(d) {
    const now = d.now_ms;
    document.getElementById("updated").textContent = "Updated " + ts(now) + " (every " + POLL_MS / 1000 + " s)";
    document.getElementById("draining").classList.toggle("hidden", !d.draining);
    span = [(now - 3600 * 1000) / 1000, now / 1000];
    if (window.uPlot) { drawRates(d); drawLatency(d); }
    fill("backlog", (d.backlog || []).map((b) => [b.target, b.open,
      d.role === "platform" ? (b.online ? "yes" : "no") : b.failed, age(b.oldest_ms, now)]));
    fill("nodes", (d.nodes || []).map((n) => [n.node, n.online ? "yes" : "no", ts(n.last_seen_ms) || "never",
      n.revoked ? "yes" : ""]));
    const stuck = d.stuck || { count: 0, rows: [] };
    document.getElementById("stuck-count").textContent = "(" + stuck.count + ")";
    fill("stuck", stuck.rows.map((r) => {
      const cells = [docLink(r.lk0), r.target, r.state, r.place || "", r.age_s];
      if (d.units > 1) cells.push(r.unit);
      return cells;
    }));
    fill("certs", (d.certificates || []).map((c) => {
      const days = el("td", c.days_left, c.days_left < 30 ? "warn" : "");
      return [c.what, c.subject, ts(c.not_after_ms), days, el("td", c.fingerprint.slice(0, 23) + "…", "mono")];
    }));
  }

  async function poll() {
    try {
      const resp = await fetch("/api/dashboard", { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (resp.status === 401) { window.location.href = "/login?next=/"; return; }
      if (resp.ok) render(await resp.json());
    } catch (e) {
      document.getElementById("updated").textContent = "Update failed: " + e;
    }
    setTimeout(poll, POLL_MS);
  }
  document.addEventListener("DOMContentLoaded", poll);
})();
