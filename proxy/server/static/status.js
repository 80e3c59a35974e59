// firstbyte's status page: polls /status/data and redraws. No dependencies, no network beyond
// the gateway itself. ?every=SECONDS sets the poll interval (default 2, at least 0.25).
"use strict";
(function () {
  const every = Math.max(0.25, parseFloat(new URLSearchParams(location.search).get("every")) || 2);
  const SVG = "http://www.w3.org/2000/svg";

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }
  function row(cells) {
    const tr = document.createElement("tr");
    for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
    return tr;
  }
  function secs(v) { return v === null || v === undefined ? "unmeasured" : v < 1 ? (v * 1000).toFixed(0) + " ms" : v.toFixed(2) + " s"; }
  function pct(v) { return (v * 100).toFixed(1) + " %"; }
  function ago(epoch, now) {
    const s = Math.max(0, now - epoch);
    return s < 90 ? s.toFixed(0) + " s ago" : s < 5400 ? (s / 60).toFixed(0) + " min ago" : (s / 3600).toFixed(1) + " h ago";
  }
  function clock(epoch) { return new Date(epoch * 1000).toLocaleTimeString(); }

  // A target's hour: one point a minute for its mean first-token time, a red bar per minute with failures.
  function chart(points, now, bucket) {
    const w = 236, h = 44, span = 60 * bucket, start = now - span;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.setAttribute("class", "chart");
    const axis = document.createElementNS(SVG, "line");
    axis.setAttribute("class", "axis");
    axis.setAttribute("x1", 0); axis.setAttribute("x2", w); axis.setAttribute("y1", h - 0.5); axis.setAttribute("y2", h - 0.5);
    svg.appendChild(axis);
    const x = (t) => Math.max(0, Math.min(w, ((t + bucket / 2 - start) / span) * w));
    const top = Math.max(0.001, ...points.map((p) => p.ttft_s || 0));
    const most = Math.max(1, ...points.map((p) => p.failures));
    const line = [];
    for (const p of points) {
      if (p.failures) {
        const bar = document.createElementNS(SVG, "rect");
        const bh = Math.max(2, (p.failures / most) * (h - 4));
        bar.setAttribute("class", "fail");
        bar.setAttribute("x", x(p.t) - 1.5); bar.setAttribute("width", 3);
        bar.setAttribute("y", h - bh); bar.setAttribute("height", bh);
        svg.appendChild(bar);
      }
      if (p.ttft_s !== null) {
        const px = x(p.t), py = h - 4 - (p.ttft_s / top) * (h - 10);
        line.push(`${px.toFixed(1)},${py.toFixed(1)}`);
        const dot = document.createElementNS(SVG, "circle");
        dot.setAttribute("class", "dot");
        dot.setAttribute("cx", px.toFixed(1)); dot.setAttribute("cy", py.toFixed(1)); dot.setAttribute("r", 2);
        svg.appendChild(dot);
      }
    }
    if (line.length) {
      const poly = document.createElementNS(SVG, "polyline");
      poly.setAttribute("class", "ttft");
      poly.setAttribute("points", line.join(" "));
      svg.appendChild(poly);
    }
    const title = document.createElementNS(SVG, "title");
    title.textContent = `peak first token ${secs(top)}; most failures in a minute ${most}`;
    svg.appendChild(title);
    return svg;
  }

  function draw(d) {
    document.getElementById("config").textContent = "config " + d.config;
    document.getElementById("reload").textContent = (d.reload_ok ? "loaded " : "last reload REFUSED; loaded ") + ago(d.loaded_at, d.now)
      + (d.draining ? " · draining" : "");
    const fleet = document.getElementById("fleet-state");
    const f = d.fleet;
    fleet.textContent = f.fleet === undefined ? f.link
      : f.link === "in-fleet" ? `in fleet ${f.fleet} as ${f.instance} since ${f.since}, peers: ${f.peers.join(", ") || "none"}`
      : `alone (fleet ${f.fleet}: ${f.reason || "not linked"})`;
    fleet.className = f.link === "in-fleet" ? "linked" : "alone";
    const hist = d.history;

    const routes = document.querySelector("#routes tbody");
    routes.replaceChildren();
    for (const r of d.routes) {
      const h = hist.routes[r.name] || {requests: 0, raced_share: 0, duplicate_share: 0, leader: null};
      const order = el("ol", null, "order");
      r.order.forEach((o, i) => order.appendChild(el("li", `${o.target} (${o.detail})`, i === 0 ? "lead" : "")));
      const cell = el("td"); cell.appendChild(order);
      const leader = h.leader ? `${h.leader.target}, ${ago(h.leader.since, d.now)}` : "no request yet";
      const excluded = r.excluded.map((e) => `${e.target} (${e.reason})`).join(", ") || "none";
      const tr = row([el("td", r.name, "lead"), r.strategy + (r.hedged ? " + hedge" : ""), cell, leader, excluded,
        el("td", h.requests, "num"), el("td", pct(h.raced_share), "num"), el("td", pct(h.duplicate_share), "num")]);
      tr.dataset.route = r.name;
      routes.appendChild(tr);
    }

    const targets = document.querySelector("#targets tbody");
    targets.replaceChildren();
    for (const t of d.targets) {
      const streamed = t.streamed || {}, buffered = t.buffered || {};
      const breaker = el("td", t.breaker + (t.failures ? ` (${t.failures} failed)` : ""), "breaker " + t.breaker);
      const cool = t.breaker === "open" ? `${t.seconds_left.toFixed(1)} s to probe` : t.cooling_s > 0 ? `${t.cooling_s.toFixed(1)} s (Retry-After)` : "";
      const graph = el("td"); graph.appendChild(chart(hist.targets[t.target] || [], d.now, hist.bucket_s));
      const tr = row([t.route, el("td", t.target, "lead"),
        el("td", `${secs(streamed.figure_s)} · ${streamed.samples || 0} samples`, "num"),
        el("td", `${secs(buffered.figure_s)} · ${buffered.samples || 0} samples`, "num"),
        breaker, el("td", cool, "num"), el("td", t.in_flight, "num"), graph]);
      tr.dataset.route = t.route;
      tr.dataset.target = t.target;
      targets.appendChild(tr);
    }

    const list = document.querySelector("#decisions ol");
    list.replaceChildren();
    for (const x of hist.decisions) {
      list.appendChild(el("li", `${clock(x.at)} ${x.status} ${x.decision}`, x.failed ? "failed" : "ok"));
    }
    if (!hist.decisions.length) list.appendChild(el("li", "no routed request yet", "dim"));
    document.getElementById("updated").textContent = "updated " + clock(d.now);
    document.getElementById("error").textContent = "";
    document.body.dataset.polls = String((parseInt(document.body.dataset.polls || "0", 10)) + 1);
  }

  async function poll() {
    try {
      const resp = await fetch("/status/data", {cache: "no-store"});
      if (!resp.ok) throw new Error(`status ${resp.status}`);
      draw(await resp.json());
    } catch (err) {
      document.getElementById("error").textContent = "cannot reach the gateway: " + err.message;
    }
    setTimeout(poll, every * 1000);
  }
  poll();
})();
