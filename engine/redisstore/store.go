package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Defaults applied by New to zero Config fields, and fixed sizes.
const (
	// DefaultPrefix is the Redis key prefix when Config.Prefix is "".
	DefaultPrefix = "tokenshard:"
	// DefaultTimeout bounds a call whose context has no earlier deadline.
	DefaultTimeout = 250 * time.Millisecond
	// DefaultFailRetryAfter is the RetryAfter of a fail-closed denial.
	DefaultFailRetryAfter = time.Second
	// ChunkSize is about how many requests one script call decides:
	// AllowBatch sends a longer batch as several calls, pipelined in one
	// round trip. The first ChunkSize requests of a key go to the call of
	// its first; a key repeated more often sends the rest in later rounds
	// of ChunkSize, one round trip each, so that no call holds Redis long.
	ChunkSize = 256
	// HistoryVersions is how many policy versions the store retains for
	// buckets not touched since an older one. A cutover that would retain
	// more first brings every bucket up to the version in force, as does
	// one while the retained versions' overrides are many (see
	// Store.ReplacePolicy).
	HistoryVersions = 64
)

// ErrUnavailable wraps what Redis answered, or failed to, when a call that
// is not a decision (New, ReplacePolicy, EvictFull, KeyCount, Peek,
// Refund) could not complete. Decisions never return it: they get the
// fail-open or fail-closed answer instead, marked engine.Decision.Degraded
// (a Wait whose deadline comes before a fail-closed answer's RetryAfter
// returns engine.ErrWouldExceedDeadline wrapping it).
var ErrUnavailable = errors.New("redisstore: redis unavailable")

// ErrNotReady wraps ErrUnavailable in the error of a call that is not a
// decision on a store started without Redis that has not yet read the
// prefix's state (see New). Until it has, its Policy is Config.Policy,
// which need not be the prefix's: a program that compares the two (as
// envoyrls's command does) waits for a call that does not return it.
var ErrNotReady = fmt.Errorf("%w: the store has not reached Redis yet", ErrUnavailable)

// Config configures New. Client and Policy are required.
type Config struct {
	// Client is the connection to Redis: a *redis.Client (one server, or a
	// primary behind Sentinel from redis.NewFailoverClient) or a
	// *redis.ClusterClient (Redis Cluster, or redis.NewFailoverClusterClient).
	// It must be created with ContextTimeoutEnabled, so that every call ends by
	// its deadline; behind Sentinel, with a ReadTimeout and a DialTimeout well
	// under Timeout, so that a sentinel that hangs costs a call, not every call
	// (see Failures), the ReadTimeout over WaitForReplicas's timeout if it waits
	// for replicas. A *redis.Ring is refused: it shards keys by itself. The
	// store does not close it.
	Client redis.UniversalClient
	// Prefix starts every key the store writes; "" means DefaultPrefix.
	// It may hold any bytes: it need not be UTF-8, and a NUL or a glob
	// character is matched literally when the store scans its buckets. But
	// its first "{", if it has one, may not be followed at once by "}":
	// Redis Cluster would hash each key whole, so New refuses it. A "{"
	// left open ("app{") or a stray "}" is fine: the virtual shards still
	// spread evenly over a cluster's masters. A tag the prefix closes
	// ("{app}:") is Redis Cluster's hash tag for every key the store
	// writes, so one master holds the whole prefix.
	// Stores that share a prefix share their buckets and their policy; no
	// prefix may begin with another store's: the longer one's keys may
	// read as the shorter one's buckets (in its KeyCount, and its passes).
	Prefix string
	// Policy is installed if the prefix has none yet. If it has one, set by
	// another process or an earlier run, that one is in force and Policy is
	// ignored: change it with ReplacePolicy.
	Policy policy.Policy
	// MaxKeyBytes bounds len(key) in bytes; 0 means
	// engine.DefaultMaxKeyBytes (256).
	MaxKeyBytes int
	// FailOpen admits when Redis cannot answer within the call's deadline;
	// the default, fail closed, denies. Either answer is marked
	// engine.Decision.Degraded.
	FailOpen bool
	// FailRetryAfter is the RetryAfter of a fail-closed denial; 0 means
	// DefaultFailRetryAfter.
	FailRetryAfter time.Duration
	// Timeout bounds each exchange with Redis whose context has no earlier
	// deadline; 0 means DefaultTimeout. A decision is one exchange. A pass
	// over the keyspace (EvictFull, a cutover's) is many, each bounded.
	Timeout time.Duration
	// OnError, if set, is called from the calling goroutine (for a call
	// that single Allows shared, from one of theirs) with every Redis
	// failure that was answered by the fail-open or fail-closed rule (an
	// error wrapping ErrUnavailable, or ErrNotReplicated or ErrKeyTags),
	// and with failures a call could not return: the expiry pass after a
	// published cutover, releasing the cutover lock, and each failed
	// attempt by New or by a decision to read the prefix's state of a
	// store started without Redis (see New; Peek, Refund and the other
	// calls return theirs). With Leases it is also called from the store's own
	// goroutines, with a failed lease request's error and the leased
	// tokens a give-back could not return. It must not block or panic: a
	// panic on those goroutines ends the process, and on a caller's it can
	// leave tokens a lease shard waits to hear of, and Close then waits
	// for good.
	OnError func(error)
	// VirtualShards is how many virtual shards the prefix's buckets are
	// spread over, each in one hash slot of its own (see the package doc);
	// 0 means DefaultVirtualShards, and at most MaxVirtualShards. Like
	// Policy, it is stored with the prefix by the first store: a later
	// store uses the stored number whatever it sets, so every process maps a
	// key to the same shard.
	VirtualShards int
	// IgnoreKeyTags makes the store pick a key's virtual shard by the whole
	// key, "{...}" and all. By default a key holding a hash tag (its first
	// "{...}", not empty) is placed by the tag alone, so keys that share a
	// tag share a shard, and AllowAll on Redis Cluster may take them
	// together. Set it when keys hold text a client controls (an API token,
	// a header, a path): a client could otherwise write a tag into its keys
	// and choose their shard, all of them on one master. With it, keys
	// share a shard only by chance, so on Redis Cluster AllowAll over more
	// than one key mostly returns ErrCrossShard. Like VirtualShards it is
	// stored with the prefix by the first store; a store that sets it
	// otherwise than the prefix holds fails at New with ErrKeyTags.
	IgnoreKeyTags bool
	// Clock is the time the store decides at. nil (the default, and the
	// only safe production setting) decides at the Redis server's TIME,
	// read inside each script, so replicas with skewed clocks cannot mint
	// tokens. A non-nil Clock makes the store send its readings to the
	// scripts instead: for tests and harnesses that need deterministic time
	// (a clock.Manual), with one process only on the prefix, since stores
	// whose clocks disagree mint tokens. Such a store sets no expiries (they
	// would run on the server's clock), so its buckets stay until EvictFull
	// deletes them. A *clock.Monotonic is refused: its readings count from
	// its construction, so they are neither the server's time nor
	// deterministic.
	Clock clock.Clock
	// Leases, if not nil, turns leasing on: the store takes tokens of each
	// busy key's global bucket in advance and spends them in the process,
	// deciding a request its lease covers without Redis (see Leases and
	// the package doc's Leases section). nil, the default, sends every
	// decision to Redis.
	Leases *Leases
}

