-- tokenshard: refill, decide and write one chunk of requests atomically.
--
-- The source is one Lua chunk that defines call(KEYS, ARGV): loaded as a
-- Redis FUNCTION library (registered under a name of its own hash), its
-- helpers are made once, at load; sent with EVALSHA, the chunk ends in
-- "return call(KEYS, ARGV)". Per-call state lives in locals of the chunk
-- that every call sets before use: calls never interleave.
--
-- Redis runs Lua 5.1, whose only numbers are doubles: exact below 2^53, while
-- units and clock readings reach 2^126 and their products more. So the
-- general path carries every quantity as a decimal string and computes on
-- base 10^7 limbs (least significant first): a limb product stays below
-- 10^14 and a column sum below 2^53, so each step is exact. Floating point
-- appears only in the fast path, where every value is an integer below 2^53
-- (exact), in estimates that are corrected exactly (div), and in the expiry,
-- which is rounded up with a margin (a key may outlive its time-to-full,
-- never the reverse).
--
-- Units: a band refilled at N tokens per P ns counts one token as P units,
-- so refill over e ns adds exactly e*N units, and a full band holds
-- capacity*P. For P = 1e9 (a rate per second) this is the 1e9-unit scheme.
-- The only rounding anywhere is at a cutover that changes a band's period:
-- its units u become floor(u*Pnew/Pold) (whole tokens kept, the fraction
-- rounded down: a unit may be lost, never minted).
--
-- The fast path: a key of one band with capacity C <= 2^52 and N*P < 2^52,
-- whose bucket is under the version in force with the same limit. Its
-- balance is whole tokens T and a fraction F < P (units T*P + F), each an
-- integer double; time is whole seconds and ns. A refill over e = q*P + r
-- ns adds q*N tokens and r*N units (r*N + F < 2^53), so every step is exact
-- or, when a product passes 2^53, compares above C exactly (C and the
-- products' operands are exact, and rounding is monotone).
--
-- A key's limit is a shape: its primary band and zero or more named bands,
-- every one of which must hold a request's cost for it to be admitted. A
-- shape travels as three strings: cap and rate of the primary band (rate
-- "N", N per second, or "N/P"), and bands: "" or "name:cap:rate" per band
-- joined by ",", names in hex.
--
-- KEYS[1] policy hash (v = version in force), KEYS[2] history list (one entry
-- per retained version, oldest first: "version cutover cap rate overridden"
-- for the default shape, then " bands" if it has bands), KEYS[3] the pending
-- flag (set while a cutover that may lengthen times-to-full is prepared:
-- buckets are then written without expiry), KEYS[4..] the buckets. A bucket
-- is in one of two formats:
--   compact (written for every key of a shape the fast path takes, by
--   either path): the byte 2, then T and F as two little-endian doubles,
--   the last update's seconds and ns, and the expiry it was given (see
--   put) in ms after that update's ms, as three little-endian unsigned
--   32-bit integers, then "version cap rate" (the limit it was written
--   under, as in the decimal format); or, written with no expiry recorded
--   (and by older stores), the byte 1, then T, F, the last update's
--   seconds and ns as four little-endian doubles, then the same;
--   decimal (the general path's for any other shape, and every older
--   store's): "units last
--   version cap rate" (the primary band's units and its cap and rate under
--   version), then " units" for each band of the shape, in order.
-- The compact format starts with a byte no decimal starts with, so a store
-- that predates it (or the byte 2) fails its script call on such a bucket
-- (its failure rule answers) rather than misread it.
--
-- ARGV[1] mode: "a" decide; "e" bring up to date and delete if full (an
--         eviction); "c" bring up to date (a cutover's pass; a full bucket
--         is then left to expire at once rather than deleted, so that only
--         EvictFull counts deletions, as in the engine); "p" bring up to date
--         and write nothing (a peek); "r" bring up to date and credit cost
--         tokens to every band, capped (a refund; a missing bucket is full
--         and stays missing); "A" decide all or nothing: every bucket is
--         decided as in "a" (each with its key's summed cost: a key comes
--         once) at the one instant, and written only if every one is
--         admitted; a refusal writes nothing.
-- ARGV[2] the version the client resolved the limits under.
-- ARGV[3] the instant in ns: "" reads the server's TIME; otherwise, with
--         expiry on, the earlier of it and TIME (an eviction judges every key
--         at the instant it began); with expiry off, exactly it
--         (Config.Clock's reading).
-- ARGV[4] "1" sets expiries at the time-to-full, "0" sets none (a store
--         with a Config.Clock); either followed by "m" when a key comes
--         more than once in the call: mode "a" then reads and writes each
--         such bucket once.
-- ARGV[5] "1" or "2": the words per bucket (below).
-- ARGV[6] S, how many shapes the buckets have under ARGV[2]; then each
--         shape's two: cap and "rate[ bands]" (a plain key's two arguments
--         are the ones it always had).
-- Then the words of each bucket: its cost (tokens) and, if ARGV[5] is "2",
--         its shape's number among the S, followed by ";" and its chain if
--         it has one: "version cap rate[ bands]" entries joined by ";"
--         giving the key's own shape under retained versions that had
--         overrides. With one word, every bucket has shape 1 and no chain.
--
-- Reply: {status, version in force, done, deleted, ...}, where done counts
-- the buckets decided or brought up to date and deleted those of them
-- deleted as full (mode "e"), both integers. status "ok": the results
-- follow; "stale": ARGV[2] is not in force and nothing was done (the reply
-- ends after the version); "nopolicy" (nothing follows); "chain": bucket
-- done+1 is behind a version with overrides that its chain lacks, and its
-- version follows, then the results of the buckets before it (mode "A":
-- done is 0 and nothing was written). Results, modes "a", "A", "p" and "r":
-- three for each done bucket. A code, an integer (a string would cost the
-- client an allocation): modes "a" and "A", 1 allowed (in "A", would be
-- allowed alone: the call is admitted only if every bucket is 1), 0 denied
-- or 2 cost above a band's capacity; modes "p" and "r", 1 if the bucket
-- exists, else 0. Then the balance after the operation: on the
-- fast path T and F, two integers; on the general path the units, one
-- decimal per band of the shape joined by " ", and ""; for 2, "" and "".
-- In "A" it is the balance an admission leaves, written or not.

