package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
)

type stopRedis struct{ m *testing.M }

func (s stopRedis) Run() int { defer redistest.Stop(); return s.m.Run() }

// parallelWaits is -test.parallel when the command line does not set it.
const parallelWaits = 8

// TestMain fails the package if a test leaves a goroutine behind: go-redis
// clients are closed by each test's cleanup, and the store starts none.
//
// It also raises -test.parallel (GOMAXPROCS by default, 2 on CI) to
// parallelWaits unless the command line sets it, or fuzzes. The tests that
// call t.Parallel wait on real servers and deadlines (a server killed, hung
// or paused, a cluster converging, a Timeout passing), not on the CPU, for
// about 90 s of this package's time, the longest of CI's race step: two at
// a time, most of those waits would still add up. Each works on a server
// or cluster of its own, or on a fresh prefix of the shared server, so
// they cannot meet; the tests that change a shared server stay
// sequential, and Go runs the parallel ones after them.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	// -test.parallel is also the number of fuzzing workers: left alone then
	if fuzz := flag.Lookup("test.fuzz"); !set && (fuzz == nil || fuzz.Value.String() == "") {
		if err := flag.Set("test.parallel", strconv.Itoa(parallelWaits)); err != nil {
			panic(err)
		}
	}
	redis.SetLogger(quiet{}) // the outage tests would fill the log with go-redis's dial retries
	goleak.VerifyTestMain(stopRedis{m})
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// client connects to the real server redistest provides (or skips loudly),
// closed when the test ends.
func client(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// pauseWrites pauses every write to c's server, the store's script calls
// among them (CLIENT PAUSE WRITE), until unpause or the test's end. The
// test ends the pause, not a duration: a duration runs on Redis's wall
// clock, which a step of the machine's clock cuts short. It returns the
// pause's error rather than failing the test, so that a hook may call it
// on a goroutine of the store's; unpause is for the test's goroutine.
func pauseWrites(t testing.TB, c *redis.Client) (unpause func(), err error) {
	t.Cleanup(func() { c.Do(context.Background(), "CLIENT", "UNPAUSE") })
	err = c.Do(context.Background(), "CLIENT", "PAUSE", "3600000", "WRITE").Err()
	return func() { require.NoError(t, c.Do(context.Background(), "CLIENT", "UNPAUSE").Err()) }, err
}

// noFuncRetries is the retries a store's first decide call adds where the
// server has no FUNCTION (Redis 6): sent by FCALL, refused, and sent again
// by EVALSHA. It is 0 where the server has FUNCTION.
func noFuncRetries(t testing.TB, c redis.UniversalClient) uint64 {
	t.Helper()
	err := c.Do(context.Background(), "FUNCTION", "LIST", "LIBRARYNAME", "none").Err()
	if redis.HasErrorPrefix(err, "unknown command") {
		return 1
	}
	require.NoError(t, err)
	return 0
}

// needPauseWrite skips t where the server has no CLIENT UNPAUSE, nor PAUSE
// WRITE (both Redis 6.2), which pauseWrites sends: Redis 6.0.
func needPauseWrite(t testing.TB, c *redis.Client) {
	t.Helper()
	if err := c.Do(context.Background(), "CLIENT", "UNPAUSE").Err(); redis.HasErrorPrefix(err, "Unknown subcommand") {
		t.Skipf("the server cannot pause writes alone: %v", err)
	}
}

// anyClient is client, or for an addr of several addresses joined by commas
// (clusterAddr) a *redis.ClusterClient, so that a test written against one
// server runs on a cluster unchanged.
func anyClient(t testing.TB, addr string) redis.UniversalClient {
	t.Helper()
	if strings.Contains(addr, ",") {
		return clusterClient(t, strings.Split(addr, ","))
	}
	return client(t, addr)
}

// clusterAddr is the shared Redis Cluster's masters, as client takes them.
func clusterAddr(t testing.TB) string { return strings.Join(redistest.ClusterAddrs(t), ",") }

// prefix is a fresh key prefix, so tests sharing one server never meet.
func prefix(t testing.TB) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	p := "tstest:" + hex.EncodeToString(b[:]) + ":"
	return p
}

// leaseMode makes newStore turn leases on (see TestCutoversLeased).
var leaseMode = os.Getenv("TOKENSHARD_TEST_LEASES") != ""

// exactBalances skips t when the package runs with leases on: t checks
// exact balances, raw buckets or counters, which a process's leases change
// by design (its leased variant, where there is one, runs instead).
func exactBalances(t *testing.T) {
	t.Helper()
	if leaseMode {
		t.Skip("checks exact balances or counters, which leases change by design (TOKENSHARD_TEST_LEASES is set)")
	}
}

// newStore builds a store on a fresh prefix of the shared server, its time
// driven by clk (Config.Clock).
func newStore(t testing.TB, cfg redisstore.Config, clk clock.Clock) *redisstore.Store {
	t.Helper()
	if cfg.Client == nil {
		cfg.Client = client(t, redisAddr(t))
	}
	if cfg.Prefix == "" {
		cfg.Prefix = prefix(t)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5e9 // the race detector slows everything; a failure is a test failure anyway
	}
	cfg.Clock = clk
	if leaseMode && cfg.Leases == nil {
		cfg.Leases = &redisstore.Leases{}
	}
	s, err := redisstore.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("redisstore.New: %v", err)
	}
	t.Cleanup(func() {
		_ = s.Close()
		cleanPrefix(cfg.Client, cfg.Prefix)
	})
	return s
}

// cleanPrefix deletes what a test wrote, on every master of a cluster.
func cleanPrefix(c redis.UniversalClient, p string) {
	ctx := context.Background()
	clean := func(ctx context.Context, c redis.UniversalClient) error {
		iter := c.Scan(ctx, 0, p+"*", 1000).Iterator()
		for key := range iter.Vals(ctx) {
			c.Del(ctx, key)
		}
		return nil
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return clean(ctx, c) })
		return
	}
	_ = clean(ctx, c)
}

// redisAddr is the shared server's address (or a loud skip).
func redisAddr(t testing.TB) string { return redistest.Addr(t) }

// startPrivate starts a redis-server this test alone uses (and may
// reconfigure or kill).
func startPrivate(t *testing.T) *redistest.Server { return redistest.Start(t) }

// skipUnderRace skips a sequential check against a model under the race
// detector: the decide script's arithmetic against math/big, or one
// caller's calls on the store against the engine's answers or timed by
// SLOWLOG. Such a check has no goroutine of its own beside the caller, so
// the detector watches only the store's and the engine's machinery, which
// the concurrent tests run under it, and these checks doubled the time of
// the longest test binary in CI's race step. `go test work` without -race
// runs them, and so does CI, after the race step.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("a sequential check against a model: `go test work` without -race runs it")
	}
}
