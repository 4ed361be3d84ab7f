-- wrk script for benchmarks/frontend.py: POSTs one JSON body, read once from a file, to one path.
-- BODY_FILE: the body's file; BODY_PATH: where it goes (default /v1/embeddings).
local file = assert(io.open(os.getenv("BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.path = os.getenv("BODY_PATH") or "/v1/embeddings"
wrk.headers["Content-Type"] = "application/json"
