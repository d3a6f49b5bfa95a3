package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Server errors. NewServer and Reload wrap them with the facts; a request's
// error reaches the client as a gRPC status whose message is the error's
// text.
var (
	// ErrNilAdmitter: NewServer was given a nil admitter.
	ErrNilAdmitter = errors.New("envoyrls: nil admitter")
	// ErrNoPeek: the admitter has no Peek method (see Peeker).
	ErrNoPeek = errors.New("envoyrls: the admitter has no Peek method")
	// ErrPolicyMismatch: the admitter's policy is not the one Policy builds
	// for the configurations.
	ErrPolicyMismatch = errors.New("envoyrls: the admitter's policy is not Policy(configs)")
	// ErrBadRequest: a request without a domain or without descriptors
	// (gRPC InvalidArgument), with more descriptors than MaxDescriptors, or
	// with more limited descriptors than engine.MaxAllowAll.
	ErrBadRequest = errors.New("envoyrls: invalid request")
	// ErrLimitOverride: a descriptor carries its own limit (Envoy's
	// limit override), which this server does not implement: its limits are
	// those of the configuration (gRPC Unimplemented).
	ErrLimitOverride = errors.New("envoyrls: descriptor limit overrides are not supported")
	// ErrAdmitter: the admitter failed; it wraps the admitter's error
	// (gRPC Unavailable, ResourceExhausted for engine.ErrKeyCapacity, or the
	// context's code).
	ErrAdmitter = errors.New("envoyrls: admitter failed")
	// ErrDegraded: the admitter answered by its failure rule (a Redis store
	// that cannot reach Redis marks such a decision Degraded), not from a
	// bucket; the request is answered gRPC Unavailable, never OK.
	ErrDegraded = errors.New("envoyrls: admitter answered by its failure rule")
)

// MaxDescriptors is the most descriptors a request may have, limited or
// not: Envoy sends one a rate limit action, a few a route. Each costs the
// server memory, and its answer a status, so a request of a few bytes a
// descriptor must not make it allocate a hundred times its size.
const MaxDescriptors = 1024

// Peeker is the method, beside engine.Admitter's, that a Server needs: the
// balance of a key without spending from it. engine.Engine and
// engine/redisstore's Store have it.
type Peeker interface {
	Peek(ctx context.Context, key string) (engine.Decision, error)
}

// Server is the RLS v3 rate limit service on an admitter. It is safe for
// concurrent use. Register it with rlsv3.RegisterRateLimitServiceServer.
// Make it with NewServer: a zero Server or a nil *Server answers with an
// error, never a panic: Reload and CheckPolicy one wrapping
// engine.ErrNotInitialized, ShouldRateLimit gRPC FailedPrecondition (after
// its checks of the request). It must not be copied.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	a    engine.Admitter
	peek Peeker
	mu   sync.Mutex // serialises Reload
	st   atomic.Pointer[state]
}

// state is one generation of configurations, by domain.
type state struct {
	domains map[string]*Config
	want    policy.Policy // Policy(configs), its version aside: see CheckPolicy
}

var _ rlsv3.RateLimitServiceServer = (*Server)(nil)

func newState(configs []*Config) (*state, error) {
	st := &state{domains: make(map[string]*Config, len(configs))}
	for i, c := range configs {
		if c == nil {
			return nil, fmt.Errorf("%w: configs[%d]", ErrNilConfig, i)
		}
		if st.domains[c.domain] != nil {
			return nil, fmt.Errorf("%w: '%s' in configs[%d]", ErrDuplicateDomain, c.domain, i)
		}
		st.domains[c.domain] = c
	}
	return st, nil
}

// NewServer returns a Server that decides with a under configs, one per
// domain. a must already run the policy Policy builds for configs, at any
// version: build it with that policy (engine.Config.Policy, or the Redis
// store's Config.Policy), or install it with a.ReplacePolicy before. NewServer
// only compares, so it does no I/O. a must also implement Peeker.
//
// Errors: ErrNilAdmitter, ErrNoPeek, those of Policy, and ErrPolicyMismatch
// when a's policy gives some key another limit than Policy(configs) does.
func NewServer(a engine.Admitter, configs ...*Config) (*Server, error) {
	if a == nil {
		return nil, ErrNilAdmitter
	}
	pk, ok := a.(Peeker)
	if !ok {
		return nil, fmt.Errorf("%w: %T", ErrNoPeek, a)
	}
	st, err := newState(configs)
	if err != nil {
		return nil, err
	}
	want, err := Policy(1, configs...)
	if err != nil {
		return nil, err
	}
	if cur := a.Policy(); !samePolicy(cur, want) {
		return nil, fmt.Errorf("%w: at version %d %s; install Policy(configs) with the admitter's ReplacePolicy first (a Redis store keeps its prefix's policy, whatever its Config.Policy)",
			ErrPolicyMismatch, cur.Version, policyDiff(cur, want))
	}
	st.want = want
	s := &Server{a: a, peek: pk}
	s.st.Store(st)
	return s, nil
}

