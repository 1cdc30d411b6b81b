// api.js - the console's only way to keyflowd: the /v1 JSON routes, /metrics
// and /readyz of the origin that served the page, with the API key the user
// typed (session storage only: it goes when the tab does).

const KEY_ITEM = "keyflow.apiKey";

export class ApiError extends Error {
  constructor(httpStatus, body) {
    super(body.message || "HTTP " + httpStatus);
    this.httpStatus = httpStatus;
    this.status = body.status || ""; // the gRPC name, e.g. "NOT_FOUND"
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY_ITEM) || "";
}

export function setApiKey(key) {
  sessionStorage.setItem(KEY_ITEM, key);
}

export function clearApiKey() {
  sessionStorage.removeItem(KEY_ITEM);
}

let unauthorized = () => {};

// Called with the error whenever the server answers 401 (no key, a wrong
// one, a revoked one): the app asks for a key again.
export function onUnauthorized(fn) {
  unauthorized = fn;
}

// One request. Resolves to the parsed JSON body (or the text, with `text`),
// rejects with an ApiError carrying the server's message.
export async function call(method, path, body, { text = false } = {}) {
  const headers = {};
  const key = apiKey();
  if (key) {
    headers.Authorization = "Bearer " + key;
  }
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const raw = await resp.text();
  if (resp.ok && text) {
    return raw;
  }
  let doc;
  try {
    doc = raw ? JSON.parse(raw) : {};
  } catch {
    doc = { message: raw };
  }
  if (!resp.ok) {
    const err = new ApiError(resp.status, doc);
    if (resp.status === 401) {
      unauthorized(err);
    }
    throw err;
  }
  return doc;
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body === undefined ? {} : body);

// A path segment: keys and run IDs may hold '/', '@', spaces.
export const seg = encodeURIComponent;

// "?a=1&b=x" from the object's non-empty values ("" when none).
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") {
      q.set(k, String(v));
    }
  }
  const s = q.toString();
  return s ? "?" + s : "";
}

// What the key may do, for hiding what it may not (the server decides
// anyway). No route says which scopes a key holds, so each scope is asked
// with a request that cannot be executed: a body that is not JSON, or a
// query parameter no request has. keyflowd checks the key and its scope
// before it reads the request, so the answer is 403 without the scope and
// 400 with it, and nothing is done either way. A key limited to name
// prefixes counts as holding the scope; the server refuses names outside.
const PROBES = [
  ["runs:read", "GET", "/v1/runs?consoleProbe=1"],
  ["runs:work", "POST", "/v1/runs/probe:release", "["],
  ["coordinators:read", "GET", "/v1/coordinators/batch/probe/probe?consoleProbe=1"],
  ["coordinators:write", "POST", "/v1/coordinators/batch/probe/probe:flush", "["],
  ["events:send", "POST", "/v1/workflows/probe/keys/probe/events", "["],
  ["functions:read", "GET", "/v1/functions?consoleProbe=1"],
  ["functions:push", "POST", "/v1/functions/probe/dry-run", "["],
];

// Resolves to {auth: false} when keys are off, to {auth: true, scopes: Set}
// with a good key, and rejects with the 401's ApiError when a key is
// needed. Whether keys are on is asked first, without a key: ListRuns
// answers 401 when they are.
export async function probeScopes() {
  if (!apiKey()) {
    await call("GET", "/v1/runs?pageSize=1"); // 200: keys are off; 401 rejects
    return { auth: false, scopes: new Set() };
  }
  const scopes = new Set();
  let refused = null;
  await Promise.all(
    PROBES.map(async ([scope, method, path, body]) => {
      try {
        await call(method, path, body);
        scopes.add(scope);
      } catch (err) {
        if (!(err instanceof ApiError)) {
          throw err;
        }
        if (err.httpStatus === 401) {
          refused = err;
        } else if (err.httpStatus !== 403) { // 403: the key lacks the scope
          scopes.add(scope);
        }
      }
    }),
  );
  if (refused) {
    throw refused;
  }
  // /metrics: 200 with metrics:read or without keys, 403 without the scope.
  try {
    await call("GET", "/metrics", undefined, { text: true });
    scopes.add("metrics:read");
  } catch (err) {
    if (!(err instanceof ApiError) || err.httpStatus !== 403) {
      throw err;
    }
  }
  return { auth: true, scopes };
}
