
-- The schedule's rules (src/core/queue_schedule.rs and src/core/schedule.rs): the two
-- lines a waiting place stands in, the order of admission, the lottery. Follows rules.lua,
-- which declares the line_* names (its rules call them) and keeps these numbers in M:
-- opens (opens_at in ms, 0: none), method (0 fifo, 1 random, 2 passthrough, 3 reject),
-- npre (how many wait in the pre-queue), opened (the opens reached, 0: none), prelast (the
-- pre-queue's latest join since it was last empty). Beside `n`
-- in the meta: `sseed` (the shuffle seed) and `lkey` (the lottery key), 32 raw bytes each,
-- written by `put`.
--
-- K_PRE    ZSET the pre-queue's waiting places, all scored 0, member "<key hex>:<seq>":
--          equal scores sort by member, so ZRANK is the rank in shuffle order and the
--          opening moves nothing
-- K_PRESEQ ZSET the same places scored by seq (join order, for the admin's list)

-- SHA-256 (FIPS 180-4) over Redis's LuaBitOp: the shuffle keys and the lottery's draws must
-- be the very numbers the Rust side computes, and Redis offers only SHA-1 to scripts.
-- Bound per call: a library of Redis Functions may read no global (bit) while it loads.
local band, bor, bxor, bnot, rshift, lshift, ror, tobit
on_call(function()
  band, bor, bxor, bnot = bit.band, bit.bor, bit.bxor, bit.bnot
  rshift, lshift, ror, tobit = bit.rshift, bit.lshift, bit.ror, bit.tobit
end)
local SHA_K = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2}

-- n as 8 bytes, big-endian (n below 2^53).
local function be8(n)
  local out = {}
  for i = 8, 1, -1 do
    out[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(out)
end

local function sha256_hex(msg)
  local len = #msg
  msg = msg .. '\128' .. string.rep('\0', (55 - len) % 64) .. be8(len * 8)
  local H = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
    0x5be0cd19}
  local w = {}
  for at = 1, #msg, 64 do
    for i = 0, 15 do
      local b1, b2, b3, b4 = string.byte(msg, at + i * 4, at + i * 4 + 3)
      w[i] = bor(lshift(b1, 24), lshift(b2, 16), lshift(b3, 8), b4)
    end
    for i = 16, 63 do
      local x, y = w[i - 15], w[i - 2]
      local s0 = bxor(ror(x, 7), ror(x, 18), rshift(x, 3))
      local s1 = bxor(ror(y, 17), ror(y, 19), rshift(y, 10))
      w[i] = tobit(w[i - 16] + s0 + w[i - 7] + s1)
    end
    local a, b, c, d, e, f, g, h = H[1], H[2], H[3], H[4], H[5], H[6], H[7], H[8]
    for i = 0, 63 do
      local s1 = bxor(ror(e, 6), ror(e, 11), ror(e, 25))
      local ch = bxor(band(e, f), band(bnot(e), g))
      local t1 = h + s1 + ch + SHA_K[i + 1] + w[i]
      local s0 = bxor(ror(a, 2), ror(a, 13), ror(a, 22))
      local maj = bxor(band(a, b), band(a, c), band(b, c))
      h, g, f, e, d, c, b, a = g, f, e, tobit(d + t1), c, b, a, tobit(t1 + s0 + maj)
    end
    H[1], H[2], H[3], H[4] = tobit(H[1] + a), tobit(H[2] + b), tobit(H[3] + c), tobit(H[4] + d)
    H[5], H[6], H[7], H[8] = tobit(H[5] + e), tobit(H[6] + f), tobit(H[7] + g), tobit(H[8] + h)
  end
  local out = {}
  for i = 1, 8 do out[i] = bit.tohex(H[i], 8) end
  return table.concat(out)
end

-- The event's secrets, read once per call. (Their cache in a block: the main chunk may
-- hold 200 locals only.)
local secret
do
  local cached
  on_call(function() cached = nil end)
  secret = function(field)
    if not cached then
      local v = rcall('HMGET', K_META, 'sseed', 'lkey')
      cached = {sseed = v[1] or '', lkey = v[2] or ''}
    end
    return cached[field]
  end

  -- Stores the event's new secrets (`put`), and forgets those read before in this call:
  -- `put` runs advance() under the old settings first, and an admission there reads the
  -- secrets (none yet, for an event switched to `random` by this change); the admissions
  -- under the new settings must draw with the new key, not take the head of the line.
  write_secrets = function(sseed, lkey)
    rcall('HSET', K_META, 'sseed', sseed, 'lkey', lkey)
    cached = nil
  end
