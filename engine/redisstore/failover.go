package redisstore

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/clock"
)

// slotMapEvery is the least time between two reloads of a cluster client's
// slot map that a store asks for: however many calls fail meanwhile, one
// reload is asked per slotMapEvery. go-redis reloads in the background, and
// at most once per 200 ms (v9.23) however often it is asked, so a master's
// slots reach the replica promoted in its place within about 300 ms of the
// first failing call after the promotion, plus the reload's round trip.
const slotMapEvery = 100 * time.Millisecond

// mapReloader limits the slot map reloads a store asks for (see
// Store.nodeFailed). New gives it a clock.Monotonic, so a wall clock
// stepped back cannot hold reloads off; clk is not changed after.
type mapReloader struct {
	clk  clock.Clock
	next atomic.Int64 // clk's reading before which no reload is asked
}

// due reports whether a reload may be asked at now (a reading of clk), and
// if so claims it: of any number of concurrent callers, one is told yes per
// slotMapEvery.
func (m *mapReloader) due(now int64) bool {
	next := m.next.Load()
	return now >= next && m.next.CompareAndSwap(next, now+int64(slotMapEvery))
}

// nodeFailed asks the cluster client to reload its slot map, if err (a
// failure of a call under ctx) may mean that a node has gone or hangs (see
// nodeLost; a deadline that passed without an answer too, which is all a
// hung node gives), and no reload was asked in the last slotMapEvery. It
// reports whether it asked.
//
// go-redis reloads the slot map by itself only when a node answers MOVED or
// ASK, and every ClusterStateReloadInterval (a minute by default): a master
// that died answers nothing, and a command go-redis does not retry, as
// every script call is, neither marks it failing nor reloads. Until the
// slot map names the replica promoted in its place, every call on its
// slots would be answered by the failure rule. ReloadState returns at
// once: go-redis reloads on a goroutine of its own, which ends when the
// reload is done (the client's dial and read timeouts bound it). A call
// that failed is not sent again (it may have run); the next calls go
// where the new slot map says.
func (s *Store) nodeFailed(ctx context.Context, err error) bool {
	if err == nil || s.cluster == nil || s.closed.Load() || errors.Is(ctx.Err(), context.Canceled) ||
		!nodeLost(err) && !errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if !s.slotMap.due(s.slotMap.clk.Now()) {
		return false
	}
	s.cluster.ReloadState(context.WithoutCancel(ctx))
	return true
}

