package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/engine"
)

// ErrNotReplicated is the failure of a script call whose writes fewer
// replicas than WaitForReplicas asks acknowledged within its timeout.
var ErrNotReplicated = errors.New("redisstore: the write was not acknowledged by enough replicas")

// WaitForReplicas makes every script call on c wait until replicas
// replicas have acknowledged its writes, by sending WAIT replicas timeout
// after it on the same connection. Replication is asynchronous: a master
// that dies may not have passed its last writes on, and the replica
// promoted in its place gives their tokens again. With WaitForReplicas a
// decision counts only once its writes are on that many replicas: a
// call they do not all acknowledge in time fails with ErrNotReplicated,
// answered by the failure rule (Config.FailOpen) and reported to
// Config.OnError, so the admissions a promotion can undo are only those
// the store never gave.
//
// It costs a round trip to the replicas on every call, and availability:
// while a master has fewer replicas than asked for (after a failover,
// until the lost node rejoins as a replica), every decision on its keys
// is the failure rule's. So is every decision if replicas is more than
// the deployment has: WAIT cannot tell a replica away from one that never
// was, and New starts the store degraded rather than fail, so the count
// is yours to check (OnError reports each ErrNotReplicated). It does not
// guard against what WAIT cannot: with more than one replica per master,
// a failover may promote a replica that was not among those that
// acknowledged, and behind Sentinel, where SENTINEL FAILOVER lets the old
// primary decide until the switch, a replica that acknowledged drops what
// it took then when it follows the new primary: there only replicas equal
// to every replica bounds the loss (see the package doc's Failures).
//
// Call it before the client's first command, on a client that serves the
// store alone: it adds a go-redis hook to c (a *redis.ClusterClient's to
// every node client it makes from then on), which any other user of c
// would go through too. timeout must be under Config.Timeout, else a call
// ends by its deadline before WAIT answers, and under the client's
// ReadTimeout, else its read times out first (WaitForReplicas refuses
// that one).
func WaitForReplicas(c redis.UniversalClient, replicas int, timeout time.Duration) error {
	if replicas < 1 || timeout < time.Millisecond {
		return fmt.Errorf("%w: WaitForReplicas needs replicas >= 1 and a timeout of at least 1ms, not %d and %v",
			engine.ErrInvalidConfig, replicas, timeout)
	}
	add := func(n *redis.Client) {
		n.AddHook(&waitHook{c: n, replicas: int64(replicas), timeout: timeout})
	}
	var read time.Duration // as the client made it: go-redis's default for 0, 0 for none
	var hook func()
	switch c := c.(type) {
	case *redis.Client:
		read, hook = c.Options().ReadTimeout, func() { add(c) }
	case *redis.ClusterClient:
		read, hook = c.Options().ReadTimeout, func() { c.OnNewNode(add) }
	default:
		return fmt.Errorf("%w: WaitForReplicas takes a *redis.Client or a *redis.ClusterClient, not %T", engine.ErrInvalidConfig, c)
	}
	if read > 0 && read <= timeout {
		return fmt.Errorf("%w: WaitForReplicas's timeout (%v) must be under the client's ReadTimeout (%v), else each call's read times out before WAIT answers",
			engine.ErrInvalidConfig, timeout, read)
	}
	hook()
	return nil
}

// waitHook follows each script call with WAIT on the same connection: a
// single call goes as a pipeline of two, and a pipeline (one connection,
// for a ClusterClient one node's part) gets WAIT at its end, which waits
// for every write the connection made before it.
type waitHook struct {
	c        *redis.Client
	replicas int64
	timeout  time.Duration
}

// scripted reports whether cmd calls a script, which may write.
func scripted(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "fcall", "evalsha", "eval":
		return true
	}
	return false
}

func (h *waitHook) DialHook(next redis.DialHook) redis.DialHook {
	return next
}

func (h *waitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !scripted(cmd) {
			return next(ctx, cmd)
		}
		pipe := h.c.Pipeline() // through ProcessPipelineHook below
		_ = pipe.Process(ctx, cmd)
		_ = execute(ctx, pipe)
		return cmd.Err()
	}
}

func (h *waitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, scripted) {
			return next(ctx, cmds)
		}
		wait := redis.NewIntCmd(ctx, "wait", h.replicas, h.timeout.Milliseconds())
		err := next(ctx, append(slices.Clip(cmds), wait))
		got, werr := wait.Result()
		switch {
		case werr != nil:
			werr = fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, werr)
		case got >= h.replicas:
			return err
		default:
			werr = fmt.Errorf("%w: WAIT %d %d answered %d", ErrNotReplicated, h.replicas, h.timeout.Milliseconds(), got)
		}
		for _, c := range cmds {
			if scripted(c) && c.Err() == nil {
				c.SetErr(werr) // the decision stands on the master alone: not given
			}
		}
		return cmp.Or(err, werr)
	}
}