end

-- schedule.rs `in_prequeue`: joined before the opening.
in_prequeue = function(joined)
  return M.opens > 0 and joined < M.opens
end

-- config.rs `opening_ahead`: ahead by this script's time, and not recorded as reached (the
-- meta's `opened`, written by rules.lua `advance`).
before_opening = function()
  return M.opens > 0 and NOW < M.opens and M.opened ~= M.opens
end

local function pre_member(seq)
  return sha256_hex(secret('sseed') .. be8(tonumber(seq))) .. ':' .. seq
end

-- (c: seq's chunk, when the caller has it.)
line_insert = function(seq, joined, c)
  if in_prequeue(joined) then
    -- Kept, never lowered by a departure, counted afresh once the pre-queue was empty:
    -- `put` may not scan the pre-queue for its latest join (queue_schedule.rs).
    if M.npre == 0 or joined > M.prelast then set('prelast', joined) end
    rcall('ZADD', K_PRE, 0, pre_member(seq))
    rcall('ZADD', K_PRESEQ, seq, seq)
    set('npre', M.npre + 1)
  else
    rank_insert(seq, c)
  end
end

line_remove = function(seq, joined)
  if in_prequeue(joined) then
    rcall('ZREM', K_PRE, pre_member(seq))
    rcall('ZREM', K_PRESEQ, seq)
    set('npre', M.npre - 1)
  else
    rank_remove(seq)
  end
end

-- The 1-based place of a waiting place in the order of admission.
line_position = function(seq, joined)
  if in_prequeue(joined) then
    return (rcall('ZRANK', K_PRE, pre_member(seq)) or -1) + 1
  end
  return M.npre + rank_position(seq)
end

-- The seqs from the k-th to the (k + n - 1)-th waiting place in the order of admission.
line_range = function(k, n)
  local out = {}
  if k <= M.npre then
    local r = rcall('ZRANGE', K_PRE, k - 1, math.min(k + n - 1, M.npre) - 1)
    for _, m in ipairs(r) do out[#out + 1] = string.match(m, ':(%d+)$') end
  end
  local left = n - #out
  if left > 0 then
    for _, s in ipairs(rank_range(math.max(k - M.npre, 1), left)) do out[#out + 1] = s end
  end
  return out
end

-- The place the next admission takes (queue_schedule.rs `line_next`): the first in line,
-- or under `random` the lottery's draw numbered by the admissions so far. The first 48
-- bits of the hash are exact as a double, and fmod is exact.
line_next = function()
  local k = 1
  local key = secret('lkey')
  if M.method == 1 and key ~= '' then
    local x = tonumber(string.sub(sha256_hex(key .. be8(M.admissions)), 1, 12), 16)
    k = math.fmod(x, N_W) + 1
  end
  return line_range(k, 1)[1]
end

-- Capacity and rate as the method sees them: passthrough has neither (-1: no cap).
limits = function()
  if M.method == 2 then return -1, 0 end
  return M.cap, M.rate
end

-- The reject rule (queue_schedule.rs `check_reject`). freed_w, freed_h: 1 when the place a
-- proven join replaces waits, or holds a slot (its room counts as free).
check_reject = function(freed_w, freed_h)
  if M.method ~= 3 or before_opening() then return true end
  local ok = M.paused ~= 1 and N_W - freed_w == 0 and N_AD + N_AC - freed_h < M.cap
  if ok and M.rate > 0 then
    refill()
    ok = M.btok >= 1.0
  end
  return ok
end
