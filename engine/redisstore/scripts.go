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

var decideScript = redis.NewScript(decideSrc)
