
-- The change log behind the nodes' replicas (src/store/redis/replica.rs), and the two
-- operations only the replicas use. Follows schedule.lua; ops.lua dispatches 'replica' and
-- 'renew' to the functions below.
--
-- K_LOG STREAM: one step per transition that changed anything (a version), the steps of
--       one script call (a batch's operations) together in one entry, appended by
--       flush_meta in the same script, so a replica applying the steps in order goes
--       through the very states Redis went through. An entry is its steps' fields one
--       after the other; each step is: 'v' the log version (lv, one more per step: a
--       replica that sees a jump missed some and resyncs),
--       't' the operation's time (left out when the same as the step before it in the
--       entry), then the numbers LOG_FIELDS names (from the prelude):
--       'm' all of them, comma-separated, in an event's first entry (and in a new
--       incarnation's), or else 'd' those the transition set, as comma-separated pairs of
--       their 0-based place in LOG_FIELDS and their value (lv is 'v'; the rest as in the
--       entry before, which a replica holds: it missed none, or the version jumped; 'inc'
--       is always among them in an entry's first step, so an entry of another
--       incarnation is told apart), or none at all when the step only added one
--       waiting place (a join's; never an entry's first step): its seq/record pair comes
--       at once and the replica counts one more waiting (a replica of an earlier
--       waitroom finds no numbers, refuses the entry and resyncs; it never patches it);
--       then for each place the transition changed, its seq and its record after it ('' once
--       ended; a seq is digits, so the next 'v' starts the next step). Trimmed by
--       versions (log_flush), so a node that falls further behind resyncs from a snapshot. Formatting all the numbers was most of a
--       join's Lua time; a join sets one or two of them.

local function log_meta()
  local out = {}
  for i, f in ipairs(LOG_FIELDS) do
    local v = M[f]
    if f == 'fadm' and not v then v = -1 end
    out[i] = fmt(v or 0)
  end
  return table.concat(out, ',')
end

