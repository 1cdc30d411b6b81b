// functions.js - the Functions views: the list (ListFunctions) with each
// function's counters, and one function (GetFunction): its descriptor and
// limits, a key's state (GetKeyState), its output followed by polling
// ReadOutput with the page's cursor, and a dry run (DryRunBatch).

import * as api from "./api.js";
import {
  clear, el, errorBox, fields, fmtBytes, fmtTime, input, num, pretty, section, shortEnum,
  table, timeCell,
} from "./ui.js";

const FOLLOW_ROWS_SHOWN = 200; // the newest rows kept on the page
const FOLLOW_PAGE_ROWS = 100;
const FOLLOW_IDLE_MS = 1000; // between polls once a page came back short

const link = (id) => el("a", { href: "#/functions/" + api.seg(id), class: "mono" }, id);
const fmtUs = (us) => (num(us) ? fmtTime(Math.floor(num(us) / 1000)) : "");

export async function list(main, ctx) {
  const box = el("div", { id: "functions" });
  main.append(el("h1", {}, "Functions"), box);
  if (!ctx.can("functions:read")) {
    box.append(el("p", { class: "muted" }, "This API key cannot list functions (functions:read)."));
    return;
  }
  ctx.every(5000, async () => {
    const all = [];
    let token = "";
    // At most ten pages of a hundred: a console is not an export tool.
    for (let page = 0; page < 10; page++) {
      const doc = await api.get("/v1/functions" + api.query({ pageSize: 100, pageToken: token }));
      all.push(...(doc.functions || []));
      token = doc.nextPageToken || "";
      if (!token) {
        break;
      }
    }
    if (!ctx.live()) {
      return;
    }
    clear(box).append(table([
      { label: "Function", cell: (f) => link(f.descriptor.functionId) },
      { label: "Runtime", cell: (f) => shortEnum(f.descriptor.runtime, "RUNTIME_").toLowerCase() },
      { label: "Available", cell: (f) => (f.available ? "yes" : "no: " + (f.unavailableReason || "")) },
      { label: "Keys", cell: (f) => num(f.keys), cls: "num" },
      { label: "Timers", cell: (f) => num(f.timers), cls: "num" },
      { label: "State", cell: (f) => fmtBytes(f.stateBytes), cls: "num" },
      { label: "Output rows", cell: (f) => num(f.retainedRows), cls: "num" },
      { label: "Producers", cell: (f) => num(f.producers), cls: "num" },
      { label: "Watermark", cell: (f) => fmtUs(f.watermarkUs) },
    ], all, { empty: "No functions registered (POST /v1/functions, or keyflow functions register).",
      cls: "functions" }));
  });
}

function schemaText(schema) {
  return ((schema && schema.fields) || []).map((f) =>
    f.name + ": " + shortEnum(f.type, "FIELD_TYPE_").toLowerCase() + (f.nullable ? "?" : "")).join(", ");
}

