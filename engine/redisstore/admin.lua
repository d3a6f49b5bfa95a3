-- The administrative scripts: installing a prefix and its virtual shards,
-- the cutover (in two phases: see cutover.go), and the lock's pending
-- flags. A history entry is "version
-- cutover cap rate overridden[ bands]" (see decide.lua); its tail is what
-- follows the cutover instant. Each script is the section after its
-- "-- script: name" line, run with this prelude before it.

-- nowNs is the server's TIME in ns, as a decimal string, or the
-- override: Config.Clock's reading.
local function nowNs(override)
  if override ~= '' then return override end
  local tm = redis.call('TIME')
  return tm[1] .. string.format('%06d', tonumber(tm[2])) .. '000'
end

-- bands is the tail of a history entry: nothing for a default shape
-- without bands (the entry a plain policy always had), else its bands
-- after a space.
local function bands(b)
  if b == nil or b == '' then return '' end
  return ' ' .. b
end
-- script: install
-- install stores the first policy of a prefix, its number of virtual
-- shards and its key map (fields seed and tags: see keyMap), if it has
-- no version (none, or one lost while the rest of the hash was kept); each
-- of the three is set once, by the first store, and every later store
-- adopts it, so all map keys alike. KEYS: policy hash, history list, blobs
-- hash. ARGV: version, and the default shape's cap and rate, overridden
-- ("1"/"0"), blob, time override, the default shape's bands (see
-- decide.lua), shards, seed, tags. Reply {"ok" or "exists", the shards,
-- seed and tags in force}.
local status = 'exists'
if redis.call('HEXISTS', KEYS[1], 'v') == 0 then
  local now = nowNs(ARGV[6])
  redis.call('DEL', KEYS[2], KEYS[3])
  redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. now .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. bands(ARGV[7]))
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[5])
  redis.call('HSET', KEYS[1], 'v', ARGV[1])
  status = 'ok'
end
redis.call('HSETNX', KEYS[1], 'shards', ARGV[8])
redis.call('HSETNX', KEYS[1], 'seed', ARGV[9])
redis.call('HSETNX', KEYS[1], 'tags', ARGV[10])
local m = redis.call('HMGET', KEYS[1], 'shards', 'seed', 'tags')
return {status, m[1], m[2], m[3]}

-- script: shardInstall
-- shardInstall gives each virtual shard that has no version yet (or lost
-- it) the version in force and a history of that one version, and writes the
-- prefix's key map into every shard's copy: on a cluster, the copy a store
-- reinstalls the global keys with once they are lost (see reinstallPolicy),
-- so that the surviving buckets keep their shards. KEYS: pairs of a
-- shard's policy hash and history list. ARGV: version, its entry's tail,
-- time override, seed, tags. Reply: how many it installed.
local now = nowNs(ARGV[3])
local n = 0
for i = 1, #KEYS, 2 do
  if redis.call('HEXISTS', KEYS[i], 'v') == 0 then
    redis.call('DEL', KEYS[i + 1])
    redis.call('RPUSH', KEYS[i + 1], ARGV[1] .. ' ' .. now .. ' ' .. ARGV[2])
    redis.call('HSET', KEYS[i], 'v', ARGV[1])
    n = n + 1
  end
  redis.call('HSET', KEYS[i], 'seed', ARGV[4], 'tags', ARGV[5])
end
return n

-- A cutover's record, in field next of the global policy hash, is
-- "next trim lengthens instant tail": the next version, "1" if the cutover
-- trims the history, "1" if it may lengthen a bucket's time-to-full (see
-- ReplacePolicy), the cutover instant ("-" until the commit sets it) and the
-- next version's entry tail. It stays until every shard is published (and,
-- for a lengthening cutover, every bucket's expiry set under the next
-- version); doneSrc then removes it.

