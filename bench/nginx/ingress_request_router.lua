-- ingress_request_router.lua: the nginx + lua-nginx-module anchor of the benchmark (issue #22).
--
-- The same routing rules as Ray's HAProxy Lua (bench/haproxy/ingress_request_router.lua, from
-- /work/shared/spec/ray-serve-ingress.md §1 step 7, §2.1 and §4), built the way an operator
-- would build it on nginx instead, with what lua-nginx-module offers and HAProxy's Lua lacks:
--
--   * router calls over POOLED keep-alive cosockets (`ngx.socket.tcp`, `sock:setkeepalive`):
--     HTTP/1.1 `POST /internal/route`, no `Connection: close`; the reply is read by its framing
--     (Content-Length, chunked, or to the close when it has neither), so the connection goes back
--     to the worker's pool and the next call reuses it;
--   * per-worker round-robin cursor per app (`_rr_cursor`, one Lua VM per nginx worker), advanced
--     exactly once per request; try order `pool[(start + i) % n + 1]`, i = 0 .. n-1;
--   * fail over to the next router ONLY when a router gave no reply (connect, send or receive
--     error / timeout). A reply that is not 200 is final (`router_non_200`), as is a 200 without a
--     usable `replica_id` (`unparseable_replica_id`). A pooled connection that turns out stale
--     (closed by the router while idle) before any reply byte is retried once on a fresh
--     connection to the same router, not counted as the router's failure (ingressd does the same,
--     docs/contract.md §4.2);
--   * the chosen replica is pinned in `balancer_by_lua` (`ngx.balancer.set_current_peer`) of an
--     upstream with `keepalive`, so replica connections are pooled too; a connect failure to the
--     pinned replica is retried on the app's next replica (HAProxy: `retry-on conn-failure` +
--     `option redispatch`; nginx: `proxy_next_upstream error timeout`, which never re-sends a POST
--     once it was written);
--   * 503 `Ingress request router failed: <reason>` with `X-Serve-Reason` on failure (§2.2).
--
-- The tables come from a generated module `irr_tables` (bench/nginx/render.py writes it from the
-- bench's topology file, like run.sh writes HAProxy's irr_tables.lua):
--   session_header  string   RAY_SERVE_SESSION_ID_HEADER_KEY ("x-session-id"; "" = off)
--   routers         { [app] = { {host=, port=, host_header=}, ... } }   the pool, co-located first
--   replicas        { [app] = { {id=, host=, port=}, ... } }             the app's replicas
-- The router timeout (RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_TIMEOUT_S, 5 s) is nginx.conf's
-- lua_socket_connect_timeout / lua_socket_send_timeout / lua_socket_read_timeout, per operation
-- like HAProxy's settimeout (spec §6 q6).
-- Router body forwarding (RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY) is off, Ray's default and
-- the bench's setting for every proxy; it is not implemented here.

local ngx = ngx
local balancer = require "ngx.balancer"
local T = require "irr_tables"

local tcp = ngx.socket.tcp
local var = ngx.var
local str_match, str_lower, str_sub, str_find = string.match, string.lower, string.sub, string.find
local tonumber, concat = tonumber, table.concat

local KEEPALIVE_IDLE_MS = 60000   -- how long an idle router connection stays in the pool
local POOL_SIZE = 512             -- idle router connections kept per router, per worker

-- the session header is read through its nginx variable: $http_x_session_id matches the header
-- whatever its case and with '-' or '_' (with `underscores_in_headers on`), Ray's two variants
local SESSION_HEADER = str_lower(T.session_header or "x-session-id")
local SESSION_VAR = SESSION_HEADER ~= "" and ("http_" .. SESSION_HEADER:gsub("-", "_")) or nil
local SESSION_LINE = "\r\n" .. SESSION_HEADER .. ": "

local _M = {}

-- Per app: the pool with each router's request head precomputed, and replica_id -> replica.
local POOLS, BY_ID, LISTS = {}, {}, {}
for app, pool in pairs(T.routers or {}) do
  local p = {}
  for i, r in ipairs(pool) do
    p[i] = { host = r.host, port = r.port,
             head = "POST /internal/route HTTP/1.1\r\n" ..
                    "Host: " .. r.host_header .. "\r\n" ..
                    "Content-Type: application/json\r\n" ..
                    "Content-Length: 0\r\n" }
  end
  POOLS[app] = p