-- The library functions of every request's path, as upvalues: in a
-- FUNCTION library a global is looked up through the library's own
-- environment, which takes about twice as long as reading an upvalue. A
-- library's load cannot read them, so the library's first call sets them
-- (bind); a script sent with EVALSHA runs its chunk anew, and sets them,
-- on every call.
local floor, mmax, rcall, byte, find, format, pack, unpackS, tonum

local function bind()
  floor, mmax, rcall, byte, find, format = math.floor, math.max, redis.call, string.byte, string.find, string.format
  pack, unpackS, tonum = struct.pack, struct.unpack, tonumber
end

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
    n[#n + 1] = tonum(string.sub(s, j, i))
    i = j - 1
  end
  return norm(n)
end

local function str(n)
  local p = { format('%d', n[#n]) }
  for i = #n - 1, 1, -1 do p[#p + 1] = format('%07d', n[i]) end
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
  for i = 1, mmax(#a, #b) do
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
      c = floor(s / B)
      local lo = s - c * B
      if lo < 0 then c, lo = c - 1, lo + B elseif lo >= B then c, lo = c + 1, lo - B end
      r[i + j - 1] = lo
    end
    r[i + #b] = c
  end
  return norm(r)
end

local P52 = 4503599627370496 -- 2^52

-- msOf is an instant in ns (a decimal string) in whole ms.
local function msOf(s)
  if #s <= 6 then return 0 end
  return tonum(string.sub(s, 1, -7))
end

-- split reads an instant in ns as whole seconds and the ns within the
-- second, each exact as a double.
local function split(s)
  local n = #s
  if n <= 9 then return 0, tonum(s) end
  return tonum(string.sub(s, 1, n - 9)), tonum(string.sub(s, n - 8))
end


-- Per-call state: set by decide before any use.
local version, mode, decide, all, expiry, pending
local nowSec, nowNs, nowMs, nowS, now
local history, out, deleted
local memo, memoOn -- mode "a": the fast-path buckets the call holds, by key and in order; whether it holds them
local NOMEMO = {} -- memo of a call without "m": never written
-- The last shape's arguments, parsed (kept from call to call of a FUNCTION
-- library: each is a function of the two strings alone)
local sCap, sArg, sRate, sBands, sN, sP, sLeast, sCapN, sFast
local KEYS2, KEYS3
local call

-- instant makes nowS (decimal ns) and now (limbs) of the call's instant.
local function instant()
  if nowS then return end
  if nowSec == 0 then
    nowS = format('%.0f', nowNs)
  else
    nowS = format('%.0f', nowSec) .. format('%09.0f', nowNs)
  end
  now = big(nowS)
end

-- reply is the answer: out, whose first four slots the call left for
-- its head.
local function reply(status, done, behind)
  out[1], out[2], out[3], out[4] = status, version, done, deleted
  if behind then table.insert(out, 5, behind) end
  return out
end

local tod, div, shapeOf, fullOf, refill, carry, splitChain, entry, bring
local shapes
local function general()
  if bring then return end
  -- tod is n as a double, rounded (a relative error of a few 2^-53): for
  -- estimates and expiries only.
  function tod(n)
    local d = 0
    for k = #n, 1, -1 do d = d * B + n[k] end
    return d
  end

  -- div returns floor(a / b) for b >= 1: schoolbook division in base B, each
  -- quotient limb estimated in floating point and then corrected exactly, so
  -- an estimate that is off costs a step, never exactness. Only a cutover that
  -- changes a band's period divides.
  function div(a, b)
    local q, r = {}, { 0 }
    for i = 1, #a do q[i] = 0 end
    for i = #a, 1, -1 do
      table.insert(r, 1, a[i]) -- r = r*B + a[i]
      r = norm(r)
      if cmp(r, b) >= 0 then -- r < b*B, so the limb is in [1, B)
        local d = floor(tod(r) / tod(b))
        if d >= B then d = B - 1 elseif d < 1 then d = 1 end
        local m = mul(b, { d })
        while cmp(m, r) > 0 do d, m = d - 1, sub(m, b) end
        local m2 = add(m, b)
        while cmp(m2, r) <= 0 do d, m, m2 = d + 1, m2, add(m2, b) end
        r = sub(r, m)
        q[i] = d
      end
    end
    return norm(q)
  end

  -- A shape is an array of bands, the primary first; a band is {name (hex,
  -- "" for the primary), cap (decimal), p (decimal), pb (P as limbs), n (N as
  -- limbs), nD (N as a double), full (cap*P as limbs)}. A shape also has
  -- min, the smallest cap (decimal). Shapes are parsed once per call.

  -- gtS reports whether decimal a (no leading zeros) is above decimal b.
  local function gtS(a, b) return #a > #b or (#a == #b and a > b) end

  local function band(name, cap, rate)
    local n, p = string.match(rate, '^(%d+)/(%d+)$')
    if not n then n, p = rate, '1000000000' end
    local pb = big(p)
    return { name = name, cap = cap, p = p, pb = pb, n = big(n), nD = tonum(n), full = mul(big(cap), pb) }
  end

  function shapeOf(cap, rate, bands)
    local k = cap .. ' ' .. rate .. ' ' .. bands
    shapes = shapes or {}
    local sh = shapes[k]
    if sh then return sh end
    sh = { band('', cap, rate) }
    sh.min = cap
    for name, c, r in string.gmatch(bands, '(%x+):(%d+):([%d/]+)') do
      sh[#sh + 1] = band(name, c, r)
      if gtS(sh.min, c) then sh.min = c end
    end
    shapes[k] = sh
    return sh
  end

  -- fullOf is every band of sh full.
  function fullOf(sh)
    local lv = {}
    for k = 1, #sh do lv[k] = sh[k].full end
    return lv
  end

  -- refill brings the bands lv of shape sh, last updated at t, up to instant
  -- now: each gains elapsed*N units, up to its capacity; a now at or before t
  -- adds nothing. It returns the new last.
  function refill(lv, t, now, sh)
    if cmp(now, t) <= 0 then return t end
    local e = sub(now, t)
    for k = 1, #sh do
      local b = sh[k]
      if cmp(lv[k], b.full) < 0 then
        local u = add(lv[k], mul(e, b.n))
        if cmp(u, b.full) > 0 then u = b.full end
        lv[k] = u
      end
    end
    return now
  end

  -- carry moves the bands lv of shape old, brought up to a cutover, to shape
  -- nxt: the primary takes over the primary, a band the band of old of the
  -- same name, each moved to the new unit if the period changes (rounding
  -- down) and clamped to the new capacity; a band new in nxt starts full; a
  -- band of old that nxt lacks is dropped.
  function carry(old, lv, nxt)
    local out = {}
    for k = 1, #nxt do
      local b, j = nxt[k], nil
      if k == 1 then
        j = 1
      else
        for m = 2, #old do
          if old[m].name == b.name then j = m break end
        end
      end
      if not j then
        out[k] = b.full
      else
        local u = lv[j]
        if old[j].p ~= b.p then u = div(mul(u, b.pb), old[j].pb) end
        if cmp(u, b.full) > 0 then u = b.full end
        out[k] = u
      end
    end
    return out
  end

  function splitChain(s)
    local m = {}
    for e in string.gmatch(s, '[^;]+') do
      local v, c, r, bs = string.match(e, '^(%d+) (%d+) (%S+) ?(%S*)$')
      if v then m[v] = { c, r, bs } end
    end
    return m
  end

  -- entry parses a history entry: version, cutover, the default shape's cap,
  -- rate and bands, and the overridden flag.
  function entry(e)
    local w, cut, c, r, ov, rest = string.match(e, '^(%d+) (%d+) (%d+) (%S+) (%d)(.*)$')
    return w, cut, c, r, string.match(rest, '^ (%S+)$') or '', ov
  end

  -- bring brings a written bucket of shape sh (under the version in force) up
  -- to now through every cutover it missed: the bucket's fields, then its
  -- chain. It returns the bands and the last update, or nil and the bucket's
  -- version when the chain lacks a version the bucket needs.
  function bring(us, ts, v, c, r, rest, sh, chain)
    local lv, t = { big(us) }, big(ts)
    for u in string.gmatch(rest, '%d+') do lv[#lv + 1] = big(u) end
    local cur, from = sh, nil
    if v ~= version then
      history = history or rcall('LRANGE', KEYS2, 0, -1)
      local at
      for h = 1, #history do
        if string.match(history[h], '^(%d+) ') == v then at = h break end
      end
      local own = splitChain(chain)
      if at then
        from = at + 1
        if #lv == 1 then
          cur = shapeOf(c, r, '') -- one band: the bucket says it all
        else
          local _, _, hc, hr, hb, ov = entry(history[at])
          if ov == '1' then
            if not own[v] then return nil, v end
            cur = shapeOf(own[v][1], own[v][2], own[v][3])
          else
            cur = shapeOf(hc, hr, hb)
          end
        end
      end
      if at and #cur == #lv then
        for h = from, #history do
          local w, cut, wc, wr, wb, ov = entry(history[h])
          local nxt
          if w == version then
            nxt = sh
          elseif ov == '1' then
            if not own[w] then return nil, v end
            nxt = shapeOf(own[w][1], own[w][2], own[w][3])
          else
            nxt = shapeOf(wc, wr, wb)
          end
          -- The cutover rule: refill under the old shape up to the cutover,
          -- then carry the bands over to the new one.
          t = refill(lv, t, big(cut), cur)
          lv = carry(cur, lv, nxt)
          cur = nxt
        end
      else
        -- The version is no longer retained: only a Redis that lost the
        -- policy keys gets here. What the bucket earned since is unknown, so
        -- it restarts empty at the current cutover: a denial too many, never
        -- a free burst.
        local last = history[#history]
        local cut = last and string.match(last, '^%d+ (%d+) ') or nowS
        lv = {}
        for k = 1, #sh do lv[k] = { 0 } end
        if cmp(big(cut), t) > 0 then t = big(cut) end
      end
    elseif #lv ~= #sh then
      -- Bands that are not the shape's (the same): restart empty, as above.
      lv = {}
      for k = 1, #sh do lv[k] = { 0 } end
    end
    t = refill(lv, t, now, sh)
    return lv, t
  end
end

-- put writes a bucket: its value val or, for a compact bucket (val nil),
-- its fields T, F, ls, lns under limit tag; last updated at lastMs (ms: for
-- a compact bucket ls*1000 + floor(lns/1e6), as fastOf counts it), with its
-- expiry at its time-to-full ttf (ns, a double) from then. A
-- compact bucket with an expiry records it (x, ms) and gets a slack of a
-- sixteenth of its time-to-full, so that the writes that follow, which
-- need an expiry no later than the one it has, keep it (KEEPTTL: Redis
-- then leaves its expiry as it is). x is the expiry read with the bucket
-- (nil if none is recorded): the key expires at x or never, as only put
-- sets an expiry and a cutover's pass only clears them. A pass that clears
-- them is followed by one that rewrites every bucket in mode "c", which
-- always sets its own; a bucket cleared by a cutover that stopped between
-- the two keeps no expiry until a write needs a later one than x, or a
-- store finishes the cutover (memory, never tokens).
local function put(key, val, ttf, lastMs, x, T, F, ls, lns, tag)
  if expiry and pending == nil then pending = rcall('EXISTS', KEYS3) == 1 end
  local at, ms -- the expiry the time-to-full needs, and the time-to-full, in ms
  if expiry and not pending then
    if ttf == 0 then
      at, ms = mmax(nowMs, lastMs) + 1, 0
    else
      ms = ttf / 1e6 -- approximately
      if ms <= 1e15 then -- over 30,000 years: never expires
        -- relative error of ms is far below 1e-12; +2 covers the ms
        -- rounding of the instant and of the expiry
        -- The time-to-full is counted from the bucket's last update, which
        -- a pass judging at an earlier instant, a cutover replayed past it
        -- or a server clock that stepped back leaves after nowMs.
        at = mmax(nowMs, lastMs) + floor(ms * (1 + 1e-12)) + 2
      end
    end
  end
  if not at then
    -- no expiry: tests, a cutover in preparation, or never full
    rcall('SET', key, val or pack('<Bddddc0', 1, T, F, ls, lns, tag))
    return
  elseif val then
    rcall('SET', key, val, 'PXAT', format('%d', at))
    return
  end
  if x and x >= at and mode ~= 'c' and ls < 4294967296 then
    rcall('SET', key, pack('<BddIIIc0', 2, T, F, ls, lns, x - lastMs, tag), 'KEEPTTL')
    return
  end
  x = at + floor(ms / 16) -- the slack
  if ls < 4294967296 and x - lastMs < 4294967296 then
    rcall('SET', key, pack('<BddIIIc0', 2, T, F, ls, lns, x - lastMs, tag), 'PXAT', format('%d', x))
  else
    -- past the year 2106, or due in more than 49 days: not recorded
    rcall('SET', key, pack('<Bddddc0', 1, T, F, ls, lns, tag), 'PXAT', format('%d', at))
  end
end

-- decimalOf reads a compact bucket as the decimal format's fields: units,
-- last, version, cap, rate (P from the bucket's own rate).
local function decimalOf(raw)
  local t, f, ls, lns, at
  if byte(raw, 1) == 2 then
    t, f, ls, lns = unpackS('<ddII', raw, 2)
    at = 30
  else
    t, f, ls, lns = unpackS('<dddd', raw, 2)
    at = 34
  end
  local v, c, r = string.match(string.sub(raw, at), '^(%d+) (%d+) (%S+)$')
  local p = string.match(r or '', '/(%d+)$') or '1000000000'
  local us = str(add(mul(big(format('%.0f', t)), big(p)), big(format('%.0f', f))))
  local ts
  if ls == 0 then ts = format('%.0f', lns) else ts = format('%.0f', ls) .. format('%09.0f', lns) end
  return us, ts, v, c, r
end

local P53 = 9007199254740992 -- 2^53

-- fastOf reads a bucket for the fast path under limit tag, or returns nil:
-- T, F, the last update's seconds and ns, and its recorded expiry (ms) or
-- nil.
local function fastOf(raw, tag, pN)
  local mark = byte(raw, 1)
  if mark == 2 then
    if #raw ~= 29 + #tag or find(raw, tag, 30, true) ~= 30 then return nil end
    local t, f, ls, lns, d = unpackS('<ddIII', raw, 2)
    return t, f, ls, lns, ls * 1000 + floor(lns / 1e6) + d
  elseif mark == 1 then
    if #raw ~= 33 + #tag or find(raw, tag, 34, true) ~= 34 then return nil end
    local t, f, ls, lns = unpackS('<dddd', raw, 2)
    return t, f, ls, lns
  end
  local us, ts, v, c, r = string.match(raw, '^(%d+) (%d+) (%d+) (%d+) (%S+)$')
  if not us or #us > 15 or v .. ' ' .. c .. ' ' .. r ~= tag then return nil end
  local u = tonum(us)
  local t = floor(u / pN)
  local f = u - t * pN
  if f < 0 then t, f = t - 1, f + pN elseif f >= pN then t, f = t + 1, f - pN end
  local ls, lns = split(ts)
  return t, f, ls, lns
end

-- flush writes a bucket the call holds (see memo), if it changed, and
-- forgets it; flushAll writes every one, in the order first met.
local function flush(m)
  if memo[m.key] ~= m then return end
  memo[m.key] = nil
  if m.dirty then
    put(m.key, nil, m.ttf, m.lastMs, m.x, m[1], m[2], m[3], m[4], m.tag)
  end
end

local function flushAll()
  for k = 1, #memo do flush(memo[k]) end
end

-- call reads 57 upvalues, of the 60 Lua 5.1 allows a function: more
-- per-call state belongs in a table or in a helper of its own.
function call(KEYS, ARGV)
  if not rcall then bind() end
  mode, expiry, memoOn = ARGV[1], byte(ARGV[4], 1) == 49, #ARGV[4] > 1 -- "1..."; "..m"
  all = mode == 'A' -- all or nothing: writes wait for every decision
  decide = mode == 'a' or all
  KEYS2, KEYS3 = KEYS[2], KEYS[3]
  pending, history, shapes, nowS, now = nil, nil, nil, nil, nil
  out, deleted = { 0, 0, 0, 0 }, 0 -- the results follow the reply's head (see reply)
  memo = memoOn and {} or NOMEMO
  version = rcall('HGET', KEYS[1], 'v')
  if not version then return { 'nopolicy' } end
  if version ~= ARGV[2] then return { 'stale', version } end

  local at = ARGV[3]
  if at == '' or expiry then
    local tm = rcall('TIME')
    nowSec, nowNs = tonum(tm[1]), tonum(tm[2]) * 1000
    nowMs = nowSec * 1000 + floor(nowNs / 1e6)
    if at ~= '' then
      local s, n = split(at)
      if s < nowSec or (s == nowSec and n < nowNs) then
        nowSec, nowNs = s, n
        nowMs = msOf(at)
        nowS = at
      end
    end
  else
    nowSec, nowNs = split(at)
    nowMs = msOf(at)
    nowS = at
  end
  if nowS then now = big(nowS) end

  local held, refused = all and {}, false -- mode "A": the writes an admission makes; whether it is refused
  local tagCap, tagRate, tag -- the last fast-path limit, and its tag
  local lastCost, lastN -- the last cost met, and as a number (most calls have one)
  local no = 4 -- how many slots of out are taken
  local n = #KEYS - 3
  -- Distinct keys (no "m"): every bucket is read once, all in one MGET.
  local pre = n > 1 and not memoOn and rcall('MGET', unpack(KEYS, 4))
  -- ARGV[5] words per bucket, ARGV[6] shapes, then each shape's two
  local per, base = ARGV[5], 6 + 2 * tonum(ARGV[6])
  local ref, cap, rate, chain = nil, ARGV[7], ARGV[8], ''
  for i = 1, n do
    local key, cost = KEYS[3 + i], nil
    if per == '1' then
      cost = ARGV[base + i]
    else
      cost = ARGV[base + 2 * i - 1]
      local r = ARGV[base + 2 * i]
      if r ~= ref then
        ref = r
        local j = find(r, ';', 1, true)
        local k = tonum(j and string.sub(r, 1, j - 1) or r)
        cap, rate, chain = ARGV[5 + 2 * k], ARGV[6 + 2 * k], j and string.sub(r, j + 1) or ''
      end
    end
    -- The shape's arguments parsed: most calls hold one shape, so they are
    -- parsed again only when they differ from the last request's.
    if cap ~= sCap or rate ~= sArg then
      sCap = nil -- until the parse is whole (a call cut short leaves none half done)
      -- One band of N per P: the double fast path may apply.
      sBands, sN, sP = '', tonum(rate), 1e9
      sRate = rate
      if not sN then
        local r, bs = string.match(rate, '^(%S+) (%S+)$')
        if r then
          sRate, sBands = r, bs
        else
          local ns, ps = string.match(rate, '^(%d+)/(%d+)$')
          if ps and #ps <= 16 then sN, sP = tonum(ns), tonum(ps) end
        end
      end
      sLeast = cap -- the smallest capacity of the shape's bands
      if sBands ~= '' then
        general()
        sLeast = shapeOf(cap, sRate, sBands).min
      end
      sCapN = sBands == '' and sN and #cap <= 16 and tonum(cap)
      sFast = sCapN and sCapN <= P52 and sN * sP < P52
      sCap, sArg = cap, rate
    end
    local bands, nN, pN, least, rate = sBands, sN, sP, sLeast, sRate
    if decide and (#cost > #least or (#cost == #least and cost > least)) then -- cost > least
      out[no + 1], out[no + 2], out[no + 3] = 2, '', ''
      no = no + 3
      refused = true
    else
      local capN, fast = sCapN, sFast
      local m = memoOn and memo[key] or nil
      if m and not (fast and m.tag == tag and cap == tagCap and rate == tagRate) then
        flush(m) -- a bucket this call holds, met off the fast path: write it first
        m = nil
      end
      local raw, T, F, ls, lns, X -- X: the bucket's recorded expiry (see put)
      if m then
        raw, T, F, ls, lns, X = m.raw, m[1], m[2], m[3], m[4], m.x
      else
        if pre then raw = pre[i] else raw = rcall('GET', key) end
        raw = raw or nil -- GET gives false for none
      end
      if fast and not m then
        if cap ~= tagCap or rate ~= tagRate then
          tagCap, tagRate, tag = cap, rate, version .. ' ' .. cap .. ' ' .. rate
        end
        if raw then
          T, F, ls, lns, X = fastOf(raw, tag, pN)
        else
          T, F, ls, lns = capN, 0, nowSec, nowNs -- a new key starts full
        end
      end
      local code, val, ttf, lastMs
      local cT, cF, cS, cN -- a compact bucket's fields to write (val nil)
      local write, del = true, false
      if T and (nowSec - ls <= 9000000 or pN == 1e9) then
        -- Fast path (see the header): T, F and every product below exact,
        -- or compared exactly with capN.
        local ds, dn = nowSec - ls, nowNs - lns
        if ds > 0 or (ds == 0 and dn > 0) then
          local q, r
          if pN == 1e9 then
            if dn < 0 then q, r = ds - 1, dn + 1e9 else q, r = ds, dn end
          else
            local e = ds * 1e9 + dn -- below 2^53
            q = floor(e / pN)
            r = e - q * pN
            if r < 0 then q, r = q - 1, r + pN elseif r >= pN then q, r = q + 1, r - pN end
          end
          local g = q * nN
          if g >= capN then
            T, F = capN, 0
          else
            local u = r * nN + F -- below P*N + P < 2^53
            local c = floor(u / pN)
            local f = u - c * pN
            if f < 0 then c, f = c - 1, f + pN elseif f >= pN then c, f = c + 1, f - pN end
            T = T + g + c
            if T >= capN then T, F = capN, 0 else F = f end
          end
          ls, lns = nowSec, nowNs
        end
        if decide then
          if cost ~= lastCost then lastCost, lastN = cost, tonum(cost) end
          local cN = lastN
          if T >= cN then
            T, code = T - cN, 1
          else
            code = 0
            write = false -- a denial changes nothing: the refill is implied
          end
        elseif mode == 'r' and raw then
          T = T + tonum(cost) -- above 2^53 only if over the capacity
          if T >= capN then T, F = capN, 0 end
        end
        if T == capN then ttf = 0 else ttf = ((capN - T) * pN - F) / nN end
        if ls == nowSec and lns == nowNs then
          lastMs = nowMs -- brought up to now, as most are
        else
          lastMs = ls * 1000 + floor(lns / 1e6)
        end
        if decide then
          out[no + 1], out[no + 2], out[no + 3] = code, T, F
          no = no + 3
        elseif mode == 'p' or mode == 'r' then
          out[no + 1], out[no + 2], out[no + 3] = raw and 1 or 0, T, F
          no = no + 3
        end
        if mode == 'a' and memoOn then
          -- A key met again in this call is read from here, and written
          -- once, as the call ends.
          if not m then
            m = { key = key, raw = raw, x = X }
            memo[key] = m
            memo[#memo + 1] = m
          end
          m[1], m[2], m[3], m[4], m.tag, m.ttf, m.lastMs = T, F, ls, lns, tag, ttf, lastMs
          m.dirty = m.dirty or (write and (raw ~= nil or ttf > 0))
          m.raw = raw or (m.dirty and true) or nil
          write = false
        elseif write then
          cT, cF, cS, cN = T, F, ls, lns
        end
      else
        -- General path: limbs, bands, and the cutovers the bucket missed.
        general()
        instant()
        local sh = shapeOf(cap, rate, bands)
        local lv, t
        if raw then
          local us, ts, v, c, r, rest
          if byte(raw, 1) <= 2 then -- compact
            us, ts, v, c, r = decimalOf(raw)
            rest = ''
          else
            us, ts, v, c, r = string.match(raw, '^(%d+) (%d+) (%d+) (%d+) (%d+)$') -- a plain bucket
            rest = ''
            if not us then us, ts, v, c, r, rest = string.match(raw, '^(%d+) (%d+) (%d+) (%d+) (%S+)(.*)$') end
          end
          lv, t = bring(us, ts, v, c, r, rest, sh, chain)
          if not lv then
            if all then
              out = { 0, 0, 0, 0 } -- nothing is written before every bucket is decided
              return reply('chain', 0, t)
            end
            flushAll()
            return reply('chain', i - 1, t)
          end
        else
          lv, t = fullOf(sh), now -- a new key starts full
        end
        if decide then
          local cb, cu = big(cost), {}
          code = 1
          for k = 1, #sh do
            cu[k] = mul(cb, sh[k].pb)
            if cmp(lv[k], cu[k]) < 0 then code = 0 end
          end
          if code == 1 then
            for k = 1, #sh do lv[k] = sub(lv[k], cu[k]) end
          end
        elseif mode == 'r' and raw then
          local cb = big(cost)
          for k = 1, #sh do
            local u = add(lv[k], mul(cb, sh[k].pb))
            if cmp(u, sh[k].full) > 0 then u = sh[k].full end
            lv[k] = u
          end
        end
        local p = {}
        ttf = 0
        for k = 1, #sh do
          p[k] = str(lv[k])
          local d = tod(sub(sh[k].full, lv[k])) / sh[k].nD
          if d > ttf then ttf = d end
        end
        local tS = str(t)
        local xs = ''
        if #p > 1 then xs = ' ' .. table.concat(p, ' ', 2) end
        if decide then
          out[no + 1], out[no + 2], out[no + 3] = code, table.concat(p, ' '), ''
          no = no + 3
        elseif mode == 'p' or mode == 'r' then
          out[no + 1], out[no + 2], out[no + 3] = raw and 1 or 0, table.concat(p, ' '), ''
          no = no + 3
        end
        if fast then
          -- A shape the fast path takes (a bucket brought through a
          -- cutover, or one of more units than fastOf reads as a decimal):
          -- written compact, so that its next call takes the fast path.
          -- units = T*P + F exactly, T <= cap <= 2^52 and F < P < 2^52.
          local u = p[1]
          if pN == 1e9 then
            if #u > 9 then cT, cF = tonum(string.sub(u, 1, -10)), tonum(string.sub(u, -9)) else cT, cF = 0, tonum(u) end
          else
            local q = div(lv[1], sh[1].pb)
            cT, cF = tod(q), tod(sub(lv[1], mul(q, sh[1].pb)))
          end
          cS, cN = split(tS)
          X = nil -- its expiry is set anew
        else
          val = p[1] .. ' ' .. tS .. ' ' .. version .. ' ' .. cap .. ' ' .. rate .. xs
        end
        lastMs = msOf(tS)
      end

      if decide then
        -- a bucket can only be full here if it was never written: nothing to keep
        if not raw and ttf == 0 then write = false end
      elseif mode == 'p' then
        write = false -- a peek writes nothing
      elseif mode == 'r' then
        write = write and raw ~= nil -- a refund creates nothing
      elseif not raw then
        write = false -- brought up to date, a bucket never written is full
      elseif mode == 'e' and ttf == 0 then
        write, del = false, true
        deleted = deleted + 1
      end

      if all then
        -- Decided, written later or never. A decision keeps every bucket
        -- it changes (a new bucket left full it need not write), so only
        -- the writes wait.
        if code ~= 1 then refused = true end
        if write and not refused then held[#held + 1] = { key, val, ttf, lastMs, X, cT, cF, cS, cN, tag } end
      elseif del then
        rcall('DEL', key)
      elseif write then
        put(key, val, ttf, lastMs, X, cT, cF, cS, cN, tag)
      end
    end
  end
  -- Mode "A": every bucket admitted, so every one is written. The first
  -- write is a SET: a Redis out of memory refuses it, and the call, before
  -- anything is written.
  if all and not refused then
    for k = 1, #held do
      local h = held[k]
      put(h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10])
    end
  end
  flushAll()
  return reply('ok', n)
end
