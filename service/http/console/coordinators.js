// coordinators.js - the Coordinators view: look up (kind, workflow, key)
// with DescribeCoordinator (its open window with the due time counting
// down, remembered event IDs, journal), flush or cancel the window, and
// send an event with SendEvent, showing its receipt and disposition.

import * as api from "./api.js";
import {
  clear, confirmAction, el, errorBox, fields, fmtDuration, fmtTime, input, notice, num,
  pretty, section, select, shortEnum, table, timeCell,
} from "./ui.js";
import { runLink } from "./runs.js";

const KINDS = [["batch", "batch"], ["debounce", "debounce"]];

export async function view(main, params, ctx) {
  const ref = {
    kind: params.get("kind") || "batch",
    workflow: params.get("workflow") || "",
    key: params.get("key") || "",
  };
  const lookup = el("form", { class: "filters", id: "coord-lookup" },
    select("Kind", "kind", KINDS, ref.kind),
    input("Workflow", "workflow", { value: ref.workflow, required: true }),
    input("Key", "key", { value: ref.key, required: true }),
    el("button", { type: "submit" }, "Look up"));
  const result = el("div", { id: "coordinator" });
  main.append(el("h1", {}, "Coordinators"), lookup, result);
  if (ctx.can("events:send")) {
    main.append(sendForm(ctx, (sent) => {
      Object.assign(ref, sent);
      for (const name of ["kind", "workflow", "key"]) {
        lookup.elements[name].value = ref[name];
      }
      showRef();
    }));
  }

  let doc = null; // the last answer, for the countdown between refreshes

  function showRef() {
    ctx.setHash("#/coordinators" + api.query(ref));
    doc = null;
    load();
  }

  lookup.addEventListener("submit", (ev) => {
    ev.preventDefault();
    for (const name of ["kind", "workflow", "key"]) {
      ref[name] = lookup.elements[name].value.trim();
    }
    showRef();
  });

  const path = () => "/v1/coordinators/" + [ref.kind, ref.workflow, ref.key].map(api.seg).join("/");

  async function act(verb) {
    const what = verb === "flush"
      ? ["Flush this window?", "Its run starts now, with the events it holds.", "Flush"]
      : ["Cancel this window?", "Its events are dropped and its run will never exist.", "Cancel window"];
    if (!(await confirmAction(what[0], what[1], { action: what[2] }))) {
      return;
    }
    try {
      const r = await api.post(path() + ":" + verb);
      notice(verb === "flush" ? "Flush: " + shortEnum(r.disposition, "DISPOSITION_") +
        (r.runId ? ", run " + r.runId + " started" : "")
        : "Cancel: " + shortEnum(r.disposition, "DISPOSITION_") +
        (r.eventsDropped ? ", " + r.eventsDropped + " events dropped" : ""));
    } catch (err) {
      notice(err.message, "error");
    }
    await load();
  }

  function render() {
    const w = doc.window;
    clear(result);
    if (!doc.exists) {
      result.append(el("p", { class: "muted", id: "coord-none" }, "No coordinator for " +
        ref.kind + " / " + ref.workflow + " / " + ref.key + " (it starts with its first event)."));
      return;
    }
    const windowBox = w
      ? section("Open window",
        fields([
          ["Run", runLink(w.runId)],
          ["Due", el("span", { id: "coord-due" })],
          ["Events", num(w.eventCount) + (num(w.eventsAbsorbed) ? " (" + w.eventsAbsorbed + " absorbed)" : "")],
          ["Input bytes", num(w.inputBytes)],
          ["Opened", fmtTime(w.openedMs)],
          ["Latest event", fmtTime(w.lastMs)],
          ["Leading run started", w.runStarted ? "yes" : ""],
          ["Rule", el("code", {}, JSON.stringify(w.rule || {}))],
        ]),
        ctx.can("coordinators:write")
          ? el("div", { class: "actions" },
            el("button", { type: "button", id: "coord-flush", onclick: () => act("flush") }, "Flush"),
            el("button", { type: "button", class: "danger", id: "coord-cancel",
              onclick: () => act("cancel") }, "Cancel window"))
          : "")
      : section("Open window", el("p", { class: "muted", id: "coord-no-window" }, "No window is open."));
    result.append(windowBox,
      section("Coordinator", fields([
        ["Runs started", num(doc.runsStarted)],
        ["Recent runs", (doc.recentRunIds || []).length
          ? el("span", { class: "list" }, (doc.recentRunIds || []).map(runLink)) : ""],
        ["Journal", num(doc.journalLength) + " entries since the last snapshot, " +
          num(doc.journalSeq) + " ever, " + num(doc.compactions) + " compactions"],
      ])),
      section("Remembered event IDs", table([
        { label: "ID", cell: (r) => r.id, cls: "mono" },
        { label: "Run", cell: (r) => r.receipt ? runLink(r.receipt.runId) : "" },
        { label: "Forgotten", cell: (r) => timeCell(r.expiresMs) },
      ], doc.rememberedIds || [], { empty: "None.", cls: "remembered" })),
      section("Journal", table([
        { label: "Seq", cell: (r) => num(r.seq), cls: "num" },
        { label: "At", cell: (r) => fmtTime(r.atMs) },
        { label: "What", cell: (r) => r.what },
        { label: "Run", cell: (r) => r.runId ? runLink(r.runId) : "" },
        { label: "Event", cell: (r) => r.eventId || "" },
        { label: "Detail", cell: (r) => r.detail || "", cls: "mono" },
      ], doc.journal || [], { empty: "Empty.", cls: "journal" })));
    tick();
  }

  // The due time, counting down between refreshes.
  function tick() {
    const due = document.getElementById("coord-due");
    if (due && doc && doc.window) {
      const left = num(doc.window.dueMs) - Date.now();
      due.textContent = fmtTime(doc.window.dueMs) + " (" +
        (left > 0 ? "in " + fmtDuration(left) : "closing") + ")";
    }
  }

  async function load() {
    if (!ref.workflow || !ref.key) {
      return;
    }
    try {
      const d = await api.get(path());
      if (ctx.live()) {
        doc = d;
        render();
      }
    } catch (err) {
      if (ctx.live()) {
        clear(result).append(errorBox(err));
      }
    }
  }

  if (!ctx.can("coordinators:read")) {
    result.append(el("p", { class: "muted" }, "This API key cannot look up coordinators (coordinators:read)."));
    return;
  }
  ctx.every(1000, async () => tick());
  ctx.every(2000, load);
}

