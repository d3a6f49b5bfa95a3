package main

import (
	"math/rand"
	"strconv"

	"github.com/tokenshard/tokenshard/internal/keycopy"
	"github.com/tokenshard/tokenshard/policy"
)

// scenario is a key distribution and a policy.
type scenario struct {
	name   string
	keys   int     // distinct keys
	zipf   float64 // Zipf exponent s; 0 means uniform
	policy policy.Policy
}

// admitAll is a policy no benchmark run can exhaust, so the figures measure
// the decision path. allDenied, one token refilled a minute, denies every
// request of a run after warm-up has spent each key's token: a key's next
// token is a minute away, longer than a scenario's column of rounds takes,
// so every contender makes the same decisions whatever its place in the
// order and however long its rounds. (At one token a second, the keys
// refilled between a contender's rounds, and each round admitted from 0 to
// 30% of its decisions, depending on how long ago the contender last ran:
// admitting costs more than denying.) mostlyDenied, one a second, is the
// Redis section's hot-denied policy, one key far beyond its limit.
var (
	admitAll     = policy.Policy{Version: 1, Capacity: 1 << 40, TokensPerSecond: 1 << 40}
	allDenied    = policy.Policy{Version: 1, Capacity: 1, Refill: policy.PerMinute(1)}
	mostlyDenied = policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}
)

var scenarios = []scenario{
	{name: "hot", keys: 1, policy: admitAll},
	{name: "uniform", keys: 100_000, policy: admitAll},
	{name: "zipf", keys: 1_000_000, zipf: 1.1, policy: admitAll},
	{name: "denied", keys: 100_000, policy: allDenied},
}

// drawLen is how many key draws a scenario precomputes; workers walk it from
// different offsets, so no random number is drawn inside a timed loop.
const drawLen = 1 << 20

// keySet is a scenario's keys, built once, and a sequence of draws from them.
// The names are what warm-up creates every key with; the draws are what the
// timed loops decide. A server's key comes from a request it has just parsed:
// its bytes sit next to the rest of that request and it is never the very
// string a map stored when it first met the key. So each draw is a copy,
// distinct from the string any contender stored, and no contender gets the
// pointer-equality shortcut of Go's string comparison, which only interned
// keys would give. The copies are laid out in draw order: a worker reads them
// in sequence, so they stream in ahead of use, as a parsed request's bytes
// are already in cache.
type keySet struct {
	names []string
	draws []string
}

// newKeySet builds the keys (about 17 bytes each, as tenant IDs are) and
// the draws, seeded so every contender sees the same sequence.
func newKeySet(s scenario) *keySet {
	ks := &keySet{names: keyNames(s.keys)}
	r := rand.New(rand.NewSource(1))
	var z *rand.Zipf
	if s.zipf > 0 {
		z = rand.NewZipf(r, s.zipf, 1, uint64(s.keys-1))
	}
	picks := make([]int, drawLen)
	for i := range picks {
		switch {
		case z != nil:
			picks[i] = int(z.Uint64())
		default:
			picks[i] = r.Intn(s.keys)
		}
	}
	ks.draws = keycopy.Copies(ks.names, picks)
	return ks
}

// keyNames returns the first n keys of every scenario.
func keyNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = keyName(i)
	}
	return names
}

// keyName is the i-th key of every scenario: about 17 bytes, as a tenant ID
// would be.
func keyName(i int) string { return "tenant:" + strconv.Itoa(1_000_000_000+i) }
