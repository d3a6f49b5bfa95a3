package redisstore_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// The multi-process lease test: mpProcs OS processes, each its own store in
// lease mode on one redis-server, deciding at the server's TIME, share the
// quotas of mpHot hot keys (demand far above the quota) and mpCold cold
// keys (demand below it), while one process is killed with SIGKILL halfway.
//
// The workload, per process (mpWorkers goroutines):
//   - mpHotWorkers goroutines share the hot keys: each first sends each of
//     its share of them mpHotBurst requests, back to back, in turn, so that
//     the processes together ask 4*mpHotBurst = 120 at once, more than the
//     capacity of 100, and no bucket keeps refilling while full; then one
//     request every mpHotEvery, cycling over the hot keys:
//     mpProcs*mpHotWorkers/(mpHot*mpHotEvery) = 800 requests per second per
//     hot key over all processes, 16 times its refill of 50 per second, as
//     far as the machine keeps up (under the race detector on a loaded
//     two-core machine, 250 to 400: still far above the refill);
//   - the others share the cold keys: in each of mpColdRounds rounds, one
//     per third of the run (or later, on a machine too slow for it: a
//     round runs to its end), a process sends each cold key a burst of
//     mpColdBurst back-to-back requests (enough for the process to lease
//     it), so a cold key is offered at most mpProcs*mpColdRounds*mpColdBurst
//     = 96 requests, against a quota of 100 + 50*10 = 600 over the run
//     (and its capacity of 100).
const (
	mpProcs      = 4
	mpWorkers    = 16
	mpHotWorkers = 8
	mpHot        = 20
	mpCold       = 1000
	mpHotBurst   = 30
	mpColdBurst  = 8
	mpColdRounds = 3
	mpHotEvery   = 2 * time.Millisecond
	mpRun        = 10 * time.Second
	mpKillAfter  = mpRun / 2 // the last process is killed then
	mpChildEnv   = "TOKENSHARD_LEASE_MP_CHILD"
	mpReady      = "leasemp: ready"
)

// mpPolicy is every key's limit.
var mpPolicy = policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 50}

// mpKey is the name of key i: the hot keys first, then the cold ones.
func mpKey(i int) string {
	if i < mpHot {
		return fmt.Sprintf("hot%02d", i)
	}
	return fmt.Sprintf("cold%04d", i-mpHot)
}

// A process's record file is a sequence of 12-byte records: the key's
// number (little-endian uint16), a kind, mpMark, so that a torn or stray
// write shows, and an instant in ns (little-endian, 8 bytes). A record of
// kind mpFirst, written before the process's first request on the key,
// and one of kind mpLast, written by a worker after its last request was
// answered, hold the server's TIME read just before; the others are one
// answered request each, by outcome, holding the wall clock (which the
// processes share) read just before the request was sent.
const (
	mpDenied   = 0
	mpAdmitted = 1
	mpDegraded = 2 // the failure rule answered: Redis is up, so the test fails on one
	mpFirst    = 3
	mpLast     = 4 // the "key" is a worker's number: see mpWorkerKeys
	mpMark     = 0xA5
)

// mpWorkerKeys reports whether worker w of a process asks key k: the first
// mpHotWorkers ask the hot keys, the others each their share of the cold.
func mpWorkerKeys(w, k int) bool {
	if w < mpHotWorkers {
		return k < mpHot
	}
	return k >= mpHot && (k-mpHot)%(mpWorkers-mpHotWorkers) == w-mpHotWorkers
}

// mpSummary is what a process that ran to the end writes beside its
// records: its Stats before and after Close (which gives its leases back).
type mpSummary struct {
	Stats, Closed redisstore.Stats
}

