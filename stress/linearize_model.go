package main

// The porcupine model of the linearizability check: the engine's sequential
// specification (internal/model) seen through the operations a history
// records. See linearize.go for how histories are recorded and why each
// recorded operation is atomic.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/anishathalye/porcupine"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

// linKind is what one recorded operation does. Engine calls that are not
// atomic as a whole are recorded as several operations, each atomic, all
// with the call's interval (linearize.go explains why that is sound).
type linKind uint8

const (
	linAllow    linKind = iota // an Allow, or one key's items of an AllowBatch, in request order
	linCutover                 // a ReplacePolicy call, stale and invalid attempts included
	linPass                    // one key's part of an EvictFull: evict it if it is full
	linKeyCount                // a KeyCount call
	linPolicy                  // a Policy call
	linAllowAll                // an AllowAll call, whole: it is atomic over all its keys
	linRefund                  // a Refund call
	linPeek                    // a Peek call
	linCharge                  // a Charge call
)

// linInput is an operation's invocation. Every operation of a history
// carries the clock reading of its epoch: the clock stands still while any
// operation is in flight, so that is the reading the engine used.
type linInput struct {
	kind     linKind
	now      int64
	key      string           // linAllow, linPass, linRefund, linPeek, linCharge
	costs    []int64          // linAllow; linRefund, linCharge: the tokens, alone
	batch    bool             // linAllow: the items come from an AllowBatch
	reqs     []engine.Request // linAllowAll
	next     policy.Policy
	expected int64 // linCutover
	sweep    int   // linPass: which EvictFull call
	passes   int   // linPass: how many passes the call has, one per key
	tally    bool  // linPass: check the call's count (unpartitioned histories only)
}

// linResult is one decision or error.
type linResult struct {
	d   engine.Decision
	err error
}

// linOutput is an operation's response.
type linOutput struct {
	res []linResult   // linAllow, one per cost; linAllowAll, linRefund, linPeek, linCharge: one
	err error         // linAllow: AllowBatch's own error; linCutover; linPass: EvictFull's error
	n   int           // linPass: the count EvictFull returned; linKeyCount: the count; linAllowAll: the index
	pol policy.Policy // linPolicy
}

// linTally is what one EvictFull's passes have done so far in a
// linearization.
type linTally struct{ passes, evicted int }

// linState is the specification's state for porcupine: one model holding
// every key the operations so far have tracked, under the key bound of the
// history's engine. One model, not one per key, because AllowAll decides
// several keys as one step: its answer and its effect depend on every key
// it names at once. A sweep is checked key by key (EvictIfFull), since the
// engine sweeps shard by shard. States are immutable: Step clones the model
// before it changes it.
type linState struct {
	m     *enginemodel.Model
	tally map[int]linTally
	canon string // canonical text, so Equal and Hash are cheap
}

func linNewState(m *enginemodel.Model, tally map[int]linTally) *linState {
	s := &linState{m: m, tally: tally}
	pol := m.Policy()
	keys := m.Keys()
	b := make([]byte, 0, 64+48*len(keys))
	b = fmt.Appendf(b, "v%d c%d %s", pol.Version, pol.Capacity, limitRateText(pol.TokensPerSecond, pol.Refill))
	if pol.Bands != nil {
		// By content, to read, and by reference, as overrides below.
		b = fmt.Appendf(b, " b%s@%p", bandsText(pol.Bands), pol.Bands)
	}
	if pol.Overrides != nil {
		// By content, to read, and by reference: racing cutovers may offer
		// equal sets, and Policy must return the very one installed.
		b = fmt.Appendf(b, " o%s@%p", overridesText(pol.Overrides), pol.Overrides)
	}
	slices.Sort(keys)
	for _, k := range keys {
		bk, _ := m.Bucket(k)
		b = append(b, ' ')
		b = append(b, k...)
		// Every band's balance, exactly: equal states hold equal bands.
		for i, t := range bk.Tokens {
			if i == 0 {
				b = append(b, '=')
			} else {
				b = append(b, ',')
			}
			b = append(b, t.RatString()...)
		}
		b = append(b, '@')
		b = strconv.AppendInt(b, bk.Last, 10)
	}
	for _, id := range slices.Sorted(maps.Keys(tally)) {
		t := tally[id]
		b = fmt.Appendf(b, " sweep%d:%d/%d", id, t.passes, t.evicted)
	}
	s.canon = string(b)
	return s
}

