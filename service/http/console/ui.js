// ui.js - small DOM and formatting helpers shared by the views. Every text
// from the server goes in through textContent (el's strings), never as HTML.

// el("a", {href: "#/runs", class: "x", onclick: fn}, "text", child, ...)
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) {
      continue;
    }
    if (k.startsWith("on")) {
      node.addEventListener(k.slice(2), v);
    } else if (k === "class") {
      node.className = v;
    } else if (v === true) {
      node.setAttribute(k, "");
    } else {
      node.setAttribute(k, String(v));
    }
  }
  for (const c of children.flat()) {
    if (c !== undefined && c !== null && c !== false) {
      node.append(c instanceof Node ? c : String(c));
    }
  }
  return node;
}

export function clear(node) {
  while (node.firstChild) {
    node.firstChild.remove();
  }
  return node;
}

// "RUN_STATUS_PENDING" -> "PENDING"
export function shortEnum(value, prefix) {
  if (!value) {
    return "";
  }
  return value.startsWith(prefix) ? value.slice(prefix.length) : value;
}

export function num(v) {
  return v === undefined || v === null || v === "" ? 0 : Number(v);
}

export function fmtTime(ms) {
  const n = num(ms);
  if (!n) {
    return "";
  }
  return new Date(n).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function fmtDuration(ms) {
  let s = Math.round(Math.abs(ms) / 1000);
  if (s < 60) {
    return s + "s";
  }
  const parts = [];
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (s >= size) {
      parts.push(Math.floor(s / size) + unit);
      s %= size;
    }
  }
  if (s) {
    parts.push(s + "s");
  }
  return parts.slice(0, 2).join("");
}

// "in 59s" / "3m ago"
export function fmtRelative(ms, now = Date.now()) {
  const n = num(ms);
  if (!n) {
    return "";
  }
  const d = n - now;
  return d >= 0 ? "in " + fmtDuration(d) : fmtDuration(d) + " ago";
}

export function fmtBytes(v) {
  let n = num(v);
  for (const unit of ["B", "KiB", "MiB", "GiB", "TiB"]) {
    if (n < 1024 || unit === "TiB") {
      return (unit === "B" ? n : n.toFixed(1)) + " " + unit;
    }
    n /= 1024;
  }
  return "";
}

export function pretty(value) {
  return value === undefined ? "" : JSON.stringify(value, null, 2);
}

// A time with its distance from now: "2026-12-01 14:52:03Z (in 59s)".
export function timeCell(ms) {
  return num(ms) ? fmtTime(ms) + " (" + fmtRelative(ms) + ")" : "";
}

export function badge(status) {
  const s = shortEnum(status, "RUN_STATUS_");
  return el("span", { class: "badge badge-" + s.toLowerCase().replace(/_/g, "-") }, s);
}

// A definition list from [label, value] pairs (values: text or nodes);
// pairs whose value is empty are left out.
export function fields(pairs, cls = "fields") {
  const dl = el("dl", { class: cls });
  for (const [label, value] of pairs) {
    if (value === undefined || value === null || value === "") {
      continue;
    }
    dl.append(el("dt", {}, label), el("dd", {}, value));
  }
  return dl;
}

// A table in a scrolling box. columns: [{label, cell(row) -> text|node, cls}]
export function table(columns, rows, { empty = "Nothing here.", cls = "" } = {}) {
  if (rows.length === 0) {
    return el("p", { class: "muted empty" }, empty);
  }
  const head = el("tr", {}, columns.map((c) => el("th", { class: c.cls }, c.label)));
  const body = rows.map((r) =>
    el("tr", {}, columns.map((c) => el("td", { class: c.cls, "data-label": c.label }, c.cell(r)))));
  return el("div", { class: "scroll" },
    el("table", { class: cls }, el("thead", {}, head), el("tbody", {}, body)));
}

export function errorBox(err) {
  const what = err && err.status ? err.status + ": " : "";
  return el("p", { class: "error", role: "alert" }, what + (err ? err.message : "failed"));
}

export function section(title, ...children) {
  return el("section", { class: "card" }, el("h2", {}, title), ...children);
}

// Asks before an action (a modal dialog). With `field`, also asks for a
// value (a lease token, say). Resolves to {value} or null when declined.
export function confirmAction(title, text, { field = null, action = "Confirm" } = {}) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-yes").textContent = action;
  const label = document.getElementById("confirm-field");
  const input = document.getElementById("confirm-input");
  label.hidden = !field;
  input.required = !!field;
  input.value = "";
  document.getElementById("confirm-field-label").textContent = field || "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      resolve(dialog.returnValue === "yes" ? { value: input.value.trim() } : null);
    }, { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

let noticeTimer = 0;

// A line at the top of the page for what an action did.
export function notice(text, kind = "ok") {
  const box = document.getElementById("notice");
  box.textContent = text;
  box.className = "notice notice-" + kind;
  box.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => {
    box.hidden = true;
  }, 8000);
}

// A form field: el("label", ...) with an input named `name`.
export function input(label, name, attrs = {}) {
  return el("label", {}, el("span", {}, label), el("input", { name, ...attrs }));
}

export function select(label, name, options, value = "") {
  return el("label", {}, el("span", {}, label),
    el("select", { name }, options.map(([v, text]) =>
      el("option", { value: v, selected: v === value }, text))));
}
