-- tokenshard: refill, decide and write one chunk of requests atomically.
--
-- Redis runs Lua 5.1, whose only numbers are doubles: exact below 2^53, while
-- units (tokens * 1e9), clock readings in ns and their products reach 2^126.
-- So every quantity travels as a decimal string and is computed on as base
-- 10^7 limbs (least significant first): a limb product stays below 10^14 and
-- a column sum below 2^53, so each step is exact. Floating point appears only
-- in the expiry, which is rounded up with a margin (a key may outlive its
-- time-to-full, never the reverse).
--
-- KEYS[1] policy hash (v = version in force), KEYS[2] history list (one entry
-- per retained version, oldest first: "version cutover cap rate overridden"),
-- KEYS[3] the pending flag (set while a cutover that may lengthen
-- times-to-full is prepared: buckets are then written without expiry),
-- KEYS[4..] the buckets, each a string "units last version cap rate".
--
-- ARGV[1] mode: "a" decide; "e" bring up to date and delete if full (an
--         eviction); "c" bring up to date (a cutover's pass; a full bucket
--         is then left to expire at once rather than deleted, so that only
--         EvictFull counts deletions, as in the engine).
-- ARGV[2] the version the client resolved the limits under.
-- ARGV[3] the instant in ns: "" reads the server's TIME; otherwise, with
--         expiry on, the earlier of it and TIME (an eviction judges every key
--         at the instant it began); with expiry off, exactly it
--         (Config.Clock's reading).
-- ARGV[4] "1" sets expiries at the time-to-full, "0" sets none (a store
--         with a Config.Clock).
-- ARGV[5..] four per bucket: cost (tokens), cap and rate of the key under
--         ARGV[2], and the chain: "version cap rate" triples joined by ";"
--         giving the key's own limit under retained versions that had
--         overrides.
--
-- Reply: {status, version in force, instant, done, deleted, ...}, where
-- done counts the buckets decided or brought up to date and deleted those of
-- them deleted as full (mode "e"). status "ok": the results follow; "stale":
-- ARGV[2] is not in force and nothing was done; "nopolicy"; "chain": bucket
-- done+1 is behind a version with overrides that its chain lacks, and its
-- version follows, then the results of the buckets before it. Results,
-- mode "a" only: for each done bucket "1" allowed, "0" denied or "c" cost above
-- capacity, then the units after the decision.

local B = 10000000

local function norm(n)
  while #n > 1 and n[#n] == 0 do n[#n] = nil end
  return n
end

local function big(s)
  local n, i = {}, #s
  while i > 0 do
    local j = i - 6
    if j < 1 then j = 1 end
    n[#n + 1] = tonumber(string.sub(s, j, i))
    i = j - 1
  end
  return norm(n)
end

local function str(n)
  local p = { string.format('%d', n[#n]) }
  for i = #n - 1, 1, -1 do p[#p + 1] = string.format('%07d', n[i]) end
  return table.concat(p)
end

local function cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  for i = #a, 1, -1 do
    if a[i] ~= b[i] then return a[i] < b[i] and -1 or 1 end
  end
  return 0
end

local function add(a, b)
  local r, c = {}, 0
  for i = 1, math.max(#a, #b) do
    local s = (a[i] or 0) + (b[i] or 0) + c
    if s >= B then r[i], c = s - B, 1 else r[i], c = s, 0 end
  end
  if c > 0 then r[#r + 1] = c end
  return r
end

-- sub requires a >= b.
local function sub(a, b)
  local r, c = {}, 0
  for i = 1, #a do
    local s = a[i] - (b[i] or 0) - c
    if s < 0 then r[i], c = s + B, 1 else r[i], c = s, 0 end
  end
  return norm(r)
end

local function mul(a, b)
  local r = {}
  for i = 1, #a + #b do r[i] = 0 end
  for i = 1, #a do
    local c, ai = 0, a[i]
    for j = 1, #b do
      local s = r[i + j - 1] + ai * b[j] + c -- at most B^2 - 1 < 2^53
      c = math.floor(s / B)
      local lo = s - c * B
      if lo < 0 then c, lo = c - 1, lo + B elseif lo >= B then c, lo = c + 1, lo - B end
      r[i + j - 1] = lo
    end
    r[i + #b] = c
  end
  return norm(r)
end

local E9 = '000000000'
local P52 = 4503599627370496 -- 2^52
local FASTCAP = 4503599     -- the largest capacity whose units are below 2^52

-- msOf is an instant in ns (a decimal string) in whole ms.
local function msOf(s)
  if #s <= 6 then return 0 end
  return tonumber(string.sub(s, 1, -7))
end

-- split reads an instant in ns as whole seconds and the ns within the
-- second, each exact as a double.
local function split(s)
  local n = #s
  if n <= 9 then return 0, tonumber(s) end
  return tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))
end

-- refill brings units u, last updated at t, up to instant now under capacity
-- cap (tokens, string) and rate (tokens per second, string); a now at or
-- before t adds nothing. Returns the units and the new last.
local function refill(u, t, now, cap, rate)
  if cmp(now, t) <= 0 then return u, t end
  local full = big(cap .. E9)
  u = add(u, mul(sub(now, t), big(rate)))
  if cmp(u, full) > 0 then u = full end
  return u, now
end

local function splitChain(s)
  local m = {}
  for v, c, r in string.gmatch(s, '(%d+) (%d+) (%d+)') do m[v] = { c, r } end
  return m
end

local mode, want, expiry = ARGV[1], ARGV[2], ARGV[4] == '1'
local version = redis.call('HGET', KEYS[1], 'v')
if not version then return { 'nopolicy' } end
if version ~= want then return { 'stale', version } end

local nowS, nowMs
if ARGV[3] == '' or expiry then
  local tm = redis.call('TIME')
  nowS = tm[1] .. string.format('%06d', tonumber(tm[2])) .. '000'
  nowMs = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
  if ARGV[3] ~= '' and cmp(big(ARGV[3]), big(nowS)) < 0 then
    nowS = ARGV[3]
    nowMs = msOf(nowS)
  end
else
  nowS = ARGV[3]
end
local now = big(nowS)
local pending = expiry and redis.call('EXISTS', KEYS[3]) == 1

local nowSec, nowNs = split(nowS)
local history -- loaded on first need
local out = {}
local deleted = 0

-- reply builds the answer without unpack, which a long chunk would overflow.
local function reply(status, done, behind)
  local r = { status, version, nowS, tostring(done), tostring(deleted) }
  if behind then r[#r + 1] = behind end
  for k = 1, #out do r[#r + 1] = out[k] end
  return r
end
local n = #KEYS - 3
for i = 1, n do
  local key, a = KEYS[3 + i], 4 + 4 * (i - 1)
  local cost, cap, rate, chain = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  if mode == 'a' and (#cost > #cap or (#cost == #cap and cost > cap)) then
    out[#out + 1] = 'c'
    out[#out + 1] = ''
  else
    local raw = redis.call('GET', key)
    local us, ts, v, c, r
    if raw then us, ts, v, c, r = string.match(raw, '^(%d+) (%d+) (%d+) (%d+) (%d+)$') end
    -- the bucket after the decision: units and last update as strings, the
    -- decision's code, and the units it lacks to be full (as a double: exact
    -- on the fast path, and zero exactly when it is full)
    local uS, tS, code, deficit
    local capN = #cap <= 7 and tonumber(cap)
    if capN and capN <= FASTCAP and (not raw or (v == version and c == cap and r == rate)) then
      -- Fast path: a capacity below 2^52 units and no cutover to replay, so
      -- every value below is an integer under 2^53, exact as a double.
      local full = capN * 1e9
      local u = full -- a new key starts full
      tS = nowS
      if raw then
        u = tonumber(us)
        local tSec, tNs = split(ts)
        local ds = nowSec - tSec
        if ds > 9000000 then
          u = full -- over 9e15 ns at one unit per ns at least: full
        elseif ds > 0 or (ds == 0 and nowNs > tNs) then
          local add = (ds * 1e9 + nowNs - tNs) * tonumber(rate)
          -- a product at or above 2^52 is over the capacity; below, exact
          if add >= P52 then u = full else u = math.min(full, u + add) end
        else
          tS = ts -- no time, or a clock that stepped back
        end
      end
      if mode == 'a' then
        local cu = tonumber(cost) * 1e9
        if u >= cu then u, code = u - cu, '1' else code = '0' end
      end
      uS, deficit = string.format('%.0f', u), full - u
    else
      -- General path: limbs, and the cutovers the bucket missed.
      local full = big(cap .. E9)
      local u, t
      if raw then
        u, t = big(us), big(ts)
        if v ~= version then
          history = history or redis.call('LRANGE', KEYS[2], 0, -1)
          local at
          for h = 1, #history do
            if string.match(history[h], '^(%d+) ') == v then at = h break end
          end
          local own, from = splitChain(chain), #history + 1
          if at then
            from = at + 1
          else
            -- The version is no longer retained: only a Redis that lost the
            -- policy keys gets here. What the bucket earned since is
            -- unknown, so it restarts empty at the current cutover: a
            -- denial too many, never a free burst.
            local last = history[#history]
            local cut = last and string.match(last, '^%d+ (%d+) ') or nowS
            u = { 0 }
            if cmp(big(cut), t) > 0 then t = big(cut) end
            c, r = cap, rate
          end
          for h = from, #history do
            local w, cut, wc, wr, ov = string.match(history[h], '^(%d+) (%d+) (%d+) (%d+) (%d)$')
            if w == version then
              wc, wr = cap, rate
            elseif ov == '1' then
              if not own[w] then
                return reply('chain', i - 1, v)
              end
              wc, wr = own[w][1], own[w][2]
            end
            -- The cutover rule: refill under the old limit up to the
            -- cutover, then clamp to the new capacity.
            u, t = refill(u, t, big(cut), c, r)
            local wfull = big(wc .. E9)
            if cmp(u, wfull) > 0 then u = wfull end
            c, r = wc, wr
          end
        end
        u, t = refill(u, t, now, cap, rate)
      else
        u, t = full, now -- a new key starts full
      end
      if mode == 'a' then
        local cu = big(cost .. E9)
        if cmp(u, cu) >= 0 then u, code = sub(u, cu), '1' else code = '0' end
      end
      uS, tS = str(u), str(t)
      local d = sub(full, u)
      deficit = 0
      for k = #d, 1, -1 do deficit = deficit * B + d[k] end
    end

    local keep = true
    if mode == 'a' then
      out[#out + 1] = code
      out[#out + 1] = uS
      -- a bucket can only be full here if it was never written: nothing to keep
      keep = raw ~= nil or deficit > 0
    elseif not raw then
      keep = false -- brought up to date, a bucket never written is full
    elseif mode == 'e' and deficit == 0 then
      keep = false
      deleted = deleted + 1
    end

    if not keep then
      if raw then redis.call('DEL', key) end
    else
      local val = uS .. ' ' .. tS .. ' ' .. version .. ' ' .. cap .. ' ' .. rate
      if not expiry or pending then
        -- no expiry: tests, or a cutover in preparation
        redis.call('SET', key, val)
      elseif deficit == 0 then
        redis.call('SET', key, val, 'PXAT', string.format('%.0f', math.max(nowMs, msOf(tS)) + 1))
      else
        local ms = deficit / tonumber(rate) / 1e6 -- time-to-full in ms, approximately
        if ms > 1e15 then
          redis.call('SET', key, val) -- over 30,000 years: never expires
        else
          -- relative error of ms is far below 1e-12; +2 covers the ms
          -- rounding of the instant and of the expiry
          -- The deficit is counted from the bucket's last update, which a
          -- pass judging at an earlier instant, a cutover replayed past it
          -- or a server clock that stepped back leaves after nowMs.
          local at = math.max(nowMs, msOf(tS)) + math.floor(ms * (1 + 1e-12)) + 2
          redis.call('SET', key, val, 'PXAT', string.format('%.0f', at))
        end
      end
    end
  end
end
return reply('ok', n)