export async function detail(main, functionId, ctx) {
  const info = el("div", { id: "function" });
  main.append(el("div", { class: "title" }, el("h1", {}, "Function"),
    el("span", { class: "mono" }, functionId)), info);
  if (!ctx.can("functions:read")) {
    info.append(el("p", { class: "muted" }, "This API key cannot read functions (functions:read)."));
    return;
  }
  const base = "/v1/functions/" + api.seg(functionId);
  let f;
  try {
    f = await api.get(base);
  } catch (err) {
    info.append(errorBox(err));
    return;
  }
  const d = f.descriptor || {};
  const counters = el("div", { id: "function-counters" });
  const limits = Object.entries(d.limits || {}).map(([k, v]) => [k, num(v)]);
  info.append(
    section("Descriptor", fields([
      ["Runtime", shortEnum(d.runtime, "RUNTIME_").toLowerCase()],
      ["Determinism", shortEnum(d.determinism, "DETERMINISM_").toLowerCase()],
      ["Input", schemaText(d.inputSchema)],
      ["Output", schemaText(d.outputSchema)],
      ["Key columns", (d.keyColumns || []).join(", ")],
      ["Event time", d.eventTimeColumn || ""],
      ["Value state", d.valueStateName || ""],
      ["Timers", (d.timerNames || []).join(", ")],
      ["Digest", el("span", { class: "mono" }, d.implementationDigest || "")],
      ["Registered", timeCell(f.createdMs)],
    ]), el("details", {}, el("summary", {}, "Descriptor JSON"), el("pre", {}, pretty(d)))),
    section("Limits", table([
      { label: "Limit", cell: (r) => r[0] },
      { label: "Value", cell: (r) => r[1], cls: "num" },
    ], limits, { cls: "limits" })),
    section("Counters", counters),
    keyStateBox(base),
    outputBox(base, d, ctx),
    ctx.can("functions:push") ? dryRunBox(base, d) : "");

  function renderCounters(g) {
    clear(counters).append(fields([
      ["Available", g.available ? "yes" : "no: " + (g.unavailableReason || "")],
      ["Keys", num(g.keys)],
      ["Timers", num(g.timers) + (num(g.dueTimers) ? " (" + g.dueTimers + " due)" : "")],
      ["State", fmtBytes(g.stateBytes)],
      ["Watermark", fmtUs(g.watermarkUs)],
      ["Output", num(g.retainedRows) + " rows kept (" + fmtBytes(g.retainedBytes) + ")"],
      ["Producers", num(g.producers)],
      ["Due timers error", g.dueTimersError || ""],
    ]));
  }
  renderCounters(f);
  ctx.every(3000, async () => {
    const g = await api.get(base);
    if (ctx.live()) {
      renderCounters(g);
    }
  });
}

function keyStateBox(base) {
  const form = el("form", { class: "filters", id: "key-form" },
    input("Key", "key", { required: true, placeholder: "key text, or a JSON array" }),
    el("button", { type: "submit" }, "Show state"));
  const out = el("div", { id: "key-state" });
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const s = await api.get(base + "/keys/" + api.seg(form.elements.key.value.trim()));
      clear(out).append(fields([
        ["Key", s.keyText],
        ["State", shortEnum(s.state, "STATE_KIND_").toLowerCase()],
        [s.valueStateName || "Value", s.state === "STATE_KIND_VALUE" ? String(num(s.value)) : ""],
        ["Expires", fmtUs(s.stateExpiresUs)],
        ["Timers", (s.timers || []).map((t) => t.name + " at " + fmtUs(t.atUs)).join(", ")],
      ]));
    } catch (err) {
      clear(out).append(errorBox(err));
    }
  });
  return section("Key state", form, out);
}

// Output rows as a table whose columns are the output schema's.
function rowsTable(rows, descriptor, id) {
  const names = ((descriptor.outputSchema && descriptor.outputSchema.fields) || []).map((f) => f.name);
  const columns = [{ label: "seq", cell: (r) => r._seq, cls: "num" },
    ...names.map((n) => ({ label: n, cell: (r) => (r[n] === null ? "null" : String(r[n] ?? "")) }))];
  const t = table(columns, rows, { empty: "No rows.", cls: "rows" });
  t.id = id;
  return t;
}

