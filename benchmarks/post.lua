-- wrk script: POST the JSON body in $BENCH_BODY to the path in $BENCH_PATH.
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.path = os.getenv("BENCH_PATH")
wrk.headers["Content-Type"] = "application/json"