// Stats counts what a Store did since New, in the terms of engine.Stats
// where they apply, so that one dashboard serves the engine and the store
// (engine/promstats and engine/promstats/storestats export both alike).
//
// Every call is counted once, by what it returned: Allowed + Denied +
// Failures + Peeks + Refunds + Errors.Sum() equals the Allow, Charge, Peek
// and Refund calls that returned plus the requests of AllowBatch calls plus the
// requests of the AllowAll calls that returned a Decision. Each request of
// such an AllowAll is one decision, as on the engine: all Allowed when
// Redis admitted the call, all Denied when it refused it (nothing was
// taken from any key), all in Failures when the failure rule answered it.
// AllowAll calls are counted apart too, in AllowAll, one per call.
type Stats struct {
	// Allowed and Denied count the requests Redis decided, by outcome, and
	// with Config.Leases those a lease decided in the process too (Local);
	// a Charge Redis answered is Allowed, as on the engine.
	Allowed, Denied uint64
	// Failures counts the requests answered by the fail-open or fail-closed
	// rule (each Decision marked Degraded), also before the store first
	// reached Redis: DegradedAllowed plus DegradedDenied.
	Failures        uint64
	DegradedAllowed uint64 // of Failures, those admitted: fail open, and every Charge, which is never denied
	DegradedDenied  uint64 // of Failures, those denied (fail closed)
	Peeks, Refunds  uint64 // Peek and Refund calls answered
	// Errors counts the Allow, Charge, Peek and Refund calls and the AllowBatch
	// requests that ended with an error, by kind as engine.Errors: Other
	// for any error of no other kind, such as engine.ErrNilContext or one
	// wrapping ErrUnavailable (a Peek or Refund Redis did not answer, or a
	// reply the store could not read); Redis out of memory is KeyCapacity
	// and engine.ErrCostExceedsCapacity InvalidCost. ClockRegression stays
	// 0: Redis's TIME is the clock.
	Errors engine.Errors
	// AllowAll counts AllowAll calls, one per call: admitted, refused (by
	// Redis or by the failure rule, as the Decision says), or ended with an
	// error (by kind, as Errors; ErrCrossShard is Other). Admitted +
	// Refused + Errors.Sum() equals the calls that returned.
	AllowAll engine.AllowAllStats
	// Decisions counts the requests Redis decided, as Allowed + Denied
	// does, and also those Redis answered with an error
	// (engine.ErrCostExceedsCapacity, or a reply the store could not read).
	// With Config.Leases it counts the leases Redis decided too, and
	// Allowed + Denied the requests decided in the process (Local).
	Decisions uint64
	// Retries counts script calls sent again: for a newer policy or a
	// cutover under way, a bucket's history, a script Redis lacked, an
	// FCALL a Redis out of memory refused (sent again as EVALSHA), or, after
	// a first resend, a slot being migrated.
	Retries uint64
	// Local counts the requests a lease decided in the process, without
	// Redis (Config.Leases): they are counted in Allowed and Denied too.
	Local uint64
	// LeasedTokens counts the tokens Redis granted as leases,
	// ReturnedTokens those given back unspent, and ForfeitedTokens those
	// given up unspent: taken across cutovers that could have clamped them
	// (see the package doc's Leases section), or not returned because Redis
	// did not answer. What was leased and is neither was spent, or is held.
	// Each stops at math.MaxUint64 (a few leases of capacities near
	// math.MaxInt64 reach it) rather than wrap.
	LeasedTokens, ReturnedTokens, ForfeitedTokens uint64
}

// errKind indexes the store's error counters, in engine.Errors order.
type errKind int

const (
	kindInvalidKey errKind = iota
	kindInvalidCost
	kindClosed
	kindContext
	kindKeyCapacity
	kindOther
	numKinds
)

// kindOf returns the kind err is counted as (see Stats.Errors).
func kindOf(err error) errKind {
	switch {
	case errors.Is(err, ErrUnavailable):
		return kindOther // Redis's fault, whatever deadline it met
	case errors.Is(err, engine.ErrInvalidKey):
		return kindInvalidKey
	case errors.Is(err, engine.ErrInvalidCost), errors.Is(err, engine.ErrCostExceedsCapacity):
		return kindInvalidCost
	case errors.Is(err, engine.ErrClosed):
		return kindClosed
	case errors.Is(err, engine.ErrKeyCapacity):
		return kindKeyCapacity
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return kindContext
	}
	return kindOther
}

// errCounts counts errors by kind.
type errCounts [numKinds]atomic.Uint64

func (c *errCounts) read() engine.Errors {
	return engine.Errors{
		InvalidKey: c[kindInvalidKey].Load(), InvalidCost: c[kindInvalidCost].Load(), Closed: c[kindClosed].Load(),
		Context: c[kindContext].Load(), KeyCapacity: c[kindKeyCapacity].Load(), Other: c[kindOther].Load(),
	}
}

// tally is what one call answered, counted on the caller's side and added
// to the store's counters at once.
type tally struct {
	allowed, denied uint64
	errs            [numKinds]uint64
}

// add counts one request's answer: an error by kind, a decision by outcome.
// A Degraded answer is not counted here: failResult counted it.
func (t *tally) add(d engine.Decision, err error) {
	switch {
	case err != nil:
		t.errs[kindOf(err)]++
	case d.Degraded:
	case d.Allowed:
		t.allowed++
	default:
		t.denied++
	}
}