// TestLeaseMultiProcess runs the workload above in mpProcs child processes
// (this test binary again, running TestLeaseMultiProcessChild), kills one
// with SIGKILL at mpKillAfter, and checks per key, over every process's
// recorded admissions, the dead one's included:
//
//	admitted <= bound = capacity + floor(rate * (end - start))
//	admitted >= 95% of ideal
//
// start is the key's earliest mpFirst reading: the server's TIME some
// process read before it sent its first request on the key, so the key's
// bucket was not created before it (the prefix is fresh, and only
// requests create buckets); end is the latest mpLast reading of a
// surviving process's worker that asks the key:
// every admission recorded on the key, the killed process's included (it
// died before any survivor's worker ended, which the test checks), was
// taken from its bucket before it. The tokens admitted on a key were taken
// from its bucket in [start, end], and a bucket that expired full and came
// back full gave out no more than one that stayed, so bound is at least
// what it could give out in that time: more only by rate times the slack
// at either end (a round trip at the start, and a hot worker's last cycle
// over the keys at the end: a token or two). Leases only move tokens taken
// from a bucket into a process, and a give-back returns tokens that were
// not admitted, so the bound holds with or without them.
//
// ideal is what one exact bucket of the key's limit, full at the first
// request, admits of the requests answered (offered), each at the instant
// its process sent it (by the wall clock, which the processes share): what
// could be admitted of the demand the run made. It is at most
// min(offered, bound), and meets it while the demand never pauses; but a
// loaded machine pauses the processes, and what the bucket refills while
// no one asks, and no one takes later, no limiter admits. Against ideal
// such a pause costs the store nothing, while a token it loses, or a
// request it denies that the bucket would have admitted, still counts.
//
// An admission counts only once recorded: a worker writes its record with
// one write(2) (an unbuffered *os.File; the kernel keeps what it wrote
// whatever then happens to the process) before it treats the request as
// admitted, so the protected action of an admission is never done
// unrecorded, and a kill loses from the count only answers that nothing
// acted on yet: the upper bound counts every admission acted on; the lower
// bound can lose at most one answer per worker of the killed process (16),
// besides its unspent leases.
func TestLeaseMultiProcess(t *testing.T) {
	srv := startPrivate(t)
	dir := t.TempDir()
	pfx := prefix(t)
	rdb := client(t, srv.Addr())
	ctx := context.Background()

	type child struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		out    *watcher
		exited chan struct{} // closed when cmd.Wait returned err
		err    error
	}
	children := make([]*child, mpProcs)
	for i := range children {
		w := &watcher{ready: make(chan struct{})}
		cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseMultiProcessChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), mpChildEnv+"="+strings.Join([]string{srv.Addr(), pfx, dir, strconv.Itoa(i)}, "|"))
		cmd.Stdout, cmd.Stderr = w, w
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		c := &child{cmd: cmd, stdin: stdin, out: w, exited: make(chan struct{})}
		go func() { c.err = cmd.Wait(); close(c.exited) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-c.exited })
		children[i] = c
	}
	for i, c := range children {
		select {
		case <-c.out.ready:
		case <-c.exited:
			t.Fatalf("process %d exited before it was ready: %v\n%s", i, c.err, c.out)
		case <-time.After(time.Minute):
			t.Fatalf("process %d was not ready after a minute:\n%s", i, c.out)
		}
	}
	for _, c := range children {
		_, err := io.WriteString(c.stdin, "go\n")
		require.NoError(t, err)
	}

	// Kill the last process halfway: its unspent leases are lost, and any
	// answer it had not yet recorded.
	killed := mpProcs - 1
	select {
	case <-time.After(mpKillAfter):
	case <-children[killed].exited:
		t.Fatalf("process %d exited before it was killed: %v\n%s", killed, children[killed].err, children[killed].out)
	}
	require.NoError(t, children[killed].cmd.Process.Signal(syscall.SIGKILL))
	<-children[killed].exited
	var exit *exec.ExitError
	require.ErrorAs(t, children[killed].err, &exit, "process %d", killed)
	require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal())
	killedAt, err := rdb.Time(ctx).Result()
	require.NoError(t, err)

	for i, c := range children {
		if i == killed {
			continue
		}
		select {
		case <-c.exited:
			require.NoError(t, c.err, "process %d:\n%s", i, c.out)
		case <-time.After(2 * time.Minute):
			t.Fatalf("process %d did not end:\n%s", i, c.out)
		}
	}

	// Read every process's records.
	admitted := make([]int64, mpHot+mpCold)
	offered := make([]int64, mpHot+mpCold)
	sent := make([][]int64, mpHot+mpCold) // each answered request's instant
	start := make([]int64, mpHot+mpCold)  // 0: not yet seen
	end := make([]int64, mpHot+mpCold)
	var total mpSummary
	for i := range children {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("p%d.rec", i)))
		require.NoError(t, err)
		var answers, admissions int
		for r := b; len(r) > 0; r = r[12:] {
			require.GreaterOrEqual(t, len(r), 12, "process %d: a torn record", i)
			k := int(binary.LittleEndian.Uint16(r))
			require.Less(t, k, mpHot+mpCold)
			require.Equal(t, byte(mpMark), r[3], "process %d: a bad record", i)
			require.NotEqual(t, byte(mpDegraded), r[2], "process %d: the failure rule answered with Redis up", i)
			at := int64(binary.LittleEndian.Uint64(r[4:]))
			switch r[2] {
			case mpFirst:
				if start[k] == 0 || at < start[k] {
					start[k] = at
				}
				continue
			case mpLast:
				require.Less(t, k, mpWorkers)
				if i != killed {
					for key := range end {
						if mpWorkerKeys(k, key) {
							end[key] = max(end[key], at)
						}
					}
				}
				continue
			}
			require.NotZero(t, start[k], "process %d: key %s answered before its first reading", i, mpKey(k))
			offered[k]++
			sent[k] = append(sent[k], at)
			answers++
			if r[2] == mpAdmitted {
				admitted[k]++
				admissions++
			}
		}
		if i == killed {
			t.Logf("process %d, killed: %d answers recorded, %d admissions", i, answers, admissions)
			continue
		}
		b, err = os.ReadFile(filepath.Join(dir, fmt.Sprintf("p%d.json", i)))
		require.NoError(t, err, "process %d wrote no summary", i)
		var s mpSummary
		require.NoError(t, json.Unmarshal(b, &s))
		t.Logf("process %d: %d allowed, %d denied, %d decided locally; leased %d tokens, returned %d (%d at Close), forfeited %d",
			i, s.Closed.Allowed, s.Closed.Denied, s.Closed.Local, s.Closed.LeasedTokens,
			s.Closed.ReturnedTokens, s.Closed.ReturnedTokens-s.Stats.ReturnedTokens, s.Closed.ForfeitedTokens)
		total.Closed.LeasedTokens += s.Closed.LeasedTokens
		total.Closed.ReturnedTokens += s.Closed.ReturnedTokens
		total.Closed.ForfeitedTokens += s.Closed.ForfeitedTokens
		total.Closed.Local += s.Closed.Local
	}
	require.NotZero(t, total.Closed.LeasedTokens, "no process leased a token")
	require.NotZero(t, total.Closed.Local, "no request was decided from a lease")

	// Per key: never over, and at least 95% of what could be admitted.
	bound := make([]int64, mpHot+mpCold)
	ideal := make([]int64, mpHot+mpCold)
	for k := range bound {
		require.NotZero(t, start[k], "key %s was never asked", mpKey(k))
		require.Less(t, killedAt.UnixNano(), end[k], "key %s: a survivor's worker ended before the kill", mpKey(k))
		b := new(big.Int).Add(big.NewInt(mpPolicy.Capacity), new(big.Int).Quo(
			new(big.Int).Mul(big.NewInt(mpPolicy.TokensPerSecond), big.NewInt(end[k]-start[k])), big.NewInt(int64(time.Second))))
		require.True(t, b.IsInt64())
		bound[k] = b.Int64()
		ideal[k] = mpIdeal(sent[k])
	}
	for _, class := range []struct {
		name   string
		lo, hi int
	}{{"hot", 0, mpHot}, {"cold", mpHot, mpHot + mpCold}} {
		worstOver, worstKey := int64(-1<<62), 0
		lowNum, lowDen, lowKey := int64(0), int64(0), class.lo // lowDen 0: none yet
		var sumAdmitted, sumOffered, sumIdeal int64
		minBound, maxBound := bound[class.lo], bound[class.lo]
		for k := class.lo; k < class.hi; k++ {
			a, o, b, m := admitted[k], offered[k], bound[k], ideal[k]
			minBound, maxBound = min(minBound, b), max(maxBound, b)
			sumAdmitted, sumOffered, sumIdeal = sumAdmitted+a, sumOffered+o, sumIdeal+m
			if a-b > worstOver {
				worstOver, worstKey = a-b, k
			}
			if m > 0 && (lowDen == 0 || a*lowDen < lowNum*m) { // a/m < lowNum/lowDen
				lowNum, lowDen, lowKey = a, m, k
			}
		}
		t.Logf("%s keys: bounds %d to %d; %d admitted of %d answered, ideal %d; max admitted-bound %d (%s), min admitted/ideal %d/%d = %.4f (%s, offered %d, bound %d)",
			class.name, minBound, maxBound, sumAdmitted, sumOffered, sumIdeal, worstOver, mpKey(worstKey), lowNum, lowDen, float64(lowNum)/float64(lowDen), mpKey(lowKey), offered[lowKey], bound[lowKey])
		for k := class.lo; k < class.hi; k++ {
			a, b, m := admitted[k], bound[k], ideal[k]
			require.LessOrEqual(t, a, b, "key %s: admitted %d, bound %d: over", mpKey(k), a, b)
			require.GreaterOrEqual(t, 100*a, 95*m, "key %s: admitted %d, ideal %d (offered %d, bound %d): under 95%%", mpKey(k), a, m, offered[k], b)
			if class.name == "hot" { // the workload is what the test says it is
				require.GreaterOrEqual(t, offered[k], b, "hot key %s was offered less than its bound", mpKey(k))
			} else {
				require.Less(t, offered[k], b, "cold key %s was offered its quota", mpKey(k))
			}
		}
	}
	t.Logf("survivors: leased %d tokens, returned %d, forfeited %d; %d requests decided locally",
		total.Closed.LeasedTokens, total.Closed.ReturnedTokens, total.Closed.ForfeitedTokens, total.Closed.Local)
}