// linSpec is one history's configuration, which the model needs too.
type linSpec struct {
	partitioned bool
	keys        []string // every key the history uses, "" and blank ones aside
	maxKeys     int
	shards      int
	clients     int
	rounds      int
	perRound    int // most calls one client makes in a round
	pol         policy.Policy
	start       int64
}

// model returns the porcupine model of spec's histories.
func (sp *linSpec) model() porcupine.Model {
	m := porcupine.Model{
		Init: func() any { return linNewState(enginemodel.New(sp.pol, sp.maxKeys, 0), map[int]linTally{}) },
		Step: func(state, input, output any) (bool, any) {
			return sp.step(state.(*linState), input.(*linInput), output.(*linOutput))
		},
		Equal:             func(a, b any) bool { return a.(*linState).canon == b.(*linState).canon },
		Hash:              func(s any) uint64 { h := fnv.New64a(); h.Write([]byte(s.(*linState).canon)); return h.Sum64() },
		DescribeOperation: func(in, out any) string { return linDescribe(in.(*linInput), out.(*linOutput)) },
		DescribeState:     func(s any) string { return s.(*linState).canon },
	}
	if sp.partitioned {
		m.Partition = sp.partition
	}
	return m
}

// partition splits a history into parts checked alone; it is used only
// when the key bound cannot bind (MaxKeys above the number of keys). The
// parts are the classes of keys that AllowAll calls join: two keys are in
// one class when some AllowAll names both, or each names one and a third,
// and so on. Each part holds its class's operations (Allows and batch
// items, AllowAlls, Refunds, Peeks and sweep passes on its keys), every
// cutover, and, for the first part, the Policy reads.
//
// Why that is sound: take a linearization of the whole history that the
// specification accepts, and keep only one part's operations. Without a
// binding key bound, an operation on keys of other classes changes neither
// this class's buckets nor the policy, and the outputs kept depend on
// nothing else: an Allow, Refund or Peek on k, on k's bucket and the
// policy; an AllowAll, on the buckets of the keys it names (all in the
// class, which is why classes are closed under AllowAll) and the policy; a
// pass over k, on k's bucket and the policy; a cutover (its error, and its
// effect on the class's buckets), on the policy and those buckets. So the
// restriction is a linearization the specification of the class's keys
// accepts, and a part with none proves the history has none: a failure is
// never a false alarm. Per key, as before AllowAll, is the finest such
// split; keying it by AllowAll's classes keeps it sound, and the recorder
// draws each AllowAll's keys from a small group so the classes stay small
// (the search is exponential in a part's concurrency). An AllowAll whose
// answer depends on no state (no requests or too many, a bad key or a cost
// below 1: decided before any key is read) joins nothing and, like an
// Allow on a bad key, may go in any part.
//
// What depends on all keys at once stays out: KeyCount is in no part, and
// a partitioned history's passes do not check the sweep's count (linBounds
// checks both ranges; unpartitioned histories check them exactly). The
// converse fails: parts may place a cutover at different instants, which
// is why linVersions checks real-time version order across keys.
func (sp *linSpec) partition(h []porcupine.Operation) [][]porcupine.Operation {
	idx := make(map[string]int, len(sp.keys))
	for i, k := range sp.keys {
		idx[k] = i
	}
	class := make([]int, len(sp.keys)) // a union-find forest over the keys
	for i := range class {
		class[i] = i
	}
	var root func(i int) int
	root = func(i int) int {
		if class[i] != i {
			class[i] = root(class[i])
		}
		return class[i]
	}
	for _, op := range h {
		in := op.Input.(*linInput)
		if in.kind != linAllowAll || linStatic(in) {
			continue
		}
		first := -1
		for _, r := range in.reqs {
			if i, ok := idx[r.Key]; ok {
				if first < 0 {
					first = i
				} else {
					class[root(i)] = root(first)
				}
			}
		}
	}
	// An operation that reads no key's state (an invalid key's) may go in
	// any part: the first key's.
	partOf := func(key string) int { return root(idx[key]) }
	parts := make([][]porcupine.Operation, len(sp.keys)) // by root
	for _, op := range h {
		in := op.Input.(*linInput)
		switch in.kind {
		case linAllow, linPass, linRefund, linPeek, linCharge:
			p := partOf(in.key)
			parts[p] = append(parts[p], op)
		case linAllowAll:
			key := ""
			if !linStatic(in) {
				for _, r := range in.reqs {
					if _, ok := idx[r.Key]; ok {
						key = r.Key
						break
					}
				}
			}
			p := partOf(key)
			parts[p] = append(parts[p], op)
		case linCutover:
			for i := range parts {
				if root(i) == i {
					parts[i] = append(parts[i], op)
				}
			}
		case linPolicy:
			p := partOf("") // its output is the policy, which every part holds
			parts[p] = append(parts[p], op)
		}
	}
	return slices.DeleteFunc(parts, func(p []porcupine.Operation) bool { return len(p) == 0 })
}

