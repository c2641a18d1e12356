-- wrk: status polls of random places; `-- FILE` names the file of waiting tokens.
local tokens = {}
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("id", counter)
end

function init(args)
  for line in io.lines(args[1]) do
    tokens[#tokens + 1] = line
  end
  math.randomseed(os.time() * 1000 + (id or 0))
end

function request()
  return wrk.format("GET", "/api/v1/queue/status?token=" .. tokens[math.random(#tokens)])
end
