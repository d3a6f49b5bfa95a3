package main

import (
	"bytes"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/time/rate"

	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// stopRedis stops the redis-server redistest.Addr may have started, before
// the leak check looks at goroutines (its process has a waiting one).
type stopRedis struct{ m *testing.M }

func (s stopRedis) Run() int { defer redistest.Stop(); return s.m.Run() }

// TestMain fails the package if a contender leaves a goroutine behind
// (go-limiter's sweeper, the engine's shards, a go-redis client not closed).
// A test binary run with leaseWorkerEnv set is a worker of the leases part
// (TestLeasesPart), as the command is.
func TestMain(m *testing.M) {
	if code, worker := leaseWorkerMain(); worker {
		os.Exit(code)
	}
	goleak.VerifyTestMain(stopRedis{m})
}

var (
	keySetsMu sync.Mutex
	keySets   = map[string]*keySet{}
)

// keysFor builds a scenario's keys once per process, outside any timer.
func keysFor(s scenario) *keySet {
	keySetsMu.Lock()
	defer keySetsMu.Unlock()
	if ks, ok := keySets[s.name]; ok {
		return ks
	}
	ks := newKeySet(s)
	keySets[s.name] = ks
	return ks
}

// skipUnderRace skips an end-to-end run of the command under the race
// detector, which makes it take minutes of CI's two cores and measures
// nothing; `go test work` without -race, which CI also runs, runs it.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("an end-to-end run of the bench: `go test work` without -race runs it")
	}
}

// BenchmarkDecide is every contender on every scenario; run it with
// -cpu 1,2 and -count 10, and compare with benchstat.
func BenchmarkDecide(b *testing.B) {
	for _, s := range scenarios {
		for _, c := range contenders {
			rg := newRig(c, s, func() *keySet { return keysFor(s) })
			b.Run("scenario="+s.name+"/contender="+strings.ReplaceAll(c.name, " ", "_"), rg.bench)
			rg.close()
		}
	}
}

// TestContendersAgree checks every contender enforces the same bucket: 3
// tokens, a refill far too slow to matter, 5 requests on one key, 3 admitted.
// A contender that does not limit would make every ratio meaningless.
func TestContendersAgree(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}
	for _, c := range contenders {
		inst := c.setup(p, 10)
		d := inst.forWorker()
		keys := []string{"k", "k", "k", "k", "k"}
		got := 0
		for i := 0; i < len(keys); i += c.batch {
			got += d.decide(keys[i:min(i+c.batch, len(keys))])
		}
		inst.close()
		if got != 3 {
			t.Errorf("%s admitted %d of 5 requests against a bucket of 3", c.name, got)
		}
	}
}

// TestGoLimiterInterval: go-limiter's bucket is p's, and one too large for
// its per-interval refill (admitAll's, 2^40 tokens a second) gets an
// interval no run reaches, so it stays full instead of refilling nothing
// after its first second and denying every later request. (Capacity
// seconds in nanoseconds overflowed there, and go-limiter took the
// negative interval for its 1 s default.)
func TestGoLimiterInterval(t *testing.T) {
	for _, c := range []struct {
		p    policy.Policy
		want time.Duration
	}{
		{policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 2}, 1500 * time.Millisecond},
		{mostlyDenied, time.Second},
		{allDenied, time.Minute},
		{policy.Policy{Version: 1, Capacity: 5, Refill: policy.Rate{Tokens: 2, Per: time.Minute}}, 150 * time.Second},
		{admitAll, 24 * time.Hour},
		{policy.Policy{Version: 1, Capacity: 1 << 40, TokensPerSecond: 1}, 24 * time.Hour},
	} {
		if got := goLimiterInterval(c.p); got != c.want {
			t.Errorf("goLimiterInterval(%+v) = %v, want %v", c.p, got, c.want)
		}
	}
}

// TestRateLimit: x/time/rate gets the policy's rate per second, a
// Refill's too (a limit of 0 would still admit its burst, then deny
// forever, where the policy refills).
func TestRateLimit(t *testing.T) {
	for _, c := range []struct {
		p     policy.Policy
		limit rate.Limit
		burst int
	}{
		{admitAll, 1 << 40, min(1<<40, math.MaxInt)}, // not 0 where int is 32 bits: a burst of 0 admits nothing
		{mostlyDenied, 1, 1},
		{allDenied, 1.0 / 60, 1},
	} {
		if l, b := rateLimit(c.p); l != c.limit || b != c.burst {
			t.Errorf("rateLimit(%v) = %v, %d, want %v, %d", c.p.Limit().Rate(), l, b, c.limit, c.burst)
		}
	}
}

// TestGCRALimit: redis_rate gets the policy's capacity as its burst and
// its rate per second, both as ints, math.MaxInt at most, so that a
// policy that admits everything does on a 32-bit platform too.
func TestGCRALimit(t *testing.T) {
	for _, c := range []struct {
		p           policy.Policy
		rate, burst int
	}{
		{leasePolicy, 1, min(1<<40, math.MaxInt)},
		{admitAll, min(1<<40, math.MaxInt), min(1<<40, math.MaxInt)},
		{mostlyDenied, 1, 1},
	} {
		if l := gcraLimit(c.p); l.Rate != c.rate || l.Burst != c.burst || l.Period != time.Second {
			t.Errorf("gcraLimit(%+v) = %+v, want rate %d, burst %d a second", c.p, l, c.rate, c.burst)
		}
	}
}

// TestQuickRun runs the command end to end on the smallest setting, so the
// README's command cannot rot. It takes about ten seconds, ten times that
// under the race detector, so it runs only without -race (CI runs both).
func TestQuickRun(t *testing.T) {
	skipUnderRace(t)
	var out bytes.Buffer
	if code := run([]string{"-quick", "-cpu", "1"}, &out, &out); code != 0 {
		t.Fatalf("bench -quick exited %d:\n%s", code, out.String())
	}
	for _, want := range []string{"ns per decision", "share of decisions admitted", "retained heap", "latency", "EvictFull", "ReplacePolicy", "redis: skipped"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