-- The numbers set since the last entry (LOG_SET, rules.lua), as 'd' carries them, and
-- the incarnation in an entry's first step: a replica that missed a deletion and the new
-- incarnation's first entry (trimmed, or a stream id not above the old one's) must still
-- see that the entry belongs to another incarnation rather than patch the old state with
-- it. (The later steps of an entry are of the same script call, so of its incarnation.)
local function log_changes(first)
  local n = #LOG_SET
  local inc = first and not LOG_SEEN[LOG_AT.inc]
  -- One number and no incarnation (a join: the waiting count): one string, no table.
  if n == 1 and not inc then
    local i = LOG_SET[1]
    local v = M[LOG_FIELDS[i]]
    if i == LOG_AT.fadm and not v then v = -1 end
    return fmt(i - 1) .. ',' .. fmt(v or 0)
  end
  local out = {}
  for k = 1, n do
    local i = LOG_SET[k]
    local v = M[LOG_FIELDS[i]]
    if i == LOG_AT.fadm and not v then v = -1 end
    out[2 * k - 1] = fmt(i - 1)
    out[2 * k] = fmt(v or 0)
  end
  if inc then
    out[#out + 1] = fmt(LOG_AT.inc - 1)
    out[#out + 1] = fmt(M.inc or 0)
  end
  return table.concat(out, ',')
end

-- The entry being built: the XADD and its steps' fields, one step per transition
-- (log_step in rules.lua), written by log_flush as one command at the end of the script (a
-- batch's joins cost one XADD, not one each), or sooner once it grows past LOG_ENTRY_ARGS
-- values (a bound on one command's arguments). LOG_FIRST: the version of its first step.
local LOG_HEAD = 3
local function log_new()
  local args = {'XADD', K_LOG, '*'}
  return args
end
local LOG_PEND, LOG_FIRST
-- The version of the entry's last step: log_flush marks by it, never by M.lv, which in an
-- early flush (from log_append) is already the next step's version, not yet in the entry.
local LOG_LAST
-- (1,500: a full batch of joins, each at its own time, is 6 values a step and 1,539 in all,
-- so it still writes an early entry, the case the trimming must mark right:
-- `a_full_batch_across_the_trim_length_keeps_the_log`. At 2,000 it did while a join's
-- step carried its numbers, 8 values.)
local LOG_ENTRY_ARGS = 1500
-- The time of the entry's last step: a step at the same time leaves out its 't'; and its
-- waiting count.
local LOG_T, LOG_NW
on_call(function()
  LOG_PEND, LOG_FIRST, LOG_LAST, LOG_T, LOG_NW = log_new(), 0, 0, nil, 0
end)

-- Trimming counts versions, not entries (an entry holds any number of them): each time the
-- log passes a multiple of LOG_MAXLEN versions, the id of the entry that passed it is kept
-- in the meta's `lgm`, and the entries before the previous such id go (MINID ~: whole
-- stream nodes only). So the log holds about LOG_MAXLEN to 2 LOG_MAXLEN versions, however
-- they are grouped into entries; a node that falls further behind resyncs from a snapshot.
log_flush = function()
  if #LOG_PEND == LOG_HEAD then return end
  local args = LOG_PEND
  LOG_PEND = log_new()
  if math.floor(LOG_LAST / LOG_MAXLEN) > math.floor((LOG_FIRST - 1) / LOG_MAXLEN) then
    local mark = rcall('HGET', K_META, 'lgm')
    if mark then
      table.insert(args, 3, 'MINID')
      table.insert(args, 4, '~')
      table.insert(args, 5, mark)
    end
    rcall('HSET', K_META, 'lgm', rcall(unpack(args)))
  else
    rcall(unpack(args))
  end
end

-- The step goes straight into the entry, and the tables it needs are reused: a join's
-- step is a few values, and building it in tables of its own (the step, the sets of
-- numbers, the seqs seen) cost Redis more than the XADD that writes it.
log_append = function(whole)
  if #LOG_PEND > LOG_ENTRY_ARGS then log_flush() end
  local P = LOG_PEND
  local n = #P
  -- An entry's first step is whole: its time, the incarnation. A later one leaves out what
  -- the step before it said (the replica carries it on).
  local first = n == LOG_HEAD
  P[n + 1], P[n + 2] = 'v', fmt(M.lv)
  n = n + 2
  if first or NOW ~= LOG_T then
    P[n + 1], P[n + 2] = 't', fmt(NOW)
    n = n + 2
  end
  LOG_T = NOW
  if whole then
    P[n + 1], P[n + 2] = 'm', log_meta()
    n = n + 2
  elseif first or #LOG_SET ~= 1 or LOG_SET[1] ~= LOG_AT.nw or M.nw ~= LOG_NW + 1 then
    P[n + 1], P[n + 2] = 'd', log_changes(first)
    n = n + 2
  end
  -- (else: a step that only added one waiting place, a join's, carries no numbers: its
  -- seq/record pair comes at once, and the replica counts one more waiting.)
  LOG_NW = M.nw
  -- Cleared in place (LOG_SEEN keeps its hash part: no new table, no rehash per step).
  for k = #LOG_SET, 1, -1 do
    LOG_SEEN[LOG_SET[k]] = nil
    LOG_SET[k] = nil
  end
  -- The places the transition changed, once each (a join: its own place alone).
  local nfx = #FX
  if nfx == 3 then
    if FX[1] ~= FX_FORGOTTEN then
      local sq = FX[2]
      local s = fmt(sq)
      P[n + 1], P[n + 2] = s, WROTE[sq] or rcall('HGET', pkey(s), s) or ''
    end
  elseif nfx <= 3000 then
    -- (At most 1,000 places a step as seq/record pairs, so that with LOG_ENTRY_ARGS an
    -- entry stays under 1,500 + 2 × 1,000 and a few values. Not a top-level local: the
    -- EVALSHA form of the script is at Lua's limit of 200 of them.)
    local seen = {}
    for i = 1, nfx, 3 do
      local s = fmt(FX[i + 1])
      if FX[i] ~= FX_FORGOTTEN and not seen[s] then
        seen[s] = true
        P[n + 1], P[n + 2] = s, WROTE[FX[i + 1]] or rcall('HGET', pkey(s), s) or ''
        n = n + 2
      end
    end
  else
    -- A step that changed more places than that (a clear, an opening, a resume, a sweep
    -- of thousands) puts them in one field 'P', "<seq>,<length>:<record>" after one
    -- another: as pairs, the XADD's arguments would pass what `unpack` can give a call
    -- (about 8,000 in Redis's Lua), and the failed XADD, coming after the step's writes,
    -- would leave the event's meta unwritten. One field keeps the step one entry, applied
    -- whole by the replicas.
    local seen, parts = {}, {}
    for i = 1, nfx, 3 do
      local s = fmt(FX[i + 1])
      if FX[i] ~= FX_FORGOTTEN and not seen[s] then
        seen[s] = true
        local rec = WROTE[FX[i + 1]] or rcall('HGET', pkey(s), s) or ''
        parts[#parts + 1] = s .. ',' .. #rec .. ':' .. rec
      end
    end
    P[n + 1], P[n + 2] = 'P', table.concat(parts)
  end
  if first then LOG_FIRST = M.lv end
  LOG_LAST = M.lv
end

-- The live places of the chunks from `from` on, as seq/record pairs, in one bounded piece:
-- it stops after SNAPSHOT_PLACES places or SNAPSHOT_CHUNKS chunks. Answers the pairs and
-- the chunk to go on from, -1 after the last chunk (the one of the next seq).
local SNAPSHOT_CHUNKS, SNAPSHOT_PLACES = 1024, 4096

local function chunk_places(from)
  local out = {}
  local last = chunk(M.seq)
  local c = from
  while c <= last and c < from + SNAPSHOT_CHUNKS and #out < 2 * SNAPSHOT_PLACES do
    for _, v in ipairs(rcall('HGETALL', pchunk(c))) do out[#out + 1] = v end
    c = c + 1
  end
  if c > last then c = -1 end
  return out, c
end

-- A replica's starting point: the numbers and the id of the last log entry (the replica
-- reads on after it), read together, and the first piece of the live places; `places`
-- (replica_places) answers the next pieces. A place read in a later piece may be newer
-- than the numbers: the log entries after the id bring every place they changed to its
-- state at the end, so the replica answers only once it read the log past the last piece.
local function replica_snapshot()
  local last = rcall('XREVRANGE', K_LOG, '+', '-', 'COUNT', 1)
  local id = '0-0'
  if last[1] then id = last[1][1] end
  local places, next = chunk_places(0)
  return finish('OK', {log_meta(), id, places, next})
end

local function replica_places(from)
  local places, next = chunk_places(from)
  return finish('OK', {places, next})
end

-- Renewals a node collected from the polls its replica answered: ARGV holds (seq, time)
-- pairs. Each renews its waiting place as the poll would have at that time: only if the
-- place was still alive then (a poll after its deadline never revives it), and never
-- moving a heartbeat back. A seq no longer waiting is not in K_WSEEN and is skipped (seqs
-- are never reused within an event).
-- Before nd no deadline has come (heartbeats only move them later), so a poll then was
-- surely alive: one ZADD; past it, the place's own deadline decides.
local function renew_batch()
  for i = 3, #ARGV, 2 do
    local s, t = ARGV[i], tonumber(ARGV[i + 1])
    local alive = t < M.nd
    if not alive then
      local seen = rcall('ZSCORE', wkey(chunk(s)), s)
      alive = seen and math.max(tonumber(seen) + M.widle, M.wfloor) > t
    end
    if alive then rcall('ZADD', wkey(chunk(s)), 'XX', 'GT', fmt(t), s) end
  end
  return finish('OK', 0)
end
