// runs.js - the Runs views: a filtered, paged, refreshing list (ListRuns)
// and one run (GetRun) with cancel (CancelRun) and release (ReleaseRun).

import * as api from "./api.js";
import {
  badge, clear, confirmAction, el, errorBox, fields, fmtRelative, input, notice, num,
  pretty, section, select, shortEnum, table, timeCell,
} from "./ui.js";

const STATUSES = ["PENDING", "LEASED", "DELAYED", "WINDOW_OPEN", "COMPLETED", "FAILED",
  "CANCELLED"];
const FINISHED = new Set(["RUN_STATUS_COMPLETED", "RUN_STATUS_FAILED", "RUN_STATUS_CANCELLED"]);
const PAGE_SIZE = 50;
const REFRESH_MS = 2000;

export const runLink = (id) => el("a", { href: "#/runs/" + api.seg(id), class: "mono" }, id);

export async function list(main, params, ctx) {
  const filters = {
    workflow: params.get("workflow") || "",
    key: params.get("key") || "",
    status: params.get("status") || "",
  };
  const form = el("form", { class: "filters", id: "runs-filter" },
    input("Workflow", "workflow", { value: filters.workflow, placeholder: "any" }),
    input("Key", "key", { value: filters.key, placeholder: "any" }),
    select("Status", "status", [["", "any"], ...STATUSES.map((s) => [s, s])], filters.status),
    el("button", { type: "submit" }, "Filter"));
  const auto = el("input", { type: "checkbox", id: "runs-auto", checked: true });
  const pager = el("div", { class: "pager" });
  const box = el("div", { id: "runs-table" });
  main.append(el("h1", {}, "Runs"), form,
    el("div", { class: "toolbar" }, el("label", { class: "check" }, auto, "Refresh every 2 s"),
      pager),
    box);
  if (!ctx.can("runs:read")) {
    box.append(el("p", { class: "muted" }, "This API key cannot list runs (runs:read)."));
    return;
  }
  const tokens = [""]; // page tokens of the pages before and of this one
  let next = "";

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const data = new FormData(form);
    location.hash = "#/runs" + api.query({
      workflow: data.get("workflow").trim(), key: data.get("key").trim(),
      status: data.get("status"),
    });
  });

  async function load() {
    const q = {
      workflow: filters.workflow, key: filters.key, pageSize: PAGE_SIZE,
      pageToken: tokens[tokens.length - 1],
      status: filters.status ? "RUN_STATUS_" + filters.status : "",
    };
    let doc;
    try {
      doc = await api.get("/v1/runs" + api.query(q));
    } catch (err) {
      clear(box).append(errorBox(err));
      return;
    }
    if (!ctx.live()) {
      return;
    }
    next = doc.nextPageToken || "";
    const rows = doc.runs || [];
    clear(box).append(table([
      { label: "Run", cell: (r) => runLink(r.runId) },
      { label: "Workflow", cell: (r) => r.workflow },
      { label: "Key", cell: (r) => r.key },
      { label: "Status", cell: (r) => badge(r.status) },
      { label: "Attempts", cell: (r) => num(r.attempts) + "/" + num(r.maxAttempts), cls: "num" },
      { label: "Worker", cell: (r) => r.workerId || "" },
      { label: "Updated", cell: (r) => fmtRelative(r.updatedMs) },
    ], rows, { empty: "No runs match.", cls: "runs" }));
    clear(pager).append(
      el("button", { type: "button", class: "quiet", disabled: tokens.length === 1,
        onclick: () => { tokens.pop(); load(); } }, "Previous"),
      el("span", { class: "muted" }, "page " + tokens.length),
      el("button", { type: "button", class: "quiet", disabled: !next,
        onclick: () => { tokens.push(next); load(); } }, "Next"));
  }

  ctx.every(REFRESH_MS, async () => {
    if (auto.checked || !box.firstChild) {
      await load();
    }
  });
}