end
for app, list in pairs(T.replicas or {}) do
  local by = {}
  for i, r in ipairs(list) do
    by[r.id] = { host = r.host, port = r.port, index = i }
  end
  BY_ID[app], LISTS[app] = by, list
end

-- Per-worker (per Lua VM) round-robin cursor, keyed by app.
local _rr_cursor = {}

local RECV_MAX = 16384

-- buf with the next bytes the router sent appended; nil, err when there are none
local function more(sock, buf)
  local data, err = sock:receiveany(RECV_MAX)
  if not data then
    return nil, err
  end
  return buf .. data
end

-- buf holding a full line from pos on, and the position of that line's CRLF
local function line_at(sock, buf, pos)
  local eol = str_find(buf, "\r\n", pos, true)
  while not eol do
    local err
    buf, err = more(sock, buf)
    if not buf then
      return nil, err
    end
    eol = str_find(buf, "\r\n", pos, true)
  end
  return buf, eol
end

-- whether the header line that starts with `name` (CRLF, name, colon) holds `word`
local function header_has(head, name, word)
  local at = str_find(head, name, 1, true)
  if not at then
    return false
  end
  local eol = str_find(head, "\r\n", at + #name, true)
  local hit = str_find(head, word, at + #name, true)
  return hit ~= nil and hit < eol
end

-- Reads one HTTP/1.x reply: status, body, keep (whether the connection may go back to the pool);
-- nil, err when there was no complete reply. A reply normally arrives in one piece, so the usual
-- case is one receiveany() and a few string.find()s over the head: no per-line receive calls.
local function read_reply(sock)
  local buf, err = sock:receiveany(RECV_MAX)
  if not buf then
    return nil, err
  end
  local head_end = str_find(buf, "\r\n\r\n", 1, true)
  while not head_end do
    if #buf > 65536 then
      return nil, "reply head too large"
    end
    buf, err = more(sock, buf)
    if not buf then
      return nil, err
    end
    head_end = str_find(buf, "\r\n\r\n", 1, true)
  end
  -- the status line and the header lines, each ending in CRLF, lower-cased for the lookups;
  -- headers are found with plain find(), patterns only anchored at a known place (an unanchored
  -- Lua pattern is tried at every position of the head: callgrind, 94k instead of 65k
  -- instructions per routed request; reading line by line with receive("*l"): 80k)
  local head = str_lower(str_sub(buf, 1, head_end + 1))
  local status = tonumber(str_match(head, "^http/%d+%.%d+ (%d%d%d)")) or 0
  local keep = str_sub(head, 1, 8) ~= "http/1.0"
  local at = str_find(head, "\r\nconnection:", 1, true)
  local conn = at and str_match(head, "^[ \t]*([%w%-]+)", at + 13)
  if conn == "close" then
    keep = false
  elseif conn == "keep-alive" then
    keep = true
  end
  local pos = head_end + 4              -- the body's first byte
  local body
  if status == 204 or status == 304 then
    body = ""
  elseif header_has(head, "\r\ntransfer-encoding:", "chunked") then
    local parts, eol = {}, nil
    while true do
      buf, eol = line_at(sock, buf, pos)
      if not buf then return nil, eol end
      local hex = str_match(buf, "^%x+", pos)
      local size = hex and tonumber(hex, 16)
      if not size then return nil, "bad chunk" end
      pos = eol + 2
      if size == 0 then
        repeat                          -- trailers, up to an empty line
          buf, eol = line_at(sock, buf, pos)
          if not buf then return nil, eol end
          local empty = eol == pos
          pos = eol + 2
        until empty
        break
      end
      while #buf < pos + size + 1 do
        buf, err = more(sock, buf)
        if not buf then return nil, err end
      end
      parts[#parts + 1] = str_sub(buf, pos, pos + size - 1)
      pos = pos + size + 2
    end
    body = concat(parts)
  else
    at = str_find(head, "\r\ncontent-length:", 1, true)
    local len = at and str_match(head, "^[ \t]*(%d+)", at + 17)
    if len then
      local last = pos + tonumber(len) - 1
      while #buf < last do
        buf, err = more(sock, buf)
        if not buf then return nil, err end
      end
      body = str_sub(buf, pos, last)
      pos = last + 1
    else
      while true do                     -- neither: the body ends when the router closes
        local data
        data, err = sock:receiveany(RECV_MAX)
        if not data then
          if err == "closed" then break end
          return nil, err
        end
        buf = buf .. data
      end
      body = str_sub(buf, pos)
      keep = false
    end
  end
  if pos <= #buf then
    keep = false                        -- bytes after the reply: do not reuse the connection
  end
  return status, body, keep
end

-- One router call. Returns status, body; or nil when the router gave no reply.
local function call_router(router, request)
  for _ = 1, 2 do
    local sock = tcp()                -- timeouts: lua_socket_*_timeout in nginx.conf
    local ok = sock:connect(router.host, router.port)
    if not ok then
      return nil                      -- refused / timed out: the next router
    end
    local reused = sock:getreusedtimes() > 0
    local status, body, keep, err
    ok, err = sock:send(request)
    if ok then
      status, body, keep = read_reply(sock)
      if status then
        if keep then
          sock:setkeepalive(KEEPALIVE_IDLE_MS, POOL_SIZE)
        else
          sock:close()
        end
        return status, body
      end
      err = body
    end
    sock:close()
    -- a stale pooled connection (closed while idle): once more on a fresh connection; a
    -- timeout, or any failure on a fresh connection, is the router's
    if not reused or err == "timeout" then
      return nil
    end
  end
  return nil
end

local function fail(reason)
  ngx.status = 503
  ngx.header["Content-Type"] = "text/plain"
  ngx.header["X-Serve-Reason"] = reason
  ngx.print("Ingress request router failed: ", reason)
  return ngx.exit(ngx.HTTP_OK)
end

-- access_by_lua of an app's POSTs (nginx.conf: `if ($request_method = POST)` in the app's
-- location, so other methods never enter Lua and go to the app's least_conn upstream): ask a
-- router, pin the reply's replica.
function _M.route(app)
  local pool = POOLS[app]
  local n = pool and #pool or 0
  if n == 0 then
    return fail("router_unreachable")
  end
  -- the request as pieces (cosocket send takes a table: no string is built): the router's
  -- precomputed head, [session header,] X-Request-Id (the client's, or the one nginx made for
  -- this request: the same id as on the replica request), end of head
  local request
  local sid = SESSION_VAR and var[SESSION_VAR]
  if sid then
    request = { "", "X-Request-Id: ", var.irr_request_id, SESSION_LINE, sid, "\r\n\r\n" }
  else
    request = { "", "X-Request-Id: ", var.irr_request_id, "\r\n\r\n" }
  end

  local start = _rr_cursor[app] or 0
  _rr_cursor[app] = (start + 1) % n

  local status, body
  for i = 0, n - 1 do
    local router = pool[(start + i) % n + 1]
    request[1] = router.head
    status, body = call_router(router, request)
    if status then
      break
    end
  end
  if not status then
    return fail("router_unreachable")
  end
  if status ~= 200 then
    return fail("router_non_200")
  end
  -- Ray's `"replica_id"\s*:\s*"([^"]+)"`, found with a plain find and matched where it is
  local replica_id
  local at = str_find(body, '"replica_id"', 1, true)
  while at and not replica_id do
    replica_id = str_match(body, '^%s*:%s*"([^"]+)"', at + 12)
    at = str_find(body, '"replica_id"', at + 12, true)
  end
  if not replica_id then
    return fail("unparseable_replica_id")
  end
  local replica = BY_ID[app][replica_id]
  if not replica then
    return fail("unknown_replica_id")
  end
  local ctx = ngx.ctx
  ctx.irr_app = app
  ctx.irr_replica = replica
end

-- balancer_by_lua of the via-router upstream: the pinned replica; after a failed connect (a
-- retry, proxy_next_upstream), the app's next replica.
function _M.balance()
  local ctx = ngx.ctx
  local replica = ctx.irr_replica
  if not replica then
    return ngx.exit(500)
  end
  local list = LISTS[ctx.irr_app]
  if balancer.get_last_failure() then
    local tries = (ctx.irr_tries or 0) + 1
    ctx.irr_tries = tries
    replica = list[(replica.index - 1 + tries) % #list + 1]
  elseif #list > 1 then
    balancer.set_more_tries(#list > 3 and 2 or #list - 1)
  end
  local ok, err = balancer.set_current_peer(replica.host, replica.port)
  if not ok then
    ngx.log(ngx.ERR, "set_current_peer: ", err)
    return ngx.exit(500)
  end
end

return _M