// mpIdeal is how many of the requests sent at the instants at (ns, in any
// order; sorted in place) one exact bucket of mpPolicy, full at the first,
// admits, a request of one token each: exactly, in integers (the bucket
// counts ns-tokens: a token is 1e9, refilled at TokensPerSecond a ns).
func mpIdeal(at []int64) int64 {
	slices.Sort(at)
	const unit = int64(time.Second)
	full := mpPolicy.Capacity * unit
	tokens, admitted := full, int64(0)
	for i, t := range at {
		if i > 0 {
			tokens = min(full, tokens+mpPolicy.TokensPerSecond*(t-at[i-1]))
		}
		if tokens >= unit {
			tokens -= unit
			admitted++
		}
	}
	return admitted
}

// watcher collects a child's output and closes ready when it prints mpReady.
type watcher struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	ready chan struct{}
	seen  bool
}

func (w *watcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.seen && bytes.Contains(w.buf.Bytes(), []byte(mpReady)) {
		w.seen = true
		close(w.ready)
	}
	return len(p), nil
}

func (w *watcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestLeaseMultiProcessChild is one process of TestLeaseMultiProcess: it
// does nothing unless that test started it (mpChildEnv set).
func TestLeaseMultiProcessChild(t *testing.T) {
	env := os.Getenv(mpChildEnv)
	if env == "" {
		return // a helper, run only as a child process of TestLeaseMultiProcess
	}
	args := strings.Split(env, "|")
	require.Len(t, args, 4)
	addr, pfx, dir, id := args[0], args[1], args[2], args[3]
	ctx := context.Background()
	rdb := client(t, addr)
	// Timeout as newStore sets it: under the race detector on a loaded
	// machine a call can take longer than the default, and the failure rule
	// would answer it (which the test counts as a failure: Redis is up).
	s, err := redisstore.New(ctx, redisstore.Config{Client: rdb, Policy: mpPolicy, Prefix: pfx, Leases: &redisstore.Leases{}, Timeout: 5 * time.Second})
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	rec, err := os.OpenFile(filepath.Join(dir, "p"+id+".rec"), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	require.NoError(t, err)
	defer func() { _ = rec.Close() }()

	fmt.Println(mpReady)
	_, err = bufio.NewReader(os.Stdin).ReadString('\n')
	require.NoError(t, err)

	runCtx, cancel := context.WithTimeout(ctx, mpRun)
	defer cancel()
	// record writes one answer, to a request sent at at, with one write(2)
	// before its worker goes on.
	record := func(k int, at time.Time, d engine.Decision) error {
		var r [12]byte
		binary.LittleEndian.PutUint16(r[:], uint16(k))
		switch {
		case d.Degraded:
			r[2] = mpDegraded
		case d.Allowed:
			r[2] = mpAdmitted
		}
		r[3] = mpMark
		binary.LittleEndian.PutUint64(r[4:], uint64(at.UnixNano()))
		_, err := rec.Write(r[:])
		return err
	}
	// first writes key k's mpFirst record before the process's first
	// request on it: every other request on k waits for it (sync.Once).
	var firsts [mpHot + mpCold]sync.Once
	var firstErrs [mpHot + mpCold]error
	first := func(k int) error {
		firsts[k].Do(func() {
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				firstErrs[k] = err
				return
			}
			var r [12]byte
			binary.LittleEndian.PutUint16(r[:], uint16(k))
			r[2], r[3] = mpFirst, mpMark
			binary.LittleEndian.PutUint64(r[4:], uint64(now.UnixNano()))
			_, firstErrs[k] = rec.Write(r[:])
		})
		return firstErrs[k]
	}
	// last writes worker w's mpLast record, after its last request.
	last := func(w int) error {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			return err
		}
		var r [12]byte
		binary.LittleEndian.PutUint16(r[:], uint16(w))
		r[2], r[3] = mpLast, mpMark
		binary.LittleEndian.PutUint64(r[4:], uint64(now.UnixNano()))
		_, err = rec.Write(r[:])
		return err
	}
	ask := func(k int) error {
		if err := first(k); err != nil {
			return err
		}
		at := time.Now()
		d, err := s.Allow(ctx, mpKey(k), 1)
		if err != nil {
			return err
		}
		return record(k, at, d) // only now may the worker act on an admission
	}
	errs := make(chan error, mpWorkers)
	var wg sync.WaitGroup
	// work runs worker w's loop, then writes its mpLast record.
	work := func(w int, loop func() error) {
		wg.Go(func() {
			err := loop()
			if err == nil {
				err = last(w)
			}
			if err != nil {
				errs <- err
			}
		})
	}
	for w := range mpHotWorkers {
		work(w, func() error {
			for range mpHotBurst { // the burst, over the worker's keys in turn
				for k := w; k < mpHot; k += mpHotWorkers {
					if err := ask(k); err != nil {
						return err
					}
				}
			}
			tick := time.NewTicker(mpHotEvery) // paces the load: mpHotEvery per request
			defer tick.Stop()
			for i := w; ; i++ {
				select {
				case <-runCtx.Done():
					return nil
				case <-tick.C:
				}
				if err := ask(i % mpHot); err != nil {
					return err
				}
			}
		})
	}
	cold := mpWorkers - mpHotWorkers
	for c := range cold {
		work(mpHotWorkers+c, func() error {
			var mine []int
			for k := range mpHot + mpCold {
				if mpWorkerKeys(mpHotWorkers+c, k) {
					mine = append(mine, k)
				}
			}
			// A round's bursts are spread over its third of the run; a
			// late worker goes on at once, and past the run's end: every
			// cold key is asked, however slow the machine.
			tick := time.NewTicker(mpRun / mpColdRounds / time.Duration(len(mine)))
			defer tick.Stop()
			for range mpColdRounds {
				for _, k := range mine {
					<-tick.C
					for range mpColdBurst {
						if err := ask(k); err != nil {
							return err
						}
					}
				}
			}
			return nil
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	sum := mpSummary{Stats: s.Stats()}
	require.NoError(t, s.Close())
	sum.Closed = s.Stats()
	b, err := json.Marshal(sum)
	require.NoError(t, err)
	tmp := filepath.Join(dir, "p"+id+".json.tmp")
	require.NoError(t, os.WriteFile(tmp, b, 0o600))
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, "p"+id+".json")))
}
