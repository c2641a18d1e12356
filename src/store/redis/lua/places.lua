-- The places' rules of src/core/queue.rs: a place's record, its end, the deadlines, the
-- sweep, the admission pace and the admission itself, and a place's view. The second part
-- of the rules: it follows rules.lua in the one script (src/store/redis/script.rs), whose
-- locals it uses, and holds.lua follows it.

-- A place record: nonce (16 raw bytes), state ('w' waiting, 'a' admitted, 's' in session),
-- then "joined,admitted,entered," and the user id ('!' .. id when the joiner proved it is
-- that user, '=' .. id when not, empty for anonymous places). Records from before the '!'
-- form read as unproven. Heartbeats live in the ZSET scores, so renewing one never rewrites
-- the record.
local function parse(rec)
  local j, a, e, u = string.match(rec, '^(%d+),(%d+),(%d+),(.*)$', 18)
  local user = nil
  if u ~= '' then user = string.sub(u, 2) end
  return {nonce = string.sub(rec, 1, 16), state = string.sub(rec, 17, 17),
    joined = tonumber(j), adm = tonumber(a), ent = tonumber(e), user = user,
    proven = string.sub(u, 1, 1) == '!'}
end

-- The record of p, or (p nil) of a new place: waiting, joined at `joined`, nonce and user
-- given (a join writes it without a table for the place).
local function encode(p, nonce, user, proven, joined)
  local u = ''
  if not p then
    if user then u = (proven and '!' or '=') .. user end
    return nonce .. 'w' .. fmt(joined) .. ',0,0,' .. u
  end
  if p.user then u = (p.proven and '!' or '=') .. p.user end
  return p.nonce .. p.state .. fmt(p.joined) .. ',' .. fmt(p.adm) .. ',' .. fmt(p.ent) .. ',' .. u
end

-- The live records this script wrote, by seq (a number): read back from here, not from
-- Redis (a join's view, the change log's entry). Every write of a record goes through
-- put_place and every removal through end_place, which keep it true.
local WROTE
on_call(function() WROTE = {} end)

local function put_place(seq, p, rec, c)
  rec = rec or encode(p)
  pend(pchunk(c or chunk(seq)), 'HSET', seq, rec)
  WROTE[num(seq)] = rec
end

local function place(seq)
  return parse(WROTE[num(seq)] or rcall('HGET', pkey(seq), seq))
end

-- Ends a session's holds and extensions (holds.lua, which defines it after these rules).
local release_holds

-- Removes a live place (queue.rs `end`). `at` is when it ended (its deadline, for expiries).
-- `bulk`: the caller drops the waiting ZSETs whole afterwards (clear), so skip the ZREMs.
local function end_place(seq, p, kind, at, bulk)
  if p.state ~= 'w' then
    -- A hold ends (queue.rs `Holds::end`): an expiry's hold ended at its deadline.
    accrue()
    set('hbusy', math.max(M.hbusy - math.max(NOW - at, 0), 0))
    set('hends', M.hends + 1)
  end
  rcall('HDEL', pkey(seq), seq)
  WROTE[num(seq)] = nil
  rcall('HDEL', K_METADATA, seq)
  if p.state == 'w' then
    if not bulk then
      line_remove(seq, p.joined)
      ws_remove(seq)
    end
    N_W = N_W - 1
  elseif p.state == 'a' then
    rcall('ZREM', K_ADM, seq)
    N_AD = N_AD - 1
  else
    rcall('ZREM', K_ASEEN, seq)
    rcall('ZREM', K_AENT, seq)
    -- In this same step: a completed session's holds are sold, any other end releases them.
    release_holds(seq, kind == FX_COMPLETED)
    N_AC = N_AC - 1
    set('ssum', M.ssum + math.max(at - p.ent, 0))
    set('scnt', M.scnt + 1)
  end
  if p.user and rcall('HGET', K_USERS, p.user) == seq then
    rcall('HDEL', K_USERS, p.user)
  end
  if kind == FX_COMPLETED then
    set('completed', M.completed + 1)
  elseif kind == FX_EXPIRED then
    set('expired', M.expired + 1)
    rcall('HSET', K_TOMB, seq, p.nonce)
    rcall('RPUSH', K_TORDER, fmt(NOW) .. ':' .. seq)
    lower_nd(NOW + RETENTION)
  else
    set('left', M.left + 1)
  end
  fx(kind, seq, at)
end

-- The earliest of: a ZSET's lowest score + add; a "time:…" list's first time + add.
local function zfront(key, add)
  local r = rcall('ZRANGE', key, 0, 0, 'WITHSCORES')
  if r[2] then return tonumber(r[2]) + add end
  return NEVER