// linStatic reports whether an AllowAll's answer depends on no state: it
// has no requests or too many, a blank or over-long key, or a cost below 1,
// each decided before any key is read. (Keys are checked against the
// engine's default MaxKeyBytes, which every history uses.)
func linStatic(in *linInput) bool {
	if len(in.reqs) == 0 || len(in.reqs) > engine.MaxAllowAll {
		return true
	}
	for _, r := range in.reqs {
		if strings.TrimSpace(r.Key) == "" || len(r.Key) > engine.DefaultMaxKeyBytes || r.Cost < 1 {
			return true
		}
	}
	return false
}

// linPartitionKey names the key of a part that linSpec.partition returned.
func linPartitionKey(part []porcupine.Operation) string {
	for _, op := range part {
		if k := linKeyOf(op.Input.(*linInput)); k != "" {
			return k
		}
	}
	return ""
}

// linKeyOf names the key an operation is on: an AllowAll's first key; ""
// for an operation on no key.
func linKeyOf(in *linInput) string {
	switch in.kind {
	case linAllow, linPass, linRefund, linPeek, linCharge:
		return in.key
	case linAllowAll:
		if len(in.reqs) > 0 {
			return in.reqs[0].Key
		}
	}
	return ""
}

// step is the specification: whether the engine could have answered out to
// in in state s, and the state after.
func (sp *linSpec) step(s *linState, in *linInput, out *linOutput) (bool, *linState) {
	switch in.kind {
	case linAllow:
		return sp.stepAllow(s, in, out)
	case linAllowAll:
		return sp.stepAllowAll(s, in, out)
	case linRefund, linPeek:
		if len(out.res) != 1 {
			return false, nil
		}
		m := s.m.Clone()
		var d engine.Decision
		var err error
		if in.kind == linPeek {
			d, err = m.Peek(in.now, in.key)
		} else {
			d, err = m.Refund(in.now, in.key, in.costs[0])
		}
		if d != out.res[0].d || linErrName(err) != linErrName(out.res[0].err) {
			return false, nil
		}
		if in.kind == linPeek || err != nil {
			return true, s // nothing changed
		}
		if _, ok := m.Bucket(in.key); !ok {
			return true, s // an untracked key: nothing to credit
		}
		return true, linNewState(m, s.tally)
	case linCharge:
		if len(out.res) != 1 {
			return false, nil
		}
		m := s.m.Clone()
		d, err := m.Charge(in.now, in.key, in.costs[0])
		if d != out.res[0].d || linErrName(err) != linErrName(out.res[0].err) {
			return false, nil
		}
		if err != nil {
			return true, s // nothing changed
		}
		return true, linNewState(m, s.tally)
	case linCutover:
		m := s.m.Clone()
		err := m.ReplacePolicy(in.now, in.next, in.expected)
		if linErrName(err) != linErrName(out.err) {
			return false, nil
		}
		if err != nil {
			return true, s
		}
		return true, linNewState(m, s.tally)
	case linPass:
		return sp.stepPass(s, in, out)
	case linKeyCount:
		return out.n == s.m.KeyCount(), s
	case linPolicy:
		return out.pol == s.m.Policy(), s
	}
	return false, nil
}