// count adds t to the store's counters.
func (s *Store) count(t *tally) {
	if t.allowed > 0 {
		s.allowed.Add(t.allowed)
	}
	if t.denied > 0 {
		s.denied.Add(t.denied)
	}
	for k, n := range t.errs {
		if n > 0 {
			s.errs[k].Add(n)
		}
	}
}

// countOne counts one request's answer (see tally.add).
func (s *Store) countOne(d engine.Decision, err error) {
	var t tally
	t.add(d, err)
	s.count(&t)
}

// Store is an engine.Admitter whose buckets live in Redis, so that every
// process using the same prefix shares one quota per key. It is safe for
// concurrent use. The goroutines it starts send single Allows that queued
// behind others, and each exits once none is left, at the latest when the
// last deadline among the requests it holds has passed; with Config.Leases,
// also two per GOMAXPROCS that own the leases, until Close, which must then
// be called. A zero Store or a nil *Store is not one: every call returns
// engine.ErrNotInitialized, Policy and Stats their zero values, and Close
// nil, as a zero engine.Engine's do.
type Store struct {
	rdb         redis.UniversalClient
	cluster     *redis.ClusterClient // rdb, on Redis Cluster; nil for one server
	prefix      string
	maxKeyBytes int
	failOpen    bool
	failRetry   time.Duration
	timeout     time.Duration
	lockTTL     time.Duration
	onError     func(error)
	clk         clock.Clock // Config.Clock, or nil for the server's TIME

	kPolicy, kHistory, kBlobs, kLock, kBucket string // global keys; kBucket starts every bucket's
	shards                                    []shardKeys
	shardByTag                                map[string]int
	kmap                                      atomic.Pointer[keyMap] // how keys map to shards, as the prefix stores it; nil until read (see syncKeyMap)

	cur       atomic.Pointer[state] // the policy in force, as last seen
	closed    atomic.Bool
	closing   chan struct{} // closed by Close: releases Wait
	closeOnce sync.Once

	mu   sync.Mutex              // guards past
	past map[int64]policy.Policy // decoded policies of retained versions

	decisions, retries       atomic.Uint64
	failedOpen, failedClosed atomic.Uint64 // requests answered by the failure rule, admitted or denied
	allowed, denied          atomic.Uint64 // requests Redis decided, by outcome (see Stats)
	peeks, refunds           atomic.Uint64
	errs                     errCounts // Allow, Peek, Refund and AllowBatch errors
	allAdmitted, allRefused  atomic.Uint64
	allErrs                  errCounts // AllowAll's

	// What New was given, for connect: installed if the prefix has none.
	cfgPolicy policy.Policy
	cfgShards int
	cfgTags   bool
	ready     atomic.Bool // start has read the prefix's state (set once, before any call goes to Redis)
	starting  atomic.Bool // a caller is in start: one at a time

	queues []combiner   // concurrent single Allows, merged into shared calls (see queueFor)
	hook   func(string) // tests only: run at the combiner's points (hookAlone...)
	noFunc atomic.Bool  // FUNCTION refused: the decide script goes by EVALSHA

	slotMap mapReloader // on a cluster: the reloads of the slot map asked after a lost node (nodeFailed)
	lease   *leaser     // Config.Leases's layer; nil without leases
}

// state is one policy version as the store uses it.
type state struct {
	p       policy.Policy
	verWord any // p.Version in decimal, as the script compares it, boxed once
	// args holds the decide script's capacity and rate arguments of
	// every shape in p's limit table, by index, boxed once so that a
	// request does not allocate them: a plain shape's capacity and tokens
	// per second, as it always sent them, else its capacity and its rate
	// argument (shapeArgs.arg).
	args []limitArgs
}

// limitArgs is one shape's capacity and rate arguments, boxed.
type limitArgs struct{ capacity, rate any }

func newState(p policy.Policy) *state {
	st := &state{p: p, verWord: strconv.FormatInt(p.Version, 10)}
	for _, sh := range p.Shapes() {
		st.args = append(st.args, limitArgs{capacity: sh.Primary.Capacity, rate: encodeShape(sh).arg()})
	}
	return st
}

var _ engine.Admitter = (*Store)(nil)

