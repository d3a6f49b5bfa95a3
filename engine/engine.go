package engine

import (
	crand "crypto/rand"
	"encoding/binary"
	"math/bits"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
	"github.com/tokenshard/tokenshard/shard"
)

// Engine is a keyed token-bucket admission engine. Keys are spread over
// shard goroutines by a hash seeded at random per engine; each shard alone
// owns its buckets, so no lock guards them. Engine is safe for concurrent use
// and must not be copied. Create it with New and release it with Close.
//
// The zero Engine, and a nil *Engine, serve nothing but never panic or
// block: every method returns ErrNotInitialized at once, except KeyCount
// and MaxKeys, Policy, Stats, ReclaimAfter and Close, which return 0, the
// zero Policy, the zero Stats, no estimate (0, false) and nil.
type Engine struct {
	maxKeys     int // Config.MaxKeys with its default
	maxKeyBytes int
	clk         clock.Clock  // for the wall time of snapshots only; shards read their own
	waitYields  int          // msg.WaitYields at GOMAXPROCS when the engine was built
	hasher      shard.Hasher // seeded at random per engine; routes keys and indexes shard tables
	mailboxes   []*shard.Mailbox
	shards      []*shard.Shard  // for their published counters only
	allDecided  []allDecided    // by shard: the decisions AllowAll calls made there
	cutovers    []atomic.Uint64 // by shard: the cutovers published to it, counted by the coordinator
	budget      *shard.Budget
	// AllowAll's counts (see Stats.AllowAll).
	allAdmitted, allRefused atomic.Uint64
	allErrs                 callerErrors

	pol atomic.Pointer[policy.Policy] // the policy in force; written by the coordinator

	// admin is the coordinator: a one-slot semaphore held by ReplacePolicy,
	// EvictFull and background sweeps, so they never overlap.
	admin chan struct{}
	// files is held by SnapshotFile from before its snapshot until its
	// rename, so the file it leaves is never older than one an earlier
	// call left.
	files chan struct{}
	// snapshotFileHook, if set (by tests only, before any SnapshotFile), is
	// called by SnapshotFile with "wait" before it waits for an earlier
	// call to end and with "rename" before it renames its file over path.
	snapshotFileHook func(stage string)
	// pressureHook, if set (by tests only, before the first pressure
	// sweep), is called by each pressure sweep once it has decided when
	// the next may start, before it records that time.
	pressureHook func()

	closed    atomic.Bool
	closing   chan struct{} // closed when Close starts
	stop      chan struct{} // closed once no sender can reach a mailbox
	closeOnce sync.Once
	wg        sync.WaitGroup // every goroutine the engine started
	// shardsRunning counts the shard goroutines; shardsGone is closed once
	// they have all exited, so the event deliverer knows none will follow.
	shardsRunning sync.WaitGroup
	shardsGone    chan struct{}

	callerErrs     callerErrors
	sweepFailures  atomic.Uint64
	pressureSweeps atomic.Uint64
	reclaim        reclaimer      // background sweeps; set by build
	events         chan msg.Event // sampled decisions on their way to Config.Events

	allows   sync.Pool // *msg.Single with its reply channel
	batches  sync.Pool // *batchCall
	allCalls sync.Pool // *allCall
}

// New validates cfg, fills its defaults and starts the engine's goroutines:
// one per shard, a sweeper unless cfg asks for none (see
// Config.SweepEvery), and one that delivers events if Config.Events is set.
// It returns ErrInvalidPolicy (wrapped, naming the field) for an invalid
// policy and ErrInvalidConfig (wrapped, naming the field) for a field out
// of its range. New allocates in proportion to the shard count and to
// EventBuffer (see Config.EventBuffer), not to MaxKeys.
func New(cfg Config) (*Engine, error) { return newEngine(cfg, false) }

// newEngine is New; a bare engine's shards answer every single request with
// a zero Decision, reading no clock and touching no bucket, so benchmarks
// can measure the transport alone.
func newEngine(cfg Config, bare bool) (*Engine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	e, shards := build(cfg)
	if bare {
		for _, s := range shards {
			s.Bare()
		}
	}
	e.start(cfg, shards)
	return e, nil
}