// stepPass evicts in.key if it is full. In an unpartitioned history it also
// checks the call's count, which is the sum of its passes: a pass that would
// take the evictions above it, or leave too few passes to reach it, cannot
// be in the linearization. Checking as the passes go, rather than once they
// are all placed, prunes porcupine's search early: without it a sweep that
// reports fewer evictions than there were full buckets when it was invoked
// makes the search try every interleaving of passes before finding that
// other calls emptied those buckets first.
func (sp *linSpec) stepPass(s *linState, in *linInput, out *linOutput) (bool, *linState) {
	if out.err != nil {
		return false, nil
	}
	evicted := 0
	m := s.m
	if _, ok := m.Bucket(in.key); ok {
		m = m.Clone()
		ok, err := m.EvictIfFull(in.now, in.key)
		if err != nil {
			return false, nil
		}
		if ok {
			evicted = 1
		} else {
			m = s.m
		}
	}
	tally := s.tally
	if in.tally {
		t := s.tally[in.sweep]
		t.passes++
		t.evicted += evicted
		if t.evicted > out.n || t.evicted+in.passes-t.passes < out.n {
			return false, nil
		}
		tally = maps.Clone(s.tally)
		if t.passes == in.passes {
			delete(tally, in.sweep) // done: forget it, so equal states compare equal
		} else {
			tally[in.sweep] = t
		}
	} else if evicted == 0 {
		return true, s
	}
	return true, linNewState(m, tally)
}

// stepAllow decides in's items one by one on in.key's bucket. The model
// holds the key bound: at it, a request that would create the key fails
// with ErrKeyCapacity, and one that fails an earlier check (the key, the
// cost, the key's capacity, the clock) keeps its own error.
func (sp *linSpec) stepAllow(s *linState, in *linInput, out *linOutput) (bool, *linState) {
	if out.err != nil || len(out.res) != len(in.costs) {
		return false, nil
	}
	m := s.m.Clone()
	for i, cost := range in.costs {
		d, err := m.Allow(in.now, in.key, cost)
		if d != out.res[i].d || linErrName(err) != linErrName(out.res[i].err) {
			return false, nil
		}
	}
	if _, ok := m.Bucket(in.key); !ok {
		return true, s // the key was not tracked and still is not
	}
	return true, linNewState(m, s.tally)
}

// stepAllowAll decides in's requests as one, on every key they name. The
// index must be the model's, but for ErrKeyCapacity on an engine of several
// shards: such an engine reserves room for new keys shard by shard, in the
// order of their numbers, which the model does not know, so the first
// request of any key the state does not track is right.
func (sp *linSpec) stepAllowAll(s *linState, in *linInput, out *linOutput) (bool, *linState) {
	if len(out.res) != 1 {
		return false, nil
	}
	m := s.m.Clone()
	d, at, err := m.AllowAll(in.now, in.reqs)
	if d != out.res[0].d || linErrName(err) != linErrName(out.res[0].err) {
		return false, nil
	}
	if at != out.n {
		if err != engine.ErrKeyCapacity || sp.shards == 1 || !linFirstOfNewKey(s.m, in.reqs, out.n) {
			return false, nil
		}
	}
	if err != nil || !d.Allowed {
		return true, s // nothing taken, nothing created
	}
	return true, linNewState(m, s.tally)
}

// linFirstOfNewKey reports whether reqs[i] is the first request of a key m
// does not track.
func linFirstOfNewKey(m *enginemodel.Model, reqs []engine.Request, i int) bool {
	if i < 0 || i >= len(reqs) {
		return false
	}
	if _, ok := m.Bucket(reqs[i].Key); ok {
		return false
	}
	return !slices.ContainsFunc(reqs[:i], func(r engine.Request) bool { return r.Key == reqs[i].Key })
}

