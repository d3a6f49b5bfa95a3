package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/internal/redistest"
)

// TestLeases runs the lease check for a few seconds on the shared Redis
// server: cutovers both ways, a store killed halfway, and every key within
// its bound at every check.
func TestLeases(t *testing.T) {
	o := options{duration: 3 * time.Second, workers: 8, cutoverEvery: 250 * time.Millisecond, seed: 1}
	c := &counters{}
	ctx, cancel := context.WithTimeout(context.Background(), o.duration) // as runChecks bounds a check
	defer cancel()
	r, err := leaseRun(ctx, o, redistest.Addr(t), c)
	require.NoError(t, err)
	t.Log(leaseTable(r))
	assert.Positive(t, r.cutovers)
	assert.Equal(t, r.cutovers+1, r.checks, "one check before each cutover and one at the end")
	assert.GreaterOrEqual(t, r.hotSlack, int64(0))
	assert.GreaterOrEqual(t, r.warmSlack, int64(0))
	var leased, local uint64
	for _, s := range r.stats {
		leased, local = leased+s.LeasedTokens, local+s.Local
	}
	assert.Positive(t, leased, "no store leased a token")
	assert.Positive(t, local, "no request was decided from a lease")
	assert.Zero(t, r.degraded, "the failure rule answered a live store")
	killed := r.stats[leaseStores-1]
	assert.Positive(t, killed.Allowed, "the killed store admitted nothing before its kill")
}

// TestLeasesCommand runs the check from the command line, on the shared
// server (-redis), and reads its report.
func TestLeasesCommand(t *testing.T) {
	var buf bytes.Buffer
	code := run(context.Background(), []string{"-check", "leases", "-redis", redistest.Addr(t), "-duration", "2s", "-seed", "2"}, &buf, &buf)
	require.Equal(t, 0, code, buf.String())
	m := regexp.MustCompile(`leases: 4 stores \(one killed halfway\), \d+ hot and \d+ warm keys, (\d+) cutovers`).FindStringSubmatch(buf.String())
	require.NotNil(t, m, buf.String())
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	assert.Positive(t, n, buf.String())
}

// cancelOn is a writer that cancels when a write contains s.
type cancelOn struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	s      string
	cancel context.CancelFunc
}

func (w *cancelOn) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if strings.Contains(string(p), w.s) {
		w.cancel()
	}
	return w.buf.Write(p)
}

func (w *cancelOn) String() string { w.mu.Lock(); defer w.mu.Unlock(); return w.buf.String() }

// TestLeasesInterrupted: a run stopped by the command's signal (its
// context's end) before the store is killed halfway reports the lease check
// interrupted, as the others, and does not fail; it reported it failed,
// "stopped before the store was to be killed", and the command said it
// would have exited 1.
func TestLeasesInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &cancelOn{s: "decisions/s", cancel: cancel} // the first progress line, a second in
	code := run(ctx, []string{"-check", "leases,flood", "-redis", redistest.Addr(t), "-duration", "5m", "-seed", "7"}, out, out)
	assert.Equal(t, 0, code, out.String())
	// interrupted, whatever the check was doing (on a loaded machine it may
	// still be opening its stores a second in)
	assert.Regexp(t, `(?m)^\| leases +\| interrupted\b`, out.String())
	assert.Regexp(t, `(?m)^\| flood +\| interrupted +\|`, out.String())
	assert.NotContains(t, out.String(), "failed")
}
