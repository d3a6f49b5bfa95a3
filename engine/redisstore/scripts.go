package redisstore

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// decideSrc refills, decides and writes a chunk of buckets atomically; its
// header comment is the protocol.
//
//go:embed decide.lua
var decideSrc string

// timeLua is shared by the administrative scripts: the server's TIME in ns,
// as a decimal string, or ARGV's override: Config.Clock's reading.
const timeLua = `
local function nowNs(override)
  if override ~= '' then return override end
  local tm = redis.call('TIME')
  return tm[1] .. string.format('%06d', tonumber(tm[2])) .. '000'
end
`

// bandsLua is the tail of a history entry: nothing for a default shape
// without bands (the entry a plain policy always had), else its bands
// after a space.
const bandsLua = `
local function bands(b)
  if b == nil or b == '' then return '' end
  return ' ' .. b
end
`

// installSrc stores the first policy of a prefix, if it has none.
// KEYS: policy hash, history list, blobs hash. ARGV: version, and the
// default shape's cap and rate, overridden ("1"/"0"), blob, time override,
// the default shape's bands (see decide.lua). Reply {"ok"} or {"exists"}.
const installSrc = timeLua + bandsLua + `
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
local now = nowNs(ARGV[6])
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. now .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. bands(ARGV[7]))
redis.call('HSET', KEYS[3], ARGV[1], ARGV[5])
redis.call('HSET', KEYS[1], 'v', ARGV[1])
return {'ok'}
`

// replaceSrc publishes the next policy if the caller still holds the cutover
// lock and expectedVersion is in force (a compare-and-set), recording the
// cutover instant; with trim, it first drops every retained version but the
// one in force (the caller has brought every bucket up to it).
// KEYS: policy hash, history list, blobs hash, lock, pending.
// ARGV: expected, next version, cap, rate, overridden, blob, time override,
// lock token, trim, bands. Reply {"ok", instant}, {"stale", version},
// {"lock"} or {"nopolicy"}.
const replaceSrc = timeLua + bandsLua + `
local cur = redis.call('HGET', KEYS[1], 'v')
if not cur then return {'nopolicy'} end
if redis.call('GET', KEYS[4]) ~= ARGV[8] then return {'lock'} end
local nv = ARGV[2]
if cur ~= ARGV[1] or #nv < #cur or (#nv == #cur and nv <= cur) then return {'stale', cur} end
local now = nowNs(ARGV[7])
if ARGV[9] == '1' then
  local old = redis.call('LRANGE', KEYS[2], 0, -2)
  for _, e in ipairs(old) do redis.call('HDEL', KEYS[3], string.match(e, '^(%d+)')) end
  redis.call('LTRIM', KEYS[2], -1, -1)
end
redis.call('RPUSH', KEYS[2], nv .. ' ' .. now .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5] .. bands(ARGV[10]))
redis.call('HSET', KEYS[3], nv, ARGV[6])
redis.call('HSET', KEYS[1], 'v', nv)
redis.call('DEL', KEYS[5])
return {'ok', now}
`

// refreshSrc extends the cutover lock and the pending flag while their
// holder works. KEYS: lock, pending. ARGV: token, ttl ms. Reply 1 if the
// caller still holds the lock.
const refreshSrc = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
return 1
`

// releaseSrc drops the lock and the pending flag if the caller holds them.
// KEYS: lock, pending. ARGV: token.
const releaseSrc = `
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
`

// pendingSrc sets the pending flag if the caller still holds the cutover
// lock, so a holder whose lock expired cannot overwrite (and later delete)
// the flag of the process that took the lock after it.
// KEYS: lock, pending. ARGV: token, ttl ms. Reply 1 if it did.
const pendingSrc = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
`

var (
	pendingScript = redis.NewScript(pendingSrc)
	decideScript  = redis.NewScript(decideSrc)
	installScript = redis.NewScript(installSrc)
	replaceScript = redis.NewScript(replaceSrc)
	refreshScript = redis.NewScript(refreshSrc)
	releaseScript = redis.NewScript(releaseSrc)
)