// nodeLost reports whether err may mean that the node a command went to has
// gone, so that the slot map may be stale: an error of the connection (a
// dial refused or timed out, a connection reset, closed or timed out, which
// a cluster client that has not loaded its slot map yet may give bare, as
// os.ErrDeadlineExceeded), a CLUSTERDOWN reply, or a cluster client's
// refusal of a command its slot map cannot place: a map of no node ("cluster
// has no nodes": loaded while the nodes answered but served no slot, as a
// cluster being created does; go-redis would keep it until its own reload, a
// minute later), or a slot whose master the map marks failed
// (redis.ErrClusterTopologyUnhealthy, from go-redis v9.24.0). Any other
// reply, a context's error without a network error in it, or a client
// closed, is not.
func nodeLost(err error) bool {
	if err == nil {
		return false
	}
	if redis.HasErrorPrefix(err, "CLUSTERDOWN") || strings.Contains(err.Error(), noNodes) || errors.Is(err, redis.ErrClusterTopologyUnhealthy) {
		return true
	}
	if _, reply := errors.AsType[redis.Error](err); reply {
		return false // the node answered
	}
	var op *net.OpError
	return errors.As(err, &op) ||
		errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// noNodes is the text of go-redis's error for a cluster slot map of no
// node, which it does not export.
const noNodes = "redis: cluster has no nodes"

// action is what exec does after a script call failed with an error.
type action int

const (
	// actFail: the script may have run and its reply been lost, or the
	// server refused it for a reason a resend would meet again (BUSY,
	// LOADING, READONLY, MASTERDOWN, a context's deadline), or the node
	// may be gone (see nodeLost: then, on a cluster, the slot map is
	// reloaded, see nodeFailed): never sent again; the failure rule answers.
	actFail action = iota
	// actWait: the script did not run, a slot being migrated (TRYAGAIN, or
	// a MOVED or ASK that go-redis, which follows them, could not settle,
	// but to a node the cluster marks failed: see movedToFailed): sent
	// again after a pause, within the call's deadline.
	actWait
	// actLoad: the script or the FUNCTION is not loaded (NOSCRIPT, Function
	// not found): loaded, and sent again.
	actLoad
	// actNoFunc: the server has no FUNCTION or refuses it (unknown command,
	// NOPERM): the call goes by EVALSHA from then on.
	actNoFunc
	// actOOM: out of memory. A FUNCTION that may write is refused before it
	// runs, so the call is sent again by EVALSHA, which runs it and refuses
	// only its writes: a call of denials or peeks alone is still answered;
	// a call that writes fails whole, and each of its decisions answers
	// engine.ErrKeyCapacity.
	actOOM
)

// classify says what err, a script call's error, calls for.
func classify(err error) action {
	switch {
	case replyIs(err, "TRYAGAIN", "MOVED", "ASK"):
		return actWait
	case replyIs(err, "NOSCRIPT", "Function not found"):
		return actLoad
	case replyIs(err, "unknown command", "NOPERM"):
		return actNoFunc
	case replyIs(err, "OOM") || replyIs(err, "Error running script") && strings.Contains(err.Error(), ": -OOM "):
		return actOOM // the second, a write refused in a script, as Redis 6 words it
	}
	return actFail
}

// movedToFailed reports whether err, a MOVED or ASK that go-redis gave up
// following, points at a node that a live node's CLUSTER SHARDS marks
// failed: a master down, not a slot migrating, whose calls would meet the
// same until their deadline. Redis 8.0 (as from 7.2, redis/redis#13414)
// lists no slots for a failed master in CLUSTER SHARDS, from which go-redis
// maps them, so it sends their calls to a live master, and follows its
// MOVED to the dead one, which it cannot reach. A MOVED during a migration
// points at a node that answers. A server without CLUSTER SHARDS (Redis 6,
// which maps a failed master's slots to it) or a node it does not list
// counts as a migration.
func (s *Store) movedToFailed(ctx context.Context, err error) bool {
	f := strings.Fields(err.Error())
	if len(f) != 3 || f[0] != "MOVED" && f[0] != "ASK" {
		return false
	}
	host, port, _ := net.SplitHostPort(f[2])
	shards, _ := one(ctx, s, func(c redis.Cmdable) *redis.ClusterShardsCmd { return c.ClusterShards(ctx) }).Result()
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			if host != "" && slices.Contains([]string{n.Endpoint, n.IP, n.Hostname}, host) &&
				(strconv.FormatInt(n.Port, 10) == port || strconv.FormatInt(n.TLSPort, 10) == port) {
				return strings.HasPrefix(n.Health, "fail")
			}
		}
	}
	return false
}

// replyIs reports whether err is a Redis reply that starts with one of
// prefixes.
func replyIs(err error, prefixes ...string) bool {
	return slices.ContainsFunc(prefixes, func(p string) bool { return redis.HasErrorPrefix(err, p) })
}

// one sends the command f makes, at once: on one server by the client, on
// a cluster in a pipeline of its own. go-redis's cluster client reads the
// servers' command table (COMMAND, from random nodes) before the first
// command it sends outside a pipeline, under a context of its own of 5 s
// whatever the caller's deadline, and holds every such command behind it
// meanwhile: a node that hangs would hold New, or a call, for those 5 s.
// A pipeline does not read the table (but for a client that routes reads
// to replicas, ClusterOptions.ReadOnly).
func one[C redis.Cmder](ctx context.Context, s *Store, f func(redis.Cmdable) C) C {
	if s.cluster == nil {
		return f(s.rdb)
	}
	pipe := s.cluster.Pipeline()
	cmd := f(pipe)
	_ = execute(ctx, pipe) // the command holds the error
	return cmd
}

// execute sends pipe. Each command keeps its own error, but for a pipeline
// that a hook on the client failed without sending it, which leaves every
// command without one (and without a reply): each then takes the
// pipeline's error. It returns Exec's error.
func execute(ctx context.Context, pipe redis.Pipeliner) error {
	cmds, err := pipe.Exec(ctx) // every command queued, whatever the error
	if err == nil || slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Err() != nil }) {
		return err
	}
	for _, c := range cmds {
		c.SetErr(err)
	}
	return err
}

// inPipeline sends n commands in one pipeline, the i-th the one f queues
// on it, and returns them, each holding its reply or its error (see
// execute), and execute's error.
func inPipeline[C redis.Cmder](ctx context.Context, s *Store, n int, f func(pipe redis.Pipeliner, i int) C) ([]C, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]C, n)
	for i := range cmds {
		cmds[i] = f(pipe, i)
	}
	return cmds, execute(ctx, pipe)
}

// direct is a processor that sends a command at once, as one does.
type direct struct{ s *Store }

func (d direct) Process(ctx context.Context, cmd redis.Cmder) error {
	one(ctx, d.s, func(c redis.Cmdable) redis.Cmder {
		_ = c.(processor).Process(ctx, cmd)
		return cmd
	})
	return cmd.Err()
}
