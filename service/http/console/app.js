// app.js - the console's entry point: asks for an API key when the server
// wants one, learns what the key may do, and shows one view per location
// hash (#/runs, #/runs/<id>, #/coordinators?..., #/functions[/<id>],
// #/health). A view gets a context whose timers stop when the view changes,
// so that a page left open polls only for what it shows.

import * as api from "./api.js";
import { clear, el, errorBox } from "./ui.js";
import * as runs from "./runs.js";
import * as coordinators from "./coordinators.js";
import * as functions from "./functions.js";
import * as health from "./health.js";

const main = document.getElementById("main");
let access = { auth: false, scopes: new Set() };
let generation = 0; // bumped by every navigation: older views' timers stop

function parseHash() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, q = ""] = hash.split("?", 2);
  const parts = path.split("/").filter((p) => p !== "").map(decodeURIComponent);
  return { parts, params: new URLSearchParams(q) };
}

function context(gen) {
  return {
    // Whether the key may do this (always, with keys off).
    can: (scope) => !access.auth || access.scopes.has(scope),
    live: () => gen === generation,
    // Runs fn now and then every `ms` after it finished, while the view is
    // shown; one call at a time, however slow the server is.
    every(ms, fn) {
      const tick = async () => {
        if (gen !== generation) {
          return;
        }
        try {
          await fn();
        } catch (err) {
          console.warn(err);
        }
        if (gen === generation) {
          setTimeout(tick, ms);
        }
      };
      tick();
    },
    // Sets the hash without showing the view again (filters, lookups).
    setHash(hash) {
      history.replaceState(null, "", hash);
    },
  };
}

async function show() {
  const gen = ++generation;
  const { parts, params } = parseHash();
  const view = parts[0] || "runs";
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.view === view);
  }
  clear(main);
  const ctx = context(gen);
  try {
    if (view === "runs" && parts[1]) {
      await runs.detail(main, parts[1], ctx);
    } else if (view === "runs") {
      await runs.list(main, params, ctx);
    } else if (view === "coordinators") {
      await coordinators.view(main, params, ctx);
    } else if (view === "functions" && parts[1]) {
      await functions.detail(main, parts[1], ctx);
    } else if (view === "functions") {
      await functions.list(main, ctx);
    } else if (view === "health") {
      await health.view(main, ctx);
    } else {
      main.append(el("p", { class: "error" }, "No such page: #/" + parts.join("/")));
    }
  } catch (err) {
    if (gen === generation) {
      main.append(errorBox(err));
    }
  }
}

// ---- signing in ------------------------------------------------------------

const login = document.getElementById("login");
const loginError = document.getElementById("login-error");

function askForKey(err) {
  generation++; // nothing polls with a refused key
  api.clearApiKey();
  document.getElementById("sign-out").hidden = true;
  if (err && err.message && !/no API key/i.test(err.message)) {
    loginError.textContent = err.message;
    loginError.hidden = false;
  }
  if (!login.open) {
    login.showModal();
  }
}

async function start() {
  try {
    access = await api.probeScopes();
  } catch (err) {
    if (err instanceof api.ApiError && err.httpStatus === 401) {
      askForKey(err);
      return;
    }
    clear(main).append(errorBox(err));
    return;
  }
  if (login.open) {
    login.close();
  }
  document.body.dataset.auth = access.auth ? "on" : "off";
  document.body.dataset.scopes = [...access.scopes].sort().join(" ");
  document.getElementById("sign-out").hidden = !access.auth;
  await show();
}

api.onUnauthorized(askForKey);

document.getElementById("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const key = document.getElementById("login-key").value.trim();
  if (!key) {
    return;
  }
  loginError.hidden = true;
  api.setApiKey(key);
  document.getElementById("login-key").value = "";
  login.close();
  start();
});

// A key is needed to use the console at all: Escape does not dismiss it.
login.addEventListener("cancel", (ev) => ev.preventDefault());

document.getElementById("sign-out").addEventListener("click", () => {
  loginError.hidden = true;
  askForKey(null);
});

window.addEventListener("hashchange", show);
start();