// CheckPolicy reports, with an error wrapping ErrPolicyMismatch, that the
// admitter's policy no longer gives every key the limit the server's
// configurations do: on a store shared with other processes, one of them
// installed its own (a replica started or reloaded with other files; the
// last to do so wins). The server then answers with its configurations'
// limits and names while the admitter enforces the other policy's, until
// Reload brings the two together; but for a limit of 0 there, which only
// a server of that configuration refuses: this one asks the entry's bucket,
// which holds one token a year, so each key may pass one request more
// (and is left spent). It is nil when they agree. The policy is
// the admitter's as it last saw it: a store meets another process's
// cutover at its next call.
func (s *Server) CheckPolicy() error {
	if s.state() == nil {
		return errZeroServer
	}
	if cur := s.a.Policy(); !samePolicy(cur, s.st.Load().want) {
		return fmt.Errorf("%w: version %d, in force, is another configuration's", ErrPolicyMismatch, cur.Version)
	}
	return nil
}

// Reload makes configs the server's configurations. If their policy differs
// from the admitter's, it installs it first with ReplacePolicy, at the next
// version: an exact cutover in which every bucket keeps what it has, clamped
// to its new capacity, and raising a limit tops nobody up. Requests decided
// meanwhile see the old configurations with the new policy: an entry's bucket
// key does not change while the entry stays where it is in the tree (and
// no share_threshold on its path is turned on or off), so such a request is
// decided under the entry's new limit (a new limit of 0 as its bucket, one
// token a year, decides: see CheckPolicy), and the key of an entry the new
// configurations drop or move gets the default that never denies
// (DefaultCapacity). Then the server answers with configs.
//
// When ReplacePolicy finds that another process moved the version on (a
// replica sharing a Redis store), Reload reads the policy again and, if that
// is not already the configurations', tries once more at the version after it.
//
// On any error the server keeps its configurations, and the admitter its
// policy, unless ReplacePolicy's error leaves the cutover made or its
// outcome unknown (a Redis store's, wrapping ErrUnavailable, when Redis
// failed after the cutover was recorded): the admitter may then run the
// new policy under the old configurations, as between the two steps above,
// until a Reload of the same configurations finds it in force and completes
// without another cutover. Errors: those of Policy, and those of
// ReplacePolicy or Peek, wrapped (engine.ErrStalePolicy if the version moved
// on twice: call Reload again).
func (s *Server) Reload(ctx context.Context, configs ...*Config) error {
	if s.state() == nil {
		return errZeroServer
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := newState(configs)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		cur := s.a.Policy()
		if cur.Version == math.MaxInt64 {
			return fmt.Errorf("envoyrls: reload: %w: version %d is the last", engine.ErrStalePolicy, cur.Version)
		}
		want, err := Policy(cur.Version+1, configs...)
		if err != nil {
			return err
		}
		st.want = want
		if samePolicy(cur, want) {
			break
		}
		err = s.a.ReplacePolicy(ctx, want, cur.Version)
		if err == nil {
			break
		}
		if !errors.Is(err, engine.ErrStalePolicy) || attempt > 0 {
			return fmt.Errorf("envoyrls: reload to version %d: %w", want.Version, err)
		}
		// Another process moved the version on (a replica on the same Redis
		// prefix, which may have installed these very configurations). A Peek
		// makes a store that has not met that version yet load it; then
		// compare again, once.
		if _, err := s.peek.Peek(ctx, probeKey); err != nil {
			return fmt.Errorf("envoyrls: reload to version %d: %w", want.Version, err)
		}
	}
	s.st.Store(st)
	return nil
}