// New connects a Store to the prefix's policy and key map, installing
// cfg.Policy and a new key map (a random seed, cfg.IgnoreKeyTags) if the
// prefix has none; it reads the key map, the number of virtual shards and
// the policy in force before it sends Redis any request.
//
// If Redis cannot be reached (a connection refused, reset or timed out,
// no reply by the deadline, a server still loading, busy with a script,
// out of memory or refusing writes (NOREPLICAS, MISCONF), a cluster down,
// or writes too few replicas acknowledged under WaitForReplicas, as on a
// server whose replica is away), New still returns a working Store, and
// tells cfg.OnError why. Until the store has read the prefix's state,
// every decision is answered by the failure rule, marked
// engine.Decision.Degraded, and Peek, Refund, ReplacePolicy, EvictFull
// and KeyCount return an error wrapping ErrNotReady; Policy is
// cfg.Policy. Each call first tries again to read that state, one call at
// a time (the others, meanwhile, are answered at once without Redis), so
// the first call after Redis answers is decided by it, with the prefix's
// key map and policy adopted as New would have; go-redis's dialer may
// hold off new connections for up to a second after repeated refusals. An
// attempt that then meets a prefix set up otherwise (ErrKeyTags) is
// reported to OnError, and the store keeps answering by the failure rule.
//
// Errors: engine.ErrNilContext for a nil ctx, engine.ErrInvalidPolicy,
// engine.ErrInvalidConfig (no client, a client without
// ContextTimeoutEnabled, an address that is not host:port with a host
// free of blanks, commas and slashes and a port a dial can use, a cluster client with no
// address or one that sends reads to replicas (ClusterOptions.ReadOnly,
// RouteByLatency or RouteRandomly), a negative duration or bound, a
// *clock.Monotonic Clock),
// ErrKeyTags when
// cfg.IgnoreKeyTags differs from the prefix's setting, the context's error
// when ctx is canceled, or an error wrapping ErrUnavailable when Redis
// answered in a way no later attempt would change (a plain client on a
// cluster node, a prefix whose global keys are lost behind a newer policy
// than cfg.Policy).
func New(ctx context.Context, cfg Config) (*Store, error) {
	if ctx == nil {
		return nil, engine.ErrNilContext
	}
	if cfg.Policy == (policy.Policy{}) { // Validate's "version 0" would mislead
		return nil, fmt.Errorf("%w: Config.Policy is not set, and it is required", engine.ErrInvalidPolicy)
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	// A client whose TCP address is not host:port is refused: no attempt to
	// connect could reach it. A Sentinel failover client's address is a
	// placeholder (its dialer asks the sentinels), and a cluster client with
	// ClusterSlots or a Dialer of its own is trusted with its addresses (a
	// plain client's options always have a Dialer: go-redis sets its own).
	var cluster *redis.ClusterClient
	var addrs []string
	timeouts := false
	switch c := cfg.Client.(type) {
	case nil:
		return nil, fmt.Errorf("%w: redisstore: Config.Client is nil", engine.ErrInvalidConfig)
	case *redis.Client:
		if c == nil { // not a client without ContextTimeoutEnabled, which is what it would otherwise be told
			return nil, fmt.Errorf("%w: redisstore: Config.Client is a nil *redis.Client", engine.ErrInvalidConfig)
		}
		o := c.Options()
		timeouts = o.ContextTimeoutEnabled
		if o.Network == "tcp" && o.Addr != "FailoverClient" {
			addrs = []string{o.Addr}
		}
	case *redis.ClusterClient:
		if c == nil {
			return nil, fmt.Errorf("%w: redisstore: Config.Client is a nil *redis.ClusterClient", engine.ErrInvalidConfig)
		}
		o := c.Options()
		timeouts, cluster = o.ContextTimeoutEnabled, c
		if o.ReadOnly { // RouteByLatency and RouteRandomly set it too
			return nil, fmt.Errorf("%w: redisstore: the cluster client sends reads to replicas (ReadOnly, RouteByLatency or RouteRandomly): the store must read its policy and its cutover lock on the masters, and go-redis would read the servers' command table, past a call's deadline, to route each command", engine.ErrInvalidConfig)
		}
		if o.Dialer == nil && o.ClusterSlots == nil {
			if len(o.Addrs) == 0 {
				return nil, fmt.Errorf("%w: redisstore: the cluster client has no address (ClusterOptions.Addrs)", engine.ErrInvalidConfig)
			}
			addrs = o.Addrs
		}
	default:
		return nil, fmt.Errorf("%w: redisstore: Config.Client is a %T; want a *redis.Client or a *redis.ClusterClient", engine.ErrInvalidConfig, cfg.Client)
	}
	_, tag, _ := strings.Cut(cfg.Prefix, "{")
	switch {
	case !timeouts:
		return nil, fmt.Errorf("%w: redisstore: the client needs ContextTimeoutEnabled: true, or a call could outlive its deadline", engine.ErrInvalidConfig)
	case cfg.MaxKeyBytes < 0:
		return nil, fmt.Errorf("%w: redisstore: Config.MaxKeyBytes is negative (%d)", engine.ErrInvalidConfig, cfg.MaxKeyBytes)
	case cfg.FailRetryAfter < 0:
		return nil, fmt.Errorf("%w: redisstore: Config.FailRetryAfter is negative (%v)", engine.ErrInvalidConfig, cfg.FailRetryAfter)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: redisstore: Config.Timeout is negative (%v)", engine.ErrInvalidConfig, cfg.Timeout)
	case cfg.VirtualShards < 0 || cfg.VirtualShards > MaxVirtualShards:
		return nil, fmt.Errorf("%w: redisstore: VirtualShards %d is not in [0, %d]", engine.ErrInvalidConfig, cfg.VirtualShards, MaxVirtualShards)
	case strings.HasPrefix(tag, "}"): // its first "{" is followed at once by "}"
		return nil, fmt.Errorf("%w: redisstore: Config.Prefix %q closes its first \"{\" at once: Redis Cluster would hash each key whole, and a script's keys would not share a slot", engine.ErrInvalidConfig, cfg.Prefix)
	}
	for _, a := range addrs {
		if !hostPort(ctx, a) {
			return nil, fmt.Errorf("%w: redisstore: the client's address %q is not host:port with a host free of blanks, commas and slashes and a port a dial can use", engine.ErrInvalidConfig, a)
		}
	}
	if l := cfg.Leases; l != nil {
		switch {
		case l.Divisor < 0:
			return nil, fmt.Errorf("%w: redisstore: Config.Leases.Divisor is negative (%d)", engine.ErrInvalidConfig, l.Divisor)
		case l.Horizon < 0:
			return nil, fmt.Errorf("%w: redisstore: Config.Leases.Horizon is negative (%v)", engine.ErrInvalidConfig, l.Horizon)
		case l.MaxAge < 0:
			return nil, fmt.Errorf("%w: redisstore: Config.Leases.MaxAge is negative (%v)", engine.ErrInvalidConfig, l.MaxAge)
		}
	}
	if _, ok := cfg.Clock.(*clock.Monotonic); ok {
		return nil, fmt.Errorf("%w: redisstore: Config.Clock is a clock.Monotonic, whose readings count from its construction; leave it nil for the server's TIME", engine.ErrInvalidConfig)
	}
	s := &Store{
		rdb:         cfg.Client,
		cluster:     cluster,
		prefix:      cmp.Or(cfg.Prefix, DefaultPrefix),
		maxKeyBytes: cmp.Or(cfg.MaxKeyBytes, engine.DefaultMaxKeyBytes),
		failOpen:    cfg.FailOpen,
		failRetry:   cmp.Or(cfg.FailRetryAfter, DefaultFailRetryAfter),
		timeout:     cmp.Or(cfg.Timeout, DefaultTimeout),
		onError:     cfg.OnError,
		clk:         cfg.Clock,
		past:        map[int64]policy.Policy{},
		closing:     make(chan struct{}),
		cfgPolicy:   cfg.Policy,
		cfgShards:   cmp.Or(cfg.VirtualShards, DefaultVirtualShards),
		cfgTags:     cfg.IgnoreKeyTags,
	}
	s.slotMap.clk = clock.NewMonotonic()
	s.lockTTL = max(minLockTTL, 3*s.timeout)
	s.globals()
	s.cur.Store(newState(cfg.Policy))

	if err := s.connect(ctx); err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, ctx.Err()
		}
		if !unreachable(err) {
			return nil, err
		}
		// Redis cannot be reached now: the store starts without it, and
		// answers by the failure rule until a call reaches it (see up).
		s.report(err)
	}
	if cfg.Leases != nil { // leases age on Config.Clock, else on a monotonic one
		s.lease = newLeaser(s, cfg.Leases, cmp.Or(cfg.Clock, clock.Clock(clock.NewMonotonic())))
	}
	if opened != nil {
		opened(s)
	}
	return s, nil
}

