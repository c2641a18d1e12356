-- wrk: anonymous joins of the benchmark event (each request makes a new waiting place).
wrk.method = "POST"
wrk.path = "/api/v1/queue/join"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"event_id":"bench"}'