// errZeroServer is the error of every method of a Server NewServer did not
// make.
var errZeroServer = fmt.Errorf("envoyrls: a zero or nil Server, not one NewServer made: %w", engine.ErrNotInitialized)

// state is s's configurations, nil for a Server NewServer did not make.
func (s *Server) state() *state {
	if s == nil {
		return nil
	}
	return s.st.Load()
}

// probeKey is a key no entry has (an entry's key has a "/" after the tag),
// for a Peek that reads nothing but the policy.
const probeKey = "{envoyrls}probe|"

// kinds of descriptor
const (
	kindNone      = iota // no entry matched, or replaced
	kindUnlimited        // unlimited: true
	kindEnforced
	kindShadow
)

type item struct {
	kind  int
	node  *node
	key   string
	cost  int64 // 0: check only (a descriptor hits_addend of 0)
	over  bool
	d     engine.Decision
	known bool // d is set
	// retry is the wait until this descriptor could pass, when over: -1
	// for never (cost above the limit).
	retry time.Duration
}

// ShouldRateLimit decides a request as the package doc says.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, ErrBadRequest.Error()+": rate limit domain must not be empty")
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, status.Error(codes.InvalidArgument, ErrBadRequest.Error()+": rate limit descriptor list must not be empty")
	}
	if len(descs) > MaxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "%v: %d descriptors, at most %d", ErrBadRequest, len(descs), MaxDescriptors)
	}
	st := s.state()
	if st == nil {
		return nil, status.Error(codes.FailedPrecondition, errZeroServer.Error())
	}
	cfg := st.domains[req.GetDomain()]
	items := make([]item, len(descs))
	var replacing map[string]bool // limit names replaced
	var replaced map[*limit]bool  // entries whose replaces are in replacing
	for i, d := range descs {
		if d.GetLimit() != nil {
			return nil, status.Errorf(codes.Unimplemented, "%v: descriptor %d", ErrLimitOverride, i)
		}
		it := &items[i]
		it.cost = max(1, int64(req.GetHitsAddend()))
		if h := d.GetHitsAddend(); h != nil {
			it.cost = int64(min(h.GetValue(), math.MaxInt64))
		}
		if cfg == nil {
			continue
		}
		n, vals := cfg.match(d.GetEntries())
		if n == nil {
			continue
		}
		it.node = n
		if len(n.limit.replaces) > 0 && !replaced[n.limit] { // once per entry, however many descriptors name it
			if replacing == nil {
				replacing, replaced = map[string]bool{}, map[*limit]bool{}
			}
			replaced[n.limit] = true
			for _, r := range n.limit.replaces {
				replacing[r] = true
			}
		}
		switch {
		case n.limit.unlimited:
			it.kind = kindUnlimited
		case n.shadow:
			it.kind = kindShadow
		default:
			it.kind = kindEnforced
		}
		if !n.limit.unlimited {
			it.key = bucketKey(n.rule, vals)
		}
	}
	limited := 0
	for i := range items {
		// An unlimited descriptor stays unlimited whoever names it, as
		// envoyproxy/ratelimit has it: only limits are replaced.
		it := &items[i]
		if it.kind != kindUnlimited && it.node != nil && it.node.limit.name != "" && replacing[it.node.limit.name] {
			it.kind = kindNone
		}
		if it.kind == kindEnforced || it.kind == kindShadow {
			limited++
		}
	}
	if limited > engine.MaxAllowAll {
		// Each costs the admitter work (a check or a shadow descriptor a
		// call of its own): a request's is bounded.
		return nil, status.Errorf(codes.InvalidArgument, "%v: %d limited descriptors, at most %d", ErrBadRequest, limited, engine.MaxAllowAll)
	}
	over, err := s.decideEnforced(ctx, items)
	if err != nil {
		return nil, err
	}
	if err := s.decideShadow(ctx, items); err != nil {
		return nil, err
	}
	return response(items, over), nil
}

