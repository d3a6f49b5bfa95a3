package main

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// waitHook follows every script call with WAIT numreplicas timeout on the
// same connection, in the same pipeline: the script's reply counts only
// once that many replicas have acknowledged every write the connection made
// before the WAIT. When fewer acknowledge within the timeout the script's
// reply is replaced by an error, so the store answers by its failure rule
// (the writes stay on the master, and may or may not survive it: the
// answer is a denial when the store fails closed, never an admission a
// promotion could undo).
//
// It sits in go-redis's hooks of one node's client (a *redis.Client, or
// each node client of a ClusterClient, through OnNewNode), where a
// pipeline is one connection: WAIT waits for that connection's writes.
type waitHook struct {
	c        *redis.Client
	replicas int64
	timeout  time.Duration
}

// errNotReplicated replaces the reply of a script call whose writes fewer
// than the wanted replicas acknowledged in time.
type errNotReplicated struct {
	want, got int64
	timeout   time.Duration
}

func (e *errNotReplicated) Error() string {
	return fmt.Sprintf("WAIT: %d of %d replicas acknowledged the write within %v", e.got, e.want, e.timeout)
}

// withWait installs the hook on rdb: on a *redis.Client at once, on a
// *redis.ClusterClient on every node client it makes from now on (install
// it before the first command).
func withWait(rdb redis.UniversalClient, replicas int, timeout time.Duration) {
	add := func(c *redis.Client) { c.AddHook(&waitHook{c: c, replicas: int64(replicas), timeout: timeout}) }
	switch c := rdb.(type) {
	case *redis.Client:
		add(c)
	case *redis.ClusterClient:
		c.OnNewNode(add)
	}
}

// writes reports whether cmd is a script call, which may write.
func writes(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "fcall", "evalsha", "eval":
		return true
	}
	return false
}

func (h *waitHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

// ProcessHook sends a script call as a pipeline of two, so that the
// pipeline hook adds the WAIT on the same connection.
func (h *waitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !writes(cmd) {
			return next(ctx, cmd)
		}
		pipe := h.c.Pipeline()
		_ = pipe.Process(ctx, cmd)
		_, _ = pipe.Exec(ctx)
		return cmd.Err()
	}
}

func (h *waitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, c := range cmds {
			if writes(c) {
				n++
			}
		}
		if n == 0 {
			return next(ctx, cmds)
		}
		wait := redis.NewIntCmd(ctx, "wait", h.replicas, h.timeout.Milliseconds())
		err := next(ctx, append(cmds[:len(cmds):len(cmds)], wait))
		got, werr := wait.Result()
		if werr == nil && got >= h.replicas {
			return err
		}
		if werr == nil {
			werr = &errNotReplicated{want: h.replicas, got: got, timeout: h.timeout}
		}
		for _, c := range cmds {
			if writes(c) && c.Err() == nil {
				c.SetErr(werr)
			}
		}
		return cmp.Or(err, werr)
	}
}
