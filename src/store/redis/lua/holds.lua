
-- Seat and inventory holds (src/core/holds.rs, src/core/sale.rs), after rules.lua (and places.lua) and
-- before ops.lua. Keys (bound by the prelude, all in the event's hash slot):
-- K_ITEMS  HASH item id -> '' available, 'h' .. seq .. ':' .. until (held by the session
--          of place seq until that time), 's' .. seq (sold to it)
-- K_HUNTIL ZSET held item ids scored by when their hold lapses
-- K_HSESS  HASH seq -> the items that session holds, space-separated (ids have no spaces)
-- K_EXT    HASH seq -> 'count:extra_ms', a session's extensions
-- and in K_META the fields itotal, iheld, isold (the admin's counts).
-- The hold and extension settings are read from the config JSON (cfg), only by these
-- operations, with the Rust defaults from the prelude for a config written before them.

local CFG
on_call(function() CFG = nil end)
local function cfg_num(name, default)
  if not CFG then CFG = cjson.decode(rcall('HGET', K_META, 'cfg')) end
  local v = CFG[name]
  if type(v) ~= 'number' then return default end
  return v
end

local function sess_items(seq)
  local t = {}
  local s = rcall('HGET', K_HSESS, seq)
  if s then for id in string.gmatch(s, '%S+') do t[#t + 1] = id end end
  return t
end

local function sess_write(seq, t)
  if #t == 0 then
    rcall('HDEL', K_HSESS, seq)
  else
    table.sort(t)
    rcall('HSET', K_HSESS, seq, table.concat(t, ' '))
  end
end

-- Ends every hold of a session, in the step that ends the session (end_place): sold when
-- it completed, released otherwise. Forward-declared in rules.lua.
release_holds = function(seq, sell)
  rcall('HDEL', K_EXT, seq)
  local s = rcall('HGET', K_HSESS, seq)
  if not s then return end
  local n = 0
  for id in string.gmatch(s, '%S+') do
    rcall('ZREM', K_HUNTIL, id)
    if sell then rcall('HSET', K_ITEMS, id, 's' .. seq) else rcall('HSET', K_ITEMS, id, '') end
    n = n + 1
  end
  rcall('HDEL', K_HSESS, seq)
  rcall('HINCRBY', K_META, 'iheld', -n)
  if sell then rcall('HINCRBY', K_META, 'isold', n) end
end

-- Releases every hold whose time is up at NOW (core Inventory::expire).
local function expire_holds()
  local due = rcall('ZRANGEBYSCORE', K_HUNTIL, '-inf', fmt(NOW))
  if #due == 0 then return end
  local by_seq = {}
  for _, id in ipairs(due) do
    local st = rcall('HGET', K_ITEMS, id)
    local seq = string.match(st or '', '^h(%d+):')
    if seq then
      by_seq[seq] = by_seq[seq] or {}
      by_seq[seq][id] = true
    end
    rcall('HSET', K_ITEMS, id, '')
    rcall('ZREM', K_HUNTIL, id)
  end
  rcall('HINCRBY', K_META, 'iheld', -#due)
  for seq, gone in pairs(by_seq) do
    local keep = {}
    for _, id in ipairs(sess_items(seq)) do
      if not gone[id] then keep[#keep + 1] = id end
    end
    sess_write(seq, keep)
  end
end

-- A session's holds as the answer: flat id, until pairs, ordered by id.
local function holds_of(seq)
  local out = {}
  for _, id in ipairs(sess_items(seq)) do
    out[#out + 1] = id
    out[#out + 1] = tonumber(rcall('ZSCORE', K_HUNTIL, id))
  end
  return out
end

local function inventory_counts()
  local c = rcall('HMGET', K_META, 'itotal', 'iheld', 'isold')
  return {tonumber(c[1]) or 0, tonumber(c[2]) or 0, tonumber(c[3]) or 0}
end

-- ARGV[3..]: item ids (checked by the Rust side). All or none past MAX_ITEMS. The counts
-- answered are an inventory read's: what is due ends, and lapsed holds go, first.
local function put_inventory()
  advance()
  expire_holds()
  local total = inventory_counts()[1]
  local fresh, seen = {}, {}
  for i = 3, #ARGV do
    local id = ARGV[i]
    if not seen[id] then
      seen[id] = true
      if rcall('HEXISTS', K_ITEMS, id) == 0 then fresh[#fresh + 1] = id end
    end
  end
  if total + #fresh > MAX_ITEMS then return finish('INVENTORY_FULL') end
  for _, id in ipairs(fresh) do rcall('HSET', K_ITEMS, id, '') end
  if #fresh > 0 then rcall('HINCRBY', K_META, 'itotal', #fresh) end
  local c = inventory_counts()
  return finish('OK', {#fresh, c[1], c[2], c[3]})
end

local function get_inventory()
  advance()
  expire_holds()
  local c = inventory_counts()
  return finish('OK', {c[1], c[2], c[3], rcall('HGETALL', K_ITEMS)})
end

-- ARGV[5..]: item ids. All or none, checked in the order given (Inventory::hold).
local function hold(seq)
  expire_holds()
  local until_ = NOW + cfg_num('hold_ttl_sec', DEFAULT_HOLD_TTL_SEC) * 1000
  local max = cfg_num('max_holds_per_session', DEFAULT_MAX_HOLDS_PER_SESSION)
  local mine = sess_items(seq)
  local have = {}
  for _, id in ipairs(mine) do have[id] = true end
  local wanted, seen, fresh = {}, {}, 0
  for i = 5, #ARGV do
    local id = ARGV[i]
    if not seen[id] then
      seen[id] = true
      wanted[#wanted + 1] = id
      local st = rcall('HGET', K_ITEMS, id)
      if not st then return finish('ITEM_NOT_FOUND') end
      if st == '' then
        -- Only a new item counts toward the limit, checked at the item that breaks it: a
        -- pure renewal adds nothing, so it is never refused, even above a lowered limit.
        fresh = fresh + 1
        if #mine + fresh > max then return finish('TOO_MANY_HOLDS') end
      elseif not have[id] then
        return finish('HOLD_CONFLICT')
      end
    end
  end
  local mark = 'h' .. seq .. ':' .. fmt(until_)
  for _, id in ipairs(wanted) do
    if not have[id] then mine[#mine + 1] = id end
    rcall('HSET', K_ITEMS, id, mark)
    rcall('ZADD', K_HUNTIL, fmt(until_), id)
  end
  if fresh > 0 then rcall('HINCRBY', K_META, 'iheld', fresh) end
  sess_write(seq, mine)
  return finish('OK', holds_of(seq))
end

-- ARGV[5] '1': release all; else ARGV[6..] the items to release.
local function release(seq)
  expire_holds()
  local gone = {}
  local all = ARGV[5] == '1'
  for i = 6, #ARGV do gone[ARGV[i]] = true end
  local keep, n = {}, 0
  for _, id in ipairs(sess_items(seq)) do
    if all or gone[id] then
      rcall('HSET', K_ITEMS, id, '')
      rcall('ZREM', K_HUNTIL, id)
      n = n + 1
    else
      keep[#keep + 1] = id
    end
  end
  if n > 0 then rcall('HINCRBY', K_META, 'iheld', -n) end
  sess_write(seq, keep)
  return finish('OK', holds_of(seq))
end

-- Adds session_extend_sec to the session's maximum: its entry-time score moves later by
-- as much, which is all the deadlines read (queue.rs deadline_of with `extra`).
local function extend(seq, p)
  local max = cfg_num('max_extensions', DEFAULT_MAX_EXTENSIONS)
  local add = cfg_num('session_extend_sec', DEFAULT_SESSION_EXTEND_SEC) * 1000
  local count, extra = 0, 0
  local cur = rcall('HGET', K_EXT, seq)
  if cur then
    local c, e = string.match(cur, '^(%d+):(%d+)$')
    count, extra = tonumber(c), tonumber(e)
  end
  if count >= max then return finish('EXTENSION_LIMIT') end
  renew(seq, p)
  rcall('HSET', K_EXT, seq, fmt(count + 1) .. ':' .. fmt(extra + add))
  rcall('ZADD', K_AENT, fmt(p.ent + extra + add), seq)
  return finish('OK', view(seq, p))
end