// build makes an engine and its shards, starting nothing: until start, the
// caller may fill the shards' states. cfg has its defaults.
func build(cfg Config) (*Engine, []*shard.Shard) {
	e := &Engine{
		maxKeys:     cfg.MaxKeys,
		maxKeyBytes: cfg.MaxKeyBytes,
		clk:         cfg.Clock,
		mailboxes:   make([]*shard.Mailbox, cfg.Shards),
		budget:      shard.NewBudget(int64(cfg.MaxKeys)),
		admin:       make(chan struct{}, 1),
		files:       make(chan struct{}, 1),
		closing:     make(chan struct{}),
		stop:        make(chan struct{}),
		shardsGone:  make(chan struct{}),
	}
	// A random seed per engine: without it anyone who reads this code could
	// pick keys that all land on one shard.
	var seed [8]byte
	_, _ = crand.Read(seed[:]) // never fails on supported platforms
	e.hasher = shard.NewHasher(binary.LittleEndian.Uint64(seed[:]))
	e.waitYields = msg.WaitYields(runtime.GOMAXPROCS(0))
	e.reclaim.configure(cfg)
	p := cfg.Policy
	e.pol.Store(&p)
	e.allows.New = func() any { return &msg.Single{Done: make(chan struct{}, 1)} }
	e.batches.New = func() any { return newBatchCall(len(e.mailboxes)) }

	if cfg.Events != nil {
		e.events = make(chan msg.Event, cfg.EventBuffer)
	}
	shards := make([]*shard.Shard, cfg.Shards)
	lim := shard.NewLimits(p) // one table for every shard: it grows with the policy's limits
	for i := range shards {
		e.mailboxes[i] = shard.NewMailbox(mailboxSize, e.closing)
		shards[i] = shard.New(lim, cfg.Clock, e.budget, e.mailboxes[i], &e.hasher)
		if e.events != nil {
			shards[i].Sample(i, e.events, uint64(cfg.EventEvery))
		}
		if e.reclaim.alarm != nil {
			shards[i].Alarm(e.reclaim.alarm)
		}
	}
	e.shards = shards
	e.allDecided = make([]allDecided, len(shards))
	e.cutovers = make([]atomic.Uint64, len(shards))
	return e, shards
}

// start starts the shards' goroutines and the sweeper.
func (e *Engine) start(cfg Config, shards []*shard.Shard) {
	e.wg.Add(len(shards))
	e.shardsRunning.Add(len(shards))
	for _, s := range shards {
		go func() {
			defer e.wg.Done()
			defer e.shardsRunning.Done()
			s.Run(e.stop)
		}()
	}
	if e.reclaim.every > 0 {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.sweeper()
		}()
	}
	if e.events != nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.deliver(cfg.Events)
		}()
	}
}

// deliver hands sampled decisions to f, one at a time, until every shard has
// exited, then what is still buffered: nothing sampled is lost to Close.
func (e *Engine) deliver(f func(Event)) {
	call := func(ev msg.Event) {
		out := Event{Key: ev.Key, Cost: ev.Cost, Err: ev.Err, Shard: ev.Shard, Reading: ev.Reading}
		out.Decision.set(&ev.Decision)
		f(out)
	}
	for {
		select {
		case ev := <-e.events:
			call(ev)
		case <-e.shardsGone:
			for {
				select {
				case ev := <-e.events:
					call(ev)
				default:
					return
				}
			}
		}
	}
}

// KeyCount returns the number of tracked keys. It never blocks, never
// exceeds MaxKeys, and counts every creation and eviction whose call has
// returned. It keeps answering after Close. A zero Engine's is 0.
func (e *Engine) KeyCount() int {
	if e.uninitialized() {
		return 0
	}
	return int(e.budget.Count())
}

// MaxKeys returns the bound on tracked keys: Config.MaxKeys, or
// DefaultMaxKeys if it was 0. KeyCount never exceeds it. A zero Engine's
// is 0.
func (e *Engine) MaxKeys() int {
	if e.uninitialized() {
		return 0
	}
	return e.maxKeys
}

// Policy returns the policy in force: the one every call that starts now
// will be decided under. It keeps answering after Close. A zero Engine's
// is the zero Policy.
func (e *Engine) Policy() policy.Policy {
	if e.uninitialized() {
		return policy.Policy{}
	}
	return *e.pol.Load()
}

// Close stops the engine. Requests a shard has already taken get their
// answers; all others, and every later call, get ErrClosed. Every Close,
// concurrent or later, returns nil only after every goroutine the engine
// started has exited. Closing a zero Engine does nothing and returns nil.
func (e *Engine) Close() error {
	if e.uninitialized() {
		return nil
	}
	e.closeOnce.Do(func() {
		e.closed.Store(true)
		close(e.closing) // releases callers blocked on a full mailbox or the coordinator
		for _, mb := range e.mailboxes {
			mb.Close() // after this no request can enter a mailbox
		}
		close(e.stop) // shards answer ErrClosed to what is queued, then exit
		e.shardsRunning.Wait()
		close(e.shardsGone) // no more events: deliver what is buffered and exit
		e.wg.Wait()
	})
	return nil
}

// shardOf returns the index of the shard that owns key, and the key's hash,
// which the shard indexes its table with: the seeded hash mapped onto [0, n)
// by a multiply-shift, which needs no power of two.
func (e *Engine) shardOf(key string) (int, uint64) {
	h := e.hasher.Sum(key)
	hi, _ := bits.Mul64(h, uint64(len(e.mailboxes)))
	return int(hi), h
}

// uninitialized reports whether e is nil or the zero Engine (see Engine):
// every engine New or Restore makes has at least one mailbox, and a
// mailbox slice is never written after build, so one length test suffices.
func (e *Engine) uninitialized() bool { return e == nil || len(e.mailboxes) == 0 }

// checkKey reports ErrInvalidKey for a blank key or one over MaxKeyBytes.
func (e *Engine) checkKey(key string) error {
	if len(key) > e.maxKeyBytes || isBlank(key) {
		return ErrInvalidKey
	}
	return nil
}

// isBlank is strings.TrimSpace(key) == "" with a fast exit for the common
// key that starts with a printable ASCII byte.
func isBlank(key string) bool {
	if key != "" && key[0] > ' ' && key[0] < 0x7f {
		return false
	}
	return strings.TrimSpace(key) == ""
}
