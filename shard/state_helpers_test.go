package shard

import "github.com/tokenshard/tokenshard/msg"

// Allow is Decide for tests: it hashes key and returns the reply.
func (s *State) Allow(now int64, key string, cost int64) msg.Reply {
	var r msg.Reply
	s.Decide(now, key, s.hasher.Sum(key), cost, &r)
	return r
}
