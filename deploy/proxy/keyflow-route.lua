-- keyflow-route.lua: HAProxy sends each keyflow HTTP request to the
-- keyflowd process serving its key's partition (docs/scaling.md), computing
-- the partition as keyflowd does (kf-hash-1, pinned by
-- tests/partition/vectors.json). Loaded by the configuration that
-- make-haproxy-config.sh writes; reads the placement file named by the
-- KEYFLOW_PLACEMENT environment variable (set in that configuration).
--
-- The fetch lua.keyflow_backend answers the backend of a request:
--   /v1/workflows/W/keys/K/...            the coordinator (W, K)'s node
--   /v1/coordinators/KIND/W/K...          the same
--   /v1/runs/RUN_ID...                    the partition in the run ID
--   /v1/functions/F/keys/K                the function key K (one key column)
--   /nodes/NAME/...                       node NAME (the configuration strips
--                                         the prefix): calls that every
--                                         process must get, one node at a time
--   anything else                         kf_any (any node, round robin)
-- Backends are named kf_<node>; a partition no node serves goes to kf_any,
-- whose answer (421, naming the owner) says what is wrong.
--
-- gRPC requests (content-type application/grpc...) carry no key in their
-- path (/keyflow.v1.Service/Method), so they are routed by metadata, each
-- value percent-encoded as a path segment is:
--   keyflow-workflow: W + keyflow-key: K  the coordinator (W, K)'s node
--   keyflow-key: K1,K2,...                the function key of columns
--                                         K1, K2, ... (a literal comma in a
--                                         column is %2C)
--   keyflow-run-id: RUN_ID                the partition in the run ID
--   neither                               kf_grpc_any (round robin)
-- to the backends kf_grpc_<node> and kf_grpc_any (HTTP/2 to the nodes'
-- gRPC ports). The header is trusted only for routing: a header naming
-- another key than the request's sends it to a node that refuses it
-- (FAILED_PRECONDITION naming the owner), never to a wrong store.

local count = nil
local owner = {} -- partition -> node name

local function parse_set(text, n)
  local out = {}
  for item in string.gmatch(text, "[^,]+") do
    local a, b = string.match(item, "^(%d+)-(%d+)$")
    if a == nil then
      a = string.match(item, "^(%d+)$")
      b = a
    end
    if a == nil then
      error("placement: bad partition set " .. text)
    end
    for p = tonumber(a), tonumber(b) do
      if p >= n then
        error("placement: partition " .. p .. " of " .. n)
      end
      out[#out + 1] = p
    end
  end
  return out
end

local function load_placement(path)
  for line in io.lines(path) do
    line = string.gsub(line, "#.*", "")
    local n = string.match(line, "^%s*partitions%s+(%d+)%s*$")
    if n ~= nil then
      count = tonumber(n)
    end
    local name, set = string.match(line, "^%s*node%s+(%S+)%s+(%S+)")
    if name ~= nil then
      if count == nil then
        error("placement: 'partitions N' must come before the nodes")
      end
      for _, p in ipairs(parse_set(set, count)) do
        owner[p] = name
      end
    end
  end
  if count == nil then
    error("placement: no 'partitions N' line in " .. path)
  end
end

-- kf-hash-1: FNV-1a (32 bits) finished with MurmurHash3's fmix32.
local function kf_hash(s)
  local h = 2166136261
  for i = 1, #s do
    h = ((h ~ string.byte(s, i)) * 16777619) & 0xffffffff
  end
  h = h ~ (h >> 16)
  h = (h * 0x85ebca6b) & 0xffffffff
  h = h ~ (h >> 13)
  h = (h * 0xc2b2ae35) & 0xffffffff
  h = h ~ (h >> 16)
  return h
end

-- A key's canonical form: per column its length (u32 big-endian), its bytes.
local function canonical(columns)
  local out = {}
  for _, c in ipairs(columns) do
    out[#out + 1] = string.pack(">I4", #c) .. c
  end
  return table.concat(out)
end

local function unescape(s)
  return (string.gsub(s, "%%(%x%x)", function(hex) return string.char(tonumber(hex, 16)) end))
end

-- The partition a run ID names (its UUIDv7's rand_a bits), or nil.
local function of_run_id(run_id)
  local uuid = string.match(run_id, "@([^@]*)$")
  if uuid == nil or #uuid ~= 36 or string.sub(uuid, 15, 15) ~= "7" then
    return nil
  end
  local p = tonumber(string.sub(uuid, 16, 18), 16)
  if p == nil or p >= count then
    return nil
  end
  return p
end

local function partition_of(path)
  local w, k = string.match(path, "^/v1/workflows/([^/]+)/keys/([^/]+)/")
  if w == nil then
    w, k = string.match(path, "^/v1/coordinators/[^/]+/([^/]+)/([^/:]+)")
  end
  if w ~= nil then
    return kf_hash(canonical({unescape(w), unescape(k)})) % count
  end
  local run_id = string.match(path, "^/v1/runs/([^/:]+)")
  if run_id ~= nil then
    return of_run_id(unescape(run_id))
  end
  local key = string.match(path, "^/v1/functions/[^/]+/keys/([^/]+)$")
  if key ~= nil then
    return kf_hash(canonical({unescape(key)})) % count
  end
  return nil
end

-- Every value of request header `name` (lower case), in order, or nil.
local function header_values(headers, name)
  local h = headers[name]
  if h == nil then
    return nil
  end
  local out = {}
  for i = 0, #h do -- HAProxy numbers a header's values from 0
    if h[i] ~= nil then
      out[#out + 1] = h[i]
    end
  end
  return out
end

-- The partition a gRPC request's keyflow-* metadata names, or nil.
local function partition_of_grpc(headers)
  local runs = header_values(headers, "keyflow-run-id")
  if runs ~= nil then
    if #runs ~= 1 then
      return nil
    end
    return of_run_id(unescape(runs[1]))
  end
  local keys = header_values(headers, "keyflow-key")
  if keys == nil then
    return nil
  end
  -- Repeated values are columns too (HTTP joins them with commas).
  local columns = {}
  for _, v in ipairs(keys) do
    for c in string.gmatch(v .. ",", "([^,]*),") do
      columns[#columns + 1] = unescape(c)
    end
  end
  local workflows = header_values(headers, "keyflow-workflow")
  if workflows ~= nil then
    if #workflows ~= 1 or #columns ~= 1 then
      return nil -- a coordinator's key is one value: not a key of ours
    end
    return kf_hash(canonical({unescape(workflows[1]), columns[1]})) % count
  end
  return kf_hash(canonical(columns)) % count
end

local function is_grpc(headers)
  local ct = headers["content-type"]
  return ct ~= nil and ct[0] ~= nil and string.find(ct[0], "^application/grpc") ~= nil
end

local function backend(txn)
  local headers = txn.http:req_get_headers()
  if is_grpc(headers) then
    local p = partition_of_grpc(headers)
    if p ~= nil and owner[p] ~= nil then
      return "kf_grpc_" .. owner[p]
    end
    return "kf_grpc_any"
  end
  local path = txn.sf:path()
  local node = string.match(path, "^/nodes/([^/]+)/")
  if node ~= nil then
    return "kf_" .. node
  end
  local p = partition_of(path)
  if p ~= nil and owner[p] ~= nil then
    return "kf_" .. owner[p]
  end
  return "kf_any"
end

load_placement(os.getenv("KEYFLOW_PLACEMENT"))
core.register_fetches("keyflow_backend", backend)