export async function detail(main, runId, ctx) {
  const head = el("div", { class: "title" }, el("h1", {}, "Run"), el("span", { class: "mono" }, runId));
  const actions = el("div", { class: "actions", id: "run-actions" });
  const body = el("div", { id: "run" });
  main.append(head, actions, body);
  let finished = false;

  async function cancel() {
    const ok = await confirmAction("Cancel this run?",
      "A pending or delayed run is cancelled at once; a leased one's worker is told to stop. " +
      "This cannot be undone.", { action: "Cancel run" });
    if (!ok) {
      return;
    }
    try {
      const doc = await api.post("/v1/runs/" + api.seg(runId) + ":cancel");
      notice("Cancel: the run is " + shortEnum(doc.run && doc.run.status, "RUN_STATUS_") +
        (doc.run && doc.run.cancelRequested ? " (its worker was told)" : ""));
    } catch (err) {
      notice(err.message, "error");
    }
    await load();
  }

  async function release() {
    const ok = await confirmAction("Release this run?",
      "The run goes back to PENDING and the attempt does not count. Only the lease's holder " +
      "knows its token (GetRun does not show it).", { field: "Lease token", action: "Release" });
    if (!ok) {
      return;
    }
    try {
      await api.post("/v1/runs/" + api.seg(runId) + ":release", { lease: ok.value });
      notice("Released: the run is pending again");
    } catch (err) {
      notice(err.message, "error");
    }
    await load();
  }

  function render(run) {
    const status = run.status || "";
    clear(actions);
    const cancellable = !FINISHED.has(status) && !run.cancelRequested;
    if (cancellable && ctx.can("coordinators:write")) {
      actions.append(el("button", { type: "button", class: "danger", id: "run-cancel",
        onclick: cancel }, "Cancel run"));
    }
    if (status === "RUN_STATUS_LEASED" && ctx.can("runs:work")) {
      actions.append(el("button", { type: "button", class: "quiet", id: "run-release",
        onclick: release }, "Release"));
    }
    const events = (run.eventIds || []).join(", ") +
      (num(run.eventIdsDropped) ? " (+" + run.eventIdsDropped + " more)" : "");
    clear(body).append(
      section("State", fields([
        ["Status", badge(status)],
        ["Workflow", el("a", { href: "#/runs" + api.query({ workflow: run.workflow }) }, run.workflow)],
        ["Key", run.key],
        ["Rule", shortEnum(run.kind, "RULE_KIND_").toLowerCase()],
        ["Coordinator", el("a", { href: "#/coordinators" + api.query({
          kind: shortEnum(run.kind, "RULE_KIND_").toLowerCase(), workflow: run.workflow,
          key: run.key }) }, "look up")],
        ["Attempts", num(run.attempts) + " of " + num(run.maxAttempts)],
        ["Lease holder", run.workerId || ""],
        ["Lease expires", status === "RUN_STATUS_LEASED" ? timeCell(run.leaseExpiresMs) : ""],
        ["Cancel requested", run.cancelRequested ? "yes: its worker was told to stop" : ""],
        ["Due", timeCell(run.dueMs)],
        ["Created", timeCell(run.createdMs)],
        ["Updated", timeCell(run.updatedMs)],
        ["Finished", timeCell(run.finishedMs)],
        ["Events", num(run.eventCount) + (events ? ": " + events : "")],
        ["Last attempt's error", run.lastError || ""],
      ])),
      status === "RUN_STATUS_FAILED" ? section("Error", el("pre", { class: "error", id: "run-error" }, run.error || "")) : "",
      "result" in run ? section("Result", el("pre", { id: "run-result" }, pretty(run.result))) : "",
      section("Input", el("pre", { id: "run-input" }, pretty(run.input))));
    body.dataset.status = shortEnum(status, "RUN_STATUS_");
  }

  async function load() {
    try {
      const run = await api.get("/v1/runs/" + api.seg(runId));
      if (ctx.live()) {
        render(run);
        finished = FINISHED.has(run.status);
      }
    } catch (err) {
      if (ctx.live()) {
        clear(body).append(errorBox(err));
      }
    }
  }

  if (!ctx.can("runs:read")) {
    body.append(el("p", { class: "muted" }, "This API key cannot read runs (runs:read)."));
    return;
  }
  // Refreshed while the run can still change.
  ctx.every(1000, async () => {
    if (!finished) {
      await load();
    }
  });
}
