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
)

// linInput is an operation's invocation. Every operation of a history
// carries the clock reading of its epoch: the clock stands still while any
// operation is in flight, so that is the reading the engine used.
type linInput struct {
	kind     linKind
	now      int64
	key      string  // linAllow, linPass
	costs    []int64 // linAllow
	batch    bool    // linAllow: the items come from an AllowBatch
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
	res []linResult   // linAllow, one per cost
	err error         // linAllow: AllowBatch's own error; linCutover; linPass: EvictFull's error
	n   int           // linPass: the count EvictFull returned; linKeyCount: the count
	pol policy.Policy // linPolicy
}

// linTally is what one EvictFull's passes have done so far in a
// linearization.
type linTally struct{ passes, evicted int }

// linState is the specification's state for porcupine. Each tracked key is
// alone in a model of its own, so one key can be swept without the
// others (the model sweeps the whole engine at once, while the engine
// sweeps shard by shard); the one coupling between keys, the key bound, is
// applied here. States are immutable: Step copies what it changes.
type linState struct {
	pol     policy.Policy
	buckets map[string]*enginemodel.Model
	tally   map[int]linTally
	canon   string // canonical text, so Equal and Hash are cheap
}

func linNewState(pol policy.Policy, buckets map[string]*enginemodel.Model, tally map[int]linTally) *linState {
	s := &linState{pol: pol, buckets: buckets, tally: tally}
	b := make([]byte, 0, 64+48*len(buckets))
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
	for _, k := range slices.Sorted(maps.Keys(buckets)) {
		bk, _ := buckets[k].Bucket(k)
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
		Init: func() any { return linNewState(sp.pol, map[string]*enginemodel.Model{}, map[int]linTally{}) },
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

// partition splits a history by key; it is used only when the key bound
// cannot bind (MaxKeys above the number of keys). Why that is sound: take a
// linearization of the whole history that the specification accepts, and
// keep only key k's operations (its Allows and batch items, its sweep
// passes), every cutover, and the Policy reads assigned to k. Without a
// binding key bound, an operation on another key changes neither k's bucket
// nor the policy, and the outputs kept depend on nothing else: an Allow on
// k, on k's bucket and the policy; a pass over k, on k's bucket and the
// policy; a cutover (its error, and its effect on k's bucket), on the policy
// and k's bucket. So the restriction is a linearization the one-key
// specification accepts, and a partition with none proves the history has
// none: a failure is never a false alarm. What depends on all keys at once
// stays out: KeyCount is in no partition, and a partitioned history's passes
// do not check the sweep's count (linBounds checks both ranges; unpartitioned
// histories check them exactly). The converse fails: partitions may place a
// cutover at different instants, which is why linVersions checks real-time
// version order across keys.
func (sp *linSpec) partition(h []porcupine.Operation) [][]porcupine.Operation {
	idx := make(map[string]int, len(sp.keys))
	for i, k := range sp.keys {
		idx[k] = i
	}
	parts := make([][]porcupine.Operation, len(sp.keys))
	for _, op := range h {
		in := op.Input.(*linInput)
		switch in.kind {
		case linAllow, linPass:
			// An invalid key's answer depends on no state: any partition
			// will do.
			parts[idx[in.key]] = append(parts[idx[in.key]], op)
		case linCutover:
			for i := range parts {
				parts[i] = append(parts[i], op)
			}
		case linPolicy:
			parts[0] = append(parts[0], op) // its output is the policy, which every partition holds
		}
	}
	return slices.DeleteFunc(parts, func(p []porcupine.Operation) bool { return len(p) == 0 })
}

// partitionKey names the key of a partition that partition returned.
func linPartitionKey(part []porcupine.Operation) string {
	for _, op := range part {
		if in := op.Input.(*linInput); in.kind == linAllow || in.kind == linPass {
			return in.key
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
	case linCutover:
		// An empty model holding the policy decides the error: invalid,
		// stale, or nil.
		err := enginemodel.New(s.pol, 0, 0).ReplacePolicy(in.now, in.next, in.expected)
		if linErrName(err) != linErrName(out.err) {
			return false, nil
		}
		if err != nil {
			return true, s
		}
		buckets := make(map[string]*enginemodel.Model, len(s.buckets))
		for k, m := range s.buckets {
			m = m.Clone()
			if m.ReplacePolicy(in.now, in.next, in.expected) != nil {
				return false, nil // cannot happen: every bucket's model holds s.pol
			}
			buckets[k] = m
		}
		return true, linNewState(in.next, buckets, s.tally)
	case linPass:
		return sp.stepPass(s, in, out)
	case linKeyCount:
		return out.n == len(s.buckets), s
	case linPolicy:
		return out.pol == s.pol, s
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
	buckets := s.buckets
	if m, ok := s.buckets[in.key]; ok {
		n, err := m.Clone().EvictFull(in.now)
		if err != nil {
			return false, nil
		}
		if n == 1 {
			evicted = 1
			buckets = maps.Clone(s.buckets)
			delete(buckets, in.key)
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
	return true, linNewState(s.pol, buckets, tally)
}

// stepAllow decides in's items one by one on in.key's bucket.
func (sp *linSpec) stepAllow(s *linState, in *linInput, out *linOutput) (bool, *linState) {
	if out.err != nil || len(out.res) != len(in.costs) {
		return false, nil
	}
	m, ok := s.buckets[in.key]
	if ok {
		m = m.Clone()
	} else {
		m = enginemodel.New(s.pol, 0, 0)
	}
	for i, cost := range in.costs {
		var d engine.Decision
		var err error
		if m.KeyCount() == 0 && len(s.buckets) >= sp.maxKeys {
			// At the bound a request that would create the key fails with
			// ErrKeyCapacity; one that fails an earlier check (the key,
			// the cost, the key's capacity, the clock) keeps its own error.
			d, err = m.Clone().Allow(in.now, in.key, cost)
			if err == nil {
				d, err = engine.Decision{}, engine.ErrKeyCapacity
			}
		} else {
			d, err = m.Allow(in.now, in.key, cost)
		}
		if d != out.res[i].d || linErrName(err) != linErrName(out.res[i].err) {
			return false, nil
		}
	}
	if m.KeyCount() == 0 {
		return true, s // the key was not tracked and still is not
	}
	buckets := maps.Clone(s.buckets)
	buckets[in.key] = m
	return true, linNewState(s.pol, buckets, s.tally)
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