// decideEnforced decides the enforced descriptors, all or nothing, and
// reports whether the request is over the limit.
func (s *Server) decideEnforced(ctx context.Context, items []item) (bool, error) {
	sums := map[string]int64{}
	var reqs []engine.Request
	var idx, checks []int
	over := false
	for i := range items {
		it := &items[i]
		if it.kind != kindEnforced {
			continue
		}
		switch {
		case it.node.limit.requestsPerUnit == 0:
			// A limit of 0 refuses every request.
			it.over, it.retry, over = true, -1, true
		case it.cost == 0:
			checks = append(checks, i)
		default:
			sums[it.key] = satAdd(sums[it.key], it.cost)
			reqs = append(reqs, engine.Request{Key: it.key, Cost: it.cost})
			idx = append(idx, i)
		}
	}
	for _, i := range idx {
		it := &items[i]
		if sums[it.key] > int64(it.node.limit.requestsPerUnit) {
			// No wait ever admits it.
			it.over, it.retry, over = true, -1, true
		}
	}
	for _, i := range checks {
		// Check only: over if the bucket holds no whole token.
		it := &items[i]
		d, err := s.peek.Peek(ctx, it.key)
		if err := answerErr(ctx, d, err, it.key); err != nil {
			return false, err
		}
		it.d, it.known = d, true
		if !d.Allowed {
			it.over, it.retry, over = true, d.RetryAfter, true
		}
	}
	var full error // the admitter had no room for a new key: the answer unless a bucket refuses
	if !over && len(reqs) > 0 {
		d, b, err := s.allowAll(ctx, reqs, sums)
		switch {
		case errors.Is(err, engine.ErrCostExceedsCapacity) && b >= 0 && b < len(idx):
			// A reload lowered the limit between the configuration this
			// request was matched under and the policy.
			it := &items[idx[b]]
			it.over, it.retry, over = true, -1, true
		case errors.Is(err, engine.ErrKeyCapacity) && ctx.Err() == nil:
			// A bucket already tracked that lacks its cost refuses the
			// request whatever the new key would hold: the Peeks below
			// find it, and the answer is OVER_LIMIT, not an error that
			// Envoy's failure_mode_deny may admit.
			full, over = answerErr(ctx, d, err, ""), true
		case err != nil || d.Degraded:
			return false, answerErr(ctx, d, err, "")
		default:
			it := &items[idx[b]]
			it.d, it.known = d, true
			if !d.Allowed {
				it.over, it.retry, over = true, d.RetryAfter, true
			}
		}
	}
	// Every other limited descriptor reports its key's balance now.
	peeked := map[string]engine.Decision{}
	for _, i := range idx {
		it := &items[i]
		if it.known {
			peeked[it.key] = it.d
		}
	}
	for _, i := range idx {
		it := &items[i]
		if it.known {
			continue
		}
		d, ok := peeked[it.key]
		if !ok {
			var err error
			d, err = s.peek.Peek(ctx, it.key)
			if err := answerErr(ctx, d, err, it.key); err != nil {
				return false, err
			}
			peeked[it.key] = d
		}
		it.d, it.known = d, true
		if over && !it.over && d.Remaining < sums[it.key] {
			// Refused with the others: its own bucket lacks its cost too.
			it.over, it.retry = true, waitFor(d, sums[it.key], it.node.limit)
		}
	}
	if full != nil && !slices.ContainsFunc(idx, func(i int) bool { return items[i].over }) {
		return false, full
	}
	for _, i := range checks {
		// A check of a bucket the request charged reports it after the
		// charge; a refused request charged none.
		if d, ok := peeked[items[i].key]; ok && !over {
			items[i].d = d
		}
	}
	return over, nil
}

// waitFor is how long the bucket of limit l, reported by d (a Peek), takes
// to hold n tokens, n above what it holds and at most its capacity: its time
// to full less the time its last capacity - n tokens take to refill. It is
// never short, and at most 2 ns too long: d.ResetAfter is rounded up, and the
// time subtracted down.
func waitFor(d engine.Decision, n int64, l *limit) time.Duration {
	rpu := uint64(l.requestsPerUnit)
	hi, lo := bits.Mul64(rpu-uint64(n), uint64(unitDuration[l.unit]))
	last, _ := bits.Div64(hi, lo, rpu) // (rpu - n) * unit / rpu < unit: no overflow
	return max(d.ResetAfter-time.Duration(last), 0)
}

// allowAll is a.AllowAll, or for requests of one key the Allow of their
// summed cost, which means the same and costs the engine less.
func (s *Server) allowAll(ctx context.Context, reqs []engine.Request, sums map[string]int64) (engine.Decision, int, error) {
	if len(sums) != 1 {
		return s.a.AllowAll(ctx, reqs)
	}
	d, err := s.a.Allow(ctx, reqs[0].Key, sums[reqs[0].Key])
	if err != nil {
		return engine.Decision{}, 0, err
	}
	return d, 0, nil
}

