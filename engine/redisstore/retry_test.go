package redisstore_test

import (
	"context"
	"io"
	"net"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// dropProxy forwards TCP to Redis; when a client->server chunk matches
// trigger (once), the server's reply to it is swallowed and the client's
// connection closed: the command ran in Redis, the client sees io.EOF.
type dropProxy struct {
	ln      net.Listener
	trigger *regexp.Regexp
	fired   atomic.Bool
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
	dropped []byte // the start of the reply swallowed, once fired
}

// droppedReply is the start of the server's reply the proxy swallowed,
// quoted: a test that fails shows whether the lost reply was the
// command's answer or an error sent instead of running it.
func (p *dropProxy) droppedReply() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strconv.Quote(string(p.dropped))
}

func startDropProxy(t *testing.T, target string, trigger *regexp.Regexp) *dropProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &dropProxy{ln: ln, trigger: trigger}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			var mine atomic.Bool
			p.wg.Add(2)
			go func() { // client -> server
				defer p.wg.Done()
				buf := make([]byte, 1<<16)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if !p.fired.Load() && p.trigger.Match(buf[:n]) {
							p.fired.Store(true)
							mine.Store(true)
						}
						if _, err := s.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						s.Close()
						return
					}
				}
			}()
			go func() { // server -> client
				defer p.wg.Done()
				buf := make([]byte, 1<<16)
				for {
					n, err := s.Read(buf)
					if n > 0 && mine.Load() {
						p.mu.Lock()
						p.dropped = append(p.dropped, buf[:min(n, 200)]...)
						p.mu.Unlock()
						c.Close() // the reply is lost on the way
						s.Close()
						return
					}
					if n > 0 {
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// TestPublishReplyLost: the script that records the cutover runs and its
// reply is lost (connection reset). go-redis retries commands by default
// (MaxRetries 3): the script is idempotent, so a second run records the same
// cutover, and ReplacePolicy must not report ErrStalePolicy, or anything
// else, for the cutover it made itself.
func TestPublishReplyLost(t *testing.T) {
	addr := redisAddr(t)
	p := prefix(t)
	c := client(t, addr)
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	realStores(t, addr, 1, redisstore.Config{Client: c, Prefix: p, Policy: v1})
	px := startDropProxy(t, addr, intentCall(p))
	admin, err := redisstore.New(context.Background(), redisstore.Config{Client: client(t, px.ln.Addr().String()), Prefix: p, Policy: v1, Timeout: slowMachine})
	require.NoError(t, err)
	err = admin.ReplacePolicy(context.Background(), policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 1}, 1)
	require.True(t, px.fired.Load())
	require.Equal(t, "2", c.HGet(context.Background(), redisstore.GlobalKey(p, "policy"), "v").Val(), "published")
	require.NoError(t, err, "this call published version 2")
}

// TestDecideReplyLost: the decide script runs (6 of 10 tokens taken) and
// its reply is lost. A go-redis retry would run it again, deny, and answer
// "denied, 4 left" as if Redis had decided that; the store answers by its
// failure rule instead.
func TestDecideReplyLost(t *testing.T) {
	addr := redisAddr(t)
	p := prefix(t)
	c := client(t, addr)
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	direct := realStores(t, addr, 1, redisstore.Config{Client: c, Prefix: p, Policy: v1})[0]
	// The script loaded first, so the reply dropped is the decision's, not
	// the "Function not found" of a server that has never run it.
	_, err := direct.Peek(context.Background(), "k")
	require.NoError(t, err)
	call := `evalsha\r\n\$40\r\n[0-9a-f]{40}|fcall\r\n\$\d+\r\ntokenshard_decide_[0-9a-f]+`
	if noFuncRetries(t, c) > 0 {
		call = `evalsha\r\n\$40\r\n[0-9a-f]{40}` // FCALL is refused there (Redis 6), never run
	}
	px := startDropProxy(t, addr, regexp.MustCompile(`(?i)(`+call+`)\r\n\$1\r\n4\r\n`))
	s, err := redisstore.New(context.Background(), redisstore.Config{Client: client(t, px.ln.Addr().String()), Prefix: p, Policy: v1, Timeout: slowMachine})
	require.NoError(t, err)
	d, err := s.Allow(context.Background(), "k", 6)
	require.NoError(t, err)
	require.True(t, px.fired.Load())
	// The outcome is unknown to the client: the failure rule (reported to
	// OnError and Stats) is the honest answer, not a second run's denial
	// presented as Redis's decision.
	require.Equal(t, uint64(1), s.Stats().Failures, "decision %+v", d)
	pk, err := direct.Peek(context.Background(), "k")
	require.NoError(t, err)
	require.Equal(t, int64(4), pk.Remaining, "the script ran once: 6 taken (the reply dropped: %s)", px.droppedReply())
}

var _ = io.EOF
var _ = engine.ErrClosed

// With MaxRetries -1 the same lost reply is settled by the read-back.
func TestPublishReplyLostNoRetries(t *testing.T) {
	addr := redisAddr(t)
	p := prefix(t)
	c := client(t, addr)
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	realStores(t, addr, 1, redisstore.Config{Client: c, Prefix: p, Policy: v1})
	px := startDropProxy(t, addr, intentCall(p))
	ac := redis.NewClient(&redis.Options{Addr: px.ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = ac.Close() })
	admin, err := redisstore.New(context.Background(), redisstore.Config{Client: ac, Prefix: p, Policy: v1, Timeout: slowMachine})
	require.NoError(t, err)
	err = admin.ReplacePolicy(context.Background(), policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 1}, 1)
	require.True(t, px.fired.Load())
	require.NoError(t, err)
}

// intentCall matches the call of the script that records a cutover on
// prefix p: an EVAL on three keys, the last of them the prefix's lock.
func intentCall(p string) *regexp.Regexp {
	lock := redisstore.GlobalKey(p, "lock")
	return regexp.MustCompile(`(?is)eval\r\n\$\d+\r\n.*?\r\n\$1\r\n3\r\n(\$\d+\r\n[^\r]*\r\n){2}\$\d+\r\n` + regexp.QuoteMeta(lock) + `\r\n`)
}
