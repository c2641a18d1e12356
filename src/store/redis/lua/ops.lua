
-- Entry points: ARGV[1] names the operation, ARGV[2] is the time, the rest is its own.
-- Each mirrors the EventQueue method of the same name in queue.rs.
-- Each operation runs in main (at the end), which the script's call enters: EVAL's top
-- level calls it last, and a library of Redis Functions registers it (script.rs).

local function op_put()
  -- ARGV: expected config version (0: the event must not exist yet), config JSON, then
  -- capacity, rate per minute (0: none), ready ttl, session idle, session max, waiting idle
  -- (all ms), max queue length (0: none), paused, accept joins (0/1), invite-only (0/1),
  -- opens_at (ms, 0: none), queueing method (0-3), shuffle seed and lottery key (32 bytes
  -- each, empty while the event has no secret).
  -- then closes_at (ms, 0: none), ended by the admin (0/1), then the record of the opening
  -- reached (opens_at in ms, 0: none) that the settings were read with (`settings`) and the
  -- one to write (config.rs `opening_reached`), then the record of the end by closes_at
  -- seen (ms, 0: none) that they were read with (config.rs `end_seen_at`).
  local expected = tonumber(ARGV[3])
  local exists = load_meta()
  if exists and OLD_LAYOUT then return redis.error_reply(OLD_LAYOUT_ERROR) end
  local ver = tonumber(rcall('HGET', K_META, 'ver')) or 0
  if not exists then ver = 0 end
  if ver ~= expected then return finish('CONFLICT') end
  -- An operation recorded the opening, or found the sale over by closes_at, since the
  -- settings were read (a node whose clock reached it): the patch was applied to an
  -- opening still ahead (its secret kept), or to a sale still running (an `end` would take
  -- this node's clock, before the close, as its moment), so it is read and applied again.
  if exists and (M.opened ~= tonumber(ARGV[21]) or M.seen ~= tonumber(ARGV[23])) then
    return finish('CONFLICT')
  end
  -- queue_schedule.rs `schedule_change_allowed`: opens_at may not move a waiting place
  -- into or out of the pre-queue (nor one of the first-come line, which a node whose clock
  -- ran ahead may have let join before openings were recorded), nor to a time at or before
  -- a pre-queue join (a clock behind the joins: a step back, or another node's), which
  -- the meta's mark of the latest join (prelast) bounds.
  local opens = tonumber(ARGV[15])
  if exists and opens ~= M.opens and N_W > 0
      and not (before_opening() and opens > 0 and NOW < opens and N_W == M.npre
               and opens > M.prelast) then
    return finish('SCHEDULE_LOCKED')
  end
  -- lifecycle.rs `reopen_allowed`: an ended sale reopens only once its places are gone.
  local closes, ended = tonumber(ARGV[19]), tonumber(ARGV[20])
  -- (Both counting an end an operation already saw: sale_ended.)
  if exists and N_W > 0 and sale_ended()
      and not (ended == 1 or (closes > 0 and math.max(NOW, M.seen) >= closes)) then
    return finish('REOPEN_LOCKED')
  end
  -- The places waiting just before this change (the end of a sale answers them: Rust's
  -- `Store::end_sale`): counted once what fell due has ended, none once the sale had ended
  -- already (its places were over then, swept or not).
  local waiting = 0
  if exists then
    -- What fell due under the old settings ends under them.
    advance()
    if not sale_ended() then waiting = N_W end
  else
    for _, f in ipairs(FIELDS) do M[f] = 0 end
    M.fadm = nil
    LOADED = true
    set('seq', 1)
    set('lay', LAYOUT)
  end
  rcall('HSET', K_META, 'cfg', ARGV[4], 'ver', fmt(ver + 1), 'inv', ARGV[14])
  local old_widle, old_ttl = M.widle, M.ttl
  for i = 1, 9 do set(FIELDS[i], tonumber(ARGV[4 + i])) end
  -- A shorter waiting idle ends no waiting place before a poller told the old settings'
  -- longest interval could be back (rules.lua `wfloor`; view.rs `lowered_idle_floor`).
  -- Never moved back: a second lowering keeps the first one's promise, and a node whose
  -- clock is behind may make the next change.
  -- (60: POLL_MAX_SEC, 1000: POLL_SLACK_MS, written out: the main chunk of an EVAL may
  -- hold 200 locals only, and a test checks them against view.rs.)
  if exists and M.widle < old_widle then
    local told = math.min(math.max(math.floor(math.min(old_widle, old_ttl) / 3000), 1), 60)
      * 1000
    set('wfloor', math.max(M.wfloor, NOW + told + 1000))
  end
  -- A shorter ready window ends no admitted place before what it was told: one admitted
  -- before the change keeps its window, and none ends before a poller told the old
  -- interval could be back (rules.lua `rkb`; view.rs `ReadyKept::lowered`, an earlier
  -- lowering's window kept while some place may hold it).
  if exists and M.ttl < old_ttl then
    if M.rkb + M.rkept > NOW then set('rkept', math.max(M.rkept, old_ttl))
    else set('rkept', old_ttl) end
    set('rkb', NOW)
    local told = math.min(math.max(math.floor(math.min(old_widle, old_ttl) / 3000), 1), 60)
      * 1000
    set('rfloor', math.max(M.rfloor, NOW + told + 1000))
  end
  set('opens', opens)
  set('opened', tonumber(ARGV[22]))
  set('method', tonumber(ARGV[16]))
  if ARGV[17] ~= '' then write_secrets(ARGV[17], ARGV[18]) end
  set('closes', closes)
  set('ended', ended)
  sale_ended() -- (for its note of the end under the new settings: queue.rs `set_config`)
  -- Deadlines are measured with the new settings: sweep and recompute nd now.
  set('nd', 0)
  expire_due()
  admit()
  return finish('OK', {ver + 1, waiting})
end

-- Whether the event is invite-only (the meta's `inv`), read once per script: only `put`
-- writes it, and never in a script that joins.
local INV
on_call(function() INV = nil end)

-- A join (EventQueue::join). A function, so that a batch can run it several times;
-- its parameter shadows the script's ARGV with the join's own arguments.
local function op_join(ARGV)
  -- ARGV: nonce (16 bytes), has user (0/1), user id, has metadata (0/1), metadata, proven
  -- (0/1), has invite (0/1), invite code.
  -- (Before nd nothing is due, and without a pre-queue or an opening to record advance()
  -- has nothing to do: most joins skip the call; sale_ended() below notes the end.)
  if NOW >= M.nd or M.npre > 0 or (M.opens > 0 and NOW >= M.opens and M.opened ~= M.opens) then
    advance()
  end
  if sale_ended() then return finish('EVENT_CLOSED') end
  local user = nil
  if ARGV[4] == '1' then user = ARGV[5] end
  local proven = user ~= nil and ARGV[8] == '1'
  -- The invite rule (EventQueue::check_invite): an unused code is bound by a new place
  -- below; a used one admits only the user it seats, proven.
  local bind = nil
  if INV == nil then INV = rcall('HGET', K_META, 'inv') == '1' end
  if INV then
    if ARGV[9] ~= '1' then return finish('INVITE_REQUIRED') end
    local held = rcall('HGET', K_INVITES, ARGV[10])
    if not held then return finish('INVITE_INVALID') end
    if held == '' then
      bind = ARGV[10]
    elseif not proven or held ~= '=' .. user then
      return finish('INVITE_INVALID')
    end
  end
  -- An unproven place of this user that a proven join replaces (EventQueue::join).
  local squat, squat_p = nil, nil
  if user then
    local seq = hget_pending(K_USERS, user)
    if seq then
      -- Only a caller who proved it is the user gets the place back, and only a place
      -- made by a proven join.
      if not proven then return finish('ALREADY_JOINED') end
      local p = place(seq)
      if p.proven then
        if p.state == 'w' then
          ws_set(seq, NOW, true)
          lower_nd(NOW + M.widle)
        end
        return finish('OK', view(seq, p))
      end
      squat, squat_p = seq, p
    end
  end
  if M.accept ~= 1 then return finish('EVENT_CLOSED') end
  -- The replaced place, if any, makes room: its spot in line or its slot.
  local freed, held = 0, 0
  if squat_p then
    if squat_p.state == 'w' then freed = 1 else held = 1 end
  end
  if not check_reject(freed, held) then return finish('EVENT_FULL') end
  if M.maxq > 0 and N_W - freed >= M.maxq then return finish('QUEUE_FULL') end
  -- Its slot, if it held one, goes to the head of the queue by the admit below.
  if squat then end_place(squat, squat_p, FX_LEFT, NOW) end
  local seqn = M.seq
  local seq = fmt(seqn)
  set('seq', seqn + 1)
  -- Its chunk, found once for the three writes into it.
  local c = chunk(seq)
  -- queue_schedule.rs `join_time`: recorded at NOW, but never before an opening already
  -- reached, so that a clock behind it puts nobody into the pre-queue. (Here rather than
  -- in schedule.lua: the main chunk may hold 200 locals only.)
  local joined = NOW
  if M.opens > 0 and not before_opening() then joined = math.max(NOW, M.opens) end
  put_place(seq, nil, encode(nil, ARGV[3], user, proven, joined), c)
  line_insert(seq, joined, c)
  ws_set(seq, NOW, false, c)
  lower_nd(NOW + M.widle)
  N_W = N_W + 1
  if user then pend(K_USERS, 'HSET', user, seq) end
  if ARGV[6] == '1' then pend(K_METADATA, 'HSET', seq, ARGV[7]) end
  -- Bound to a user only when proven: a code bound to a bare id would seat anyone who
  -- claims that id once the place ends.
  if bind then rcall('HSET', K_INVITES, bind, proven and ('=' .. user) or ('#' .. seq)) end
  set('joins', M.joins + 1)
  fx(FX_JOINED, seq, joined)
  if M.method == 3 then admit(1) else admit() end
  -- Nothing but this join happened (no expiry, no admission, no squatter): the short answer,
  -- which the node rebuilds with the join's time as its joining time (so never for a join
  -- before opens_at: it joined the pre-queue, or is dated at the opening reached).
  if BATCHED and #FX == 3 and not in_prequeue(NOW) then return finish_join(seqn) end
  -- (view reads the place back from what this script wrote: admit() may have admitted it.)
  local v = view(seq, nil, true)
  -- The replaced place's key: the node's gate stops passing its session at once.
  if squat then v[#v + 1] = tonumber(squat); v[#v + 1] = squat_p.nonce end
  return finish('OK', v)
end

local function op_tick()
  -- ARGV: the lease value this node believes it holds ('' if none), this node's id, lease
  -- length (ms). Only the holder does the periodic work; checking the fencing value in the
  -- same script as the work means a node that lost its lease can never act on it.
  local held, node, lease_ms = ARGV[3], ARGV[4], ARGV[5]
  local cur = rcall('GET', K_LEASE)
  local mine
  if cur and cur == held then
    rcall('PEXPIRE', K_LEASE, lease_ms)
    mine = cur
  elseif not cur then
    mine = node .. ':' .. rcall('HINCRBY', K_META, 'lepoch', 1)
    rcall('SET', K_LEASE, mine, 'NX', 'PX', lease_ms)
  else
    return finish('LEASED', rcall('PTTL', K_LEASE))
  end
  -- (advance admits only into the room an ending made or at the opening; the tick also
  -- spends fresh rate budget.)
  advance()
  admit()
  if sale_ended() then
    -- The end of the sale: one bounded batch of waiting places per tick (queue.rs `tick`),
    -- so a long queue never blocks Redis in one script; the next tick comes at once.
    -- The waiting ZSETs lose the batch in two bulk calls rather than two per place.
    local seqs = rank_range(1, END_BATCH)
    for _, s in ipairs(seqs) do end_place(s, place(s), FX_CLOSED, NOW, true) end
    rank_drop(seqs)
    ws_drop(seqs)
    -- Then the pre-queue's places, from the head of K_PRE: its members carry their seq
    -- ("<key>:<seq>"), so no key is recomputed.
    local room = END_BATCH - #seqs
    if room > 0 and M.npre > 0 then
      local members = rcall('ZRANGE', K_PRE, 0, room - 1)
      local pre = {}
      for i, m in ipairs(members) do
        pre[i] = string.match(m, ':(%d+)$')
        end_place(pre[i], place(pre[i]), FX_CLOSED, NOW, true)
      end
      if #pre > 0 then
        rcall('ZREMRANGEBYRANK', K_PRE, 0, #pre - 1)
        rcall('ZREM', K_PRESEQ, unpack(pre))
        ws_drop(pre)
        set('npre', M.npre - #pre)
      end
    end
    if N_W > 0 then return finish('OK', {NOW + 1, mine}) end
  end
  local next = next_deadline()
  local function sooner(t)
    if t < next then next = t end
  end
  local cap, rate = limits()
  if M.closes > NOW then sooner(M.closes) end
  -- Admissions left for the next tick (admit's bound): at once.
  if M.cut then sooner(NOW + 1) end
  -- Before the opening nobody is admitted, so no token is spent and the next one stays
  -- due: the wake for the opening below is the one that counts.
  if rate > 0 and N_AD + N_AC < cap and M.paused ~= 1 and N_W > 0 and not before_opening() then
    sooner(math.max(next_token_at(), NOW + 1))
  end
  -- The opening: the pre-queue starts to be admitted. Asked for even while nobody waits:
  -- a join does not re-plan the scheduler.
  if before_opening() then sooner(M.opens) end
  local front = rcall('LINDEX', K_TORDER, 0)
  if front then
    sooner(tonumber(string.match(front, '^(%d+):')) + RETENTION)
  end
  if next == NEVER then next = -1 end
  return finish('OK', {next, mine})
end

-- Operations on one place: ARGV[3] is its seq, ARGV[4] its nonce. A function, like
-- op_join, so that a batch can run it; its parameters shadow the script's OP and ARGV.
local function op_place(OP, ARGV)
  local seq, nonce = ARGV[3], ARGV[4]
  advance()
  local p, err = lookup(seq, nonce)

  if OP == 'leave' then
    if not p then return finish('OK', 0) end
    end_place(seq, p, FX_LEFT, NOW)
    admit()
    return finish('OK', 1)
  end

  if OP == 'status' or OP == 'heartbeat' or OP == 'peek' or OP == 'enter' then
    if not p then return finish(err) end
    if OP == 'status' or OP == 'heartbeat' then renew(seq, p) end
    if OP == 'heartbeat' then return finish('OK', 1) end
    if OP == 'enter' then
      if p.state == 'w' then return finish('NOT_READY') end
      if p.state == 'a' then
        p.state = 's'
        p.ent = NOW
        put_place(seq, p)
        rcall('ZREM', K_ADM, seq)
        rcall('ZADD', K_ASEEN, fmt(NOW), seq)
        rcall('ZADD', K_AENT, fmt(NOW), seq)
        lower_nd(NOW + math.min(M.sidle, M.smax))
        N_AD = N_AD - 1
        N_AC = N_AC + 1
        fx(FX_ENTERED, seq, NOW)
      end
    end
    return finish('OK', view(seq, p))
  end

  -- Session operations: only an active place has a session.
  if not p or p.state ~= 's' then return finish('NO_SESSION') end
  if OP == 'session_heartbeat' then
    renew(seq, p)
    return finish('OK', view(seq, p))
  elseif OP == 'session' then
    return finish('OK', view(seq, p))
  elseif OP == 'complete' then
    -- A hold that lapsed is not sold.
    expire_holds()
    end_place(seq, p, FX_COMPLETED, NOW)
    admit()
    return finish('OK', 1)
  elseif OP == 'hold' or OP == 'unhold' then
    -- Choosing seats is a sign of life: the idle deadline is renewed as a heartbeat renews
    -- it, whatever the call answers (sale.rs `seen_choosing`).
    renew(seq, p)
    if OP == 'hold' then return hold(seq) end
    return release(seq)
  elseif OP == 'extend' then
    return extend(seq, p)
  end
  return redis.error_reply('unknown operation ' .. tostring(OP))
end

-- A batch of joins, leaves and enters of this event from one node (batch.rs), as one step:
-- ARGV[3..] holds, per operation, its name, its time, its number of arguments and those
-- arguments. Each runs in the order given, at its own time, by the same functions as when
-- sent alone, and gets its own answer (an error code for one does not touch the others);
-- the meta is written back once, at the end. A Lua error in one operation answers that
-- operation only, and the meta still records what the others did. Under `maxmemory`,
-- Redis refuses a script's first write and lets every later one through: so either an
-- operation wrote and the meta can be written too, or nothing was written and writing the
-- meta is refused as well; then the whole batch fails as one (nothing changed). (FCALL,
-- whose function may write, is refused whole under `maxmemory`: call.rs then sends the
-- same call as EVALSHA, which behaves as said here.)
-- The answer lists each operation's own in order: a table, or for a fresh join whose
-- context did not change, three numbers flat (finish_join in rules.lua; batch.rs `expand`).
local function op_batch()
  BATCHED = true
  local out = {}
  local i = 3
  -- A join's arguments go in one table for every join of the batch (op_join keeps no
  -- reference to it), with the arguments it left out nil.
  -- jn: how many arguments the join before left in it (only those past this join's own
  -- are cleared: setting an absent field to nil still costs Lua a lookup and a store).
  local ja, jn = {}, 0
  local nargv = #ARGV
  while i <= nargv do
    local name, n = ARGV[i], num(ARGV[i + 2])
    local a = ja
    if name == 'join' then
      for j = 1, n do a[2 + j] = ARGV[i + 2 + j] end
      for j = n + 1, jn do a[2 + j] = nil end
      jn = n
      a[1], a[2] = name, ARGV[i + 1]
    else
      a = {name, ARGV[i + 1]}
      for j = 1, n do a[2 + j] = ARGV[i + 2 + j] end
    end
    NOW = num(a[2])
    if GAVE_FX then
      FX, GAVE_FX = {}, false
    else
      for k = #FX, 1, -1 do FX[k] = nil end
    end
    local ok, r
    if name == 'join' then
      ok, r = pcall(op_join, a)
    else
      ok, r = pcall(op_place, name, a)
    end
    if not ok then
      -- What the operation changed before it failed is logged like any transition (a
      -- refused log write leaves a gap in lv, which a replica resyncs over).
      pcall(log_step)
      r = {'FAILED', tostring(type(r) == 'table' and r.err or r), FX, ctx(), M.lv or 0}
      PREV_CTX, GAVE_FX = r[4], true
    end
    if r.flat then
      local k = #out
      out[k + 1], out[k + 2], out[k + 3] = r[1], r[2], r[3]
    else
      out[#out + 1] = r
    end
    i = i + 3 + n
  end
  BATCHED = false
  local ok, err = pcall(flush_meta)
  if not ok then return redis.error_reply(type(err) == 'table' and err.err or tostring(err)) end
  return out
end

local function main(keys, argv)
  begin_call(keys, argv)
  local OP = ARGV[1]
  if OP == 'put' then return op_put() end

  if not load_meta() then return finish('EVENT_NOT_FOUND') end
  if OLD_LAYOUT and OP ~= 'delete' then return redis.error_reply(OLD_LAYOUT_ERROR) end
  -- The replicas' snapshot and the batched renewals (replica.lua).
  if OP == 'replica' then return replica_snapshot() end
  if OP == 'replica_places' then return replica_places(tonumber(ARGV[3])) end
  if OP == 'renew' then return renew_batch() end

  if OP == 'get' then
    advance()
    return finish('OK', {rcall('HGET', K_META, 'cfg'), N_W, N_AD, N_AC, M.completed, M.left,
      M.expired, M.cap, M.wsum, M.admissions, M.wn, M.joins, M.opened, M.seen})
  end

  if OP == 'settings' then
    -- What `put` is applied to (configure.rs): the settings, their version and the records
    -- of the opening and of the end by closes_at, which live in the meta's numbers rather
    -- than in the settings' JSON.
    return finish('OK', {rcall('HGET', K_META, 'cfg'), rcall('HGET', K_META, 'ver'), M.opened,
      M.seen})
  end

  if OP == 'delete' then
    rcall('UNLINK', unpack(KEYS))
    -- Every chunk a seq so far may have used (keys that do not exist cost little).
    local batch = {}
    for c = 0, chunk(M.seq) do
      batch[#batch + 1] = pchunk(c)
      batch[#batch + 1] = qkey(c)
      batch[#batch + 1] = wkey(c)
      if #batch >= 300 or c == chunk(M.seq) then
        rcall('UNLINK', unpack(batch))
        batch = {}
      end
    end
    return {'OK', false, FX, ctx()}
  end

  if OP == 'clear' then
    advance()
    -- The waiting places were over at the end of the sale: the sweep ends them as closed.
    if sale_ended() then return finish('OK', 0) end
    local seqs = rcall('ZRANGE', K_PRESEQ, 0, -1)
    -- Every chunk holding a waiting place is in K_WINDEX; the line in seq order.
    local chunks = rcall('ZRANGE', K_WINDEX, 0, -1)
    table.sort(chunks, function(x, y) return tonumber(x) < tonumber(y) end)
    for _, c in ipairs(chunks) do
      for _, seq in ipairs(rank_chunk(c, 0, -1)) do seqs[#seqs + 1] = seq end
    end
    for _, seq in ipairs(seqs) do end_place(seq, place(seq), FX_CLEARED, NOW, true) end
    for _, c in ipairs(chunks) do rcall('UNLINK', qkey(c), wkey(c)) end
    rcall('DEL', K_RANKF, K_WINDEX, K_PRE, K_PRESEQ)
    set('npre', 0)
    set('fsz', 0)
    set('ftot', 0)
    return finish('OK', #seqs)
  end

  if OP == 'head' then
    advance()
    local limit = tonumber(ARGV[3])
    local out = {}
    -- After the end of the sale no place waits, removed or not yet (queue.rs `head`).
    if limit > 0 and not sale_ended() then
      -- Before the opening the shuffle order is secret, even from the admin: the pre-queue
      -- is listed in join order.
      local seqs
      if before_opening() then
        seqs = rcall('ZRANGE', K_PRESEQ, 0, limit - 1)
      else
        seqs = line_range(1, limit)
      end
      for _, seq in ipairs(seqs) do
        local p = place(seq)
        out[#out + 1] = p.user or false
        out[#out + 1] = p.joined
        out[#out + 1] = tonumber(seq)
      end
    end
    return finish('OK', out)
  end

  if OP == 'inventory_put' then return put_inventory() end
  if OP == 'inventory' then return get_inventory() end
  if OP == 'prequeue' then
    -- ARGV: after this seq, at most this many: the pre-queue's waiting places in join order.
    advance()
    if sale_ended() then return finish('OK', {}) end
    return finish('OK', rcall('ZRANGEBYSCORE', K_PRESEQ, '(' .. ARGV[3], '+inf', 'LIMIT', 0,
      tonumber(ARGV[4])))
  end

  if OP == 'invite' then
    -- ARGV: the codes to add; a known code keeps its binding.
    local added = 0
    for i = 3, #ARGV do added = added + rcall('HSETNX', K_INVITES, ARGV[i], '') end
    return finish('OK', added)
  end

  if OP == 'join' then return op_join(ARGV) end
  if OP == 'tick' then return op_tick() end

  if OP == 'release' then
    -- ARGV: the lease value to give up (at shutdown), so another node takes over at once.
    if rcall('GET', K_LEASE) == ARGV[3] then rcall('DEL', K_LEASE) end
    return {'OK', false, FX, ctx()}
  end

  if OP == 'batch' then return op_batch() end
  return op_place(OP, ARGV)
end
