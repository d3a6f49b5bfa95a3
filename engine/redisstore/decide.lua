-- tokenshard: refill, decide and write one chunk of requests atomically.
--
-- The source is one Lua chunk that defines call(KEYS, ARGV): loaded as a
-- Redis FUNCTION library (registered under a name of its own hash), its
-- functions are made once, at load; sent with EVALSHA, the chunk ends in
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
-- capacity*P. The only rounding anywhere is at a cutover that changes a
-- band's period: its units u become floor(u*Pnew/Pold) (whole tokens kept,
-- the fraction rounded down: a unit may be lost, never minted).
--
-- The fast path: a key of one band with capacity C <= 2^52 and N*P < 2^52,
-- whose bucket is compact under the version in force with the same limit
-- and was updated at most 9e6 s ago. Its balance is whole tokens T and a
-- fraction F < P (units T*P + F), each an integer double; time is whole
-- seconds and ns, so the time elapsed e is below 2^53 ns. A refill over
-- e = q*P + r ns adds q*N tokens and r*N units (r*N + F < 2^53), so every
-- step is exact or, when a product passes 2^53, compares above C exactly.
-- Any other bucket takes the general path, which writes a shape the fast
-- path takes back compact.
--
-- A key's limit is a shape: its primary band and zero or more named bands,
-- every one of which must hold a request's cost for it to be admitted. A
-- shape travels as two strings: the primary band's cap, and "rate[ bands]":
-- rate "N" (N per second) or "N/P", bands "name:cap:rate" per band joined
-- by ",", names in hex.
--
-- KEYS (see KEY): the shard's policy hash (v = version in force), its
-- history list (one entry per retained version, oldest first: "version
-- cutover cap rate overridden" for the default shape, then " bands" if it
-- has bands), its pending flag (a hash, set while a cutover that may
-- lengthen times-to-full is prepared: buckets are then written without
-- expiry; a value of another type is no store's and sets nothing), then
-- the buckets. A bucket is in one of two formats:
--   compact, for every key of a shape the fast path takes (written by
--   either path): the byte 2, then T, F and the last update's seconds as
--   three little-endian doubles, its ns and the expiry it was given (see
--   put; 0 if none is recorded) in ms after that update's ms as two
--   little-endian unsigned 32-bit integers, then "version cap rate" (the
--   limit it was written under);
--   decimal, for any other shape: "units last version cap rate" (the
--   primary band's units and its cap and rate under version), then
--   " units" for each further band of the shape, in order.
-- A balance may be below zero, a debt (mode "d"), never below minus its
-- band's capacity: a compact bucket's T is then negative (|T| <= C <= 2^52,
-- still exact, and 0 <= F < P as always: units T*P + F), a decimal's units
-- carry a "-". On the general path a debt is the limbs of its magnitude
-- with the field neg set (never for zero); only a band's units are signed.
--
-- ARGV (see ARG):
--   mode: "a" decide; "e" bring up to date and delete if full (an eviction);
--     "c" bring up to date (a cutover's pass: a full bucket is left to
--     expire at once rather than deleted, so that only EvictFull counts
--     deletions); "p" bring up to date and write nothing (a peek); "r" bring
--     up to date and credit cost tokens to every band, capped (a refund; a
--     missing bucket is full and stays missing); "d" bring up to date and
--     debit cost tokens from every band, each down to minus its capacity at
--     most, the rest forgiven (a charge, never denied: a missing bucket is
--     created full, then charged); "A" decide all or nothing:
--     every bucket is decided as in "a" (each with its key's summed cost: a
--     key comes once) at the one instant, and written only if every one is
--     admitted.
--   version: the version the client resolved the limits under.
--   now: the instant in ns: "" reads the server's TIME; otherwise, with
--     expiry on, the earlier of it and TIME (an eviction judges every key at
--     the instant it began); with expiry off, exactly it (Config.Clock's).
--   expiry: "1" sets expiries at the time-to-full, "0" sets none; either
--     followed by "m" when a key comes more than once in the call: mode "a"
--     then reads and writes each such bucket once.
--   per: 1 or 2, the words per bucket.
--   seed: the seed of the key map the client placed the keys by; a shard
--     whose copy (field seed of its policy hash) differs refuses the call.
--   shapes: S, how many shapes the buckets have; then each shape's cap and
--     "rate[ bands]".
--   Then the words of each bucket: its cost and, if per is 2, its shape's
--   number among the S, followed by ";" and its chain if it has one:
--   "version cap rate[ bands]" entries joined by ";" giving the key's own
--   shape under retained versions that had overrides.
--
-- Reply: {status, version in force, done, deleted, ...}: done counts the
-- buckets decided or brought up to date, deleted those deleted as full
-- (mode "e"). status "ok": the results follow; "stale": version is not in
-- force and nothing was done; "nopolicy" and "keymap" (seed is not the
-- shard's): nothing follows, nothing was done; "chain": bucket
-- done+1 is behind a version with overrides that its chain lacks, and its
-- version follows, then the results of the buckets before it (mode "A":
-- done is 0 and nothing was written). Results (modes "a", "A", "p", "r",
-- "d"): three per done bucket. A code: in "a" and "A", 1 allowed (in "A",
-- would be allowed alone), 0 denied, 2 cost above a band's capacity; in
-- "p", "r" and "d", 1 if the bucket exists, else 0 (unused in "d"). Then
-- the balance after the operation: on the fast path T and F, two integers
-- (T negative in debt); on the general path the units, one decimal per band
-- joined by " " ("-" in debt), and "", or, for a bucket last updated after
-- the call's instant (which refills nothing until that update), the
-- nanoseconds until it (a decimal: such a bucket takes the general path);
-- for 2, "" and "".

-- The protocol's positions, which the Go encoder is tested against.
local KEY = { policy = 1, history = 2, pending = 3, buckets = 4 }
local ARG = { mode = 1, version = 2, now = 3, expiry = 4, per = 5, seed = 6, shapes = 7 }

-- The library functions of every request's path, and the server's
-- REDIS_VERSION_NUM (nil before 7.0), as upvalues: in a FUNCTION library a
-- global is looked up through the library's own environment, about twice
-- as slow. A library's load cannot read them, so its first call sets them
-- (bind).
local floor, mmax, rcall, byte, find, format, pack, unpackS, tonum, sub, match, v7

local function bind()
  floor, mmax, rcall, byte, find, format = math.floor, math.max, redis.call, string.byte, string.find, string.format
  pack, unpackS, tonum, sub, match, v7 = struct.pack, struct.unpack, tonumber, string.sub, string.match, redis.REDIS_VERSION_NUM
end

-- Limbs: base B, least significant first.
local B = 10000000

local function norm(n)
  while #n > 1 and n[#n] == 0 do n[#n] = nil end return n
end

local function big(s)
  local n = {}
  for i = #s, 1, -7 do n[#n + 1] = tonum(sub(s, mmax(i - 6, 1), i)) end
  return norm(n)
end

local function str(n)
  local p = { format('%d', n[#n]) }
  for i = #n - 1, 1, -1 do p[#p + 1] = format('%07d', n[i]) end
  return table.concat(p)
end

local function cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  for i = #a, 1, -1 do if a[i] ~= b[i] then return a[i] < b[i] and -1 or 1 end end
  return 0
end

local function add(a, b)
  local r, c = {}, 0
  for i = 1, mmax(#a, #b) do
    local s = (a[i] or 0) + (b[i] or 0) + c
    if s >= B then r[i], c = s - B, 1 else r[i], c = s, 0 end
  end
  if c > 0 then r[#r + 1] = c end return r
end

-- minus is a - b, for a >= b.
local function minus(a, b)
  local r, c = {}, 0
  for i = 1, #a do
    local s = a[i] - (b[i] or 0) - c
    if s < 0 then r[i], c = s + B, 1 else r[i], c = s, 0 end
  end
  return norm(r)
end

-- sminus is a - b for a, b >= 0, signed; sadd is a + b and ssub a - b for
-- a signed and b >= 0; sstr and sbig convert a signed number (see
-- fdiv and smul, below div).
local function neg(n) n.neg = true return n end
local function sminus(a, b) if cmp(a, b) >= 0 then return minus(a, b) end return neg(minus(b, a)) end
local function sadd(a, b) if a.neg then return sminus(b, a) end return add(a, b) end
local function ssub(a, b) if a.neg then return neg(add(a, b)) end return sminus(a, b) end
local function sstr(n) return (n.neg and '-' or '') .. str(n) end
local function sbig(s) if byte(s, 1) == 45 then return neg(big(sub(s, 2))) end return big(s) end

-- divmod is floor(a / p) and a - p*floor(a / p), exact for integers a and p
-- below 2^53: the quotient estimated in floating point, then corrected.
local function divmod(a, p)
  local q = floor(a / p)
  local r = a - q * p
  if r < 0 then return q - 1, r + p elseif r >= p then return q + 1, r - p end
  return q, r
end

local function mul(a, b)
  local r = {}
  for i = 1, #a + #b do r[i] = 0 end
  for i = 1, #a do
    local c, ai = 0, a[i]
    for j = 1, #b do
      c, r[i + j - 1] = divmod(r[i + j - 1] + ai * b[j] + c, B) -- at most B^2 - 1 < 2^53
    end
    r[i + #b] = c
  end
  return norm(r)
end

-- tod is n as a double, rounded: for estimates and expiries only.
local function tod(n)
  local d = 0
  for k = #n, 1, -1 do d = d * B + n[k] end return d
end

-- div returns floor(a / b) for b >= 1: schoolbook division in base B, each
-- quotient limb estimated in floating point and then corrected exactly.
local function div(a, b)
  local q, r = {}, { 0 }
  for i = 1, #a do q[i] = 0 end
  for i = #a, 1, -1 do
    table.insert(r, 1, a[i]) -- r = r*B + a[i]
    r = norm(r)
    if cmp(r, b) >= 0 then -- r < b*B, so the limb is in [1, B)
      local d = floor(tod(r) / tod(b))
      if d >= B then d = B - 1 elseif d < 1 then d = 1 end
      local m = mul(b, { d })
      while cmp(m, r) > 0 do d, m = d - 1, minus(m, b) end
      local m2 = add(m, b)
      while cmp(m2, r) <= 0 do d, m, m2 = d + 1, m2, add(m2, b) end
      r, q[i] = minus(r, m), d
    end
  end
  return norm(q)
end

-- fdiv is floor(a / p) for a signed and p >= 1: in debt, -ceil(|a| / p).
local function fdiv(a, p) if a.neg then return neg(div(add(a, minus(p, { 1 })), p)) end return div(a, p) end
-- smul is a * b for a signed and b >= 1.
local function smul(a, b) local r = mul(a, b) r.neg = a.neg return r end

-- gtS reports whether decimal a (no leading zeros) is above decimal b.
local function gtS(a, b) return #a > #b or (#a == #b and a > b) end

-- msOf is an instant in ns (a decimal string) in whole ms.
local function msOf(s) return #s <= 6 and 0 or tonum(sub(s, 1, -7)) end

-- split reads an instant in ns as whole seconds and the ns within the
-- second, each exact as a double.
local function split(s)
  if #s <= 9 then return 0, tonum(s) end return tonum(sub(s, 1, -10)), tonum(sub(s, -9))
end

-- Per-call state: set by call before any use.
local K, A -- the call's KEYS and ARGV
local version, mode, decide, all, expiry, pending
local nowSec, nowNs, nowMs, nowS, now
local history, shapes, out, no, deleted, held, refused
local memo, memoOn -- mode "a": the fast-path buckets the call holds, by key and in order
local NOMEMO = {} -- memo of a call without "m": never written
local tag, tagCap, tagRate -- the last fast-path limit, and its tag
-- The last shape's arguments, parsed: sRate and sBands split from the rate
-- argument, one band's N and P and the capacity as numbers if it has one,
-- sLeast the smallest capacity, sFast whether the fast path takes it.
local sCap, sArg, sRate, sBands, sN, sP, sLeast, sCapN, sFast

-- emit appends one bucket's three results.
local function emit(a, b, c) out[no + 1], out[no + 2], out[no + 3], no = a, b, c, no + 3 end

-- instant makes nowS (decimal ns) and now (limbs) of the call's instant.
local function instant()
  nowS = nowS or nowSec == 0 and format('%.0f', nowNs) or format('%.0f', nowSec) .. format('%09.0f', nowNs)
  now = now or big(nowS)
end

-- clock sets the call's instant from ARGV's and the server's TIME.
local function clock(at)
  if at == '' or expiry then
    local tm = rcall('TIME')
    nowSec, nowNs = tonum(tm[1]), tonum(tm[2]) * 1000
    nowMs = nowSec * 1000 + floor(nowNs / 1e6)
    if at == '' then return end
    local s, n = split(at)
    if s > nowSec or (s == nowSec and n >= nowNs) then return end -- TIME is the earlier
  end
  nowSec, nowNs = split(at)
  nowMs, nowS = msOf(at), at
end

-- A shape is an array of bands, the primary first; a band is {name (hex,
-- "" for the primary), cap, p (decimal), pb (P as limbs), n (N as limbs),
-- nD (N as a double), full (cap*P as limbs)}; sh.min is the smallest cap.
local function band(name, cap, rate)
  local n, p = match(rate, '^(%d+)/(%d+)$')
  if not n then n, p = rate, '1000000000' end
  local pb = big(p) -- low is the floor, -cap*P
  return { name = name, cap = cap, p = p, pb = pb, n = big(n), nD = tonum(n), full = mul(big(cap), pb), low = neg(mul(big(cap), pb)) }
end

-- shapeOf parses a shape, once per call.
local function shapeOf(cap, rate, bands)
  local k = cap .. ' ' .. rate .. ' ' .. bands
  shapes = shapes or {}
  if shapes[k] then return shapes[k] end
  local sh = { band('', cap, rate), min = cap }
  for name, c, r in string.gmatch(bands, '(%x+):(%d+):([%d/]+)') do
    sh[#sh + 1] = band(name, c, r)
    if gtS(sh.min, c) then sh.min = c end
  end
  shapes[k] = sh
  return sh
end

-- parseShape sets the s* state from a shape's two arguments.
local function parseShape(cap, rate)
  sCap = nil -- until the parse is whole
  sBands, sN, sP, sRate = '', tonum(rate), 1e9, rate
  if not sN then
    local r, bs = match(rate, '^(%S+) (%S+)$')
    if r then
      sRate, sBands = r, bs
    else
      local ns, ps = match(rate, '^(%d+)/(%d+)$')
      if ps and #ps <= 16 then sN, sP = tonum(ns), tonum(ps) end
    end
  end
  sLeast = sBands == '' and cap or shapeOf(cap, sRate, sBands).min
  sCapN = sBands == '' and sN and #cap <= 16 and tonum(cap)
  sFast = sCapN and sCapN <= 4503599627370496 and sN * sP < 4503599627370496 -- 2^52
  sCap, sArg = cap, rate
end

-- refill brings the bands lv of shape sh, last updated at t, up to instant
-- to: each gains elapsed*N units, up to its capacity; a to at or before t
-- adds nothing. It returns the new last.
local function refill(lv, t, to, sh)
  if cmp(to, t) <= 0 then return t end
  local e = minus(to, t)
  for k = 1, #sh do
    local b = sh[k]
    if lv[k].neg or cmp(lv[k], b.full) < 0 then
      local u = sadd(lv[k], mul(e, b.n))
      lv[k] = not u.neg and cmp(u, b.full) > 0 and b.full or u
    end
  end
  return to
end

-- carry moves the bands lv of shape old, brought up to a cutover, to shape
-- nxt: the primary takes over the primary, a band the band of old of the
-- same name, each moved to the new unit if the period changes (rounding
-- down) and clamped to the new capacity; a band new in nxt starts full.
local function carry(old, lv, nxt)
  local res = {}
  for k = 1, #nxt do
    local b, j = nxt[k], k == 1 and 1 or nil -- the primary takes over the primary
    for m = 2, k == 1 and 0 or #old do -- a band the band of its name
      if old[m].name == b.name then j = m break end
    end
    local u = b.full
    if j then
      u = lv[j]
      if old[j].p ~= b.p then u = fdiv(smul(u, b.pb), old[j].pb) end -- floor(u*Pnew/Pold): toward more debt
      if cmp(u, b.full) > 0 then u = u.neg and b.low or b.full end -- clamped to [-cap*P, cap*P]
    end
    res[k] = u
  end
  return res
end

-- shapeAt is the shape a bucket had under history entry e ("version
-- cutover cap rate overridden[ bands]"): the entry's default, or its own
-- from chain if the version had overrides (nil if chain lacks it).
local function shapeAt(e, chain)
  local w, c, r, ov, bs = match(e, '^(%d+) %d+ (%d+) (%S+) (%d) ?(%S*)$')
  if ov ~= '1' then return shapeOf(c, r, bs) end
  for o in string.gmatch(chain, '[^;]+') do
    local v, oc, orate, obs = match(o, '^(%d+) (%d+) (%S+) ?(%S*)$')
    if v == w then return shapeOf(oc, orate, obs) end
  end
end

-- emptied is every band of sh empty: for a bucket whose bands are not its
-- shape's, or whose version is no longer retained (only a Redis that lost
-- the policy keys), which restarts empty: a denial too many, never a free
-- burst.
local function emptied(sh) local lv = {} for k = 1, #sh do lv[k] = { 0 } end return lv end

-- bring brings a written bucket of shape sh up to now through every cutover
-- it missed. It returns the bands and the last update, or nil and the
-- bucket's version when chain lacks a version the bucket needs.
local function bring(lv, t, v, c, r, sh, chain)
  if v == version then
    if #lv ~= #sh then lv = emptied(sh) end
    return lv, refill(lv, t, now, sh)
  end
  history = history or rcall('LRANGE', K[KEY.history], 0, -1)
  local at
  for h = 1, #history do
    if match(history[h], '^(%d+) ') == v then at = h break end
  end
  local cur = at and (#lv == 1 and shapeOf(c, r, '') or shapeAt(history[at], chain))
  if at and not cur then return nil, v end
  if not at or #cur ~= #lv then -- restarts empty at the current cutover
    local last = history[#history]
    local cut = big(last and match(last, '^%d+ (%d+) ') or nowS)
    lv = emptied(sh)
    return lv, refill(lv, cmp(cut, t) > 0 and cut or t, now, sh)
  end
  for h = at + 1, #history do
    local w, cut = match(history[h], '^(%d+) (%d+) ')
    local nxt = w == version and sh or shapeAt(history[h], chain)
    if not nxt then return nil, v end
    -- The cutover rule: refill under the old shape up to the cutover, then
    -- carry the bands over to the new one. An instant after now (another
    -- master's TIME, or a clock that stepped back since) has not come
    -- here: the old shape refills up to now at most.
    t = refill(lv, t, cmp(big(cut), now) > 0 and now or big(cut), cur)
    lv, cur = carry(cur, lv, nxt), nxt
  end
  return lv, refill(lv, t, now, sh)
end

-- put writes a bucket: its value val or, for a compact bucket (val nil),
-- its fields T, F, ls, lns under limit tag; last updated at lastMs (ms),
-- with its expiry at its time-to-full ttf (ns, a double) from then. A
-- compact bucket with an expiry records it and gets a slack of a sixteenth
-- of its time-to-full, so that the writes that follow, which need an expiry
-- no later than the one it has, keep it (KEEPTTL). x is the expiry read
-- with the bucket (nil if none is recorded): the key expires at x or never,
-- as only put sets an expiry and a cutover's pass only clears them (then
-- rewriting every bucket in mode "c", which always sets its own).
local function put(key, val, ttf, lastMs, x, T, F, ls, lns, tg)
  if expiry and pending == nil then pending = rcall('TYPE', K[KEY.pending]).ok == 'hash' end
  -- the expiry the time-to-full needs, and the time-to-full, in ms
  local at, ms = nil, expiry and not pending and ttf / 1e6
  if ms and ms <= 1e15 then -- over 30,000 years: never expires
    -- ms's relative error is far below 1e-12; +1 and +2 cover the ms
    -- rounding of the instant and of the expiry. The time-to-full counts
    -- from the last update, which a pass judging at an earlier instant, a
    -- cutover replayed past it or a server clock that stepped back leaves
    -- after nowMs.
    at = mmax(nowMs, lastMs) + (ttf == 0 and 1 or floor(ms * (1 + 1e-12)) + 2)
  end
  local d = 0 -- a compact bucket's recorded expiry, in ms after lastMs
  if at and not val then
    if x and x >= at and mode ~= 'c' then
      return rcall('SET', key, pack('<BdddIIc0', 2, T, F, ls, lns, x - lastMs, tg), 'KEEPTTL')
    end
    d = at + floor(ms / 16) - lastMs -- the slack
    if d < 4294967296 then at = lastMs + d else d = 0 end -- due in more than 49 days: not recorded
  end
  val = val or pack('<BdddIIc0', 2, T, F, ls, lns, d, tg)
  -- SET's PXAT is Redis 6.2's: before 7.0 (no REDIS_VERSION_NUM), a
  -- PEXPIREAT after, which costs a written bucket about twice the time
  if at and v7 then rcall('SET', key, val, 'PXAT', format('%d', at)) else rcall('SET', key, val) end
  if at and not v7 then rcall('PEXPIREAT', key, format('%d', at)) end
end

-- readBucket reads a written bucket for the general path: its bands (limbs)
-- and last update (limbs), and the version, cap and rate it was written
-- under (a compact bucket's P from its own rate).
local function readBucket(raw)
  if byte(raw, 1) == 2 then
    local t, f, ls, lns = unpackS('<dddI', raw, 2)
    local v, c, r = match(sub(raw, 34), '^(%d+) (%d+) (%S+)$')
    local p = match(r or '', '/(%d+)$') or '1000000000'
    local m = mul(big(format('%.0f', t < 0 and -t or t)), big(p))
    return { sadd(t < 0 and neg(m) or m, big(format('%.0f', f))) }, big(format('%.0f', ls) .. format('%09.0f', lns)), v, c, r
  end
  local us, ts, v, c, r, rest = match(raw, '^(%-?%d+) (%d+) (%d+) (%d+) (%S+)(.*)$')
  local lv = { sbig(us) }
  for u in string.gmatch(rest, '%-?%d+') do lv[#lv + 1] = sbig(u) end
  return lv, big(ts), v, c, r
end

-- fastOf reads a compact bucket written under limit tag: T, F, the last
-- update's seconds and ns, and its recorded expiry (ms) or nil; nothing for
-- any other bucket.
local function fastOf(raw)
  if byte(raw, 1) == 2 and #raw == 33 + #tag and find(raw, tag, 34, true) == 34 then
    local t, f, ls, lns, d = unpackS('<dddII', raw, 2)
    return t, f, ls, lns, d > 0 and ls * 1000 + floor(lns / 1e6) + d or nil
  end
end

-- flush writes a bucket the call holds (see memo), if it changed, and
-- forgets it; flushAll writes every one, in the order first met.
local function flush(m)
  if memo[m.key] ~= m then return end
  memo[m.key] = nil
  if m.dirty then put(m.key, nil, m.ttf, m.lastMs, m.x, m[1], m[2], m[3], m[4], m.tag) end
end

local function flushAll() for k = 1, #memo do flush(memo[k]) end end

-- refillFast brings T, F, last updated at ls s + lns ns, up to now under a
-- band of N per P ns and capacity C (see the header).
local function refillFast(T, F, ls, lns, C, N, P)
  local e = (nowSec - ls) * 1e9 + nowNs - lns -- below 2^53: at most 9e6 s (see one)
  if e <= 0 then return T, F, ls, lns end
  local q, r = divmod(e, P)
  if q * N >= C - T then return C, 0, nowSec, nowNs end -- C - T <= 2C: exact
  local c, f = divmod(r * N + F, P) -- below P*N + P < 2^53
  T = T + q * N + c
  if T >= C then return C, 0, nowSec, nowNs end
  return T, f, nowSec, nowNs
end

-- fastOne decides (or brings up to date) a bucket on the fast path. It
-- returns the code, the time-to-full, the last update in ms, whether to
-- write, and the fields to write.
local function fastOne(key, raw, cost, m, T, F, ls, lns, x)
  local C, N, P = sCapN, sN, sP
  if ls ~= nowSec or lns ~= nowNs then T, F, ls, lns = refillFast(T, F, ls, lns, C, N, P) end
  local code, write = 0, true
  if decide then
    local c = tonum(cost)
    if T >= c then T, code = T - c, 1 else write = false end -- a denial changes nothing
  elseif mode == 'r' and raw then
    T = T + tonum(cost) -- above 2^53 only if over the capacity
    if T >= C then T, F = C, 0 end
  elseif mode == 'd' then
    local c = tonum(cost) -- inexact only above 2^53 >= T + C: then to the floor
    if c > T + C then T, F = -C, 0 else T = T - c end
  end
  local ttf = T == C and 0 or ((C - T) * P - F) / N
  local lastMs = (ls == nowSec and lns == nowNs) and nowMs or ls * 1000 + floor(lns / 1e6)
  if mode ~= 'e' and mode ~= 'c' then
    out[no + 1], out[no + 2], out[no + 3], no = decide and code or (raw and 1 or 0), T, F, no + 3
  end
  if mode ~= 'a' or not memoOn then return code, ttf, lastMs, write, T, F, ls, lns end
  -- Held for the rest of the call: a key met again is read from here, and
  -- written once, as the call ends.
  if not m then
    m = { key = key, raw = raw, x = x }
    memo[key], memo[#memo + 1] = m, m
  end
  m[1], m[2], m[3], m[4], m.tag, m.ttf, m.lastMs = T, F, ls, lns, tag, ttf, lastMs
  m.dirty = m.dirty or (write and (raw ~= nil or ttf > 0))
  m.raw = raw or (m.dirty and true) or nil
  return code, ttf, lastMs, false
end

-- applyGeneral takes cost from every band of lv (mode "a", "A": all or
-- none) or credits it, capped (mode "r" on a written bucket); it returns
-- the code.
local function applyGeneral(lv, sh, cost, raw)
  if not decide and not (mode == 'r' and raw) then return 0 end
  local cb, cu = big(cost), {}
  for k = 1, #sh do
    cu[k] = mul(cb, sh[k].pb)
    if decide and (lv[k].neg or cmp(lv[k], cu[k]) < 0) then return 0 end
  end
  for k = 1, #sh do
    local u = decide and minus(lv[k], cu[k]) or sadd(lv[k], cu[k])
    lv[k] = not u.neg and cmp(u, sh[k].full) > 0 and sh[k].full or u
  end
  return decide and 1 or 0
end

-- chargeGeneral takes cost from every band of lv (mode "d"), each down to
-- minus its capacity at most: the rest is forgiven.
local function chargeGeneral(lv, sh, cost)
  for k = 1, #sh do
    local u = ssub(lv[k], mul(big(cost), sh[k].pb))
    lv[k] = u.neg and cmp(u, sh[k].full) > 0 and sh[k].low or u
  end
  return 1
end

-- slowOne is fastOne on the general path: limbs, bands, and the cutovers
-- the bucket missed. It returns nil and a version for a chain to fetch;
-- else the code, time-to-full, last update in ms, and the value to write,
-- or nil and a compact bucket's fields (for a shape the fast path takes,
-- so that its next call takes it).
local function slowOne(raw, cost, cap, rate, bands, chain)
  instant()
  local sh = shapeOf(cap, rate, bands)
  local lv, t = {}, now -- a new key starts full
  for k = 1, #sh do lv[k] = sh[k].full end
  if raw then
    local blv, bt, v, c, r = readBucket(raw)
    lv, t = bring(blv, bt, v, c, r, sh, chain)
    if not lv then return nil, t end
  end
  local code = mode == 'd' and chargeGeneral(lv, sh, cost) or applyGeneral(lv, sh, cost, raw)
  local p, ttf = {}, 0
  for k = 1, #sh do
    p[k] = sstr(lv[k])
    ttf = mmax(ttf, tod(lv[k].neg and add(sh[k].full, lv[k]) or minus(sh[k].full, lv[k])) / sh[k].nD)
  end
  local units, tS = table.concat(p, ' '), str(t)
  if mode ~= 'e' and mode ~= 'c' then emit(decide and code or (raw and 1 or 0), units, cmp(t, now) > 0 and str(minus(t, now)) or '') end
  if not sFast then
    local val = p[1] .. ' ' .. tS .. ' ' .. version .. ' ' .. cap .. ' ' .. rate
    if #p > 1 then val = val .. ' ' .. table.concat(p, ' ', 2) end
    return code, ttf, msOf(tS), val
  end
  -- units = T*P + F exactly, |T| <= cap <= 2^52 and 0 <= F < P < 2^52
  local u, pb = lv[1], sh[1].pb
  local q = fdiv(u, pb) -- T
  local f = q.neg and sadd(u, mul(q, pb)) or minus(u, mul(q, pb)) -- u - T*P
  local cS, cN = split(tS)
  return code, ttf, msOf(tS), nil, q.neg and -tod(q) or tod(q), tod(f), cS, cN
end

-- store writes what a bucket's operation left, as its mode says: mode "A"
-- holds the writes until every bucket is admitted (a refusal writes
-- nothing; a new bucket left full needs no write).
local function store(key, raw, code, ttf, write, val, lastMs, x, T, F, ls, lns)
  local del = false -- deleted as full (mode "e")
  if decide or mode == 'd' then -- a charge leaves a bucket below full: written
    write = write and (raw ~= nil or ttf > 0)
  elseif mode == 'p' then
    write = false -- a peek writes nothing
  elseif mode == 'r' or not raw then
    write = write and raw ~= nil -- a refund creates nothing; a bucket never written is full
  elseif mode == 'e' and ttf == 0 then
    write, del, deleted = false, true, deleted + 1
  end
  if all then
    refused = refused or code ~= 1
    if write and not refused then held[#held + 1] = { key, val, ttf, lastMs, x, T, F, ls, lns, tag } end
  elseif del then
    rcall('DEL', key)
  elseif write then
    put(key, val, ttf, lastMs, x, T, F, ls, lns, tag)
  end
end

-- one runs bucket i, its key's cost and its shape's cap, rate and chain
-- (the s* state parsed), read from pre if the call read them all. It
-- returns nil and a version when the bucket needs a chain.
local function one(i, key, cost, cap, chain, pre)
  local rate, m = sRate, memoOn and memo[key] or nil
  -- a bucket this call holds, met off the fast path, is written first
  if m and not (sFast and m.tag == tag and cap == tagCap and rate == tagRate) then m = flush(m) end
  local raw, T, F, ls, lns, x
  if m then
    raw, T, F, ls, lns, x = m.raw, m[1], m[2], m[3], m[4], m.x
  else
    raw = (pre and pre[i] or not pre and rcall('GET', key)) or nil -- false for none
    if sFast then
      if cap ~= tagCap or rate ~= tagRate then tagCap, tagRate, tag = cap, rate, version .. ' ' .. cap .. ' ' .. rate end
      if raw then T, F, ls, lns, x = fastOf(raw) else T, F, ls, lns = sCapN, 0, nowSec, nowNs end
    end
  end
  local code, ttf, lastMs, write, val
  -- a bucket last updated after now (another master's TIME, a clock that
  -- stepped back) takes the general path, which says so in its answer
  if T and nowSec - ls <= 9000000 and (ls < nowSec or ls == nowSec and lns <= nowNs) then
    code, ttf, lastMs, write, T, F, ls, lns = fastOne(key, raw, cost, m, T, F, ls, lns, x)
  else
    code, ttf, lastMs, val, T, F, ls, lns = slowOne(raw, cost, cap, rate, sBands, chain)
    if not code then return nil, ttf end
    write, x = true, nil -- a compact bucket's expiry is set anew
  end
  if write or all then store(key, raw, code, ttf, write, val, lastMs, x, T, F, ls, lns) end
  return code
end

-- Each bucket's arguments: itemArgs returns bucket i's cost, and sets
-- aCap, aRate and aChain to its shape's (kept while the reference repeats).
local aRef, aCap, aRate, aChain, base, per1

local function itemArgs(i)
  if per1 then return A[base + i] end
  local r = A[base + 2 * i]
  if r ~= aRef then
    local j = find(r, ';', 1, true)
    local k = tonum(j and sub(r, 1, j - 1) or r)
    aCap, aRate = A[ARG.shapes - 1 + 2 * k], A[ARG.shapes + 2 * k]
    aChain, aRef = j and sub(r, j + 1) or '', r
  end
  return A[base + 2 * i - 1]
end

-- start sets the per-call state; it returns the reply if the call cannot
-- run under the version it names.
local function start(keys, argv)
  K, A, mode = keys, argv, argv[ARG.mode]
  expiry, memoOn = byte(A[ARG.expiry], 1) == 49, #A[ARG.expiry] > 1 -- "1..."; "..m"
  all, decide = mode == 'A', mode == 'a' or mode == 'A' -- "A": all or nothing, writes wait for every decision
  pending, history, shapes, nowS, now, tag, tagCap, tagRate = nil
  out, no, deleted, held, refused = { 0, 0, 0, 0 }, 4, 0, all and {}, false -- out[1..4]: the reply's head
  memo = memoOn and {} or NOMEMO
  base, per1 = ARG.shapes + 2 * tonum(A[ARG.shapes]), A[ARG.per] == '1'
  aRef, aCap, aRate, aChain = nil, A[ARG.shapes + 1], A[ARG.shapes + 2], ''
  local m = rcall('HMGET', K[KEY.policy], 'v', 'seed')
  version = m[1]
  if not version then return { 'nopolicy' } end
  if m[2] ~= A[ARG.seed] then return { 'keymap' } end -- another key map placed the caller's keys
  if version ~= A[ARG.version] then return { 'stale', version } end
  clock(A[ARG.now])
end

local function call(keys, argv)
  if not rcall then bind() end
  local early = start(keys, argv)
  if early then return early end
  local kb, n = KEY.buckets - 1, #K - KEY.buckets + 1
  -- Distinct keys (no "m"): every bucket is read once, all in one MGET.
  local pre = n > 1 and not memoOn and rcall('MGET', unpack(K, KEY.buckets))
  for i = 1, n do
    local cost = itemArgs(i)
    if aCap ~= sCap or aRate ~= sArg then parseShape(aCap, aRate) end
    if decide and (#cost > #sLeast or (#cost == #sLeast and cost > sLeast)) then -- above a capacity
      emit(2, '', '')
      refused = true
    else
      local code, v = one(i, K[kb + i], cost, aCap, aChain, pre)
      if not code then -- mode "A" writes nothing before every bucket is decided
        if not all then flushAll() end
        return { 'chain', version, all and 0 or i - 1, deleted, v, unpack(out, 5, all and 4 or no) }
      end
    end
  end
  -- Mode "A": every bucket admitted, so every one is written. The first
  -- write is a SET: a Redis out of memory refuses it, and the call, before
  -- anything is written.
  if all and not refused then for k = 1, #held do put(unpack(held[k], 1, 10)) end end
  flushAll()
  out[1], out[2], out[3], out[4] = 'ok', version, n, deleted -- the head the results left room for
  return out
end
