package main

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// durFreePorts returns the first of n consecutive ports of 127.0.0.1 that
// nothing listens on, picked at random below 30000: under Linux's default
// ephemeral range (32768), where outgoing connections take no port, and
// under CI's clusters (30001 on), whose nodes a test may kill and restart
// on their ports while these tests run beside it. The durability
// check starts its servers on ports its caller chooses: fixed ports here
// failed the tests where a service of the host held one, or another run of
// them (a second checkout's, a measurement's) did.
func durFreePorts(t *testing.T, n int) int {
	t.Helper()
	const low, high = 10000, 30000
	for range 100 {
		base := low + rand.IntN(high-low-n)
		if durPortsFree(base, n) {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports between %d and %d in 100 tries", n, low, high)
	return 0
}

// durPortsFree says whether nothing listens on 127.0.0.1 at ports base to
// base+n-1.
func durPortsFree(base, n int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}

// durNeedRedis skips loudly without redis-server and redis-cli, or fails
// under TOKENSHARD_REQUIRE_REDIS=1.
func durNeedRedis(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("TOKENSHARD_REQUIRE_REDIS") == "1" {
				t.Fatalf("*** the durability measurement needs %s: %v", bin, err)
			}
			t.Skipf("*** THE DURABILITY MEASUREMENT DID NOT RUN: no %s on PATH (%v) ***", bin, err)
		}
	}
}

// TestDurabilityCrash kills -9 a server just after its keys were drained:
// without AOF every token comes back (the RDB save points are minutes
// apart), with appendfsync always none does.
func TestDurabilityCrash(t *testing.T) {
	durNeedRedis(t)
	o := options{workers: 8, seed: 1, dur: durOptions{keys: 40, port: durFreePorts(t, 1)}}
	for _, st := range durSettings {
		c := &counters{}
		r, err := durCrash(context.Background(), o, st, t.TempDir(), c)
		require.NoError(t, err, st.name)
		t.Logf("%s: %d minted, %.0f decisions/s", st.name, r.minted, r.perSec)
		assert.Equal(t, int64(40*durCapacity), r.admitted, st.name)
		assert.Zero(t, r.unacked, "%s: nothing was in flight at the kill", st.name)
		assert.Equal(t, int64(40*durCapacity), c.allowed.Load(), st.name)
		if st.lossless {
			assert.Zero(t, r.minted, "%s: a drained key stays drained", st.name)
		}
	}
	r, err := durCrash(context.Background(), o, durSettings[0], t.TempDir(), &counters{})
	require.NoError(t, err)
	assert.Equal(t, int64(40*durCapacity), r.minted, "without AOF the restart hands every key a fresh burst")
}

// TestDurabilityCommand runs the whole check from the command line, with
// one failover each way, with and without a lagging replica, on clusters
// of its own, and reads its table.
func TestDurabilityCommand(t *testing.T) {
	durNeedRedis(t)
	if testing.Short() {
		t.Skip("starts a six-node cluster twice: not in -short")
	}
	before := goleak.IgnoreCurrent() // the package's shared redis-server, started by other tests
	// The crash servers' port, the cluster's buses 10 to 15 above it, then
	// the cluster's six ports and the lag proxy's.
	port := durFreePorts(t, 23)
	var buf bytes.Buffer
	code := run(context.Background(), []string{"-check", "durability", "-workers", "8", "-durability-keys", "40",
		"-durability-runs", "1", "-durability-port", strconv.Itoa(port), "-durability-cluster-port", strconv.Itoa(port + 16),
		"-durability-lag", "10ms"}, &buf, &buf)
	require.Equal(t, 0, code, buf.String())
	out := buf.String()
	assert.Regexp(t, regexp.MustCompile(`crash: no appendonly \(RDB save points\)\s*\|\s*4000 of 4000\s*\|`), out)
	assert.Regexp(t, regexp.MustCompile(`crash: appendonly, appendfsync always\s*\|\s*0 of 4000\s*\|`), out)
	assert.Regexp(t, regexp.MustCompile(`failover, WAIT 1 \S+ after each script call\s*\|\s*0/0/0\s*\|`), out, "WAIT: no acknowledged admission lost")
	assert.Regexp(t, regexp.MustCompile(`failover, WAIT 1 \S+ after each script call, replica 10ms behind\s*\|\s*0/0/0\s*\|`), out,
		"WAIT: none lost from a lagging replica either")
	// A go-redis pool that failed to dial the killed node PoolSize times
	// redials in the background, sleeping a second between tries, and
	// sees its Close only when it wakes.
	var leak error
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		if leak = goleak.Find(before); leak == nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // a goroutine of go-redis's ending
	}
	require.NoError(t, leak, "a goroutine outlives the check's clients by more than go-redis's redial pause")

	buf.Reset()
	assert.Equal(t, 2, run(context.Background(), []string{"-check", "durability", "-durability-keys", "4"}, &buf, &buf),
		"fewer keys than workers")
	o, err := parseOptions([]string{"-check", "all"}, &buf)
	require.NoError(t, err)
	assert.NotContains(t, o.checks, "durability", "all leaves out the check that starts servers")
}
