// trio_agents web UI: plain JavaScript, no build step, nothing fetched from another host.
//
// It is a client of the HTTP face only (DESIGN §19): GET/POST /runs..., GET /agents, and
// GET /runs/{id}/events?tree=1 as Server-Sent Events. EventSource cannot send an
// Authorization header, so the events are read with fetch() and a small SSE parser over
// the response's ReadableStream; the id of the last event received is sent back as
// Last-Event-ID when the stream is opened again (a dropped connection, a reload), so the
// server resumes right after it: no gap, no duplicate.
//
// The bearer token lives in this tab's sessionStorage only (so a reload keeps you signed
// in), never in a URL, a cookie, localStorage or a log line.
"use strict";

(() => {
  const TOKEN_KEY = "trio-agents.token";
  const VIEW_KEY = "trio-agents.view"; // the selected run's view, for a reload
  const TERMINAL = new Set(["completed", "failed", "cancelled"]);
  // a tool result's status, in the colours of the run statuses
  const TOOL_STATUS = { running: "running", ok: "completed", error: "failed", cancelled: "cancelled" };
  const LIST_EVERY_MS = 1500;
  const RETRY_MS = [250, 500, 1000, 2000, 4000];
  // The page is served at <prefix>/ui/; the API lives at <prefix>/.
  const BASE = location.pathname.replace(/\/ui(\/.*)?$/, "");

  let token = sessionStorage.getItem(TOKEN_KEY);
  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ HTTP helpers

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  function errorOf(status, data) {
    const body = data && (data.error && typeof data.error === "object" ? data.error : data);
    const code = (body && body.code) || (status === 401 ? "unauthorized" : "http_" + status);
    const message = (body && (body.message || body.detail)) || "HTTP " + status;
    return new ApiError(status, code, message);
  }

  function authHeaders(extra) {
    return Object.assign({ Authorization: "Bearer " + token }, extra || {});
  }

  async function api(method, path, body) {
    const init = { method, headers: authHeaders(), cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(BASE + path, init);
    const text = await resp.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (_) {
        data = { message: text };
      }
    }
    if (resp.status === 401) {
      signOut("The server refused the token.");
      throw errorOf(401, data);
    }
    if (!resp.ok) throw errorOf(resp.status, data);
    return data;
  }

  const runPath = (id) => "/runs/" + encodeURIComponent(id);
  const unwrapRun = (data) => (data && data.run) || data;
  const unwrapRuns = (data) => (Array.isArray(data) ? data : (data && data.runs) || []);

  // ------------------------------------------------------------------ SSE over fetch

  // Read one SSE response: calls onEvent(id, type, data) per event; returns when the
  // server ends the stream. Follows the WHATWG parsing rules (fields, comments, CRLF).
  async function readSSE(resp, onEvent) {
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let data = [];
    let type = "";
    let id = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let start = 0;
      for (;;) {
        const nl = buffer.indexOf("\n", start);
        if (nl < 0) break;
        let line = buffer.slice(start, nl);
        start = nl + 1;
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (data.length) onEvent(id, type || "message", data.join("\n"));
          data = [];
          type = "";
          id = null;
          continue;
        }
        if (line[0] === ":") continue; // a comment: keep-alive
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? "" : line.slice(colon + 1);
        if (val[0] === " ") val = val.slice(1);
        if (field === "data") data.push(val);
        else if (field === "event") type = val;
        else if (field === "id" && !val.includes("\0")) id = val;
      }
      buffer = buffer.slice(start);
    }
  }

  // ------------------------------------------------------------------ the run view's model

  // One run tree: every node's state, the SSE id to re-attach from, and counters that
  // prove the stream had no gap and no duplicate (per run, seqs must go 1, 2, 3, ...).
  function emptyView(root) {
    return {
      root,
      nodes: {},
      lastId: null,
      seqs: {},
      stats: { events: 0, duplicates: 0, gaps: 0, dropped: 0, attaches: 0 },
      done: false,
    };
  }

  function newNode(id) {
    return {
      id,
      parent: null,
      callId: null,
      agent: "",
      status: "queued",
      reason: null,
      turn: 0,
      entries: [], // transcript: user / assistant / tool / note entries, in order
      tools: {}, // call id -> index into entries
      injections: {}, // injection id -> {delivered}
      pending: [], // call ids waiting for approval (its own)
      waiting: [], // calls waiting below it
      questions: [], // what its running calls ask (detail.questions): {id, call_id, name, message, data, schema}
      limits: null,
      throttled: null, // why its request waits (detail.throttled of its running update), or null
      usage: null, // its own tokens and cost, from its record (GET /runs/{id}) once terminal
      usageKnown: false,
      children: [],
      streaming: -1, // index of the assistant entry being streamed (-1: none)
    };
  }

  let view = null;
  const dom = {}; // run id -> its DOM parts (rebuilt from the model after a reload)
  const dirty = new Set();
  let renderQueued = false;

  function node(id) {
    let n = view.nodes[id];
    if (!n) {
      n = view.nodes[id] = newNode(id);
      dirty.add(id);
    }
    return n;
  }

  function pushEntry(n, entry) {
    entry.v = 1; // a version: bumped on each change, compared with what is on screen
    n.entries.push(entry);
    return n.entries.length - 1;
  }

  function touch(n, index) {
    n.entries[index].v += 1;
    dirty.add(n.id);
  }

  function toolEntry(n, callId, name, args) {
    let index = n.tools[callId];
    if (index === undefined) {
      index = n.tools[callId] = pushEntry(n, {
        kind: "tool",
        callId,
        name: name || "",
        args: args || "",
        progress: "",
        status: "",
        output: null,
      });
    }
    const t = n.entries[index];
    if (name && !t.name) t.name = name;
    if (args && !t.args) t.args = args;
    return index;
  }

  // Apply one event of the tree stream to the model. ``run_id`` and ``seq`` come with
  // every event (a tree stream carries each descendant's, each with its own seqs).
  function apply(ev) {
    const id = ev.run_id;
    const n = node(id);
    const seq = ev.seq;
    // events.dropped has no place in the run's seqs (a tree stream's has seq 0)
    if (typeof seq === "number" && ev.type !== "events.dropped") {
      const last = view.seqs[id] || 0;
      if (seq <= last) {
        view.stats.duplicates += 1; // never applied twice; counted, so a test can see it
        return;
      }
      if (seq !== last + 1 && !view.afterDrop) view.stats.gaps += 1;
      view.afterDrop = false;
      view.seqs[id] = seq;
    }
    view.stats.events += 1;
    dirty.add(id);
    switch (ev.type) {
      case "run.updated": {
        n.status = ev.status;
        n.reason = ev.reason || null;
        n.turn = ev.turn || n.turn;
        const detail = ev.detail || {};
        const before = [...n.pending, ...n.questions.map((q) => q.call_id)];
        n.pending = ev.status === "awaiting_approval" ? detail.pending || [] : [];
        n.questions = ev.status === "awaiting_approval" ? detail.questions || [] : [];
        // A question's id is its own; the call that asks it shows "awaiting approval" too.
        for (const callId of [...before, ...n.pending, ...n.questions.map((q) => q.call_id)]) {
          if (n.tools[callId] !== undefined) touch(n, n.tools[callId]); // "awaiting approval" on it
        }
        n.waiting = ev.status === "awaiting_approval" ? detail.waiting || [] : [];
        if (detail.limits) n.limits = detail.limits;
        // Set by a running update whose request waits (a rate limit); the next update
        // without it (the request went out, or any other status) clears it.
        const throttled = ev.status === "running" ? detail.throttled : undefined;
        n.throttled = throttled == null || throttled === false ? null : String(throttled === true ? "" : throttled);
        if (TERMINAL.has(ev.status) && n.streaming >= 0) {
          n.entries[n.streaming].streaming = false;
          touch(n, n.streaming);
          n.streaming = -1;
        }
        if (TERMINAL.has(ev.status)) fetchUsage(id);
        if (id === view.root) {
          rowStatus(id, ev.status);
          if (TERMINAL.has(ev.status)) view.done = true;
        }
        break;
      }
      case "response.text.delta": {
        if (n.streaming < 0 || n.entries[n.streaming].turn !== ev.turn) {
          if (n.streaming >= 0) n.entries[n.streaming].streaming = false;
          n.streaming = pushEntry(n, { kind: "assistant", text: "", turn: ev.turn, streaming: true, rewrites: 0 });
        }
        n.entries[n.streaming].text += ev.text;
        touch(n, n.streaming);
        break;
      }
      case "run.item": {
        const item = ev.item || {};
        if (item.type === "message" && item.role === "assistant") {
          const text = typeof item.content === "string" ? item.content : JSON.stringify(item.content);
          if (n.streaming >= 0) {
            const e = n.entries[n.streaming];
            if (e.text !== text) {
              e.text = text; // not what streamed (cut short, say): shown anew
              e.rewrites = (e.rewrites || 0) + 1;
            }
            e.streaming = false;
            e.incomplete = item.status === "incomplete";
            e.seq = ev.seq;
            touch(n, n.streaming);
            n.streaming = -1;
          } else {
            pushEntry(n, { kind: "assistant", text, turn: ev.turn, incomplete: item.status === "incomplete", seq: ev.seq });
          }
        } else if (item.type === "message") {
          const text = typeof item.content === "string" ? item.content : JSON.stringify(item.content);
          pushEntry(n, { kind: "user", text, seq: ev.seq });
        } else if (item.type === "function_call") {
          if (n.streaming >= 0) {
            n.entries[n.streaming].streaming = false;
            touch(n, n.streaming);
            n.streaming = -1;
          }
          toolEntry(n, item.call_id, item.name, item.arguments);
        } else if (item.type === "function_call_output") {
          const index = toolEntry(n, item.call_id);
          const t = n.entries[index];
          t.status = item.status || t.status || "ok";
          if (t.output === null) t.output = item.output;
          t.seq = ev.seq; // the item a fork "from here" keeps last: the call's result
          touch(n, index);
        }
        break;
      }
      case "tool.started": {
        const index = toolEntry(n, ev.call_id, ev.name, ev.arguments);
        n.entries[index].status = "running";
        touch(n, index);
        break;
      }
      case "tool.progress": {
        const index = toolEntry(n, ev.call_id, ev.name);
        n.entries[index].progress = ev.message;
        touch(n, index);
        break;
      }
      case "tool.finished": {
        const index = toolEntry(n, ev.call_id, ev.name);
        n.entries[index].status = ev.status;
        n.entries[index].output = ev.output;
        touch(n, index);
        break;
      }
      case "inbox.injected": {
        const items = (ev.items || []).map((i) => (typeof i.content === "string" ? i.content : i.type)).join(" | ");
        n.injections[ev.injection_id] = pushEntry(n, {
          kind: "note",
          text: "injected (" + ev.when + "): " + items,
          injection: ev.injection_id,
          delivered: false,
        });
        break;
      }
      case "inbox.delivered": {
        const index = n.injections[ev.injection_id];
        if (index !== undefined) {
          n.entries[index].delivered = true;
          touch(n, index);
        }
        break;
      }
      case "run.child": {
        const child = node(ev.child_id);
        if (!child.parent) {
          child.parent = id;
          child.callId = ev.call_id;
          n.children.push(ev.child_id);
        }
        child.agent = child.agent || ev.agent;
        if (child.status === "queued" || TERMINAL.has(ev.status)) child.status = ev.status;
        dirty.add(ev.child_id);
        const index = n.tools[ev.call_id];
        if (index !== undefined) touch(n, index);
        break;
      }
      case "run.handoff": {
        n.agent = ev.to_agent;
        pushEntry(n, { kind: "note", text: "handoff: " + ev.from_agent + " → " + ev.to_agent, handoff: true });
        break;
      }
      case "events.dropped": {
        // what retention lost is said, never counted as a gap
        view.stats.dropped += 1;
        view.afterDrop = true;
        pushEntry(n, { kind: "note", text: (ev.count ? ev.count + " events" : "events") + " lost (retention)" });
        break;
      }
      default:
        break;
    }
    scheduleRender();
  }

  // ------------------------------------------------------------------ following a run

  let follow = null; // {root, abort, promise}

  function setConn(state, text) {
    const el = $("conn");
    el.className = "conn " + state;
    el.textContent = text || state;
  }

  async function followRun(root) {
    const controller = new AbortController();
    const me = { root, controller };
    follow = me;
    let failures = 0;
    while (follow === me && !view.done) {
      const headers = authHeaders({ Accept: "text/event-stream" });
      // Where to resume: the id of the last event received (a reload restores it).
      if (view.lastId !== null) headers["Last-Event-ID"] = view.lastId;
      try {
        const resp = await fetch(BASE + runPath(root) + "/events?tree=1", {
          headers,
          cache: "no-store",
          credentials: "omit",
          signal: controller.signal,
        });
        if (resp.status === 401) {
          signOut("The server refused the token.");
          return;
        }
        if (!resp.ok) {
          const text = await resp.text();
          let data = null;
          try {
            data = JSON.parse(text);
          } catch (_) {
            data = null;
          }
          const err = errorOf(resp.status, data);
          if (resp.status === 404) {
            // unknown, or another principal's: the same answer, and nothing shown
            $("run-view").querySelector(".tree").textContent = "";
            sessionStorage.removeItem(VIEW_KEY);
            showRunError(err.message);
            setConn("idle", "not found");
            return;
          }
          throw err;
        }
        view.stats.attaches += 1;
        failures = 0;
        setConn("live", "live");
        await readSSE(resp, (id, type, data) => {
          if (follow !== me) return;
          let payload;
          try {
            payload = JSON.parse(data);
          } catch (_) {
            return;
          }
          const ev = payload && payload.event && typeof payload.event === "object"
            ? Object.assign({ run_id: payload.run_id, seq: payload.seq }, payload.event)
            : payload;
          if (ev.type === undefined && type !== "message") ev.type = type;
          apply(ev);
          if (id !== null) view.lastId = id;
        });
      } catch (err) {
        if (controller.signal.aborted || follow !== me) return;
        failures += 1;
      }
      if (follow !== me || view.done) break;
      // The stream ended before the root's terminal update: re-attach from lastId.
      setConn("retrying", "reconnecting…");
      await new Promise((r) => setTimeout(r, RETRY_MS[Math.min(failures, RETRY_MS.length - 1)]));
    }
    if (follow === me) {
      setConn("idle", view.done ? "finished" : "idle");
      saveView();
    }
  }

  function stopFollowing() {
    if (follow) {
      follow.controller.abort();
      follow = null;
    }
  }

  // ------------------------------------------------------------------ keeping the view over a reload

  function saveView() {
    if (!view) return;
    const copy = Object.assign({}, view);
    try {
      sessionStorage.setItem(VIEW_KEY, JSON.stringify(copy));
    } catch (_) {
      // Too big for the tab's storage: forget it; a reload then replays from seq 1.
      sessionStorage.removeItem(VIEW_KEY);
    }
  }

  function loadView(root) {
    const text = sessionStorage.getItem(VIEW_KEY);
    if (!text) return null;
    try {
      const saved = JSON.parse(text);
      return saved && saved.root === root ? saved : null;
    } catch (_) {
      return null;
    }
  }

  // ------------------------------------------------------------------ tokens and cost

  // A terminal node's usage is in its record, not in the event stream: read once, then
  // kept in the view (a reload does not ask again).
  function fetchUsage(id) {
    const n = view.nodes[id];
    if (!n || n.usageKnown || n.usageAsked) return;
    n.usageAsked = true;
    const root = view.root;
    api("GET", runPath(id)).then((data) => {
      const info = unwrapRun(data);
      if (!view || view.root !== root || !view.nodes[id] || !info) return;
      n.usage = info.usage || null;
      n.usageKnown = true;
      dirty.add(id);
      dirty.add(root); // the tree's total
      scheduleRender();
    }, () => {
      n.usageAsked = false; // asked again at the next terminal update or open
    });
  }

  // Costs are decimal strings ("0.000123", "1E-7"): summed exactly, as BigInt digits
  // and a scale, never as floats (0.1 + 0.2 is not what a bill says).
  function parseDecimal(text) {
    const m = /^(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d{1,3}))?$/.exec(String(text));
    if (!m || m[1] + (m[2] || "") === "") return null;
    const fraction = m[2] || "";
    let scale = fraction.length - Number(m[3] || 0);
    let digits = BigInt((m[1] || "0") + fraction);
    if (scale < 0) {
      digits *= 10n ** BigInt(-scale);
      scale = 0;
    }
    return { digits, scale };
  }

  function addDecimals(a, b) {
    const scale = Math.max(a.scale, b.scale);
    const up = (d) => d.digits * 10n ** BigInt(scale - d.scale);
    return { digits: up(a) + up(b), scale };
  }

  function formatDecimal(d) {
    const text = d.digits.toString();
    if (d.scale === 0) return text;
    const padded = text.padStart(d.scale + 1, "0");
    const cut = padded.length - d.scale;
    return (padded.slice(0, cut) + "." + padded.slice(cut)).replace(/0+$/, "").replace(/\.$/, "");
  }

  function usageText(tokens, cost) {
    return tokens + " tokens" + (cost ? " · $" + formatDecimal(cost) : "");
  }

  // The whole tree's usage: the sum over its nodes, once every node's is known.
  function treeUsage() {
    let tokens = 0;
    let cost = null;
    for (const n of Object.values(view.nodes)) {
      if (!n.usageKnown) return null;
      if (!n.usage) continue;
      tokens += (n.usage.input_tokens || 0) + (n.usage.output_tokens || 0);
      const c = n.usage.cost == null ? null : parseDecimal(n.usage.cost);
      if (c) cost = cost ? addDecimals(cost, c) : c;
    }
    return usageText(tokens, cost);
  }

  // ------------------------------------------------------------------ rendering the tree

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function button(text, cls, onClick) {
    const b = el("button", cls, text);
    b.type = "button";
    b.addEventListener("click", onClick);
    return b;
  }

  function showRunError(message) {
    const box = $("run-view").querySelector(".run-error");
    if (box) box.textContent = message;
  }

  async function act(id, verb, body, errorBox) {
    errorBox.textContent = "";
    try {
      await api("POST", runPath(id) + "/" + verb, body);
      return true;
    } catch (err) {
      errorBox.textContent = verb + ": " + err.message;
      return false;
    }
  }

  // A form for a question's JSON schema: one field per property of an object schema
  // (strings, numbers, integers, booleans; an enum as a select), prefilled with each
  // property's default. Returns {element, content()} (content: the values set, typed;
  // an empty field is left out, so the server's check names a required one), or null
  // when the schema has no properties to fill in.
  function questionForm(schema) {
    const properties = schema && typeof schema === "object" ? schema.properties : null;
    if (!properties || typeof properties !== "object" || !Object.keys(properties).length) return null;
    const required = Array.isArray(schema.required) ? schema.required : [];
    const element = el("div", "question-form");
    const readers = [];
    for (const [key, spec0] of Object.entries(properties)) {
      const spec = spec0 && typeof spec0 === "object" ? spec0 : {};
      const label = el("label", "field");
      label.dataset.field = key;
      label.append(el("span", "field-name", (spec.title || key) + (required.includes(key) ? " *" : "")));
      let input;
      let read;
      if (Array.isArray(spec.enum)) {
        input = el("select");
        input.append(el("option", null, ""));
        spec.enum.forEach((value, i) => {
          const option = el("option", null, String(value));
          option.value = String(i);
          if (spec.default !== undefined && value === spec.default) option.selected = true;
          input.append(option);
        });
        read = () => (input.value === "" ? undefined : spec.enum[Number(input.value)]);
      } else if (spec.type === "boolean") {
        input = el("input");
        input.type = "checkbox";
        input.checked = spec.default === true;
        read = () => input.checked;
      } else if (spec.type === "number" || spec.type === "integer") {
        input = el("input");
        input.type = "number";
        if (spec.type === "integer") input.step = "1";
        if (typeof spec.default === "number") input.value = String(spec.default);
        read = () => (input.value === "" ? undefined : Number(input.value));
      } else {
        input = el("input");
        input.type = "text";
        if (typeof spec.default === "string") input.value = spec.default;
        read = () => (input.value === "" ? undefined : input.value);
      }
      input.name = key;
      if (spec.description) input.title = spec.description;
      label.append(input);
      element.append(label);
      readers.push([key, read]);
    }
    const content = () => {
      const values = {};
      for (const [key, read] of readers) {
        const value = read();
        if (value !== undefined) values[key] = value;
      }
      return values;
    };
    return { element, content };
  }

  function buildNode(n) {
    const root = el("div", "node");
    root.dataset.run = n.id;
    const head = el("div", "node-head");
    const badge = el("span", "status");
    const agent = el("span", "agent");
    const rid = el("span", "mono muted", n.id);
    const turn = el("span", "muted turn");
    const session = el("span", "muted session");
    const reason = el("span", "reason");
    const throttled = el("span", "throttled");
    const usage = el("span", "muted usage");
    const total = el("span", "tree-usage");
    const actions = el("span", "actions");
    const errorBox = el("div", "error action-error");

    // Cancel (with a reason), inject (with when): small panels opened by their button.
    const cancelPanel = el("div", "panel cancel-panel");
    cancelPanel.hidden = true;
    const cancelReason = el("input", "cancel-reason");
    cancelReason.placeholder = "reason (shown on the run)";
    const cancelGo = button("Cancel run", "danger cancel-confirm", async () => {
      cancelGo.disabled = true;
      const body = cancelReason.value ? { reason: cancelReason.value } : {};
      if (await act(n.id, "cancel", body, errorBox)) cancelPanel.hidden = true;
      cancelGo.disabled = false;
    });
    cancelPanel.append(cancelReason, cancelGo);

    const injectPanel = el("div", "panel inject-panel");
    injectPanel.hidden = true;
    const injectText = el("input", "inject-text");
    injectText.placeholder = "message to the agent";
    const injectWhen = el("select", "inject-when");
    for (const w of ["next_turn", "now", "when_idle"]) injectWhen.append(new Option(w, w));
    const injectGo = button("Send", "inject-send", async () => {
      if (!injectText.value) return;
      injectGo.disabled = true;
      const body = { items: [{ role: "user", content: injectText.value }], when: injectWhen.value };
      if (await act(n.id, "inject", body, errorBox)) {
        injectText.value = "";
        injectPanel.hidden = true;
      }
      injectGo.disabled = false;
    });
    injectPanel.append(injectText, injectWhen, injectGo);

    // Fork from here: a copy of the session up to an item (the run.item event's seq:
    // the server resolves it once the run has ended), then a run on the copy with new
    // input. Opened by the small button on an item of a root run that has a session.
    const forkPanel = el("div", "panel fork-panel");
    forkPanel.hidden = true;
    const forkWhere = el("div", "muted fork-where");
    const forkText = el("input", "fork-text");
    forkText.placeholder = "new message, from this point";
    const forkGo = button("Fork & run", "fork-run", async () => {
      const seq = Number(forkPanel.dataset.seq);
      if (!forkText.value || !n.session || !seq) return;
      forkGo.disabled = true;
      errorBox.textContent = "";
      try {
        await forkAndRun(n, seq, forkText.value);
        forkText.value = "";
      } catch (err) {
        errorBox.textContent = "fork: " + err.message;
      } finally {
        forkGo.disabled = false;
      }
    });
    forkPanel.append(forkWhere, forkText, forkGo);

    const cancelOpen = button("Cancel…", "danger cancel-open", () => {
      cancelPanel.hidden = !cancelPanel.hidden;
      if (!cancelPanel.hidden) cancelReason.focus();
    });
    const injectOpen = button("Inject…", "secondary inject-open", () => {
      injectPanel.hidden = !injectPanel.hidden;
      if (!injectPanel.hidden) injectText.focus();
    });
    actions.append(injectOpen, cancelOpen);
    head.append(badge, throttled, agent, rid, session, turn, reason, usage, total, el("span", "spacer"), actions);

    const budget = el("div", "budget");
    const approvals = el("div", "approvals");
    const transcript = el("div", "transcript");
    const children = el("div", "children");
    root.append(head, cancelPanel, injectPanel, forkPanel, errorBox, budget, approvals, transcript, children);
    return {
      root, badge, throttled, agent, session, turn, reason, usage, total, actions, cancelPanel, injectPanel,
      forkPanel, forkWhere, forkText,
      budget, approvals, transcript, children, errorBox,
      shown: [], // per entry: {el, v}
      approvalsKey: null, limitsKey: null, childCount: 0,
    };
  }

  function renderEntry(n, entry, d, errorBox) {
    if (entry.kind === "assistant") {
      const e = el("div", "msg assistant");
      e.textContent = entry.text;
      e.classList.toggle("streaming", !!entry.streaming);
      return e;
    }
    if (entry.kind === "user") return forkable(n, entry, el("div", "msg user", entry.text), entry.text);
    if (entry.kind === "note") {
      const e = el("div", "msg note" + (entry.handoff ? " handoff" : ""), entry.text);
      if (entry.injection) {
        e.dataset.injection = entry.injection;
        if (entry.delivered) e.append(" — delivered");
        else if (!TERMINAL.has(n.status)) {
          e.append(" ");
          e.append(button("withdraw", "secondary withdraw", () =>
            act(n.id, "withdraw", { injection_id: entry.injection }, errorBox)));
        }
      }
      return e;
    }
    // a tool call: name(arguments), progress, result
    const e = el("div", "tool " + (entry.status || ""));
    e.dataset.call = entry.callId;
    const line = el("div");
    line.append(el("span", "name", entry.name || "tool"), el("span", "args mono", "(" + entry.args + ")"));
    // Waiting: a call not started yet for its approval, or a running one for the
    // answer to a question it asks.
    const waiting =
      (!entry.status && n.pending.includes(entry.callId)) ||
      (entry.status === "running" && n.questions.some((q) => q.call_id === entry.callId));
    const shown = waiting ? "awaiting_approval" : TOOL_STATUS[entry.status] || "";
    line.append(" ", el("span", "status " + shown, waiting ? "awaiting approval" : entry.status || "called"));
    e.append(line);
    const child = Object.values(view.nodes).find((c) => c.parent === n.id && c.callId === entry.callId);
    if (child) e.append(el("div", "muted", "sub-agent " + (child.agent || "") + " (" + child.id + ")"));
    if (entry.progress && entry.output === null) e.append(el("div", "progress", entry.progress));
    if (entry.output !== null) e.append(el("div", "out mono", "→ " + entry.output));
    return entry.output !== null ? forkable(n, entry, e, (entry.name || "tool") + " → " + entry.output) : e;
  }

  // The "Fork from here" button of an item: on a root run with a session, once the
  // item's run.item event is known. Text-less (its label is drawn by the stylesheet),
  // so an item's text stays exactly its own.
  function forkable(n, entry, e, what) {
    if (!entry.seq || n.parent || !n.session || n.id !== view.root) return e;
    const open = button("", "secondary fork-open", () => {
      const d = dom[n.id];
      d.forkPanel.dataset.seq = String(entry.seq);
      d.forkWhere.textContent = "Fork after: " + what.slice(0, 80);
      d.forkPanel.hidden = false;
      d.forkText.focus();
    });
    open.title = "Fork from here";
    open.setAttribute("aria-label", "Fork from here");
    e.append(open);
    return e;
  }

  async function forkAndRun(n, seq, text) {
    const suffix = Math.random().toString(36).slice(2, 8);
    const forked = n.session + "-fork-" + suffix;
    await api("POST", "/sessions/" + encodeURIComponent(n.session) + "/fork", {
      new_session_id: forked,
      at: { run_id: n.id, seq },
    });
    const data = await api("POST", "/runs", { agent: n.startedAs || n.agent, input: text, session_id: forked });
    const id = (data && (data.run_id || (data.run && data.run.run_id))) || null;
    if (id) openRun(id);
    refreshRuns();
  }

  // A streaming text grows in one text node; once it passes SEAL_AT characters, all but
  // its last line (or word) moves into a block of its own that never changes again.
  // The browser then lays out only the short live part each frame, not the whole text
  // (a block that did not change keeps its layout); without this, layout per frame
  // grows with the text and a long fast stream slows the page down.
  const SEAL_AT = 4096;

  function seal(shown) {
    const live = shown.live;
    const text = live.data;
    let cut = text.lastIndexOf("\n");
    let skip = 1; // the newline itself: the block's end breaks the line already
    if (cut < 0) {
      cut = text.lastIndexOf(" ");
      skip = 0;
      if (cut < 0) cut = text.length - 1;
      cut += 1; // keep the space at the end of the sealed part
    }
    const block = el("span", "sealed", text.slice(0, cut));
    shown.el.insertBefore(block, live);
    live.deleteData(0, cut + (skip && text[cut] === "\n" ? 1 : 0));
    shown.sealed += cut + (skip && text[cut] === "\n" ? 1 : 0);
  }

  function renderNode(n) {
    let d = dom[n.id];
    if (!d) {
      d = dom[n.id] = buildNode(n);
      const parent = n.parent ? dom[n.parent] : null;
      if (parent) parent.children.append(d.root);
      else if (n.id === view.root) $("run-view").querySelector(".tree").append(d.root);
      else return; // a node whose parent is not known yet: placed once it is
    } else if (!d.root.isConnected && n.parent && dom[n.parent]) {
      dom[n.parent].children.append(d.root);
    }
    const terminal = TERMINAL.has(n.status);
    d.root.className = "node " + n.status;
    d.root.dataset.agent = n.agent || "";
    d.root.dataset.status = n.status;
    d.badge.className = "status " + n.status;
    d.badge.textContent = n.status;
    d.agent.textContent = n.agent || "";
    d.session.textContent = n.session ? "session " + n.session : "";
    d.turn.textContent = n.turn ? "turn " + n.turn : "";
    d.reason.textContent = n.reason ? n.reason : "";
    d.throttled.textContent = n.throttled === null ? "" : n.throttled ? "throttled: " + n.throttled : "throttled";
    if (n.throttled === null) delete d.root.dataset.throttled;
    else d.root.dataset.throttled = n.throttled;
    const u = n.usageKnown && n.usage ? n.usage : null;
    d.usage.textContent = u
      ? usageText(u.input_tokens + u.output_tokens, u.cost == null ? null : parseDecimal(u.cost)) +
        (u.model ? " · " + u.model : "") // the model that answered (a fallback's member), when one did
      : "";
    const total = n.id === view.root && terminal ? treeUsage() : null;
    d.total.textContent = total && view.nodes[n.id].children.length ? "tree: " + total : "";
    d.actions.hidden = terminal; // a finished run takes no cancel, inject or decision
    if (terminal) {
      d.cancelPanel.hidden = true;
      d.injectPanel.hidden = true;
    }

    const limitsKey = JSON.stringify(n.limits);
    if (limitsKey !== d.limitsKey) {
      d.limitsKey = limitsKey;
      d.budget.textContent = "";
      for (const [name, v] of Object.entries(n.limits || {})) {
        const part = el("span", "limit");
        part.dataset.limit = name;
        const bar = el("span", "bar" + (v.used > v.limit ? " over" : ""));
        const fill = el("span");
        fill.style.width = Math.min(100, (100 * v.used) / Math.max(v.limit, 1)) + "%";
        bar.append(fill);
        part.append(name + " ", bar, " " + Math.round(v.used) + " / " + v.limit);
        d.budget.append(part);
      }
    }

    // (Pending ids, questions' among them: a form being filled in survives other updates.)
    const approvalsKey = n.pending.join(",") + "|" + n.waiting.length;
    if (approvalsKey !== d.approvalsKey) {
      d.approvalsKey = approvalsKey;
      d.approvals.textContent = "";
      for (const callId of n.pending) {
        const index = n.tools[callId];
        const t = index === undefined ? null : n.entries[index];
        const question = n.questions.find((q) => q.id === callId);
        const box = el("div", question ? "approval question" : "approval");
        box.dataset.call = callId;
        let form = null;
        if (question) {
          // A question a running call asks (ctx.request_approval): what it asks, and
          // for one with a schema a form whose values are the approval's content.
          box.append(el("div", "muted", "Question from " + (question.name || "a tool") + ":"));
          box.append(el("div", "question-message", question.message));
          form = questionForm(question.schema);
          if (form) box.append(form.element);
        } else {
          box.append(el("div", null, "Waiting for approval: " + (t ? t.name + "(" + t.args + ")" : callId)));
        }
        const panel = el("div", "panel");
        const message = el("input", "reject-message");
        message.placeholder = "(optional) why rejected";
        panel.append(
          button("Approve", "approve", () => {
            const body = { call_id: callId };
            if (form) body.content = form.content();
            act(n.id, "approve", body, d.errorBox);
          }),
          button("Reject", "danger reject", () => {
            const body = { call_id: callId };
            if (message.value) body.message = message.value;
            act(n.id, "reject", body, d.errorBox);
          }),
          message,
        );
        box.append(panel);
        d.approvals.append(box);
      }
      if (n.waiting.length) {
        d.approvals.append(el("div", "muted waiting", n.waiting.length + " call(s) waiting for approval below"));
      }
    }

    // The transcript: new entries appended, changed ones replaced; nothing else touched
    // (a half-typed inject message or reason survives every update).
    for (let i = 0; i < n.entries.length; i++) {
      const entry = n.entries[i];
      const shown = d.shown[i];
      if (shown && shown.v === entry.v) continue;
      if (shown && entry.kind === "assistant") {
        // The hot path, once per frame while text streams: append what arrived since
        // the last frame to the same text node. Replacing the whole text instead makes
        // the browser shape and lay out all of it again, every frame (measured:
        // benchmarks/ui.py fell behind a 1,000 deltas/s stream that way).
        const live = shown.live;
        const had = shown.sealed + (live ? live.length : 0);
        if (live && entry.rewrites === shown.rewrites && entry.text.length >= had) {
          if (entry.text.length > had) live.appendData(entry.text.slice(had));
          if (live.length > SEAL_AT) seal(shown);
        } else {
          shown.el.textContent = entry.text;
          shown.live = shown.el.firstChild || shown.el.appendChild(document.createTextNode(""));
          shown.sealed = 0;
          shown.rewrites = entry.rewrites;
        }
        shown.el.classList.toggle("streaming", !!entry.streaming);
        shown.v = entry.v;
        continue;
      }
      const fresh = renderEntry(n, entry, d, d.errorBox);
      if (shown) shown.el.replaceWith(fresh);
      else d.transcript.append(fresh);
      d.shown[i] = { el: fresh, v: entry.v, rewrites: entry.rewrites, sealed: 0, live: null };
      if (entry.kind === "assistant") {
        d.shown[i].live = fresh.firstChild || fresh.appendChild(document.createTextNode(""));
      }
    }
    for (const childId of n.children) {
      if (dom[childId] && !dom[childId].root.isConnected) d.children.append(dom[childId].root);
    }
  }

  function render() {
    renderQueued = false;
    if (!view) return;
    // parents before children, so a child always finds its parent's element
    const order = [...dirty].sort((a, b) => depth(a) - depth(b));
    dirty.clear();
    for (const id of order) {
      if (view.nodes[id]) renderNode(view.nodes[id]);
    }
    const stats = $("run-view").querySelector(".stats");
    if (stats) {
      const s = view.stats;
      stats.textContent = s.events + " events" + (s.duplicates ? ", " + s.duplicates + " duplicates" : "") +
        (s.gaps ? ", " + s.gaps + " gaps" : "");
    }
    saveSoon();
  }

  function depth(id) {
    let d = 0;
    for (let n = view.nodes[id]; n && n.parent; n = view.nodes[n.parent]) d++;
    return d;
  }

  function scheduleRender() {
    if (renderQueued) return;
    renderQueued = true;
    requestAnimationFrame(render);
  }

  let saveTimer = null;
  function saveSoon() {
    if (saveTimer !== null) return;
    saveTimer = setTimeout(() => {
      saveTimer = null;
      saveView();
    }, 1000);
  }

  function openRun(id) {
    stopFollowing();
    for (const key of Object.keys(dom)) delete dom[key];
    dirty.clear();
    const rv = $("run-view");
    rv.textContent = "";
    const head = el("div", "run-head");
    head.append(el("h2", null, "Run"), el("span", "mono", id), el("span", "muted stats"));
    rv.append(head, el("div", "error run-error"), el("div", "tree"));
    const saved = loadView(id);
    view = saved || emptyView(id);
    node(id);
    for (const nid of Object.keys(view.nodes)) {
      view.nodes[nid].streaming = view.nodes[nid].streaming ?? -1;
      view.nodes[nid].usageAsked = false; // a request of the page before the reload is gone
      dirty.add(nid);
    }
    render();
    // the root's agent and session: the tree's events name every child's, not the root's
    api("GET", runPath(id)).then((data) => {
      const info = unwrapRun(data);
      if (!view || view.root !== id || !info) return;
      const n = node(id);
      n.agent = n.agent || info.agent;
      n.startedAs = info.agent;
      n.session = info.session_id || null;
      // Items drawn before the session was known get their fork button now.
      n.entries.forEach((entry, i) => {
        if (n.session && entry.seq && entry.kind !== "assistant") touch(n, i);
      });
      dirty.add(id);
      scheduleRender();
    }, () => {});
    for (const row of document.querySelectorAll("#runs tr.run-row")) {
      row.classList.toggle("selected", row.dataset.run === id);
    }
    if (location.hash !== "#/runs/" + id) history.replaceState(null, "", "#/runs/" + encodeURIComponent(id));
    for (const nid of Object.keys(view.nodes)) {
      if (TERMINAL.has(view.nodes[nid].status)) fetchUsage(nid); // loaded finished: not asked yet
    }
    followRun(id);
  }

  // ------------------------------------------------------------------ the runs list

  let runs = [];
  let runsKey = "";

  function rowStatus(id, status) {
    const run = runs.find((r) => r.run_id === id);
    if (run && run.status !== status) {
      run.status = status;
      renderRuns();
    }
  }

  function matches(run) {
    const want = $("filter-status").value;
    if (want === "live" && TERMINAL.has(run.status)) return false;
    if (want && want !== "live" && run.status !== want) return false;
    const text = $("filter-text").value.trim().toLowerCase();
    if (!text) return true;
    return [run.run_id, run.agent, run.session_id || ""].some((s) => String(s).toLowerCase().includes(text));
  }

  function renderRuns() {
    const body = $("runs").querySelector("tbody");
    const rows = [];
    const selected = view && view.root;
    for (const run of runs) {
      if (!matches(run)) continue;
      const tr = el("tr", "run-row" + (run.run_id === selected ? " selected" : ""));
      tr.dataset.run = run.run_id;
      const status = el("td");
      status.append(el("span", "status " + run.status, run.status));
      tr.append(status, el("td", null, run.agent), el("td", "mono", run.session_id || ""), el("td", "mono", run.run_id));
      tr.title = run.reason ? run.status + ": " + run.reason : run.status;
      tr.addEventListener("click", () => openRun(run.run_id));
      rows.push(tr);
    }
    body.replaceChildren(...rows);
    $("runs-count").textContent = "(" + rows.length + (rows.length !== runs.length ? " of " + runs.length : "") + ")";
  }

  let listTimer = null;
  async function refreshRuns() {
    clearTimeout(listTimer);
    if (!token) return;
    try {
      const fresh = unwrapRuns(await api("GET", "/runs"));
      // newest first: the order the server answers is start order
      fresh.reverse();
      const key = JSON.stringify(fresh);
      if (key !== runsKey) {
        runsKey = key;
        runs = fresh;
        renderRuns();
      }
    } catch (_) {
      // shown through the sign-in screen when it is the token; otherwise next time
    }
    if (token) listTimer = setTimeout(refreshRuns, LIST_EVERY_MS);
  }

  // ------------------------------------------------------------------ starting a run

  async function loadAgents() {
    const select = $("start-agent");
    try {
      const data = await api("GET", "/agents");
      const agents = Array.isArray(data) ? data : (data && data.agents) || [];
      select.replaceChildren(...agents.map((a) => {
        const name = typeof a === "string" ? a : a.name;
        const option = new Option(name, name);
        if (a && a.description) option.title = a.description;
        return option;
      }));
    } catch (err) {
      $("start-error").textContent = "agents: " + err.message;
    }
  }

  async function startRun(event) {
    event.preventDefault();
    $("start-error").textContent = "";
    const body = { agent: $("start-agent").value, input: $("start-input").value };
    const session = $("start-session").value.trim();
    if (session) body.session_id = session;
    const limits = {};
    for (const name of ["requests", "tool_calls", "total_tokens", "deadline"]) {
      const v = $("limit-" + name).value;
      if (v) limits[name] = Number(v);
    }
    if (Object.keys(limits).length) body.limits = limits;
    $("start-button").disabled = true;
    try {
      const data = await api("POST", "/runs", body);
      const id = (data && (data.run_id || (data.run && data.run.run_id))) || null;
      $("start-input").value = "";
      if (id) openRun(id);
      refreshRuns();
    } catch (err) {
      $("start-error").textContent = err.message;
    } finally {
      $("start-button").disabled = false;
    }
  }

  // ------------------------------------------------------------------ signing in and out

  function signOut(message) {
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(VIEW_KEY);
    stopFollowing();
    clearTimeout(listTimer);
    view = null;
    runs = [];
    runsKey = "";
    $("runs").querySelector("tbody").textContent = "";
    $("run-view").replaceChildren(el("p", "muted empty", "Select a run, or start one."));
    $("app").hidden = true;
    $("who").hidden = true;
    $("signin").hidden = false;
    $("signin-error").textContent = message || "";
  }

  async function signIn(candidate) {
    token = candidate;
    try {
      // the token is checked by asking for the runs: 401 means it is not one
      const data = await api("GET", "/runs");
      runs = unwrapRuns(data).reverse();
    } catch (err) {
      if (err.status !== 401) signOut("Could not reach the server: " + err.message);
      return false;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    $("signin").hidden = true;
    $("app").hidden = false;
    $("who").hidden = false;
    $("signin-error").textContent = "";
    renderRuns();
    loadAgents();
    refreshRuns();
    const m = /^#\/runs\/(.+)$/.exec(location.hash);
    if (m) openRun(decodeURIComponent(m[1]));
    return true;
  }

  function init() {
    $("signin-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = $("token").value.trim();
      $("token").value = "";
      if (value) signIn(value);
    });
    $("sign-out").addEventListener("click", () => signOut(""));
    $("start-form").addEventListener("submit", startRun);
    $("filter-text").addEventListener("input", renderRuns);
    $("filter-status").addEventListener("change", renderRuns);
    // keep the view for a reload: written atomically with the last event id it holds
    window.addEventListener("pagehide", saveView);
    window.addEventListener("hashchange", () => {
      const m = /^#\/runs\/(.+)$/.exec(location.hash);
      if (m && token && (!view || view.root !== decodeURIComponent(m[1]))) openRun(decodeURIComponent(m[1]));
    });
    if (token) signIn(token);
    else $("signin").hidden = false;
  }

  // for tests and the benchmark: the counters that prove no gap and no duplicate
  window.trioAgentsUI = {
    stats: () => (view ? Object.assign({ root: view.root, done: view.done, lastId: view.lastId }, view.stats) : null),
    seqs: () => (view ? Object.assign({}, view.seqs) : null),
  };

  document.addEventListener("DOMContentLoaded", init);
})();