// linErrs are the errors a history can hold, by the name they print as.
var linErrs = []struct {
	err  error
	name string
}{
	{engine.ErrInvalidKey, "ErrInvalidKey"},
	{engine.ErrCostExceedsCapacity, "ErrCostExceedsCapacity"}, // before ErrInvalidCost, which it wraps
	{engine.ErrInvalidCost, "ErrInvalidCost"},
	{engine.ErrKeyCapacity, "ErrKeyCapacity"},
	{engine.ErrStalePolicy, "ErrStalePolicy"},
	{engine.ErrClockRegression, "ErrClockRegression"},
	{engine.ErrClosed, "ErrClosed"},
	{engine.ErrInvalidConfig, "ErrInvalidConfig"},
	{engine.ErrInvalidPolicy, "ErrInvalidPolicy"},
	{engine.ErrAllowAllSize, "ErrAllowAllSize"},
	{context.Canceled, "Canceled"},
	{context.DeadlineExceeded, "DeadlineExceeded"},
}

// linErrName names err by the engine error it is (errors.Is): the engine
// wraps rare errors with facts the model does not repeat.
func linErrName(err error) string {
	if err == nil {
		return ""
	}
	for _, e := range linErrs {
		if errors.Is(err, e.err) {
			return e.name
		}
	}
	return "error(" + err.Error() + ")"
}

// linDescribe prints one operation compactly, for violations and
// porcupine's visualization.
func linDescribe(in *linInput, out *linOutput) string {
	var b strings.Builder
	switch in.kind {
	case linAllow:
		name := "Allow"
		if in.batch {
			name = "Batch"
		}
		fmt.Fprintf(&b, "%s(%q, cost %s) -> ", name, in.key, linJoin(in.costs))
		for i, r := range out.res {
			if i > 0 {
				b.WriteString("; ")
			}
			b.WriteString(linResultString(r))
		}
	case linAllowAll:
		reqs := make([]string, len(in.reqs))
		for i, r := range in.reqs {
			reqs[i] = fmt.Sprintf("%q %d", r.Key, r.Cost)
		}
		if len(in.reqs) > 8 {
			reqs = append(reqs[:8], fmt.Sprintf("... %d in all", len(in.reqs)))
		}
		fmt.Fprintf(&b, "AllowAll(%s) -> %s at %d", strings.Join(reqs, ", "), linResultString(out.res[0]), out.n)
	case linRefund:
		fmt.Fprintf(&b, "Refund(%q, %d) -> %s", in.key, in.costs[0], linResultString(out.res[0]))
	case linPeek:
		fmt.Fprintf(&b, "Peek(%q) -> %s", in.key, linResultString(out.res[0]))
	case linCharge:
		fmt.Fprintf(&b, "Charge(%q, %d) -> %s", in.key, in.costs[0], linResultString(out.res[0]))
	case linCutover:
		fmt.Fprintf(&b, "ReplacePolicy(%s, expected %d) -> %s", policyText(in.next), in.expected, linErrOrNil(out.err))
	case linPass:
		fmt.Fprintf(&b, "EvictFull#%d pass over %q (the call returned %d, %s)", in.sweep, in.key, out.n, linErrOrNil(out.err))
	case linKeyCount:
		fmt.Fprintf(&b, "KeyCount -> %d", out.n)
	case linPolicy:
		fmt.Fprintf(&b, "Policy -> %s", policyText(out.pol))
	}
	fmt.Fprintf(&b, " @%d", in.now)
	return b.String()
}

func linResultString(r linResult) string {
	if r.err != nil {
		return linErrName(r.err)
	}
	verdict := "denied"
	if r.d.Allowed {
		verdict = "allowed"
	}
	s := fmt.Sprintf("%s rem %d v%d lim %d reset %d", verdict, r.d.Remaining, r.d.Version, r.d.Limit, r.d.ResetAfter)
	if !r.d.Allowed {
		s += fmt.Sprintf(" retry %d", r.d.RetryAfter)
	}
	if r.d.Band != "" {
		s += fmt.Sprintf(" band %q", r.d.Band)
	}
	return s
}

func linErrOrNil(err error) string {
	if err == nil {
		return "nil"
	}
	return linErrName(err)
}

func linJoin(costs []int64) string {
	s := make([]string, len(costs))
	for i, c := range costs {
		s[i] = strconv.FormatInt(c, 10)
	}
	return strings.Join(s, ",")
}
