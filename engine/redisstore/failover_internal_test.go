package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/clock"
)

// replyErr is an error reply of Redis, as go-redis returns one.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

var _ redis.Error = replyErr("")

// errUnhealthy is go-redis's refusal (from v9.24.0) of a command for a slot
// whose master its cluster client's slot map marks failed, as New met it
// while a master was down: the command was not sent.
var errUnhealthy = fmt.Errorf("%w: a script on virtual shard 0: %w", ErrUnavailable,
	fmt.Errorf("%w: slot 580 master Redis<127.0.0.1:37927 db:0> is fail", redis.ErrClusterTopologyUnhealthy))

func TestNodeLost(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		err  error
		lost bool
	}{
		{refused, true},
		{fmt.Errorf("%w: %w", ErrUnavailable, refused), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded}, true}, // a dial that timed out
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{io.EOF, true},
		{fmt.Errorf("%w: %w", ErrUnavailable, io.ErrUnexpectedEOF), true},
		{syscall.EPIPE, true},
		{fmt.Errorf("%w: reading the policy: %w", ErrUnavailable, os.ErrDeadlineExceeded), true}, // a read timeout, bare
		{replyErr("CLUSTERDOWN The cluster is down"), true},
		{fmt.Errorf("%w: %w", ErrUnavailable, replyErr("CLUSTERDOWN Hash slot not served")), true},
		{fmt.Errorf("%w: reading the policy: %w", ErrUnavailable, errors.New(noNodes)), true}, // a slot map of no node
		{errUnhealthy, true},

		{nil, false},
		{replyErr("NOSCRIPT No matching script"), false},
		{replyErr("OOM command not allowed"), false},
		{replyErr("MOVED 3999 127.0.0.1:6381"), false}, // go-redis reloads on MOVED itself
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), false},
		{context.Canceled, false},
		{context.DeadlineExceeded, false},
		{redis.ErrClosed, false}, // the client, not a node
		{redis.Nil, false},
		{errors.New("redisstore: unexpected script status"), false},
	} {
		if got := nodeLost(c.err); got != c.lost {
			t.Errorf("nodeLost(%#v) = %v, want %v", c.err, got, c.lost)
		}
	}
}

func TestSlotMapDue(t *testing.T) {
	var m mapReloader
	every := int64(slotMapEvery)
	for _, c := range []struct {
		now int64
		due bool
	}{
		{0, true}, // the zero value has asked none
		{0, false},
		{every - 1, false},
		{every, true},
		{every + 1, false},
		{5 * every, true}, // after a quiet while, at once
		{6*every - 1, false},
	} {
		if got := m.due(c.now); got != c.due {
			t.Fatalf("due(%d) = %v, want %v", c.now, got, c.due)
		}
	}
}

// TestSlotMapReloadStorm: many concurrent calls failing on a lost node ask
// the cluster client for one slot map reload per slotMapEvery, and the
// client is asked (it calls its ClusterSlots). No server: the slot map
// source is a function that reports its calls. The store's clock is a
// Manual one, so the count is exact: one reload while it stands still, and
// one more once slotMapEvery has passed.
func TestSlotMapReloadStorm(t *testing.T) {
	loaded := make(chan struct{}, 1)
	cc := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			select {
			case loaded <- struct{}{}:
			default:
			}
			// an error ends go-redis's reload goroutine at once, with no
			// cooldown to outlive the test
			return nil, errors.New("no slots here")
		}})
	t.Cleanup(func() { _ = cc.Close() })
	clk := clock.NewManual(0)
	s := &Store{rdb: cc, cluster: cc}
	s.slotMap.clk = clk
	lost := fmt.Errorf("%w: %w", ErrUnavailable, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})

	storm := func() int64 {
		const goroutines, calls = 32, 2000
		var asked atomic.Int64
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				for range calls {
					if s.nodeFailed(context.Background(), lost) {
						asked.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return asked.Load()
	}
	if n := storm(); n != 1 {
		t.Fatalf("64,000 failing calls at one instant asked %d reloads, want 1", n)
	}
	select {
	case <-loaded:
	case <-time.After(5 * time.Second):
		t.Fatal("go-redis did not load the slot map after a reload was asked")
	}
	clk.Advance(slotMapEvery - 1)
	if n := storm(); n != 0 {
		t.Fatalf("a storm within slotMapEvery of the last reload asked %d more, want 0", n)
	}
	clk.Advance(1)
	if n := storm(); n != 1 {
		t.Fatalf("a storm slotMapEvery after the last reload asked %d reloads, want 1", n)
	}
}

// TestNodeFailedAsksOnlyWhenItMay: no reload is asked on one server, by a
// closed store, for a caller's cancellation, or for an error that is not a
// lost node; and none of those holds off the next one that may. A deadline
// that passed asks one: a node that hangs (stopped, not dead) gives nothing
// else, and the slot map must move to its replica once it is promoted.
func TestNodeFailedAsksOnlyWhenItMay(t *testing.T) {
	lost := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	ctx := context.Background()
	one := &Store{}
	if one.nodeFailed(ctx, lost) {
		t.Fatal("a store on one server asked a slot map reload")
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) { return nil, errors.New("no slots here") }})
	t.Cleanup(func() { _ = cc.Close() })
	s := &Store{rdb: cc, cluster: cc}
	s.slotMap.clk = clock.NewManual(0)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	for _, c := range []struct {
		ctx context.Context
		err error
	}{
		{ctx, nil},
		{ctx, replyErr("NOSCRIPT No matching script")},
		{ctx, replyErr("BUSY Redis is busy running a script.")},
		{canceled, lost},
		{canceled, context.DeadlineExceeded},
	} {
		if s.nodeFailed(c.ctx, c.err) {
			t.Fatalf("nodeFailed(%v) asked a reload", c.err)
		}
	}
	if !s.nodeFailed(ctx, lost) {
		t.Fatal("a lost node asked no reload")
	}
	s.slotMap.next.Store(0)
	if !s.nodeFailed(ctx, fmt.Errorf("%w: %w", ErrUnavailable, context.DeadlineExceeded)) {
		t.Fatal("a deadline passed without an answer asked no reload")
	}
	s.slotMap.next.Store(0)
	s.closed.Store(true)
	if s.nodeFailed(ctx, lost) {
		t.Fatal("a closed store asked a slot map reload")
	}
}

