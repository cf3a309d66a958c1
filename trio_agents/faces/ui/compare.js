// trio_agents web UI: compare two runs' conversations side by side, and replay a run's
// recorded model calls against a served agent's model (DESIGN §23).
//
// Self-contained beside ui.js, like timeline.js: it adds two buttons to the run view's
// head. Both read only what the REST face serves: GET /runs (the runs to compare with),
// GET /runs/{id} and GET /runs/{id}/events (a run's conversation: its run.item events,
// and with record_requests its model.request events), GET /agents (the models a replay
// may use: the served agents', by name), and POST /runs/{id}/replay. The token comes from
// this tab's sessionStorage and travels in the Authorization header only. The timeline's
// "replay…" button on a model call (timeline.js) opens the Model calls panel at it.
"use strict";

(() => {
  const TOKEN_KEY = "trio-agents.token";
  const TERMINAL = new Set(["completed", "failed", "cancelled"]);
  const BASE = location.pathname.replace(/\/ui(\/.*)?$/, "");

  let shown = null; // { kind, runId, panel, abort } while a panel is open

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function headers(extra) {
    return Object.assign({ Authorization: "Bearer " + sessionStorage.getItem(TOKEN_KEY) }, extra || {});
  }

  async function api(method, path, body, signal) {
    const init = { method, headers: headers(), cache: "no-store", credentials: "omit", signal };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(BASE + path, init);
    const data = await resp.json().catch(() => null);
    if (!resp.ok) {
      const error = data && data.error;
      throw new Error((error && error.message) || "HTTP " + resp.status);
    }
    return data;
  }

  const runPath = (id) => "/runs/" + encodeURIComponent(id);

  // A run's events as GET /runs/{id}/events serves them, up to its latest event when
  // asked (a live run's stream does not end: the read stops there, a snapshot).
  async function events(runId, signal) {
    const info = (await api("GET", runPath(runId), undefined, signal)).run;
    const controller = new AbortController();
    const stop = () => controller.abort();
    signal.addEventListener("abort", stop);
    const got = [];
    try {
      const resp = await fetch(BASE + runPath(runId) + "/events", {
        headers: headers(), cache: "no-store", credentials: "omit", signal: controller.signal,
      });
      if (!resp.ok) throw new Error("events: HTTP " + resp.status);
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let data = [];
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let nl;
        while ((nl = buffer.indexOf("\n")) >= 0) {
          let line = buffer.slice(0, nl);
          buffer = buffer.slice(nl + 1);
          if (line.endsWith("\r")) line = line.slice(0, -1);
          if (line === "") {
            if (data.length) got.push(JSON.parse(data.join("\n")).event);
            data = [];
          } else if (line.startsWith("data:")) {
            data.push(line.slice(line[5] === " " ? 6 : 5));
          }
        }
        const last = got.length ? got[got.length - 1] : null;
        if (last && (last.seq >= info.seq || (last.type === "run.updated" && TERMINAL.has(last.status)))) break;
      }
    } finally {
      signal.removeEventListener("abort", stop);
      controller.abort(); // a live run's stream: let it go
    }
    return { info, events: got };
  }

  // A run's conversation: its run.item events' items, in order. With record_requests the
  // run's first recorded request shows what came before them (its session's history, as
  // the model was sent it): those items first, marked as history, then the run's items
  // after that request (its input is in both: taken once).
  function conversation(evs) {
    const first = evs.find((e) => e.type === "model.request" && e.request);
    const items = [];
    if (first) {
      const inRequest = first.request.items.length;
      const before = evs.filter((e) => e.type === "run.item" && e.seq < first.seq).length;
      first.request.items.forEach((item, i) => items.push({ item, history: i < inRequest - before }));
    }
    for (const e of evs) {
      if (e.type === "run.item" && (!first || e.seq > first.seq)) items.push({ item: e.item, history: false });
    }
    return items;
  }

  const plural = (n, word) => n + " " + word + (n === 1 ? "" : "s");

  function content(value) {
    return typeof value === "string" ? value : JSON.stringify(value);
  }

  function itemText(item) {
    if (item.type === "message") return [item.role, content(item.content)];
    if (item.type === "function_call") return ["tool call", item.name + "(" + item.arguments + ")"];
    if (item.type === "function_call_output") {
      return ["tool result", content(item.output) + (item.status && item.status !== "ok" ? " (" + item.status + ")" : "")];
    }
    return [item.type || "item", JSON.stringify(item)];
  }

  // Two items are the same when they say the same thing: call ids differ from run to run
  // (and the ids the server gives items), so they are left out of the comparison.
  function key(item) {
    const skip = new Set(["call_id", "id"]);
    const norm = (v) => {
      if (Array.isArray(v)) return v.map(norm);
      if (v && typeof v === "object") {
        const out = {};
        for (const k of Object.keys(v).sort()) if (!skip.has(k)) out[k] = norm(v[k]);
        return out;
      }
      return v;
    };
    return JSON.stringify(norm(item));
  }

  function cell(entry) {
    const td = el("td", "diff-cell");
    if (!entry) {
      td.classList.add("missing");
      return td;
    }
    const [kind, text] = itemText(entry.item);
    td.dataset.kind = kind;
    if (entry.history) td.classList.add("history");
    td.append(el("span", "diff-kind", entry.history ? kind + " · history" : kind), el("div", "diff-text", text));
    return td;
  }

  function runLabel(info) {
    return (info.agent || "?") + " · " + info.status + " · " + info.run_id + (info.session_id ? " · session " + info.session_id : "");
  }

  function renderDiff(box, left, right) {
    const a = conversation(left.events);
    const b = conversation(right.events);
    let same = 0;
    while (same < a.length && same < b.length && key(a[same].item) === key(b[same].item)) same += 1;
    const identical = same === a.length && same === b.length;
    const summary = identical
      ? "The same " + plural(a.length, "item") + "."
      : "The same for the first " + plural(same, "item") + "; they differ from item " + (same + 1) + " on.";
    const table = el("table", "diff");
    const head = el("tr");
    head.append(el("th", "diff-run", runLabel(left.info)), el("th", "diff-run", runLabel(right.info)));
    const thead = el("thead");
    thead.append(head);
    table.append(thead);
    const body = el("tbody");
    for (let i = 0; i < Math.max(a.length, b.length); i += 1) {
      const row = el("tr", "diff-row " + (i < same ? "same" : "differs"));
      if (i === same) row.classList.add("first-difference");
      row.dataset.index = String(i + 1);
      row.append(cell(a[i]), cell(b[i]));
      body.append(row);
    }
    table.append(body);
    box.replaceChildren(el("p", "diff-summary", summary), table);
  }

  async function openCompare(runId, panel, signal) {
    const title = el("strong", null, "Compare with");
    const other = el("select", "compare-other");
    const go = el("button", "compare-go", "Compare");
    go.type = "button";
    const result = el("div", "compare-result");
    const bar = el("div", "compare-bar");
    bar.append(title, other, go);
    panel.replaceChildren(bar, result);
    const runs = (await api("GET", "/runs", undefined, signal)).runs || [];
    for (const run of runs) {
      if (run.run_id !== runId) other.append(new Option(runLabel(run), run.run_id));
    }
    if (!other.options.length) {
      result.replaceChildren(el("p", "muted", "No other run to compare with."));
      go.disabled = true;
      return;
    }
    go.addEventListener("click", async () => {
      go.disabled = true;
      result.replaceChildren(el("p", "muted", "Reading both conversations…"));
      try {
        const [left, right] = await Promise.all([events(runId, signal), events(other.value, signal)]);
        renderDiff(result, left, right);
      } catch (err) {
        if (!signal.aborted) result.replaceChildren(el("p", "error", "Compare: " + err.message));
      } finally {
        go.disabled = false;
      }
    });
  }

  // ------------------------------------------------------------------ model calls

  function usageText(usage) {
    if (!usage) return "";
    const tokens = (usage.input_tokens || 0) + (usage.output_tokens || 0);
    return tokens + " tokens" + (usage.cost != null ? " · $" + usage.cost : "");
  }

  function answerBox(cls, title, text, calls, usage) {
    const box = el("div", "call-answer " + cls);
    box.append(el("div", "call-answer-title muted", title));
    if (text) box.append(el("div", "call-text", text));
    for (const call of calls) box.append(el("div", "call-tool mono", "tool call " + call.name + "(" + call.arguments + ")"));
    if (!text && !calls.length) box.append(el("div", "muted", "(nothing)"));
    if (usage) box.append(el("div", "muted call-usage", usageText(usage)));
    return box;
  }

  // What the model answered to one request: the assistant messages and tool calls the
  // run added at that turn (the first of them carries the request's usage).
  function original(evs, request) {
    const items = evs.filter((e) => e.type === "run.item" && e.turn === request.turn && e.seq > request.seq);
    const said = items.filter((e) => e.item.type === "message" && e.item.role === "assistant");
    const calls = items.filter((e) => e.item.type === "function_call").map((e) => e.item);
    const usage = items.map((e) => e.usage).find((u) => u) || null;
    return answerBox("call-original", "answered (" + request.model + ")", said.map((e) => content(e.item.content)).join(""), calls, usage);
  }

  async function openCalls(runId, panel, signal) {
    panel.replaceChildren(el("p", "muted", "Reading the run's model calls…"));
    const [{ info, events: evs }, agents] = await Promise.all([
      events(runId, signal),
      api("GET", "/agents", undefined, signal).then((d) => d.agents || []),
    ]);
    const requests = evs.filter((e) => e.type === "model.request");
    const head = el("div", "calls-head");
    head.append(el("strong", null, "Model calls"), el("span", "mono muted calls-run", runId), el("span", "muted", requests.length + " recorded"));
    if (!requests.length) {
      panel.replaceChildren(head, el("p", "muted calls-none", "No recorded model call: a run records its requests with the run option record_requests=True."));
      return;
    }
    const list = el("div", "calls");
    for (const request of requests) {
      const row = el("div", "call-row");
      row.dataset.seq = String(request.seq);
      row.dataset.turn = String(request.turn);
      const line = el("div", "call-line");
      line.append(
        el("span", "call-turn", "turn " + request.turn),
        el("span", "mono muted", request.model),
        el("span", "muted", request.size + " bytes · " + (request.request ? plural(request.request.items.length, "item") : "not recorded: " + request.omitted)),
      );
      const answers = el("div", "call-answers");
      answers.append(original(evs, request));
      if (request.request) {
        const agent = el("select", "call-agent");
        // The run's own agent first chosen (does its answer reproduce?), when served.
        for (const a of agents) agent.append(new Option(a.name, a.name, false, a.name === info.agent));
        const go = el("button", "secondary call-replay", "Replay");
        go.type = "button";
        go.title = "Send this request again to the chosen agent's model";
        const replayed = el("div", "call-replayed");
        go.addEventListener("click", async () => {
          go.disabled = true;
          replayed.replaceChildren(el("div", "muted", "Replaying on " + agent.value + "…"));
          try {
            const data = await api("POST", runPath(runId) + "/replay", { seq: request.seq, agent: agent.value }, signal);
            const r = data.response;
            replayed.replaceChildren(answerBox("call-replay-answer", "replayed on " + data.agent + " (" + data.model + ")", r.text, r.tool_calls, r.usage));
          } catch (err) {
            if (!signal.aborted) replayed.replaceChildren(el("div", "error", "Replay: " + err.message));
          } finally {
            go.disabled = false;
          }
        });
        line.append(el("span", "spacer"), el("span", "muted", "on"), agent, go);
        answers.append(replayed);
      }
      row.append(line, answers);
      list.append(row);
    }
    panel.replaceChildren(head, list);
  }

  // ------------------------------------------------------------------ the panels

  function close() {
    if (!shown) return;
    shown.abort.abort();
    shown.panel.remove();
    shown = null;
  }

  function open(kind, runId, head) {
    close();
    const panel = el("section", "card " + (kind === "compare" ? "compare" : "model-calls"));
    head.after(panel);
    const abort = new AbortController();
    shown = { kind, runId, panel, abort, ready: null };
    const opened = kind === "compare" ? openCompare : openCalls;
    shown.ready = opened(runId, panel, abort.signal).catch((err) => {
      if (!abort.signal.aborted) panel.replaceChildren(el("p", "error", err.message));
    });
  }

  // The timeline's "replay…" on a model call (timeline.js): the Model calls panel, at
  // that call's row (marked, scrolled to).
  async function replayFromTimeline(event) {
    const { runId, turn } = event.detail || {};
    const head = document.querySelector("#run-view .run-head");
    if (!head || !runId) return;
    if (!shown || shown.kind !== "calls" || shown.runId !== runId) open("calls", runId, head);
    const me = shown;
    await me.ready;
    if (shown !== me) return;
    for (const row of me.panel.querySelectorAll(".call-row")) {
      const mine = row.dataset.turn === String(turn);
      row.classList.toggle("picked", mine);
      if (mine) row.scrollIntoView({ block: "nearest" });
    }
  }

  function toggle(kind, label, runId, head) {
    const b = el("button", "secondary " + kind + "-toggle", label);
    b.type = "button";
    b.addEventListener("click", () => {
      if (shown && shown.kind === kind && shown.runId === runId) close();
      else open(kind, runId, head);
    });
    return b;
  }

  // ui.js rebuilds the run view when a run is opened: give each new head its buttons.
  function attach() {
    if (shown && !document.body.contains(shown.panel)) close(); // another run was opened
    const head = document.querySelector("#run-view .run-head");
    if (!head || head.querySelector(".compare-toggle")) return;
    const runId = head.querySelector(".mono") && head.querySelector(".mono").textContent;
    if (!runId) return;
    head.append(toggle("compare", "Compare…", runId, head), toggle("calls", "Model calls", runId, head));
  }

  document.addEventListener("DOMContentLoaded", () => {
    const view = document.getElementById("run-view");
    if (!view) return;
    new MutationObserver(attach).observe(view, { childList: true });
    document.addEventListener("trio-agents:replay", replayFromTimeline);
    attach();
  });
})();