end

local function lfront(key, add)
  local h = rcall('LINDEX', key, 0)
  if h then return tonumber(string.match(h, '^(%d+):')) + add end
  return NEVER
end

-- The earliest heartbeat of any waiting place + add, or NEVER: K_WINDEX's front, made
-- exact first (an entry left low by removals or renewals is set to its chunk's earliest
-- heartbeat, or dropped, until the front is exact), so that deadlines and the tick's next
-- wake-up are as exact as over one ZSET. Each correction is paid once per change that made
-- an entry low.
local function ws_front(add)
  while true do
    local r = rcall('ZRANGE', K_WINDEX, 0, 0, 'WITHSCORES')
    if not r[2] then return NEVER end
    local w = rcall('ZRANGE', wkey(r[1]), 0, 0, 'WITHSCORES')
    if w[2] and tonumber(w[2]) == tonumber(r[2]) then return tonumber(r[2]) + add end
    WLOW = {}
    if w[2] then
      rcall('ZADD', K_WINDEX, w[2], r[1])
    else
      rcall('ZREM', K_WINDEX, r[1])
    end
  end
end

-- The earliest deadline of any live place (a session's is min(seen + idle, entered + max),
-- so the minimum over sessions is the smaller of the two ZSET fronts), or NEVER.
local function next_deadline()
  local w = ws_front(0)
  if w ~= NEVER then w = math.max(w + M.widle, M.wfloor) end
  -- The earliest admitted place's deadline, exactly (as queue.rs files it): of those
  -- admitted before rkb, the first plus the longer window; of the others, the first from
  -- rkb on plus ttl; and not before rfloor.
  local a = zfront(K_ADM, 0)
  if a ~= NEVER then
    if a < M.rkb then
      a = a + math.max(M.ttl, M.rkept)
      local r = rcall('ZRANGEBYSCORE', K_ADM, fmt(M.rkb), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      if r[2] then a = math.min(a, tonumber(r[2]) + M.ttl) end
    else
      a = a + M.ttl
    end
    a = math.max(a, M.rfloor)
  end
  return math.min(w, a, zfront(K_ASEEN, M.sidle), zfront(K_AENT, M.smax))
end

-- Ends every place whose deadline is at or before NOW; answers whether anything ended.
-- Also forgets tombstones past their retention and slides the admission window.
local function expire_due()
  if NOW < M.nd then return false end
  local due = {}
  local seen = {}
  -- Waiting places: the chunks whose lower bound is due, then the due places in each.
  -- None is due before wfloor (a deadline is max(seen + widle, wfloor)).
  local visited = {}
  if NOW >= M.wfloor then
    visited = rcall('ZRANGEBYSCORE', K_WINDEX, '-inf', fmt(NOW - M.widle))
  end
  for _, c in ipairs(visited) do
    local w = rcall('ZRANGEBYSCORE', wkey(c), '-inf', fmt(NOW - M.widle), 'WITHSCORES')
    for i = 1, #w, 2 do
      due[#due + 1] = {math.max(tonumber(w[i + 1]) + M.widle, M.wfloor), w[i]}
    end
  end
  -- Admitted places past their window by the settings, then due by what a lowered window
  -- kept (rkb, rkept, rfloor).
  local r = rcall('ZRANGEBYSCORE', K_ADM, '-inf', fmt(NOW - M.ttl), 'WITHSCORES')
  for i = 1, #r, 2 do
    local adm = tonumber(r[i + 1])
    local d = adm + M.ttl
    if adm < M.rkb then d = math.max(d, adm + M.rkept) end
    d = math.max(d, M.rfloor)
    if d <= NOW then due[#due + 1] = {d, r[i]} end
  end
  -- A session ends at min(last heartbeat + idle, entry + max): due when either is.
  local function session_due(seq)
    if seen[seq] then return end
    seen[seq] = true
    local ls = tonumber(rcall('ZSCORE', K_ASEEN, seq))
    local en = tonumber(rcall('ZSCORE', K_AENT, seq))
    due[#due + 1] = {math.min(ls + M.sidle, en + M.smax), seq}
  end
  r = rcall('ZRANGEBYSCORE', K_ASEEN, '-inf', fmt(NOW - M.sidle))
  for i = 1, #r do session_due(r[i]) end
  r = rcall('ZRANGEBYSCORE', K_AENT, '-inf', fmt(NOW - M.smax))
  for i = 1, #r do session_due(r[i]) end
  if #due > 1 then
    table.sort(due, function(x, y)
      if x[1] ~= y[1] then return x[1] < y[1] end
      return tonumber(x[2]) < tonumber(y[2])
    end)
  end
  for _, d in ipairs(due) do
    end_place(d[2], place(d[2]), FX_EXPIRED, d[1])
  end
  ws_refresh(visited)
  while true do
    local h = rcall('LINDEX', K_TORDER, 0)
    if not h then break end
    local at, s = string.match(h, '^(%d+):(%d+)$')
    if tonumber(at) + RETENTION > NOW then break end
    rcall('LPOP', K_TORDER)
    rcall('HDEL', K_TOMB, s)
    fx(FX_FORGOTTEN, s, NOW)
  end
  while M.wn > 0 do
    local h = rcall('LINDEX', K_WINDOW, 0)
    if not h then set('wn', 0); break end
    local at, n = string.match(h, '^(%d+):(%d+)$')
    if tonumber(at) + WINDOW > NOW then break end
    rcall('LPOP', K_WINDOW)
    set('wn', M.wn - tonumber(n))
  end
  set('nd', math.min(next_deadline(), lfront(K_TORDER, RETENTION), lfront(K_WINDOW, WINDOW)))
  return #due > 0
end

-- Token bucket behind admit_per_minute (queue.rs `Bucket`), operation for operation.
local function burst()
  return math.max(math.ceil(M.rate / 60.0), 1.0)
end

local function refill()
  local b = burst()
  if M.bprimed ~= 1 then
    set('btok', b)
    set('bprimed', 1)
  elseif NOW > M.blast then
    set('btok', M.btok + (NOW - M.blast) * M.rate / 60000.0)
  end
  set('btok', math.min(M.btok, b))
  set('blast', math.max(M.blast, NOW))
end

local function next_token_at()
  local missing = math.max(1.0 - M.btok, 0.0)
  return M.blast + math.ceil(missing * 60000.0 / M.rate)
end

-- Whether the sale ended (core/lifecycle.rs): by the `end` call, or closes_at reached. It
-- also notes when an operation first found it over by closes_at (`seen`, 0: none did yet;
-- queue.rs `note_end`), so that one stamped earlier (a node whose clock runs behind, a
-- request that waited) still finds it over. Only the first is written, not every later
-- operation. (One function for both: the main chunk may hold 200 locals only.)
local function sale_ended()
  if M.closes > 0 and NOW >= M.closes and M.seen < M.closes then set('seen', NOW) end
  return M.ended == 1 or (M.closes > 0 and math.max(NOW, M.seen) >= M.closes)
end

-- Admits the first in line while there is room and budget (queue.rs `admit`); nobody after
-- the end of the sale.
-- At most END_BATCH admissions a script (M.nadm counts this call's; M.cut says some were
-- left for the tick, which then comes back at once): a resume, a capacity raise or an
-- opening that admits thousands would otherwise hold Redis, every event on it, for the
-- whole step (some 100-200 us a place) and pass an operation's time bound. The rest wait
-- in line, their positions exact, until the next ticks admit them. (M's two fields are
-- not stored: the meta is written from FIELDS.)
-- `extra`: admissions allowed past the bound, for a `reject` join's own (check_reject let
-- it in because it need not wait: it may not be left waiting by a bound that earlier work
-- in the same script used up).
local function admit(extra)
  if M.paused == 1 or before_opening() or sale_ended() then return end
  local cap, rate = limits()
  local k = 0
  local budget = END_BATCH - (M.nadm or 0) + (extra or 0)
  while (cap < 0 or N_AD + N_AC < cap) and N_W > 0 do
    if k >= budget then
      M.cut = true
      break
    end
    if rate > 0 then
      refill()
      if M.btok < 1.0 then break end
      set('btok', M.btok - 1.0)
    end
    accrue()
    local seq = line_next()
    local p = place(seq)
    line_remove(seq, p.joined)
    ws_remove(seq)
    p.state = 'a'
    p.adm = NOW
    put_place(seq, p)
    rcall('ZADD', K_ADM, fmt(NOW), seq)
    lower_nd(math.max(NOW + M.ttl, M.rfloor))
    set('wsum', M.wsum + math.max(NOW - p.joined, 0))
    set('admissions', M.admissions + 1)
    N_W = N_W - 1
    N_AD = N_AD + 1
    k = k + 1
    fx(FX_ADMITTED, seq, NOW)
  end
  M.nadm = (M.nadm or 0) + k
  if k > 0 then
    -- Admissions at the same instant share one window entry.
    local tail = rcall('LINDEX', K_WINDOW, -1)
    local at, n = nil, nil
    if tail then at, n = string.match(tail, '^(%d+):(%d+)$') end
    if at and tonumber(at) == NOW then
      rcall('LSET', K_WINDOW, -1, fmt(NOW) .. ':' .. fmt(tonumber(n) + k))
    else
      rcall('RPUSH', K_WINDOW, fmt(NOW) .. ':' .. fmt(k))
    end
    set('wn', M.wn + k)
    lower_nd(NOW + WINDOW)
    if not M.fadm then set('fadm', NOW) end
  end
end

-- Ends what is due and admits into the room that made (queue.rs `advance`). Only an ending
-- admits here: fresh rate budget is spent by the tick.
-- Also records the opening once NOW reaches it (queue_schedule.rs `note_opening`): in the
-- meta, so that a node whose clock is behind (or this one's after a step back) still finds
-- the sale open: no pre-queue, the seed published. Every operation that sees the time
-- passes here first (a join only when there is something to do: see op_join).
local function advance()
  if M.opens > 0 and NOW >= M.opens and M.opened ~= M.opens then set('opened', M.opens) end
  sale_ended() -- (for its note of the end, as queue.rs `advance` notes it)
  -- Past the opening, a pre-queue still waiting is the opening not yet seen by an
  -- operation: any operation admits it (queue.rs `advance`).
  if expire_due() or (M.npre > 0 and M.opens > 0 and not before_opening()) then admit() end
end

-- The place behind a token, or the error its token answers.
local function lookup(seq, nonce)
  local rec = rcall('HGET', pkey(seq), seq)
  if rec and string.sub(rec, 1, 16) == nonce then
    -- Waiting when the sale ended: gone, even before the sweep removes it.
    if string.sub(rec, 17, 17) == 'w' and sale_ended() then return nil, 'TOKEN_NOT_FOUND' end
    return parse(rec)
  end
  if rcall('HGET', K_TOMB, seq) == nonce then return nil, 'TOKEN_EXPIRED' end
  return nil, 'TOKEN_NOT_FOUND'
end

-- Renews the heartbeat of a waiting place or a session (never moves it back).
local function renew(seq, p)
  if p.state == 'w' then
    rcall('ZADD', wkey(chunk(seq)), 'XX', 'GT', fmt(NOW), seq)
  elseif p.state == 's' then
    rcall('ZADD', K_ASEEN, 'XX', 'GT', fmt(NOW), seq)
  end
end

-- The raw facts of a place; the Rust side turns them into a PlaceView. (The last heartbeat
-- matters only for a session's deadline.) `newest`: seq is the place a join just made and
-- p its record as written (admit() may have admitted it since, the one change a join
-- makes to it after writing it: p is then read again).
local function view(seq, p, newest)
  if newest and string.sub(WROTE[num(seq)], 17, 17) ~= 'w' then p, newest = nil, false end
  p = p or place(seq)
  local pos, ls, extra = 0, 0, 0
  local pre = p.state == 'w' and in_prequeue(p.joined)
  if newest and p.state == 'w' and not pre then
    -- The newest seq is the last of the line: behind every waiting place, pre-queue
    -- included (line_position counts it ahead), so its place is their count.
    pos = N_W
  elseif p.state == 'w' and not (pre and before_opening()) then
    -- (Before the opening a pre-queue place has no position to show.)
    pos = line_position(seq, p.joined)
  elseif p.state == 's' then
    ls = tonumber(rcall('ZSCORE', K_ASEEN, seq))
    -- What extensions added to the session's maximum (its entry score moved by as much).
    extra = tonumber(rcall('ZSCORE', K_AENT, seq)) - p.ent
  end
  -- The opening as the view counts down to it: 0 once reached (by a clock, or recorded).
  local opens = 0
  if before_opening() then opens = M.opens end
  -- An admitted place's deadline where a lowered window kept it later than its admission
  -- plus the window (rkb: its `enter_within_sec` counts down to it), else 0.
  local kept = 0
  if p.state == 'a' then
    local d = p.adm + M.ttl
    if p.adm < M.rkb then d = math.max(d, p.adm + M.rkept) end
    d = math.max(d, M.rfloor)
    if d > p.adm + M.ttl then kept = d end
  end
  return {seq, p.nonce, p.state, p.user or false, p.joined, p.adm, p.ent, ls, pos, N_W,
    pre and 1 or 0, opens, M.method, extra, p.proven and 1 or 0, kept}
end
