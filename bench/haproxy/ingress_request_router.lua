-- ingress_request_router.lua: the reference data plane for the benchmark.
--
-- An HAProxy 2.6 Lua action that does what Ray Serve's `ingress_request_router.lua.tmpl`
-- (pool version, PR #64489) does, written from /work/shared/spec/ray-serve-ingress.md
-- §1 step 7, §2.1 and §4:
--   * per-app router pool, built by the caller (co-located routers sorted by (host, port));
--   * `_rr_cursor`: one table per Lua state; loaded with `lua-load-per-thread`, so one cursor
--     per HAProxy thread, per app. It advances exactly once per request;
--   * try `pool[(start + i) % n + 1]` for i = 0 .. n-1; fail over to the next router ONLY when
--     `call_router` returns nil (connect, send or receive error / timeout). A reply that is
--     present but not 200 is final (`router_non_200`), as is a 200 without a usable
--     `replica_id` (`unparseable_replica_id`);
--   * every router call is a NEW TCP connection (`core.tcp()`), HTTP/1.0 with
--     `Connection: close`, reply read until the router closes it (`receive("*a")`);
--   * the replica id is mapped to an HAProxy server name; the frontend then sends the request to
--     the `<backend>-via-ingress-request-router` backend, where `use-server` pins it.
--
-- Ray renders the tables into the template with string.Template; here the benchmark writes them
-- to a small generated Lua file that is loaded (per thread) just before this one and defines:
--   IRR_TIMEOUT_S        number   RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_TIMEOUT_S (5)
--   IRR_FORWARD_BODY     boolean  RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY (false)
--   IRR_SESSION_HEADER   string   RAY_SERVE_SESSION_ID_HEADER_KEY ("x-session-id")
--   IRR_ROUTERS          { ["http-llm"] = { {host=, port=, host_header=}, ... } }
--   IRR_REPLICA_TARGETS  { ["http-llm"] = { ["SERVE_REPLICA::llm#LLMServer#r1"] = "<server>" } }
--
-- Like LUA-pool-b, the client's (or the frontend-generated) x-request-id is forwarded to the
-- router, so both legs carry the same id (ingressd does the same; keeps the features equal).

local TIMEOUT_S = IRR_TIMEOUT_S or 5
local FORWARD_BODY = IRR_FORWARD_BODY or false
local SESSION_HEADER = string.lower(IRR_SESSION_HEADER or "x-session-id")
local ROUTERS = IRR_ROUTERS or {}
local REPLICA_TARGETS = IRR_REPLICA_TARGETS or {}

-- Per-thread (per Lua state) round-robin cursor, keyed by app (backend name).
local _rr_cursor = {}

-- Returns the raw reply string, or nil when the router gave no reply.
local function call_router(router, body, extra_headers)
  local sock = core.tcp()
  sock:settimeout(TIMEOUT_S)
  local ok = sock:connect(router.host, router.port)
  if not ok then
    sock:close()
    return nil
  end
  local request = "POST /internal/route HTTP/1.0\r\n" ..
                  "Host: " .. router.host_header .. "\r\n" ..
                  "Connection: close\r\n" ..
                  "Content-Type: application/json\r\n" ..
                  "Content-Length: " .. #body .. "\r\n" ..
                  extra_headers ..
                  "\r\n" ..
                  body
  local sent = sock:send(request)
  if not sent then
    sock:close()
    return nil
  end
  local reply = sock:receive("*a")
  sock:close()
  return reply
end

local function first_header(headers, name)
  local v = headers[name]
  if v ~= nil and v[0] ~= nil then
    return v[0]
  end
  return nil
end

-- Client Content-Length when it is larger than what was buffered for the router; else nil.
-- A chunked request (no Content-Length) is never flagged.
local function truncated_full_length(headers, buffered)
  local cl = first_header(headers, "content-length")
  if cl == nil then
    return nil
  end
  local n = tonumber(cl)
  if n ~= nil and n > buffered then
    return n
  end
  return nil
end

local function fail(txn, reason)
  txn:set_var("txn.ingress_request_router_failed", reason)
end

local function route_via_ingress_request_router(txn)
  local app = txn:get_var("txn.ingress_request_router_app")
  if app == nil then
    return
  end
  local pool = ROUTERS[app]
  local replicas = REPLICA_TARGETS[app]
  if pool == nil or replicas == nil then
    return -- app has no map entry: silent return, primary backend (§4.4)
  end
  local n = #pool
  if n == 0 then
    -- the #64489 Lua has no guard here (`% 0`); an explicit failure is the sane reading
    fail(txn, "router_unreachable")
    return
  end

  local headers = txn.http:req_get_headers()
  local body = ""
  local extra = ""
  if FORWARD_BODY then
    body = txn.sf:req_body() or ""
    local full = truncated_full_length(headers, #body)
    if full ~= nil then
      extra = extra .. "X-Body-Truncated: " .. #body .. "/" .. full .. "\r\n"
    end
  end
  if SESSION_HEADER ~= "" then
    local sid = first_header(headers, SESSION_HEADER)
    if sid == nil then
      local alt = string.gsub(SESSION_HEADER, "[-_]", { ["-"] = "_", ["_"] = "-" })
      sid = first_header(headers, alt)
    end
    if sid ~= nil then
      extra = extra .. SESSION_HEADER .. ": " .. sid .. "\r\n"
    end
  end
  local rid = first_header(headers, "x-request-id")
  if rid ~= nil then
    extra = extra .. "x-request-id: " .. rid .. "\r\n"
  end

  local start = _rr_cursor[app] or 0
  _rr_cursor[app] = (start + 1) % n

  local reply = nil
  for i = 0, n - 1 do
    reply = call_router(pool[(start + i) % n + 1], body, extra)
    if reply ~= nil then
      break
    end
  end
  if reply == nil then
    fail(txn, "router_unreachable")
    return
  end
  if not string.match(reply, "^HTTP/[%d%.]+ 200") then
    fail(txn, "router_non_200")
    return
  end
  local sep = string.find(reply, "\r\n\r\n", 1, true)
  local reply_body = sep and string.sub(reply, sep + 4) or ""
  local replica_id = string.match(reply_body, '"replica_id"%s*:%s*"([^"]+)"')
  if replica_id == nil then
    fail(txn, "unparseable_replica_id")
    return
  end
  local server = replicas[replica_id]
  if server == nil then
    fail(txn, "unknown_replica_id")
    return
  end
  txn:set_var("txn.ingress_request_router_target", server)
  txn:set_var("txn.via_ingress_request_router", true)
end

core.register_action("route_via_ingress_request_router", { "http-req" },
                     route_via_ingress_request_router, 0)