// connect reads the prefix's key map, virtual shards and policy (under ctx
// bounded by Config.Timeout), installing Config's if the prefix has none,
// and then marks the store ready: no call goes to Redis with a key before
// it has. Only one caller runs it at a time (New, or up), and only before
// the store is ready: it writes the fields the calls read once ready is
// set. An attempt that fails starts afresh the
// next time. A failure that may mean a lost node has the cluster client
// reload its slot map (see nodeFailed), as a call's does: else the next
// attempts would go to a dead master for as long as go-redis keeps its
// slot map (a minute), though its replica has taken its place. Its error,
// and one it reports, is as startErr says.
func (s *Store) connect(ctx context.Context) (err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	defer func() {
		s.nodeFailed(ctx, err)
		err = startErr(err)
		if s.cluster == nil && replyIs(err, "MOVED", "ASK", "CROSSSLOT") {
			err = fmt.Errorf("%w: the server is a node of a Redis Cluster, which the store reaches only through a *redis.ClusterClient", err)
		}
		if s.cluster != nil && replyIs(err, "This instance has cluster support disabled") {
			err = fmt.Errorf("%w: the server is not a node of a Redis Cluster; reach it through a *redis.Client", err)
		}
	}()
	s.shards, s.shardByTag, s.queues = nil, nil, nil
	s.kmap.Store(nil)
	seed, tags := newSeed(), tagsArg(s.cfgTags)
	// The global keys lost while shards survive (on a cluster, their
	// master lost its data): never reinstall them below a shard's version,
	// nor with another key map than the shards' buckets were placed by.
	// Sent once on one server: go-redis's own retries, with their backoff,
	// would hold every call of a store started without Redis for about 100
	// ms, and the next call tries again anyway. (A cluster's pipeline
	// retries a node it cannot reach all the same: see the package doc.)
	probe := redis.NewCmd(ctx, "hexists", s.kPolicy, "v") // a hash that lost only its version is lost too
	_ = direct{s}.Process(ctx, noRetryCmd{probe})
	n, err := probe.Int64()
	if err != nil {
		return fmt.Errorf("%w: reading the policy: %w", ErrUnavailable, err)
	}
	pol, kept := s.cfgPolicy, [2]string{seed, tags}
	if n == 0 {
		s.layout(s.cfgShards)
		// An earlier attempt may have read a newer version than Config's
		// before it failed: the newest known is the floor.
		pol, kept, err = s.survivors(ctx, pol, kept)
		s.shards, s.shardByTag = nil, nil
		if err != nil {
			return err
		}
	}
	installed, stored, err := s.install(ctx, pol, s.cfgShards, kept)
	if err != nil {
		return err
	}
	s.layout(stored)
	s.queues = make([]combiner, len(s.shards))
	// A policy another process installed is read even if its version is
	// Config.Policy's: the two may differ. Loading also finishes a cutover
	// an earlier process left half done.
	if err := s.load(ctx, !installed, true); err != nil {
		return err
	}
	if err := s.ensureShards(ctx, s.allShards()); err != nil {
		if s.cluster == nil || !unreachable(err) && !replyIs(err, "MOVED", "ASK") {
			return err
		}
		// A master away (the prefix's global keys, read above, are on
		// another; or a MOVED go-redis gave up following: Redis 8.0, as
		// from 7.2, lists no slots for a failed master in CLUSTER SHARDS,
		// redis/redis#13414, so go-redis's slot map places them nowhere):
		// its shards are set up by the first call that meets one
		// with no version or key map once it is back (status "nopolicy",
		// see mend), as after a master lost its data, and the other
		// masters' keys are decided meanwhile, as by a store that was
		// running when the master went away.
		s.report(startErr(err))
	}
	s.ready.Store(true)
	return nil
}

// startErr is err, from an attempt to read the prefix's state, as OnError
// and New's caller are told it: wrapping ErrUnavailable, saying where if a
// step returned a deadline bare (taking connect's bounded context for the
// caller's), unless it already does or is ErrKeyTags or ErrNotReplicated.
func startErr(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrKeyTags) || errors.Is(err, ErrNotReplicated) {
		return err
	}
	return fmt.Errorf("%w: reading the prefix's state: %w", ErrUnavailable, err)
}

// up reports whether the store has read the prefix's state (see connect),
// making one attempt under ctx (bounded by Config.Timeout) if it has not
// and no other caller is making one; err is that attempt's error. A caller
// that finds another attempt under way does not wait for it: it reports
// false with a nil error. So a store started without Redis tries again at
// every call, one at a time, and the first call after Redis answers (or
// after go-redis's own dialer lets it through, within about a second) is
// decided by Redis.
func (s *Store) up(ctx context.Context) (bool, error) {
	if s.ready.Load() {
		return true, nil
	}
	if !s.starting.CompareAndSwap(false, true) {
		return false, nil
	}
	defer s.starting.Store(false)
	if s.ready.Load() { // another caller's attempt ended meanwhile
		return true, nil
	}
	err := s.connect(ctx)
	return err == nil, err
}

// need is up for a call that is not a decision: nil once the store is
// ready, else an error wrapping ErrNotReady.
func (s *Store) need(ctx context.Context) error {
	switch ok, err := s.up(ctx); {
	case ok:
		return nil
	case err != nil:
		return notReady{err}
	}
	return ErrNotReady
}

// notReady is need's error after a failed attempt to reach Redis: it
// wraps ErrNotReady and the attempt's error, and says "redis unavailable"
// once where the attempt's error says it too.
type notReady struct{ err error }

func (e notReady) Error() string {
	return ErrNotReady.Error() + ": " + strings.TrimPrefix(e.err.Error(), ErrUnavailable.Error()+": ")
}

func (e notReady) Unwrap() []error { return []error{ErrNotReady, e.err} }

// hostPort reports whether addr is host:port with a host that may name
// one and a port a dial can use: 1 to 65535, or a service name the system
// knows. A host may name one unless it holds a blank, control character,
// comma or slash, which only an address written wrong has (a list of
// addresses in one, a stray blank, a URL's path) and no later attempt to
// connect would reach. Anything else may be a name the client's Dialer
// resolves.
func hostPort(ctx context.Context, addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" || strings.ContainsFunc(host, func(r rune) bool {
		return r == ',' || r == '/' || unicode.IsSpace(r) || unicode.IsControl(r)
	}) {
		return false
	}
	n, err := net.DefaultResolver.LookupPort(ctx, "tcp", port)
	return err == nil && n > 0
}