// The send-event form; `sent` gets the coordinator the event went to.
function sendForm(ctx, sent) {
  const form = el("form", { class: "grid", id: "send-form" },
    input("Workflow", "workflow", { required: true }),
    input("Key", "key", { required: true }),
    select("Rule", "kind", KINDS),
    input("Max events (batch)", "maxEvents", { type: "number", min: 1, placeholder: "100" }),
    input("Window ms (debounce)", "windowMs", { type: "number", min: 1, placeholder: "1000" }),
    input("Max wait ms", "maxWaitMs", { type: "number", min: 0 }),
    input("Event ID", "id", { placeholder: "optional: deduplicates retries" }),
    el("label", { class: "wide" }, el("span", {}, "Input (JSON)"),
      el("textarea", { name: "input", rows: 3, spellcheck: "false" }, "{}")),
    el("label", { class: "check" }, el("input", { type: "checkbox", name: "flush" }),
      "Close the window with this event (flush)"),
    el("div", { class: "actions wide" }, el("button", { type: "submit" }, "Send event")));
  const out = el("div", { id: "send-result" });

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = form.elements;
    const kind = f.kind.value;
    let inputValue;
    try {
      inputValue = JSON.parse(f.input.value);
    } catch (err) {
      clear(out).append(el("p", { class: "error" }, "input: not JSON: " + err.message));
      return;
    }
    const rule = { kind };
    for (const name of kind === "batch" ? ["maxEvents", "maxWaitMs"] : ["windowMs", "maxWaitMs"]) {
      if (f[name].value !== "") {
        rule[name] = Number(f[name].value);
      }
    }
    const event = { rule, input: inputValue };
    if (f.id.value.trim()) {
      event.id = f.id.value.trim();
    }
    if (f.flush.checked) {
      event.flush = true;
    }
    const workflow = f.workflow.value.trim();
    const key = f.key.value.trim();
    try {
      const r = await api.post("/v1/workflows/" + api.seg(workflow) + "/keys/" + api.seg(key) +
        "/events", event);
      const receipt = r.receipt || {};
      clear(out).append(fields([
        ["Disposition", el("strong", { id: "send-disposition" }, shortEnum(r.disposition, "DISPOSITION_"))],
        ["Run", receipt.runId ? runLink(receipt.runId) : ""],
        ["Due", timeCell(receipt.dueMs)],
        ["Commit", receipt.commitSeq || ""],
      ]), el("details", {}, el("summary", {}, "Reply"), el("pre", {}, pretty(r))));
      sent({ kind, workflow, key });
    } catch (err) {
      clear(out).append(errorBox(err));
    }
  });
  return section("Send an event", form, out);
}
