-- http_load.lua - wrk script for keyflowd's HTTP gateway (used by bench/run.sh).
--
-- KF_HTTP_MODE=send    POST /v1/workflows/{workflow}/keys/{key}/events with a
--                      debounce rule whose window stays open for the run, keys
--                      drawn uniformly from KF_KEYS; the key "key:NNNNNN" goes
--                      percent-encoded in the path, as a real client sends it.
-- KF_HTTP_MODE=healthz GET /healthz, the HTTP no-op baseline.
--
-- Requests are formatted once per thread in init(), so wrk spends its time on
-- the wire and not in Lua (it shares the two cores with the server).
-- done() prints one JSON line (kind "http_load") that run.sh collects; a
-- non-2xx/3xx reply counts in errors.status, so failures stay visible.

local mode = os.getenv("KF_HTTP_MODE") or "send"
local workflow = os.getenv("KF_WORKFLOW") or "bench-http"
local keys = tonumber(os.getenv("KF_KEYS") or "10000")
local connections = tonumber(os.getenv("KF_CONNECTIONS") or "0")

local thread_count = 0
local prepared = {}

function setup(thread)
   thread_count = thread_count + 1
   thread:set("thread_id", thread_count)
end

function init(args)
   -- Distinct seeds per thread, or every thread would walk the same keys.
   math.randomseed(os.time() * 1000 + (thread_id or 0))
   if mode == "healthz" then
      prepared[1] = wrk.format("GET", "/healthz")
      return
   end
   local body = '{"rule":{"kind":"debounce","windowMs":60000},"input":{"n":1}}'
   local headers = { ["Content-Type"] = "application/json" }
   for i = 0, keys - 1 do
      local path = string.format("/v1/workflows/%s/keys/key%%3A%06d/events", workflow, i)
      prepared[i + 1] = wrk.format("POST", path, headers, body)
   end
end

function request()
   if #prepared == 1 then
      return prepared[1]
   end
   return prepared[math.random(#prepared)]
end

function done(summary, latency, requests)
   local e = summary.errors
   local seconds = summary.duration / 1e6
   local failed = e.status + e.timeout
   local ok = summary.requests - e.status
   io.write(string.format(
      '{"kind":"http_load","mode":"%s","connections":%d,"threads":%d,"requests":%d,' ..
      '"ok":%d,"duration_s":%.3f,"errors":{"connect":%d,"read":%d,"write":%d,' ..
      '"status":%d,"timeout":%d},"error_total":%d,"throughput_per_s":%.1f,' ..
      '"p50_us":%.1f,"p99_us":%.1f,"p999_us":%.1f,"max_us":%.1f,"mean_us":%.1f}\n',
      mode, connections, thread_count, summary.requests, ok, seconds, e.connect, e.read,
      e.write, e.status, e.timeout, failed + e.connect + e.read + e.write,
      seconds > 0 and ok / seconds or 0, latency:percentile(50), latency:percentile(99),
      latency:percentile(99.9), latency.max, latency.mean))
end
