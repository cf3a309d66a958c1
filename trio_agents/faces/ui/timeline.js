// trio_agents web UI: the timeline of the selected run tree (DESIGN §23), a Gantt-like
// chart of every run, model call and tool call with its tokens and cost.
//
// Self-contained beside ui.js: it adds a "Timeline" button to the run view ui.js builds,
// and reads GET /runs/{id}/timeline (the spans the server derives from the tree's event
// log; nothing is computed here but the drawing). While the tree is live the chart is
// read again every second; once its root is terminal, every span is closed and the
// reading stops. Each finished model call has a "replay…" button, which opens the Model
// calls panel of compare.js for its run, at that call. Same rules as ui.js: the token from this tab's sessionStorage, sent in
// the Authorization header only; nothing fetched from another host.
"use strict";

(() => {
  const TOKEN_KEY = "trio-agents.token";
  const TERMINAL = new Set(["completed", "failed", "cancelled"]);
  // a span's status, in the colours of the run statuses (ui.css's .status classes)
  const COLOUR = {
    ok: "completed", completed: "completed", incomplete: "failed", interrupted: "queued",
    error: "failed", failed: "failed", cancelled: "cancelled", running: "running",
    awaiting_approval: "awaiting_approval", queued: "queued",
  };
  const REFRESH_MS = 1000;
  const BASE = location.pathname.replace(/\/ui(\/.*)?$/, "");

  let shown = null; // { runId, panel, timer } while a timeline is open

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  async function load(runId) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const resp = await fetch(BASE + "/runs/" + encodeURIComponent(runId) + "/timeline", {
      headers: { Authorization: "Bearer " + token },
      cache: "no-store",
      credentials: "omit",
    });
    const data = await resp.json().catch(() => null);
    if (!resp.ok) {
      const error = data && data.error;
      throw new Error((error && error.message) || "HTTP " + resp.status);
    }
    return data.timeline;
  }

  // Tokens and cost, as the run view writes them ("300 tokens · $0.00024"). The cost is
  // the server's decimal string, shown as it is: never summed or rounded through floats.
  function usageText(usage) {
    if (!usage) return "";
    const tokens = (usage.input_tokens || 0) + (usage.output_tokens || 0);
    return tokens + " tokens" + (usage.cost != null ? " · $" + usage.cost : "");
  }

  function durationText(span, end) {
    if (span.start == null) return "";
    const seconds = (span.end != null ? span.end : end) - span.start;
    const text = seconds < 1 ? Math.round(seconds * 1000) + " ms" : seconds.toFixed(2) + " s";
    return span.end == null ? text + "…" : text;
  }

  // The spans in tree order: each run, then its calls by start, each child run under
  // the tool call it runs in.
  function ordered(timeline) {
    const below = new Map();
    for (const span of timeline.spans) {
      const key = span.parent_id || "";
      if (!below.has(key)) below.set(key, []);
      below.get(key).push(span);
    }
    for (const list of below.values()) list.sort((a, b) => (a.start || 0) - (b.start || 0));
    const rows = [];
    const visit = (span, depth) => {
      rows.push({ span, depth });
      for (const child of below.get(span.id) || []) visit(child, depth + 1);
    };
    for (const root of below.get("") || []) visit(root, 0);
    return rows;
  }

  function render(panel, timeline) {
    const rows = ordered(timeline);
    const times = [];
    for (const { span } of rows) {
      if (span.start != null) times.push(span.start);
      if (span.end != null) times.push(span.end);
    }
    const t0 = times.length ? Math.min(...times) : 0;
    // an open span runs to the latest time the events show (the server's clock, not ours)
    const t1 = times.length ? Math.max(...times) : 0;
    const width = t1 - t0 || 1;
    const root = rows.length ? rows[0].span : null;
    const head = el("div", "tl-head");
    head.append(
      el("strong", null, "Timeline"),
      el("span", "muted tl-total", root ? durationText(root, t1) : ""),
      el("span", "tl-usage", timeline.usage ? "tree: " + usageText(timeline.usage) : ""),
    );
    const chart = el("div", "tl-chart");
    for (const { span, depth } of rows) {
      const row = el("div", "tl-row tl-" + span.kind);
      row.dataset.span = span.id;
      row.dataset.kind = span.kind;
      row.dataset.status = span.status;
      row.dataset.name = span.name;
      if (span.end == null) row.classList.add("open");
      const label = el("div", "tl-label");
      label.style.paddingLeft = depth * 14 + 4 + "px";
      label.append(el("span", "tl-kind", span.kind), el("span", "tl-name", span.name));
      label.title = span.id;
      const track = el("div", "tl-track");
      const bar = el("div", "tl-bar status " + (COLOUR[span.status] || "queued"));
      const start = span.start != null ? span.start : t0;
      const end = span.end != null ? span.end : t1;
      bar.style.left = ((start - t0) / width) * 100 + "%";
      bar.style.width = Math.max(((end - start) / width) * 100, 0.4) + "%";
      bar.title = span.status + " · " + durationText(span, t1);
      track.append(bar);
      const meta = el("div", "tl-meta");
      meta.append(
        el("span", "tl-status", span.status),
        el("span", "muted tl-duration", durationText(span, t1)),
        el("span", "tl-usage", usageText(span.usage)),
      );
      if (span.model && span.kind === "model" && span.model !== span.name) {
        meta.append(el("span", "muted tl-model", span.model));
      }
      if (span.kind === "model" && span.end != null) {
        // compare.js's "Model calls" panel replays a run's recorded calls; this opens it
        // for the call's run (the root or a sub-agent), at this call (a run that
        // recorded none says so there).
        const replay = el("button", "secondary tl-replay", "replay…");
        replay.type = "button";
        replay.title = "Replay this model call on a served agent's model";
        replay.addEventListener("click", () => {
          document.dispatchEvent(new CustomEvent("trio-agents:replay", { detail: { runId: span.run_id, turn: span.turn } }));
        });
        meta.append(replay);
      }
      row.append(label, track, meta);
      chart.append(row);
    }
    panel.replaceChildren(head, chart);
    return root != null && TERMINAL.has(root.status);
  }

  function close() {
    if (!shown) return;
    clearTimeout(shown.timer);
    shown.panel.remove();
    shown = null;
  }

  async function refresh(me) {
    if (shown !== me) return;
    let done = false;
    try {
      done = render(me.panel, await load(me.runId));
    } catch (err) {
      me.panel.replaceChildren(el("p", "error", "Timeline: " + err.message));
    }
    if (shown === me && !done) me.timer = setTimeout(() => refresh(me), REFRESH_MS);
  }

  function open(runId, head) {
    close();
    const panel = el("section", "card timeline");
    panel.append(el("p", "muted", "Loading the timeline…"));
    head.after(panel);
    shown = { runId, panel, timer: 0 };
    refresh(shown);
  }

  // ui.js rebuilds the run view when a run is opened: give each new head its button.
  function attach() {
    if (shown && !document.body.contains(shown.panel)) close(); // another run was opened
    const head = document.querySelector("#run-view .run-head");
    if (!head || head.querySelector(".timeline-toggle")) return;
    const runId = head.querySelector(".mono") && head.querySelector(".mono").textContent;
    if (!runId) return;
    const toggle = el("button", "secondary timeline-toggle", "Timeline");
    toggle.type = "button";
    toggle.addEventListener("click", () => {
      if (shown && shown.runId === runId) close();
      else open(runId, head);
    });
    head.append(toggle);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const view = document.getElementById("run-view");
    if (!view) return;
    new MutationObserver(attach).observe(view, { childList: true });
    attach();
  });
})();