// decideShadow decides the shadow-mode descriptors, each on its own.
func (s *Server) decideShadow(ctx context.Context, items []item) error {
	var reqs []engine.Request
	var idx, checks []int
	for i := range items {
		it := &items[i]
		if it.kind != kindShadow || it.node.limit.requestsPerUnit == 0 {
			continue
		}
		if it.cost == 0 {
			d, err := s.peek.Peek(ctx, it.key)
			if err := answerErr(ctx, d, err, it.key); err != nil {
				return err
			}
			it.d, it.known, it.over = d, true, !d.Allowed
			checks = append(checks, i)
			continue
		}
		reqs = append(reqs, engine.Request{Key: it.key, Cost: it.cost})
		idx = append(idx, i)
	}
	if len(reqs) == 0 {
		return nil
	}
	out := make([]engine.Result, len(reqs))
	if err := s.a.AllowBatch(ctx, reqs, out); err != nil {
		return rpcErr(ctx, err, "")
	}
	for j, r := range out {
		it := &items[idx[j]]
		switch {
		case errors.Is(r.Err, engine.ErrCostExceedsCapacity):
			it.over = true
		case errors.Is(r.Err, engine.ErrKeyCapacity):
			// No room for its bucket: it has no numbers to report, and a
			// descriptor that never changes the answer does not fail it.
		case r.Err != nil || r.Decision.Degraded:
			return answerErr(ctx, r.Decision, r.Err, it.key)
		default:
			it.d, it.known, it.over = r.Decision, true, !r.Decision.Allowed
		}
	}
	// A check of a bucket the batch charged reports it after the charge, as
	// an enforced one does: the batch decides in order, so its last decision
	// of a key is the key's balance after all of them.
	if len(checks) == 0 {
		return nil
	}
	last := map[string]engine.Decision{}
	for _, i := range idx {
		if it := &items[i]; it.known {
			last[it.key] = it.d
		}
	}
	for _, i := range checks {
		if d, ok := last[items[i].key]; ok {
			items[i].d = d
		}
	}
	return nil
}

// answerErr is the gRPC error for an admitter's answer, or nil: rpcErr of
// its error, or Unavailable with ErrDegraded for a decision its failure
// rule gave (Redis unreachable), which is no bucket's answer and so never an
// OK: Envoy's failure_mode_deny decides.
func answerErr(ctx context.Context, d engine.Decision, err error, key string) error {
	if err == nil && d.Degraded {
		err = ErrDegraded
	}
	if err == nil {
		return nil
	}
	return rpcErr(ctx, err, key)
}

// rpcErr is the gRPC status of an admitter's error: the code of ctx if it
// ended (the caller gave up), ResourceExhausted for engine.ErrKeyCapacity,
// else Unavailable (an admitter's own timeout included).
func rpcErr(ctx context.Context, err error, key string) error {
	code := codes.Unavailable
	switch {
	case ctx != nil && ctx.Err() != nil:
		code = status.FromContextError(ctx.Err()).Code()
	case errors.Is(err, engine.ErrKeyCapacity):
		code = codes.ResourceExhausted
	}
	head := ErrAdmitter.Error()
	if errors.Is(err, ErrDegraded) {
		head, err = ErrDegraded.Error(), nil // says it all: not "admitter failed: admitter answered..."
	}
	if key != "" {
		head += fmt.Sprintf(": key %q", key)
	}
	if err != nil {
		return status.Errorf(code, "%s: %v", head, err)
	}
	return status.Error(code, head)
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// response builds the answer from decided items.
func response(items []item, over bool) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items)),
	}
	if over {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	head := -1
	for i := range items {
		it := &items[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch it.kind {
		case kindNone:
			continue
		case kindUnlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		}
		l := it.node.limit
		st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: l.name, RequestsPerUnit: l.requestsPerUnit, Unit: l.unit}
		if it.kind == kindEnforced && it.over {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if it.known {
			st.LimitRemaining = uint32(min(max(it.d.Remaining, 0), math.MaxUint32))
			st.DurationUntilReset = durationpb.New(it.d.ResetAfter)
		}
		if it.kind != kindEnforced {
			continue
		}
		if head < 0 || better(it, &items[head]) {
			head = i
		}
	}
	if head >= 0 {
		resp.ResponseHeadersToAdd = headers(&items[head], resp.Statuses[head])
	}
	return resp
}

// better reports whether a rather than b should give the header fields:
// over the limit before not, the longer wait (never the longest) among those
// over, the fewer tokens left among those not; the first on a tie.
func better(a, b *item) bool {
	switch {
	case a.over != b.over:
		return a.over
	case a.over:
		return a.retry < 0 && b.retry >= 0 || b.retry >= 0 && a.retry > b.retry
	default:
		return a.d.Remaining < b.d.Remaining
	}
}

// headers are the IETF RateLimit fields for the descriptor it, and
// Retry-After when it is over the limit and some wait admits it.
func headers(it *item, st *rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	l := it.node.limit
	t := ceilSeconds(it.d.ResetAfter)
	retry := int64(-1)
	switch {
	case it.over && it.retry >= 0:
		retry = max(ceilSeconds(it.retry), 1)
		t = retry
	case l.requestsPerUnit == 0: // never full: a window, as the reference's reset says
		t = int64(unitDuration[l.unit] / time.Second)
	}
	buf := make([]byte, 0, len(l.sfName)+32)
	buf = append(buf, l.sfName...)
	buf = append(buf, ";r="...)
	buf = strconv.AppendUint(buf, uint64(st.LimitRemaining), 10)
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, t, 10)
	h := []*corev3.HeaderValue{
		{Key: "RateLimit-Policy", Value: l.policyField},
		{Key: "RateLimit", Value: string(buf)},
	}
	if retry >= 0 {
		h = append(h, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(retry, 10)})
	}
	return h
}

