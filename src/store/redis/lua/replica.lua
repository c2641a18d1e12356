
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
--       incarnation is told apart);
--       then for each place the transition changed, its seq and its record after it ('' once
--       ended; a seq is digits, so the next 'v' starts the next step). Trimmed by
--       versions (log_flush), so a node that falls further behind resyncs from a snapshot. Formatting all 25 numbers was most of a
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
  local out = {}
  for k, i in ipairs(LOG_SET) do
    local v = M[LOG_FIELDS[i]]
    if i == LOG_AT.fadm and not v then v = -1 end
    out[2 * k - 1] = fmt(i - 1)
    out[2 * k] = fmt(v or 0)
  end
  if first and not LOG_SEEN[LOG_AT.inc] then
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
local LOG_PEND, LOG_FIRST = log_new(), 0
-- The version of the entry's last step: log_flush marks by it, never by M.lv, which in an
-- early flush (from log_append) is already the next step's version, not yet in the entry.
local LOG_LAST = 0
local LOG_ENTRY_ARGS = 2000
-- The time of the entry's last step: a step at the same time leaves out its 't'.
local LOG_T = nil

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

log_append = function(whole)
  if #LOG_PEND > LOG_ENTRY_ARGS then log_flush() end
  -- An entry's first step is whole: its time, the incarnation. A later one leaves out what
  -- the step before it said (the replica carries it on).
  local first = #LOG_PEND == LOG_HEAD
  local step
  if first or NOW ~= LOG_T then
    step = {'v', fmt(M.lv), 't', fmt(NOW)}
  else
    step = {'v', fmt(M.lv)}
  end
  LOG_T = NOW
  if whole then
    step[#step + 1], step[#step + 2] = 'm', log_meta()
  else
    step[#step + 1], step[#step + 2] = 'd', log_changes(first)
  end
  LOG_SET, LOG_SEEN = {}, {}
  local seen = {}
  for i = 1, #FX, 3 do
    local s = fmt(FX[i + 1])
    if FX[i] ~= FX_FORGOTTEN and not seen[s] then
      seen[s] = true
      step[#step + 1] = s
      step[#step + 1] = WROTE[FX[i + 1]] or rcall('HGET', pkey(s), s) or ''
    end
  end
  if first then LOG_FIRST = M.lv end
  LOG_LAST = M.lv
  local n = #LOG_PEND
  for i = 1, #step do LOG_PEND[n + i] = step[i] end
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
      alive = seen and tonumber(seen) + M.widle > t
    end
    if alive then rcall('ZADD', wkey(chunk(s)), 'XX', 'GT', fmt(t), s) end
  end
  return finish('OK', 0)
end
