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