function outputBox(base, descriptor, ctx) {
  const toggle = el("button", { type: "button", id: "follow" }, "Follow output");
  const status = el("span", { class: "muted", id: "follow-status" }, "");
  const box = el("div", { id: "output-rows" });
  let following = false;
  let cursor = "";
  let after = "0";
  let rows = [];

  // One page from the position; the next one at once while pages come back
  // full, else after a pause. Pages hold one partition's rows each; the
  // cursor (several partitions) or after (one) says where to go on.
  async function poll() {
    if (!following || !ctx.live()) {
      return;
    }
    let full = false;
    try {
      const page = await api.get(base + "/output" + api.query(
        cursor ? { cursor, limit: FOLLOW_PAGE_ROWS } : { after, limit: FOLLOW_PAGE_ROWS }));
      const got = page.rows || [];
      full = got.length === FOLLOW_PAGE_ROWS;
      if (page.nextCursor) {
        cursor = page.nextCursor;
      } else if (page.nextAfterSeq) {
        after = page.nextAfterSeq;
      }
      if (got.length) {
        rows = rows.concat(got.map((r) => ({ ...r, _partition: page.partition || 0 })))
          .slice(-FOLLOW_ROWS_SHOWN);
        clear(box).append(rowsTable(rows, descriptor, "output-table"));
      }
      status.textContent = "following: " + rows.length + " rows shown (the newest " +
        FOLLOW_ROWS_SHOWN + " are kept)";
    } catch (err) {
      status.textContent = "stopped: " + err.message;
      following = false;
      toggle.textContent = "Follow output";
      return;
    }
    if (following && ctx.live()) {
      setTimeout(poll, full ? 0 : FOLLOW_IDLE_MS);
    }
  }

  toggle.addEventListener("click", () => {
    following = !following;
    toggle.textContent = following ? "Stop following" : "Follow output";
    status.textContent = following ? "following..." : "stopped";
    if (following) {
      poll();
    }
  });
  return section("Output", el("div", { class: "toolbar" }, toggle, status), box);
}

function dryRunBox(base, descriptor) {
  const example = {};
  for (const field of (descriptor.inputSchema && descriptor.inputSchema.fields) || []) {
    example[field.name] = { FIELD_TYPE_UTF8: "a", FIELD_TYPE_INT64: 1, FIELD_TYPE_FLOAT64: 1.5,
      FIELD_TYPE_BOOL: true, FIELD_TYPE_TIMESTAMP_US: Date.now() * 1000 }[field.type] ?? null;
  }
  const form = el("form", { class: "grid", id: "dry-run-form" },
    el("label", { class: "wide" }, el("span", {}, "Rows (a JSON array of objects)"),
      el("textarea", { name: "rows", rows: 4, spellcheck: "false" }, JSON.stringify([example]))),
    input("Watermark (µs, optional)", "watermarkUs", { type: "number" }),
    el("div", { class: "actions wide" }, el("button", { type: "submit" }, "Dry run")));
  const out = el("div", { id: "dry-run-result" });
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    let rowsValue;
    try {
      rowsValue = JSON.parse(form.elements.rows.value);
    } catch (err) {
      clear(out).append(el("p", { class: "error" }, "rows: not JSON: " + err.message));
      return;
    }
    const body = { rows: rowsValue, format: "ROW_FORMAT_JSON" };
    if (form.elements.watermarkUs.value !== "") {
      body.watermarkUs = form.elements.watermarkUs.value;
    }
    try {
      const r = await api.post(base + "/dry-run", body);
      const output = r.outputJson ? JSON.parse(r.outputJson) : [];
      clear(out).append(
        fields([
          ["Rows accepted", num(r.rowsAccepted)],
          ["Handler calls", num(r.handlerCalls)],
          ["Timer callbacks", num(r.timerCallbacks)],
          ["Watermark after", fmtUs(r.watermarkUs)],
        ]),
        el("h3", {}, "Output it would append"), rowsTable(output, descriptor, "dry-run-output"),
        el("h3", {}, "Key changes"),
        table([
          { label: "Key", cell: (c) => c.keyText },
          { label: "Before", cell: (c) => stateText(c.stateBefore, c.valueBefore) },
          { label: "After", cell: (c) => stateText(c.stateAfter, c.valueAfter) },
        ], r.changes || [], { cls: "changes" }),
        el("p", { class: "muted" }, "Nothing was written: a dry run applies nothing."));
    } catch (err) {
      clear(out).append(errorBox(err));
    }
  });
  return section("Dry run", form, out);
}

function stateText(kind, value) {
  const k = shortEnum(kind, "STATE_KIND_").toLowerCase();
  return k === "value" ? String(num(value)) : k;
}