// unreachable reports whether err, from New's first attempt to reach
// Redis, means that Redis cannot serve the store now (a connection
// refused, reset or timed out, a deadline passed with no reply, a server
// loading its data, busy with a script, out of memory or refusing writes
// (too few replicas for min-replicas-to-write, a failed snapshot), a
// cluster not serving, writes too few replicas acknowledged under
// WaitForReplicas), rather than that it answered in a way a later attempt
// would answer too (a reply of the wrong kind of server, a prefix set up
// otherwise, a WAIT the server or an ACL refuses).
func unreachable(err error) bool {
	if nodeLost(err) || replyIs(err, "LOADING", "MASTERDOWN", "TRYAGAIN", "BUSY", "OOM", "NOREPLICAS", "MISCONF") {
		return true
	}
	if _, reply := errors.AsType[redis.Error](err); reply {
		return false
	}
	return errors.Is(err, ErrNotReplicated) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout)
}

// opened, if set, is called with every store New returns: the tests use it
// to find a prefix's key map.
var opened func(*Store)

// uninitialized reports whether s is a zero Store or nil, not one New made.
func (s *Store) uninitialized() bool { return s == nil || s.rdb == nil }

// deadline is when a call under ctx must end: ctx's deadline, or the
// store's Timeout from now if that is sooner.
func (s *Store) deadline(ctx context.Context) time.Time {
	dl := clock.In(s.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		return d
	}
	return dl
}

// nowArg is the instant a script decides at: "" for the server's TIME, else
// Config.Clock's reading.
func (s *Store) nowArg() string {
	if s.clk != nil {
		return strconv.FormatInt(s.clk.Now(), 10)
	}
	return ""
}

// install stores p as the prefix's first policy unless it has one, with
// shards virtual shards and the key map of seed and tags (as stored: see
// keyMap), and reports whether it did, the number of virtual shards in
// force and the key map in force (seed and tags), which one script call
// sets if the prefix has none, so that every store adopts the first one's.
// Once the store has its virtual shards (New), another number in force is
// an error.
func (s *Store) install(ctx context.Context, p policy.Policy, shards int, kept [2]string) (installed bool, n int, err error) {
	a := encodeShape(p.Shape())
	cmd := one(ctx, s, func(c redis.Cmdable) *redis.Cmd {
		return c.Eval(ctx, installSrc, []string{s.kPolicy, s.kHistory, s.kBlobs},
			p.Version, p.Capacity, a.rate, overridden(p), encodePolicy(p), s.nowArg(), a.bands, shards, kept[0], kept[1])
	})
	if shortOfReplicas(cmd.Err()) {
		s.report(cmd.Err()) // it ran, on a master short of replicas (see ensureShards)
		cmd.SetErr(nil)
	}
	res, err := cmd.StringSlice()
	if err == nil && len(res) != 4 {
		err = fmt.Errorf("reply %v", res)
	}
	if err != nil {
		return false, 0, fmt.Errorf("%w: installing the policy: %w", ErrUnavailable, err)
	}
	n, err = strconv.Atoi(res[1])
	switch {
	case err != nil || n < 1 || n > MaxVirtualShards:
		err = fmt.Errorf("%w: the stored number of virtual shards %q", ErrUnavailable, res[1])
	case s.shards != nil && n != len(s.shards):
		err = fmt.Errorf("%w: the prefix was reinstalled with %d virtual shards, not %d", ErrUnavailable, n, len(s.shards))
	default:
		err = s.adopt([2]string{res[2], res[3]}) // the map in force: this one, or the first store's
	}
	return res[0] == "ok", n, err
}

// adopt makes the key map kept (seed and tags, as stored) this store's,
// unless it already is: at New, and when a call finds the prefix set up
// with another (see syncKeyMap). A map whose tags setting is not
// Config.IgnoreKeyTags's is ErrKeyTags.
func (s *Store) adopt(kept [2]string) error {
	if kept[1] != tagsArg(s.cfgTags) {
		return fmt.Errorf("%w: Config.IgnoreKeyTags is %v", ErrKeyTags, s.cfgTags)
	}
	if m := s.kmap.Load(); m != nil && m.seed == kept[0] {
		return nil
	}
	m, err := parseKeyMap(kept[0], kept[1])
	if err == nil {
		s.kmap.Store(&m)
	}
	return err
}

// syncKeyMap adopts the key map stored with the prefix if it is not this
// store's: after Redis lost the prefix's state, a store started since may
// have set the prefix up anew, with a seed of its own, before this one
// reinstalled it. Calls under the old map meet the decide script's check
// (status "keymap") and are sent again under the new one, so that a key
// keeps one bucket. A prefix set up anew with another number of virtual
// shards cannot be adopted by a running store: that is an error.
func (s *Store) syncKeyMap(ctx context.Context) error {
	vals, err := one(ctx, s, func(c redis.Cmdable) *redis.SliceCmd { return c.HMGet(ctx, s.kPolicy, "shards", "seed", "tags") }).Result()
	if err != nil {
		return fmt.Errorf("%w: reading the key map: %w", ErrUnavailable, err)
	}
	n, _ := vals[0].(string)
	seed, _ := vals[1].(string)
	tags, _ := vals[2].(string)
	switch {
	case seed == "": // lost again: the next call reinstalls it
		return nil
	case n != strconv.Itoa(len(s.shards)):
		return fmt.Errorf("%w: the prefix was set up anew with %s virtual shards, not this store's %d: restart the process", ErrUnavailable, n, len(s.shards))
	}
	return s.adopt([2]string{seed, tags})
}

// tail is the part of p's history entry after the cutover instant: the
// default shape's cap and rate, overridden, and its bands if any.
func tail(p policy.Policy) string {
	a := encodeShape(p.Shape())
	t := strconv.FormatInt(p.Capacity, 10) + " " + a.rate + " " + overridden(p)
	if a.bands != "" {
		t += " " + a.bands
	}
	return t
}

