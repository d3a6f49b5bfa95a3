package main

import (
	"math/rand"
	"strconv"

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
// the decision path; mostlyDenied refills one token a minute.
var (
	admitAll     = policy.Policy{Version: 1, Capacity: 1 << 40, TokensPerSecond: 1 << 40}
	mostlyDenied = policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}
)

var scenarios = []scenario{
	{name: "hot", keys: 1, policy: admitAll},
	{name: "uniform", keys: 100_000, policy: admitAll},
	{name: "zipf", keys: 1_000_000, zipf: 1.1, policy: admitAll},
	{name: "denied", keys: 100_000, policy: mostlyDenied},
}

// drawLen is how many key draws a scenario precomputes; workers walk it from
// different offsets, so no random number is drawn inside a timed loop.
const drawLen = 1 << 20

// keySet is a scenario's keys, built once, and a sequence of draws from them.
type keySet struct {
	names []string
	draws []string
}

// newKeySet builds the keys (about 17 bytes each, as tenant IDs are) and
// the draws, seeded so every contender sees the same sequence.
func newKeySet(s scenario) *keySet {
	ks := &keySet{names: make([]string, s.keys), draws: make([]string, drawLen)}
	for i := range ks.names {
		ks.names[i] = keyName(i)
	}
	r := rand.New(rand.NewSource(1))
	var z *rand.Zipf
	if s.zipf > 0 {
		z = rand.NewZipf(r, s.zipf, 1, uint64(s.keys-1))
	}
	for i := range ks.draws {
		switch {
		case z != nil:
			ks.draws[i] = ks.names[z.Uint64()]
		default:
			ks.draws[i] = ks.names[r.Intn(s.keys)]
		}
	}
	return ks
}

// keyName is the i-th key of every scenario: about 17 bytes, as a tenant ID
// would be.
func keyName(i int) string { return "tenant:" + strconv.Itoa(1_000_000_000+i) }