// timeoutErr is a net.Error that timed out, as a read deadline gives.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// actLost, in TestClassify's table: actFail for an error that may mean a
// lost node (nodeLost), on which exec has the slot map reloaded.
const actLost action = -1

// TestClassify: what exec does with each error Redis, the network or the
// context gives a script call.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want action
	}{
		{replyErr("MOVED 3999 127.0.0.1:6381"), actWait},
		{replyErr("ASK 3999 127.0.0.1:6381"), actWait},
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), actWait},
		{replyErr("NOSCRIPT No matching script. Please use EVAL."), actLoad},
		{replyErr("ERR Function not found"), actLoad},
		{replyErr("ERR unknown command 'FCALL', with args beginning with: "), actNoFunc},
		{replyErr("NOPERM this user has no permissions to run the 'fcall' command"), actNoFunc},
		{replyErr("OOM command not allowed when used memory > 'maxmemory'."), actOOM},
		{replyErr("ERR unknown command `fcall`, with args beginning with: `tokenshard_decide_f5ab5d113420e045`, `4`, "), actNoFunc}, // Redis 6.0
		{replyErr("ERR Error running script (call to f_f5ab5d113420e045a2ee82a82347cdd242ee27f0): @user_script:448: @user_script: 448: -OOM command not allowed when used memory > 'maxmemory'."), actOOM}, // Redis 6.0's, raised at a script's first write
		{replyErr("ERR Error running script (call to f_f5ab5d113420e045a2ee82a82347cdd242ee27f0): @user_script:12: user_script:12: Script attempted to access nonexistent global variable 'x'"), actFail},
		{replyErr("BUSY Redis is busy running a script."), actFail},
		{replyErr("LOADING Redis is loading the dataset in memory"), actFail},
		{replyErr("READONLY You can't write against a read only replica."), actFail},
		{replyErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), actFail},
		{replyErr("ERR user_script:1: Script attempted to access nonexistent global variable"), actFail},
		{replyErr("CLUSTERDOWN The cluster is down"), actLost},
		{errors.New(noNodes), actLost}, // a slot map loaded before the slots were assigned
		{errUnhealthy, actLost},
		{context.DeadlineExceeded, actFail}, // the call's deadline: the script may have run
		{context.Canceled, actFail},
		{&net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}, actLost},
		{os.ErrDeadlineExceeded, actLost}, // a cluster client's read timeout, bare
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, actLost},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, actLost},
		{io.EOF, actLost},
		{io.ErrUnexpectedEOF, actLost},
		{redis.ErrClosed, actFail},
		{redis.ErrPoolTimeout, actFail},
	} {
		got := classify(c.err)
		if got == actFail && nodeLost(c.err) {
			got = actLost
		}
		if got != c.want {
			t.Errorf("classify(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

// TestUnreachable: which errors of New's first attempt start the store
// degraded (Redis cannot serve it now) and which fail New (an answer every
// later attempt would get too).
func TestUnreachable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{replyErr("LOADING Redis is loading the dataset in memory"), true},
		{replyErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), true},
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{replyErr("BUSY Redis is busy running a script."), true},
		{replyErr("OOM command not allowed when used memory > 'maxmemory'."), true},
		{replyErr("NOREPLICAS Not enough good replicas to write."), true},
		{replyErr("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), true},
		{replyErr("CLUSTERDOWN The cluster is down"), true},
		{fmt.Errorf("%w: reading the policy: %w", ErrUnavailable, errors.New(noNodes)), true},
		{errUnhealthy, true}, // a master down: New starts the store, as with go-redis v9.23.0
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}, true},
		{fmt.Errorf("%w: reading the policy: %w", ErrUnavailable, os.ErrDeadlineExceeded), true}, // as a cluster client gives it
		{io.EOF, true},
		{context.DeadlineExceeded, true},
		{redis.ErrPoolTimeout, true},
		{fmt.Errorf("%w: WAIT 1 20 answered 0", ErrNotReplicated), true},
		{fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, replyErr("NOPERM User has no permissions to run the 'wait' command")), false},
		{replyErr("READONLY You can't write against a read only replica."), false},
		{replyErr("ERR unknown command 'FUNCTION', with args beginning with: "), false},
		{replyErr("NOPERM this user has no permissions to run the 'fcall' command"), false},
		{context.Canceled, false},
	} {
		if got := unreachable(c.err); got != c.want {
			t.Errorf("unreachable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