-- script: intent
-- intent is a cutover's first step, on the global keys: if the
-- caller holds the lock, expectedVersion is in force and no other cutover's
-- record is left unfinished, it records the next version's blob and the
-- cutover to make, which from then on any store may finish.
-- KEYS: policy hash, blobs hash, lock. ARGV: expected, next version, its
-- entry's tail, blob, lock token, trim, lengthens. Reply {"ok"}, {"stale",
-- version}, {"lock"}, {"nopolicy"} or {"busy", record}.
local cur = redis.call('HGET', KEYS[1], 'v')
if not cur then return {'nopolicy'} end
if redis.call('GET', KEYS[3]) ~= ARGV[5] then return {'lock'} end
local nv = ARGV[2]
if cur ~= ARGV[1] or #nv < #cur or (#nv == #cur and nv <= cur) then return {'stale', cur} end
local rec = redis.call('HGET', KEYS[1], 'next')
if rec then
  local w = string.match(rec, '^(%d+) ')
  if w ~= nv and w and (#w > #cur or (#w == #cur and w >= cur)) then return {'busy', rec} end
end
redis.call('HSET', KEYS[2], nv, ARGV[4])
redis.call('HSET', KEYS[1], 'next', nv .. ' ' .. ARGV[6] .. ' ' .. ARGV[7] .. ' - ' .. ARGV[3])
return {'ok'}

-- script: prepare
-- prepare is a cutover's second step, on one virtual shard: its
-- version becomes "p" and the next version, which the decide script
-- refuses to every caller ("stale"), until the shard is published. A shard
-- with no version (its master lost its data) is first installed at the old
-- one. KEYS: the shard's policy hash and history list. ARGV: old version,
-- next version, the old version's entry tail, time override. Reply "ok",
-- or the shard's version if it is neither the old nor prepared: a shard
-- already at the next version is not "ok" here, since only the caller can
-- tell (from the global keys) whether the cutover has committed.
local v = redis.call('HGET', KEYS[1], 'v')
if v == 'p' .. ARGV[2] then return 'ok' end
if not v then
  redis.call('DEL', KEYS[2])
  redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. nowNs(ARGV[4]) .. ' ' .. ARGV[3])
  v = ARGV[1]
end
if v ~= ARGV[1] then return v end
redis.call('HSET', KEYS[1], 'v', 'p' .. ARGV[2])
return 'ok'

-- script: commit
-- commit is a cutover's third step, on the global keys, once
-- every shard is prepared: the next version recorded by intentSrc is in
-- force from here on, its cutover instant this step's TIME, kept in the
-- record so that every shard is published as of that one instant. KEYS:
-- policy hash, history list, blobs hash. ARGV: old version, next version,
-- time override. Reply {"ok", instant} or {"stale", version}.
local cur = redis.call('HGET', KEYS[1], 'v')
local w, trim, len, at, tail = string.match(redis.call('HGET', KEYS[1], 'next') or '', '^(%d+) (%d) (%d) (%S+) (.*)$')
if cur == ARGV[2] and w == ARGV[2] then return {'ok', at} end
if cur ~= ARGV[1] or w ~= ARGV[2] then return {'stale', cur or ''} end
if trim == '1' then
  local old = redis.call('LRANGE', KEYS[2], 0, -2)
  for _, e in ipairs(old) do redis.call('HDEL', KEYS[3], string.match(e, '^(%d+)')) end
  redis.call('LTRIM', KEYS[2], -1, -1)
end
at = nowNs(ARGV[3])
redis.call('RPUSH', KEYS[2], w .. ' ' .. at .. ' ' .. tail)
redis.call('HSET', KEYS[1], 'v', w, 'next', w .. ' ' .. trim .. ' ' .. len .. ' ' .. at .. ' ' .. tail)
return {'ok', at}