// headerFields sets l's header field parts that do not change: its
// structured-field name and its RateLimit-Policy item.
func (l *limit) headerFields() {
	name := l.name
	if !printable(name) {
		name = strconv.FormatUint(uint64(l.requestsPerUnit), 10) + "-per-" + unitName(l.unit)
	}
	l.sfName = strconv.Quote(name) // printable ASCII: Go's quoting is the structured field's
	w := int64(unitDuration[l.unit] / time.Second)
	l.policyField = l.sfName + ";q=" + strconv.FormatUint(uint64(l.requestsPerUnit), 10) + ";w=" + strconv.FormatInt(w, 10)
}

// ceilSeconds is d in whole seconds, rounded up, 0 for d <= 0, and at most
// the longest Duration's whole seconds: a client that multiplies it by a
// second would otherwise overflow to a wait below 0. d + time.Second - 1
// would wrap for a d near math.MaxInt64, a wait an admitter may report.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 && s < math.MaxInt64/int64(time.Second) {
		s++
	}
	return s
}

func printable(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// match finds the entry a descriptor's entries select, as envoyproxy/ratelimit
// does: at each level the entry of the same key and value, else the first
// wildcard entry of the key whose pattern the value matches, else the entry
// of the key with no value; a limit applies only if the last of the
// descriptor's entries reaches it. It returns the entry, if limited, and the
// request values at the variable entries of its path.
func (c *Config) match(entries []*rlv3.RateLimitDescriptor_Entry) (*node, []string) {
	parent := c.root
	var vals []string
	for i, e := range entries {
		k, v := e.GetKey(), e.GetValue()
		next := parent.exact[entryKey{k, v}]
		if next == nil {
			for _, w := range parent.wildcards {
				if w.key == k && wildcardMatch(w.wildcard, v) {
					next = w
					break
				}
			}
		}
		if next == nil {
			next = parent.defaults[k]
		}
		if next == nil {
			return nil, nil
		}
		if next.value == "" || next.wildcard != nil && !next.share {
			vals = append(vals, v)
		}
		if i == len(entries)-1 {
			if next.limit == nil {
				return nil, nil
			}
			return next, vals
		}
		if len(next.exact) == 0 && len(next.defaults) == 0 {
			return nil, nil
		}
		parent = next
	}
	return nil, nil
}

// wildcardMatch reports whether value matches the pattern split on '*':
// each '*' matches any run of bytes, the empty one included.
func wildcardMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	fixed := 0
	for _, p := range parts {
		fixed += len(p)
	}
	if len(value) < fixed || len(value) < len(first)+len(last) ||
		value[:len(first)] != first || value[len(value)-len(last):] != last {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		j := strings.Index(rest, p)
		if j < 0 {
			return false
		}
		rest = rest[j+len(p):]
	}
	return true
}
