-- wrk script: POST the body in $BENCH_BODY to the path in $BENCH_PATH, as JSON unless
-- $BENCH_HEADER_LENGTH is set (the Open Inference Protocol's binary tensor data extension).
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.path = os.getenv("BENCH_PATH")
local header_length = os.getenv("BENCH_HEADER_LENGTH")
if header_length then
  wrk.headers["Content-Type"] = "application/octet-stream"
  wrk.headers["Inference-Header-Content-Length"] = header_length
else
  wrk.headers["Content-Type"] = "application/json"
end

-- With $BENCH_STATUSES set, count answers by status (and 503s without Retry-After) and print
-- them as one JSON line after the run, with upper bounds on the latency percentiles of the
-- 200s and of the 503s. wrk keeps one latency distribution for all answers; when a share g
-- of them are 200s, the 200s' p99 is at most the overall percentile 100 - g (every 200
-- slower than its own p99 is among the slowest 1% of g, so at most g% of all answers).
if os.getenv("BENCH_STATUSES") then
  local threads = {}

  function setup(thread)
    table.insert(threads, thread)
  end

  function init(args)
    ok, refused, refused_without_retry_after, other = 0, 0, 0, 0
  end

  function response(status, headers, body)
    if status == 200 then
      ok = ok + 1
    elseif status == 503 then
      refused = refused + 1
      if not (headers["retry-after"] or headers["Retry-After"]) then
        refused_without_retry_after = refused_without_retry_after + 1
      end
    else
      other = other + 1
    end
  end

  local function bound(latency, share, q)
    -- Upper bound on the q-th percentile of a share of all answers (share in (0, 1]).
    if share <= 0 then return nil end
    return latency:percentile(math.min(100 - (100 - q) * share, 100)) / 1000.0
  end

  function done(summary, latency, requests)
    local n = {ok = 0, refused = 0, refused_without_retry_after = 0, other = 0}
    for _, thread in ipairs(threads) do
      for key, _ in pairs(n) do
        n[key] = n[key] + thread:get(key)
      end
    end
    local total = n.ok + n.refused + n.other
    local g, r = n.ok / math.max(total, 1), n.refused / math.max(total, 1)
    local function num(x) return x and string.format("%.3f", x) or "null" end
    io.write(string.format(
      'BENCH_STATUSES {"seconds": %.3f, "ok": %d, "refused": %d, '
        .. '"refused_without_retry_after": %d, "other": %d, "socket_errors": %d, '
        .. '"ok_p50_ms_at_most": %s, "ok_p99_ms_at_most": %s, "refused_p99_ms_at_most": %s}\n',
      summary.duration / 1e6, n.ok, n.refused, n.refused_without_retry_after, n.other,
      summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
      num(bound(latency, g, 50)), num(bound(latency, g, 99)), num(bound(latency, r, 99))))
  end
end
