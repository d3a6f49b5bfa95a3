package shard

import "github.com/tokenshard/tokenshard/msg"

// allow is decide for tests: it hashes key and returns the reply.
func (s *State) allow(now int64, key string, cost int64) msg.Reply {
	var r msg.Reply
	s.decide(now, key, s.hasher.Sum(key), cost, &r)
	return r
}