// ensureShards installs those of the virtual shards named by which that
// have no version yet at the policy in force as this store last saw it, and
// writes the prefix's key map into each one's copy: at New (every shard),
// and when a shard answers that it has none (its master lost its data). It
// is one script per shard, pipelined.
func (s *Store) ensureShards(ctx context.Context, which []int) error {
	p, m := s.cur.Load().p, s.kmap.Load()
	cmds, err := s.eachShard(ctx, which, shardInstallSrc, func(k shardKeys) []string { return []string{k.policy, k.history} },
		p.Version, tail(p), s.nowArg(), m.seed, m.tags)
	// Every command that failed ran, on a master short of the replicas
	// WaitForReplicas asks: the writes of an idempotent setup are there, and
	// only that master's keys' decisions are the failure rule's, each saying
	// so, as WaitForReplicas documents; taken for a failure, one master short
	// of replicas would leave a store starting then with every key answered
	// by the failure rule.
	if shortOfReplicas(err) && !slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return c.Err() != nil && !shortOfReplicas(c.Err()) }) {
		s.report(err)
		return nil
	}
	return err
}

// shortOfReplicas reports whether err is a script call's that ran but
// whose WAIT fewer replicas acknowledged than asked, or that did not come
// back, rather than one the server refused (an ACL without WAIT): a reply
// every later attempt would get too.
func shortOfReplicas(err error) bool {
	var reply redis.Error
	return errors.Is(err, ErrNotReplicated) && !errors.As(err, &reply)
}

// eachShard runs the script src once on each shard in which, with the keys
// keys gives and args, pipelined (go-redis sends each node its own part).
// The scripts are idempotent, so go-redis may retry them. It returns the
// commands, answered, or the first failure: the context's, or a shard's
// (wrapping ErrUnavailable).
func (s *Store) eachShard(ctx context.Context, which []int, src string, keys func(shardKeys) []string, args ...any) ([]*redis.Cmd, error) {
	cmds, err := inPipeline(ctx, s, len(which), func(pipe redis.Pipeliner, j int) *redis.Cmd {
		return pipe.Eval(ctx, src, keys(s.shards[which[j]]), args...)
	})
	if err != nil && ctx.Err() != nil {
		return cmds, ctx.Err()
	}
	for j, c := range cmds {
		if err := c.Err(); err != nil {
			return cmds, fmt.Errorf("%w: a script on virtual shard %d: %w", ErrUnavailable, which[j], err)
		}
	}
	return cmds, nil
}

// reload reads the policy in force from Redis; if the prefix has none (a
// Redis that restarted empty), it installs the newest one this store knows.
func (s *Store) reload(ctx context.Context) error { return s.load(ctx, false, false) }

// load is reload; with all, it also reads a policy of the version this
// store already has. It finishes a cutover recorded and not yet
// committed; with published, also one committed whose shards are not all
// published (New). A call's reload leaves that to the call that meets an
// unpublished shard: the version in force is the committed one whatever
// the others, and publishing to a master that is away would cost a call on
// a healthy shard its deadline.
func (s *Store) load(ctx context.Context, all, published bool) error {
	settled := false
	for range 3 {
		v, next, err := s.policyRecord(ctx)
		if err != nil {
			return err
		}
		if v == "" {
			m := s.kmap.Load()
			p, kept, err := s.survivors(ctx, s.cur.Load().p, [2]string{m.seed, m.tags})
			if err == nil {
				_, _, err = s.install(ctx, p, len(s.shards), kept)
			}
			if err != nil {
				return err
			}
			continue
		}
		if next != "" && !settled && (published || !strings.HasPrefix(next, v+" ")) {
			// A cutover recorded and not yet ended: finish it, or publish
			// the shards it has not reached if it is committed. A
			// committed cutover is in force whatever its shards: a shard
			// away now is published when it is back.
			settled = true
			if committed, err := s.settle(ctx, ""); err != nil && !committed {
				return err
			}
			continue
		}
		version, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("%w: the stored policy version %q: %w", ErrUnavailable, v, err)
		}
		if version == s.cur.Load().p.Version && !all {
			return nil
		}
		p, err := s.policyAt(ctx, version)
		if err != nil {
			return err
		}
		// Redis is the authority: a version older than the cached one is
		// adopted too (a Redis that restarted empty and got an older policy
		// reinstalled), and a reload racing another can only cost a call one
		// more round trip, since the script refuses any version but the one
		// in force.
		s.cur.Store(newState(p))
		return nil
	}
	return fmt.Errorf("%w: the policy disappeared while it was read", ErrUnavailable)
}

// survivors is the policy and key map to reinstall the prefix's global
// keys with once they are lost. The policy is the newest of p, the one
// this store is at and, if a virtual shard that survived (on a cluster, on
// another master) holds a version newer than this store's, that one,
// whose policy this store must know: else it fails, and no store
// reinstalls the keys until one that knows it does (a global older than a
// shard would make every call on that shard answer "stale" for good). The
// key map is the one (seed and tags) the first surviving shard holds a
// copy of, else m: the map the shards' buckets were placed by, which New
// reinstalls rather than draw a seed of its own.
func (s *Store) survivors(ctx context.Context, p policy.Policy, m [2]string) (policy.Policy, [2]string, error) {
	q := s.cur.Load().p
	var kept [2]string
	cmds, _ := inPipeline(ctx, s, len(s.shards), func(pipe redis.Pipeliner, i int) *redis.SliceCmd { // each command holds its error
		return pipe.HMGet(ctx, s.shards[i].policy, "v", "seed", "tags")
	})
	newest, at := q.Version, -1
	for i, c := range cmds {
		vals, err := c.Result()
		if err != nil {
			return p, m, fmt.Errorf("%w: reading virtual shard %d's version: %w", ErrUnavailable, i, err)
		}
		seed, _ := vals[1].(string)
		tags, _ := vals[2].(string)
		if kept[0] == "" && seed != "" && tags != "" {
			kept = [2]string{seed, tags}
		}
		// a shard with no version, or a prepared one ("p" and the next),
		// counts for none: the latter holds an older version still, and the
		// cutover it waits for is not known to have committed
		v, _ := vals[0].(string)
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > newest {
			newest, at = n, i
		}
	}
	if kept[0] == "" {
		kept = m
	}
	if at >= 0 {
		s.mu.Lock()
		known, ok := s.past[newest]
		s.mu.Unlock()
		if !ok {
			return p, kept, fmt.Errorf("%w: the prefix's global keys are lost and virtual shard %d holds policy version %d, newer than this store's %d: only a store that knows version %d can reinstall them", ErrUnavailable, at, newest, q.Version, newest)
		}
		q = known
	}
	if q.Version > p.Version {
		p = q
	}
	return p, kept, nil
}