-- script: publish
-- publish is a cutover's last step, on one prepared virtual
-- shard: the next version is in force there from the cutover instant,
-- which its buckets replay. KEYS: the shard's policy hash, history list and
-- pending flag. ARGV: next version, its entry's tail, trim, the cutover
-- instant ("" for the shard's TIME), a version the shard may be at instead
-- of prepared ("" for none: a shard found behind a committed version), the
-- pending token of the cutover to remove ("" for none), and the lock's TTL
-- in ms. Reply "ok", or the shard's version if it is neither prepared for
-- the next (nor at that version) nor the next.
--
-- The cutover's token kept the whole flag from expiring (see flag), the
-- tokens of holders beside it too: once it is gone, a flag that still
-- holds some expires after the lock's TTL, as a holder's own flag does
-- (a live holder renews it), so that one left by a process that died
-- mid-cutover does not stop every bucket's expiry for good.
local function unflag()
  if ARGV[6] == '' then return end
  redis.call('HDEL', KEYS[3], ARGV[6])
  if redis.call('PTTL', KEYS[3]) == -1 then redis.call('PEXPIRE', KEYS[3], ARGV[7]) end
end
local v = redis.call('HGET', KEYS[1], 'v')
if v == ARGV[1] then
  unflag()
  return 'ok'
end
if v ~= 'p' .. ARGV[1] and (ARGV[5] == '' or v ~= ARGV[5]) then return v or '' end
if ARGV[3] == '1' then redis.call('LTRIM', KEYS[2], -1, -1) end
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. nowNs(ARGV[4]) .. ' ' .. ARGV[2])
redis.call('HSET', KEYS[1], 'v', ARGV[1])
unflag()
return 'ok'

-- script: flag
-- flag sets a lengthening cutover's own pending token in one
-- virtual shard, with no expiry (the whole flag's: publish gives it back),
-- unless the shard is already published (a flag set after the publish
-- would stay). KEYS: the shard's policy hash and
-- pending flag. ARGV: next version, token. Reply "ok".
if redis.call('HGET', KEYS[1], 'v') == ARGV[1] then return 'ok' end
redis.call('HSET', KEYS[2], ARGV[2], '1')
redis.call('PERSIST', KEYS[2])
return 'ok'

-- script: done
-- done ends a cutover, on the global keys, once every shard is
-- published (and a lengthening cutover's expiry pass is done): it removes
-- the record if it is still that committed cutover's. KEYS: policy hash.
-- ARGV: the version. Reply 1 if it did.
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
local w = string.match(redis.call('HGET', KEYS[1], 'next') or '', '^(%d+) ')
if w ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'next')
return 1

-- A pending flag is a hash of the tokens of the cutovers that set it, one
-- per virtual shard; the decide script writes buckets without expiry while
-- it exists. Each cutover adds and removes only its own token, so a holder
-- whose lock expired cannot remove the flag of the one that took the lock
-- after it.

-- script: pending
-- pending sets the caller's pending flag in each shard given. With
-- ARGV[3] "1", KEYS[1] is the lock, and nothing is set unless the caller
-- holds it (one server: one script); on a cluster the caller renews the lock
-- first. KEYS: [lock,] pending flags. ARGV: token, ttl ms, with lock.
-- Reply 1 if it did.
local first = 1
if ARGV[3] == '1' then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
  first = 2
end
for i = first, #KEYS do
  redis.call('HSET', KEYS[i], ARGV[1], '1')
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1

-- script: refresh
-- refresh extends the cutover lock and the caller's pending flags while
-- it works. KEYS: [lock,] pending flags. ARGV: token, ttl ms, with lock.
-- Reply 1 if the caller still holds the lock (always 1 without it).
local first = 1
if ARGV[3] == '1' then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  first = 2
end
for i = first, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[1]) == 1 then redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
end
return 1

-- script: release
-- release drops the caller's pending flags and, with ARGV[2] "1", the
-- lock (KEYS[1]) if the caller holds it. KEYS: [lock,] pending flags.
-- ARGV: token, with lock.
local first = 1
if ARGV[2] == '1' then
  if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
  first = 2
end
for i = first, #KEYS do redis.call('HDEL', KEYS[i], ARGV[1]) end
return 1
