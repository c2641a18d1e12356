-- wrk: joins whose waiting tokens are appended to `-- FILE`, for the status phases.
wrk.method = "POST"
wrk.path = "/api/v1/queue/join"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"event_id":"bench"}'

local out

function init(args)
  out = io.open(args[1], "a")
end

function response(status, headers, body)
  local t = body:match('"waiting_token":"([^"]+)"')
  if t then
    out:write(t, "\n")
    out:flush()
  end
end
