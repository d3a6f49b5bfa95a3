package redisstore_test

import (
	"context"
	"fmt"
	"net"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/engine/redisstore"
)

// hook is a go-redis hook made of functions, for tests that stop, fail or
// watch what a store sends; a nil function passes commands through.
type hook struct {
	process  func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error
	pipeline func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error
	dial     func(ctx context.Context, network, addr string, next redis.DialHook) (net.Conn, error)
}

func (h hook) DialHook(next redis.DialHook) redis.DialHook {
	if h.dial == nil {
		return next
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return h.dial(ctx, network, addr, next)
	}
}

func (h hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	if h.process == nil {
		return next
	}
	return func(ctx context.Context, cmd redis.Cmder) error { return h.process(ctx, cmd, next) }
}

func (h hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	if h.pipeline == nil {
		return next
	}
	return func(ctx context.Context, cmds []redis.Cmder) error { return h.pipeline(ctx, cmds, next) }
}

// decideHook is a hook that runs fn around every call of the decide script,
// whether sent alone (a command) or pipelined with others (fn sees the
// whole pipeline), and passes every other command through.
func decideHook(fn func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error) hook {
	return hook{
		process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if !redisstore.IsDecideCall(cmd) {
				return next(ctx, cmd)
			}
			return fn(ctx, []redis.Cmder{cmd}, func(ctx context.Context, cmds []redis.Cmder) error { return next(ctx, cmds[0]) })
		},
		pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			for _, cmd := range cmds {
				if redisstore.IsDecideCall(cmd) {
					return fn(ctx, cmds, next)
				}
			}
			return next(ctx, cmds)
		},
	}
}

// scriptKeys returns the keys of an EVAL or EVALSHA command, or nil for
// any other command.
func scriptKeys(cmd redis.Cmder) []string {
	a := cmd.Args()
	if (cmd.Name() != "evalsha" && cmd.Name() != "eval" && cmd.Name() != "fcall") || len(a) < 3 {
		return nil
	}
	var n int
	if _, err := fmt.Sscan(fmt.Sprint(a[2]), &n); err != nil || len(a) < 3+n {
		return nil
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint(a[3+i])
	}
	return keys
}
