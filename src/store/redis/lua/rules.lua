-- The queue rules of src/core/queue.rs, over one event's keys, run inside Redis so that every
-- transition is one atomic script (EVALSHA) without any lock. This file opens the
-- one script the Redis store runs, after a prelude generated from the Rust constants
-- (`src/store/redis/script.rs`); `places.lua`, the rules' second part, and in the end `ops.lua`
-- follow it. Keep them in step with queue.rs:
-- the conformance suite and the model-based property test compare the two backends.
--
-- Time is ARGV[2] (milliseconds), the caller's clock, never Redis TIME: the tests drive the
-- store with a fake clock, and every node must apply the same deadlines.
--
-- Numbers: Lua numbers are doubles. Every integer here stays below 2^53 (epoch milliseconds,
-- counters), so arithmetic on them is exact. They are written back with string.format('%d'),
-- because Redis turns a bare Lua number into a string in exponent form from 1e15 on. The
-- token bucket is a true double and is stored with '%.17g', which reads back bit for bit,
-- so the Lua bucket and the Rust bucket make the same decisions.

-- Every key of the event; all share the hash tag {prefix:event}, so one Cluster slot. The
-- locals K_* are bound to KEYS by the generated prelude (src/store/redis/script.rs), in the
-- order of its table:
-- K_META     HASH: config (JSON and the numbers the rules use), counters, bucket
-- K_PLACES   prefix of the chunks K_PLACES:<c>, HASH seq -> place record (see encode)
-- K_USERS    HASH user id -> seq of the user's live place
-- K_RANK     prefix of the chunks K_RANK:<c>, LIST of the waiting seqs (past any
--            pre-queue) in seq order (layouts 1 and 2: a ZSET of them scored by seq): LPOS
--            (ZRANK) is the position within the chunk
-- K_RANKF    STRING: how many waiting seqs each K_RANK chunk before the meta's ftail holds,
--            as a Fenwick tree of u32 (node i at bit offset 32 i, chunk c is node c + 1;
--            the meta's fsz is its size, a power of two, ftot its total): prefix sums give
--            the place of a chunk in the line. The tail chunk ftail, where the joins go, is
--            counted in only once the line moves past it, so a join writes no tree
-- K_WSEEN    prefix of the chunks K_WSEEN:<c>, ZSET waiting seqs scored by last heartbeat
-- K_WINDEX   ZSET chunk number -> a time no heartbeat in K_WSEEN:<c> is earlier than; every
--            chunk holding a waiting place is in it (the sweep drops it once empty)
--
-- Chunks: the per-place structures are split by seq into chunks of CHUNK seqs (c = seq
-- // CHUNK; 128 in an event of layout 1), each small enough to stay in Redis's compact
-- listpack encoding (up to 128 entries), which costs a third of the memory of one large
-- hash or skiplist per place. The chunk keys share the event's hash tag (one Cluster
-- slot), are not among KEYS, and are dropped by `delete` and `clear`. The meta's `lay` is
-- the layout's number (LAYOUT): an event written before the chunks (lay 0) is refused,
-- never misread (it can only be deleted).
-- K_ADM      ZSET admitted seqs scored by admission time
-- K_ASEEN    ZSET active seqs scored by last session heartbeat
-- K_AENT     ZSET active seqs scored by entry time
-- K_TOMB     HASH seq -> nonce of expired places (answer TOKEN_EXPIRED)
-- K_TORDER   LIST "at:seq" of tombstones, oldest first
-- K_WINDOW   LIST "at:count" of admissions in the last minute, oldest first
-- K_METADATA HASH seq -> metadata JSON (only places that sent some)
-- K_LEASE    STRING: holder of the periodic-work lease (node:epoch)
-- K_INVITES  HASH invite code -> '' while unused, '=' .. user id (bound by a proven join) or
--            '#' .. seq (by an unproven one) once it seats
--            someone (see the join in ops.lua)
--
-- The prelude also defines, from the Rust constants: RETENTION (EXPIRED_RETENTION_MS),
-- WINDOW (RATE_WINDOW_MS), NEVER ("no deadline": 2^53, above any time and still exact as a
-- double) and the effect kinds FX_* that the Rust side decodes.

-- Per-call state. The script's top level runs once when it is loaded as a library of Redis
-- Functions, and its functions then serve every call: so each value below that a call
-- changes is set afresh by an on_call hook (prelude) at the start of every call, in the
-- order they are declared (after the keys and ARGV are bound). Constants are set here.
local NOW, FX
on_call(function()
  NOW = tonumber(ARGV[2])
  FX = {}  -- flat triples: kind, seq, at
end)

-- Buffered writes. A batch of joins writes three keys per join (the place's record, the
-- line and the heartbeats, each into its chunk), and each `redis.call` costs Redis as much
-- as a short command of its own: so these appends wait in PEND (key -> the command and its
-- pairs, in the order they came) and go as one command per key and batch. Every other
-- command goes through rcall, which sends what waits first: whatever reads a key (or
-- writes it otherwise) sees every write before it, exactly as if each had gone at once,
-- and nothing runs between the script's commands. Nothing reads the buffered keys in
-- between but through rcall; finish() (flush_meta) sends the rest.
local PEND, PEND_KEYS, PENDING
-- The values of the user index's waiting HSETs, key -> field -> value, for hget_pending.
local PEND_HV
on_call(function() PEND, PEND_KEYS, PENDING, PEND_HV = {}, {}, false, {} end)
local function flush_pending()
  if not PENDING then return end
  local pend, keys = PEND, PEND_KEYS
  PEND, PEND_KEYS, PENDING, PEND_HV = {}, {}, false, {}
  -- A key sent alone (flush_key) is gone from pend; one buffered again after that is
  -- listed twice and goes once.
  for _, k in ipairs(keys) do
    local l = pend[k]
    if l then
      pend[k] = nil
      redis.call(unpack(l))
    end
  end
end
-- Sends what waits for one key only, before a command that reads that key alone: the
-- other keys' appends keep waiting, so a chunk's appends still go as one command (the tail
-- chunk's count, read when a join passes it, split every chunk's appends in two).
local function flush_key(key)
  local l = PEND[key]
  if not l then return end
  PEND[key], PEND_HV[key] = nil, nil
  redis.call(unpack(l))
end
local function rcall(...)
  if PENDING then flush_pending() end
  return redis.call(...)
end
-- Buffers `cmd key a b` (HSET of a field, ZADD of a member: their pairs append, and a
-- later pair for the same field or member wins, as it would in separate commands), or
-- `cmd key a` (b nil: RPUSH of a value, appended after those before). A key takes one kind
-- of command only.
local function pend(key, cmd, a, b)
  local l = PEND[key]
  if not l then
    l = {cmd, key}
    PEND[key] = l
    PEND_KEYS[#PEND_KEYS + 1] = key
    PENDING = true
  end
  local n = #l
  if b == nil then
    l[n + 1] = a
  else
    l[n + 1], l[n + 2] = a, b
  end
  -- (Only the user index is read back through the buffer: a place's record is read from
  -- WROTE, so its chunks' values are not kept twice.)
  if key == K_USERS then
    local hv = PEND_HV[key]
    if not hv then
      hv = {}
      PEND_HV[key] = hv
    end
    hv[a] = b
  end
end
-- HGET of a hash whose HSETs may wait in the buffer: the waiting value, else Redis's. The
-- buffer stays (a field not waiting is current in Redis: any other write to the key went
-- through rcall, which sent the buffer first). A user join reads and writes the user index
-- (K_USERS): through rcall, both sent every chunk's appends at each such join.
local function hget_pending(key, field)
  local hv = PEND_HV[key]
  if hv and hv[field] ~= nil then return hv[field] end
  return redis.call('HGET', key, field)
end
-- tonumber of a string is glibc's strtod (a thousand instructions and more), and a join
-- read its seq (a string: it goes into commands as one) back as a number five times, and
-- each operation's time and argument count in the batch loop: each distinct string is read
-- once per script (fmt below records the strings it makes). A number passes through.
-- (fmt and num share their tables in a block: the main chunk may hold 200 locals only.)
local num, fmt
do
local NUMS, FMTS
on_call(function() NUMS, FMTS = {}, {} end)
num = function(s)
  local n = NUMS[s]
  if not n then
    n = tonumber(s)
    NUMS[s] = n
  end
  return n
end
-- string.format costs a few µs of interpreter time per call, and a batch formats the same
-- numbers again and again (its time, small counts, chunk numbers): each distinct number is
-- formatted once per script.
fmt = function(n)
  local s = FMTS[n]
  if not s then
    s = string.format('%d', n)
    FMTS[n] = s
    NUMS[s] = n
  end
  return s
end
end

local function fx(kind, seq, at)
  local n = #FX
  FX[n + 1], FX[n + 2], FX[n + 3] = kind, num(seq), at
end

-- The layout of this script's keys (see Chunks above); the meta records it at creation.
-- Layout 1 has chunks of 128 seqs, 2 of CHUNK: the smaller chunk costs Redis less per
-- write (each insert into a listpack scans it) for a few bytes more per place. Layout 3
-- (new events) has chunks of CHUNK too, and the line's chunks K_RANK:<c> are LISTs of
-- seqs in line order rather than ZSETs scored by seq (rank_* below): seqs only grow, so a
-- join appends (RPUSH) instead of inserting into a ZSET's listpack, which searched it for
-- the member and walked it for the score (half of a join's ZADD work). An event keeps the
-- layout it was made with.
local LAYOUT = 3
local CHUNK_OF = {[1] = 128, [2] = CHUNK, [3] = CHUNK}
local OLD_LAYOUT_ERROR = 'LAYOUT this event was written by an older waitroom (before the '
  .. 'chunked Redis layout) and cannot be read; delete it and create it again'

-- This event's chunk size (load_meta sets it from the meta's layout).
-- RANK_LIST: the line's chunks are LISTs (layout 3 on).
local EV_CHUNK, RANK_LIST
on_call(function() EV_CHUNK, RANK_LIST = CHUNK, LAYOUT >= 3 end)
local function chunk(seq) return math.floor(num(seq) / EV_CHUNK) end
-- A chunk's key names, built once per script and chunk (building one formats the number
-- and hashes the new string: a batch of joins into one chunk would pay it per join).
local function key_cache(base)
  local names = {}
  return function(c)
    local k = names[c]
    if not k then
      k = base .. ':' .. c
      names[c] = k
    end
    return k
  end
end
local qkey, wkey, pchunk
on_call(function()
  qkey, wkey, pchunk = key_cache(K_RANK), key_cache(K_WSEEN), key_cache(K_PLACES)
end)
local function pkey(seq) return pchunk(chunk(seq)) end

-- Meta: the numbers the rules read, kept as one MessagePack array in the meta's field `n`
-- (decoding one string is several times cheaper than reading 27 hash fields, and an
-- operation that changes nothing writes nothing back). Beside it: `cfg` (the config as
-- JSON, for the admin API), `ver` (the config version, for optimistic updates) and
-- `lepoch` (the lease epoch). MessagePack keeps integers and doubles exact, so the token
-- bucket reads back bit for bit. Times are in ms where the config says seconds.
--
-- Besides the settings and the counters of queue.rs, the numbers are:
-- - nw, nad, nac: how many places wait, are admitted, are in session (the sizes of the
--   ZSETs, kept here so that no operation pays a ZCARD for them);
-- - nd: a time no deadline is earlier than (places, the admission window, tombstones).
--   Most operations find NOW < nd and skip the sweep altogether; it is lowered whenever an
--   earlier deadline appears (heartbeats only ever move deadlines later) and recomputed
--   exactly after each sweep;
-- - fadm: the first admission's time, -1 before it;
-- - hbusy, hsince, hends: the slot-time held by admitted and active places (queue.rs
--   `Holds`, behind the ETA): accrued up to hsince (0 before the first time), and how many
--   holds ended. Added after fadm, so a meta written before them reads them as 0.
-- - opens, method, npre: the schedule (schedule.lua), 0 in a meta written before them.
-- - closes, ended: the end of the sale (core/lifecycle.rs): closes_at in ms (0: none), and
--   1 once the admin's `end` call ended it. Also read as 0 from an older meta.
-- - lv, inc: the change log's version (one more per write of the meta) and the event's
--   incarnation (replica.lua).
-- - fsz, ftail, ftot: the size of the K_RANKF tree, the line's tail chunk (not in the tree)
--   and the tree's total; lay: the layout of the keys (LAYOUT).
-- - opened: the opens_at a script's time reached (0: none), so that the opening stays
--   reached for every node, whatever its clock says after (`advance` below;
--   config.rs `opening_reached`). 0 in a meta written before it: reached by the clock alone.
-- - prelast: the latest joined time of a place put in the pre-queue since it was last empty
--   (schedule.lua `line_insert`): no waiting place of the pre-queue joined later, so `put`
--   knows which openings keep it whole without scanning it (queue_schedule.rs
--   `schedule_change_allowed`). Never lowered by a departure. Read from a meta written
--   before it as just before the opening (load_meta). Only `put` reads it: not in the
--   change log.
-- - seen: the time an operation first found the sale over by closes_at (0: none did yet;
--   `sale_ended` below; queue.rs `note_end`), in the change log too: a replica on a node
--   whose clock is behind answers no waiting place after it. Answered by `get` and
--   `settings` (config.rs `end_seen_at`): such a node gives the end's reason too, and an
--   end call there keeps the close's moment. 0 in a meta written before it.
-- - wfloor: the earliest deadline of a waiting place, set when `widle` is lowered (0:
--   never): the change, plus what a poller told the old interval needs to be back (ops.lua
--   `op_put`). A waiting place's deadline is max(seen + widle, wfloor), as queue.rs
--   `deadline_of` has it (a live stream renews its place at the change, a poller when it
--   comes back as told, and their last renewal, at the old period, may be older than the
--   new value). 0 in a meta written before it.
-- - rkb, rkept, rfloor: what a lowered `ttl` kept (view.rs `ReadyKept`; 0: never lowered;
--   ops.lua `op_put`): a place admitted before rkb keeps at least the window rkept, and
--   none ends before rfloor (a poller told the old interval is back by then). An admitted
--   place's deadline is max(adm + ttl, adm + rkept if adm < rkb, rfloor). 0 in a meta
--   written before them.
local FIELDS = {'cap', 'rate', 'ttl', 'sidle', 'smax', 'widle', 'maxq', 'paused', 'accept',
  'seq', 'completed', 'left', 'expired', 'joins', 'admissions', 'wsum', 'ssum', 'scnt', 'wn',
  'btok', 'blast', 'bprimed', 'nw', 'nad', 'nac', 'nd', 'fadm', 'hbusy', 'hsince', 'hends',
  'opens', 'method', 'npre', 'closes', 'ended', 'lv', 'inc', 'fsz', 'ftail', 'ftot', 'lay',
  'opened', 'prelast', 'seen', 'wfloor', 'rkb', 'rkept', 'rfloor'}
local FADM_AT = 27
local M, DIRTY
on_call(function() M, DIRTY = {}, false end)
-- After an event's first entry, the change log carries only the numbers of LOG_FIELDS an
-- operation set (replica.lua): LOG_AT maps a field to its place in LOG_FIELDS, LOG_SET
-- lists the places set since the last entry (LOG_SEEN: once each). Every change of those
-- numbers goes through set(), but for lv and inc (log_step: lv is the entry's `v`, and a
-- new inc writes a whole entry).
local LOG_AT = {}
-- (A plain loop: a library of Functions may read no global, not even ipairs, while it loads.)
for i = 1, #LOG_FIELDS do LOG_AT[LOG_FIELDS[i]] = i end
local LOG_SET, LOG_SEEN
on_call(function() LOG_SET, LOG_SEEN = {}, {} end)
-- The numbers of M an answer's context is made of (ctx(), with opens and method that a
-- short answer carries beside it), but for those hold_total() reads: CTX_GEN counts their
-- changes in this call, so that a fresh join's answer knows its context is the one before
-- it without comparing each (finish_join). Only set() changes them after load_meta.
-- (CTX_F in a block: the main chunk may hold 200 locals only.)
local CTX_GEN, set
on_call(function() CTX_GEN = 0 end)
do
local CTX_F = {wn = true, fadm = true, rate = true, cap = true, ssum = true, scnt = true,
  ttl = true, sidle = true, smax = true, widle = true, paused = true, hends = true,
  opens = true, method = true}
set = function(f, v)
  if CTX_F[f] and M[f] ~= v then CTX_GEN = CTX_GEN + 1 end
  M[f] = v
  DIRTY = true
  local i = LOG_AT[f]
  if i and not LOG_SEEN[i] then
    LOG_SEEN[i] = true
    LOG_SET[#LOG_SET + 1] = i
  end
end
end

-- The Fenwick tree of the line's chunk counts (K_RANKF). A chunk past its size grows it by
-- doubling: the new root covers the old one and only empty chunks.
local function lowbit(i) return bit.band(i, -i) end

-- K_RANKF is never buffered, and these commands read nothing else: they go by redis.call,
-- leaving the buffer be (a join passing the tail chunk adds its count here, which through
-- rcall sent every chunk's appends apart from the rest of the batch's).
local function fen_add(c, d)
  local i = c + 1
  if M.fsz == 0 then set('fsz', 1) end
  while M.fsz < i do
    local total = redis.call('BITFIELD_RO', K_RANKF, 'GET', 'u32', '#' .. M.fsz)[1]
    redis.call('BITFIELD', K_RANKF, 'SET', 'u32', '#' .. (2 * M.fsz), total)
    set('fsz', 2 * M.fsz)
  end
  local args = {'BITFIELD', K_RANKF}
  while i <= M.fsz do
    args[#args + 1] = 'INCRBY'
    args[#args + 1] = 'u32'
    args[#args + 1] = '#' .. i
    args[#args + 1] = d
    i = i + lowbit(i)
  end
  redis.call(unpack(args))
  set('ftot', M.ftot + d)
end

-- How many wait in the line's chunks before chunk c (at most the tail chunk).
local function fen_before(c)
  if c >= M.ftail then return M.ftot end
  local i = math.min(c, M.fsz)
  if i <= 0 then return 0 end
  local args = {'BITFIELD_RO', K_RANKF}
  while i > 0 do
    args[#args + 1] = 'GET'
    args[#args + 1] = 'u32'
    args[#args + 1] = '#' .. i
    i = i - lowbit(i)
  end
  local sum = 0
  for _, v in ipairs(rcall(unpack(args))) do sum = sum + v end
  return sum
end

-- The chunk holding the k-th of the line, and its rank (1-based) within the chunk; a chunk
-- past the last (empty) when fewer than k wait.
local function fen_find(k)
  if k > M.ftot then return M.ftail, k - M.ftot end
  local pos, step = 0, M.fsz
  while step > 0 do
    if pos + step <= M.fsz then
      local v = rcall('BITFIELD_RO', K_RANKF, 'GET', 'u32', '#' .. (pos + step))[1]
      if v < k then
        pos = pos + step
        k = k - v
      end
    end
    step = math.floor(step / 2)
  end
  return pos, k
end

-- The line past any pre-queue (schedule.lua's line_* build on these).
-- Seqs only grow: a join goes to the tail chunk or past it. Past it, the old tail's count
-- goes into the tree (a chunk between them had no join into the line, or it would have
-- been the tail: it is empty).
-- (c: seq's chunk, when the caller has it.)
local function rank_insert(seq, c)
  c = c or chunk(seq)
  if c > M.ftail then
    flush_key(qkey(M.ftail))
    local n = redis.call(RANK_LIST and 'LLEN' or 'ZCARD', qkey(M.ftail))
    if n > 0 then fen_add(M.ftail, n) end
    set('ftail', c)
  end
  if RANK_LIST then
    pend(qkey(c), 'RPUSH', seq)
  else
    pend(qkey(c), 'ZADD', seq, seq)
  end
end

local function rank_remove(seq)
  local c = chunk(seq)
  local n
  if RANK_LIST then
    n = rcall('LREM', qkey(c), 1, seq)
  else
    n = rcall('ZREM', qkey(c), seq)
  end
  if n == 1 and c < M.ftail then fen_add(c, -1) end
end

-- The 1-based place of seq in the line past any pre-queue.
local function rank_position(seq)
  local c = chunk(seq)
  return fen_before(c) + rcall(RANK_LIST and 'LPOS' or 'ZRANK', qkey(c), seq) + 1
end

-- The seqs of chunk c from the i-th to the j-th (0-based, both included; -1: the last),
-- in line order.
local function rank_chunk(c, i, j)
  return rcall(RANK_LIST and 'LRANGE' or 'ZRANGE', qkey(c), i, j)
end

-- The seqs from the k-th to the (k + n - 1)-th of the line past any pre-queue.
local function rank_range(k, n)
  local out = {}
  while #out < n do
    local c, r = fen_find(k + #out)
    local got = rank_chunk(c, r - 1, r - 1 + n - #out - 1)
    if #got == 0 then break end
    for _, s in ipairs(got) do out[#out + 1] = s end
  end
  return out
end

-- Seqs grouped by chunk: {c = {seq, ...}}.
local function by_chunk(seqs)
  local g = {}
  for _, s in ipairs(seqs) do
    local c = chunk(s)
    if not g[c] then g[c] = {} end
    local l = g[c]
    l[#l + 1] = s
  end
  return g
end

-- Removes seqs from the line past any pre-queue, a command or two per chunk. A LIST
-- chunk whose first values are the chunk's seqs in order (the end of the sale drops the
-- line's head) loses them by one LTRIM; otherwise one LREM per seq.
local function rank_drop(seqs)
  for c, l in pairs(by_chunk(seqs)) do
    local n = 0
    if RANK_LIST then
      local head = rcall('LRANGE', qkey(c), 0, #l - 1)
      local prefix = #head == #l
      for i = 1, #l do
        if head[i] ~= l[i] then prefix = false; break end
      end
      if prefix then
        rcall('LTRIM', qkey(c), #l, -1)
        n = #l
      else
        for _, s in ipairs(l) do n = n + rcall('LREM', qkey(c), 1, s) end
      end
    else
      n = rcall('ZREM', qkey(c), unpack(l))
    end
    if n > 0 and c < M.ftail then fen_add(c, -n) end
  end
end

-- Heartbeats of waiting places. A write that may lower a chunk's earliest score lowers its
-- K_WINDEX entry too (LT); removals and renewals (which only raise scores) leave the entry
-- low, still a lower bound, and the sweep sets it exactly when it visits the chunk.
-- WLOW: chunk -> a time this script already lowered its entry to (so the entry is at or
-- below it): a later write at or after that time skips the ZADD LT, which would change
-- nothing (a batch's joins into one chunk pay it once). Forgotten whenever an entry is set
-- otherwise (ws_refresh, ws_front).
local WLOW
on_call(function() WLOW = {} end)
local function ws_set(seq, t, xx, c)
  c = c or chunk(seq)
  if xx then
    rcall('ZADD', wkey(c), 'XX', fmt(t), seq)
  else
    pend(wkey(c), 'ZADD', fmt(t), seq)
  end
  if WLOW[c] and WLOW[c] <= t then return end
  -- K_WINDEX is never buffered and this reads nothing else: it need not send the buffer
  -- (through rcall, a batch's first join into each chunk sent that chunk's appends
  -- alone, and the rest went in a second command).
  redis.call('ZADD', K_WINDEX, 'LT', fmt(t), fmt(c))
  WLOW[c] = t
end

local function ws_remove(seq)
  rcall('ZREM', wkey(chunk(seq)), seq)
end

local function ws_drop(seqs)
  for c, l in pairs(by_chunk(seqs)) do rcall('ZREM', wkey(c), unpack(l)) end
end

-- Sets each chunk's K_WINDEX entry to its earliest heartbeat, or drops it once empty.
local function ws_refresh(chunks)
  WLOW = {}
  for _, c in ipairs(chunks) do
    local r = rcall('ZRANGE', wkey(c), 0, 0, 'WITHSCORES')
    if r[2] then
      rcall('ZADD', K_WINDEX, r[2], c)
    else
      rcall('ZREM', K_WINDEX, c)
    end
  end
end

-- The schedule's rules, defined in schedule.lua (after this file) and called below.
local in_prequeue, before_opening, line_insert, line_remove, line_position, line_range
local line_next, limits, check_reject, write_secrets

-- Live counts, kept in step by the rules below and written back by finish().
local N_W, N_AD, N_AC
-- Whether the event exists (its meta was loaded or is being created): only then does
-- finish() write the meta back.
local LOADED
-- The event's meta is of an older layout (see Chunks above): only `delete` may run.
local OLD_LAYOUT
on_call(function() N_W, N_AD, N_AC, LOADED, OLD_LAYOUT = 0, 0, 0, false, false end)

local function load_meta()
  local raw = rcall('HGET', K_META, 'n')
  if not raw then return false end
  LOADED = true
  local v = cmsgpack.unpack(raw)
  for i, f in ipairs(FIELDS) do M[f] = v[i] or 0 end
  if M.fadm < 0 then M.fadm = nil end -- nil until the first admission
  -- A meta written before prelast (FIELDS' 43rd) was kept, with a pre-queue waiting: any
  -- of its places may have joined just before the opening.
  if v[43] == nil and M.npre > 0 then M.prelast = M.opens - 1 end
  N_W, N_AD, N_AC = M.nw, M.nad, M.nac
  OLD_LAYOUT = CHUNK_OF[M.lay] == nil
  EV_CHUNK = CHUNK_OF[M.lay] or CHUNK
  RANK_LIST = M.lay >= 3
  return true
end

local function lower_nd(t)
  if t < M.nd then set('nd', t) end
end

-- Adds the transition to the change log's next entry, and writes that entry (replica.lua,
-- after these rules).
local log_append, log_flush

-- True when the meta changed since the last write (a batch writes it once, at its end, but
-- logs each of its operations as its own entry).
local UNWRITTEN
on_call(function() UNWRITTEN = false end)

-- Ends one transition: when it changed the meta, the change log gets one entry for it,
-- numbered by lv (replica.lua), with this transition's effects and time. Inside a batch
-- each operation is logged this way, so a replica goes through the same states as when
-- the operations are sent one by one.
local function log_step()
  if not LOADED then return end
  if N_W ~= M.nw then set('nw', N_W) end
  if N_AD ~= M.nad then set('nad', N_AD) end
  if N_AC ~= M.nac then set('nac', N_AC) end
  if not DIRTY then return end
  DIRTY = false
  UNWRITTEN = true
  M.lv = M.lv + 1
  local whole = false
  if M.lv == 1 or M.inc == 0 then
    M.inc = NOW
    whole = true
  end
  log_append(whole)
end

local function flush_meta()
  log_step()
  flush_pending()
  log_flush()
  if not UNWRITTEN then return end
  UNWRITTEN = false
  local v = {}
  for i, f in ipairs(FIELDS) do v[i] = M[f] end
  v[FADM_AT] = M.fadm or -1
  rcall('HSET', K_META, 'n', cmsgpack.pack(v))
end

-- Slot-time held (queue.rs `Holds`), brought up to NOW before the number of live holds
-- changes, with integers only, so that both backends estimate from the same figures.
local function accrue()
  if M.hsince == 0 then
    set('hsince', NOW)
  elseif NOW > M.hsince then
    set('hbusy', M.hbusy + (N_AD + N_AC) * (NOW - M.hsince))
    set('hsince', NOW)
  end
end

local function hold_total()
  if M.hsince == 0 or NOW <= M.hsince then return M.hbusy end
  return M.hbusy + (N_AD + N_AC) * (NOW - M.hsince)
end

-- What the Rust side needs to compute ETAs and deadlines in seconds, exactly as queue.rs does.
local function ctx()
  if not M.cap then return {0, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} end -- no such event
  return {M.wn, M.fadm or -1, M.rate, M.cap, M.ssum, M.scnt, M.ttl, M.sidle, M.smax, M.widle,
    M.paused, hold_total(), M.hends, N_AD + N_AC}
end

-- Inside a batch (ops.lua), the meta is written back once, after the batch's last operation.
local BATCHED
-- The context of the batch's answer before this one (nil: none, or not to be relied on),
-- which a fresh join's short answer leaves out when it is the same (finish_join).
local PREV_CTX
-- Whether FX went out in an answer (finish): the next operation of a batch then starts a
-- new table, else it clears this one in place (each table made costs Redis its share of
-- the Lua collector's passes over the whole script).
local GAVE_FX
on_call(function() BATCHED, PREV_CTX, GAVE_FX = false, nil, false end)

-- The one way out: writes the meta back (in a batch, logs the operation) and answers
-- {code, payload, effects, context, log version} (the version tells this node when its
-- replica holds its own write).
local function finish(code, payload)
  if BATCHED then log_step() else flush_meta() end
  if payload == nil then payload = false end
  local c = ctx()
  PREV_CTX = c
  GAVE_FX = true
  return {code, payload, FX, c, M.lv or 0}
end

-- The answer of a fresh join inside a batch that only joined (its effects are its own
-- FX_JOINED alone), past any pre-queue and still waiting: it is the last of the line, so
-- its position is the waiting count. The node knows everything else of the view (the
-- nonce, the user, the time, the state) and of the effect, and rebuilds them (batch.rs
-- `expand`): {seq, waiting count, log version, opens, method} and the 14 numbers of the
-- context; or, when opens, method and the context are those of the short answer before it
-- in the batch, only its first three numbers, flat in the batch's answer (SHORT, marked
-- `flat`, which the batch loop copies out: no table of its own). Each table and value of
-- an answer costs Redis a conversion: the whole answer was four tables and 36 values.
local finish_join
do
local SHORT = {flat = true}
-- The CTX_GEN of the short answer's context before (PREV_CTX, when it has opens and method
-- at [15] and [16]: only a join's whole answer leaves it so).
local PREV_GEN
on_call(function() PREV_GEN = nil end)
finish_join = function(seq)
  log_step()
  -- The same context as ctx() would build, known without building it (most joins): none
  -- of its numbers of M changed since, and the two it computes are equal.
  local p = PREV_CTX
  if p and p[15] ~= nil and PREV_GEN == CTX_GEN and p[14] == N_AD + N_AC
      and p[12] == hold_total() then
    SHORT[1], SHORT[2], SHORT[3] = seq, N_W, M.lv
    return SHORT
  end
  local c = ctx()
  local out = {seq, N_W, M.lv, M.opens, M.method}
  for i = 1, 14 do out[5 + i] = c[i] end
  -- (A whole answer's context has no [15]: the next short answer carries its own.)
  c[15], c[16] = M.opens, M.method
  PREV_CTX, PREV_GEN = c, CTX_GEN
  return out
end
end