// policyAt returns the retained policy of a version, decoded once; a
// record that holds another version is an error.
func (s *Store) policyAt(ctx context.Context, version int64) (policy.Policy, error) {
	s.mu.Lock()
	p, ok := s.past[version]
	s.mu.Unlock()
	if ok {
		return p, nil
	}
	blob, err := one(ctx, s, func(c redis.Cmdable) *redis.StringCmd { return c.HGet(ctx, s.kBlobs, strconv.FormatInt(version, 10)) }).Result()
	if err != nil {
		return policy.Policy{}, fmt.Errorf("%w: reading policy version %d: %w", ErrUnavailable, version, err)
	}
	p, err = decodePolicy(blob)
	switch {
	case err != nil:
		return policy.Policy{}, fmt.Errorf("%w: stored policy version %d: %w", ErrUnavailable, version, err)
	case p.Version != version:
		return policy.Policy{}, fmt.Errorf("%w: stored policy version %d holds version %d", ErrUnavailable, version, p.Version)
	}
	s.remember(p)
	return p, nil
}

// remember keeps p, decoded, for policyAt.
func (s *Store) remember(p policy.Policy) {
	s.mu.Lock()
	if len(s.past) >= 2*HistoryVersions {
		clear(s.past) // versions come and go; a later miss only costs a read
	}
	s.past[p.Version] = p
	s.mu.Unlock()
}

// Policy returns the policy in force as this store last saw it: a cutover
// made by another process shows from this store's next script call to
// Redis on (with Leases, a request its lease decides makes none; nor does
// KeyCount, a scan of keys). Until the
// store has first read the prefix's policy from Redis (see New) it is
// Config.Policy; a first connection that read it and then failed leaves
// the version it read, which the next one keeps as its floor.
func (s *Store) Policy() policy.Policy {
	if s.uninitialized() {
		return policy.Policy{}
	}
	return s.cur.Load().p
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	if s.uninitialized() {
		return Stats{}
	}
	st := Stats{
		Allowed: s.allowed.Load(), Denied: s.denied.Load(),
		DegradedAllowed: s.failedOpen.Load(), DegradedDenied: s.failedClosed.Load(),
		Peeks: s.peeks.Load(), Refunds: s.refunds.Load(), Errors: s.errs.read(),
		AllowAll:  engine.AllowAllStats{Admitted: s.allAdmitted.Load(), Refused: s.allRefused.Load(), Errors: s.allErrs.read()},
		Decisions: s.decisions.Load(), Retries: s.retries.Load(),
	}
	st.Failures = st.DegradedAllowed + st.DegradedDenied
	if l := s.lease; l != nil {
		for _, q := range l.shards {
			a, d := q.allowed.Load(), q.denied.Load()
			st.Allowed, st.Denied, st.Local = st.Allowed+a, st.Denied+d, st.Local+a+d
		}
		st.LeasedTokens, st.ReturnedTokens, st.ForfeitedTokens = l.granted.load(), l.returned.load(), l.forfeited.load()
	}
	return st
}

// Close makes every later call return engine.ErrClosed but KeyCount, Policy
// and Stats, which keep answering, as the engine's do; calls already in
// flight finish, but a Wait returns ErrClosed. With Config.Leases it first
// gives every lease back, each give-back bounded by Config.Timeout (tokens
// Redis has not taken back by then are given up, and OnError told), so call
// it before closing the client. It does not close the Redis client, and
// always returns nil.
func (s *Store) Close() error {
	if s.uninitialized() {
		return nil
	}
	if s.lease != nil {
		s.lease.close()
	}
	s.closed.Store(true)
	s.closeOnce.Do(func() { close(s.closing) })
	return nil
}

// KeyCount counts the buckets under the prefix with SCAN, so it costs a
// pass over the keyspace and is approximate while buckets are created or
// expire meanwhile. The store does not bound the number of keys: Redis's
// maxmemory does, and a decision that Redis refuses for lack of memory
// returns engine.ErrKeyCapacity. A nil ctx is engine.ErrNilContext.
func (s *Store) KeyCount(ctx context.Context) (int, error) {
	if s.uninitialized() {
		return 0, engine.ErrNotInitialized
	}
	if ctx == nil {
		return 0, engine.ErrNilContext
	}
	if err := s.need(ctx); err != nil {
		return 0, err
	}
	n := 0
	err := s.scan(ctx, func(keys []string) error { n += len(keys); return nil })
	return n, err
}

// masters returns a client for each server that holds keys: the one
// server, or every master of the cluster as it stands now.
func (s *Store) masters(ctx context.Context) ([]redis.UniversalClient, error) {
	if s.cluster == nil {
		return []redis.UniversalClient{s.rdb}, nil
	}
	var mu sync.Mutex
	var out []redis.UniversalClient
	err := s.round(ctx, func(ctx context.Context) error {
		return s.cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
			mu.Lock()
			out = append(out, c)
			mu.Unlock()
			return nil
		})
	})
	return out, err
}

// scan calls f with every page of bucket keys SCAN returns, empty ones
// included, on every master in turn.
func (s *Store) scan(ctx context.Context, f func(keys []string) error) error {
	ms, err := s.masters(ctx)
	if err != nil {
		return err
	}
	match := globEscape(s.prefix) + "{*}k:*"
	for _, m := range ms {
		for cursor := uint64(0); ; {
			bctx, cancel := context.WithTimeout(ctx, s.timeout)
			keys, next, err := m.Scan(bctx, cursor, match, 512).Result()
			cancel()
			if err != nil {
				if err := ended(ctx); err != nil {
					return err
				}
				return fmt.Errorf("%w: scanning: %w", ErrUnavailable, err)
			}
			buckets := slices.DeleteFunc(keys, func(k string) bool {
				_, ok := s.bucketKeyOf(k)
				return !ok
			})
			if err := f(buckets); err != nil { // also for an empty page: passes renew their lock per page
				return err
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return nil
}

// globEscape makes s match itself in a SCAN MATCH pattern: a backslash
// before each of Redis's glob metacharacters, every other byte as it is. It
// works on bytes, not runes: a prefix need not be UTF-8, and ranging over
// runes would turn each invalid byte into U+FFFD and match nothing. A
// strings.Replacer whose old strings are single bytes replaces byte by byte.
func globEscape(s string) string { return globEscaper.Replace(s) }

var globEscaper = strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`, `\`, `\\`)

func overridden(p policy.Policy) string { return flag(p.Overrides.Len() > 0) }
