package shard

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/internal/keycopy"
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// BenchmarkBatchZipf is State.batch alone, on the bench's hardest table: a
// million keys of 17 bytes, drawn Zipf (s=1.1) in batches of 128, each key a
// copy of its bytes as a request's would be. It measures the table path,
// warming included, and the hashing and item building a caller does,
// without the hand-off; ns/op is per decision.
func BenchmarkBatchZipf(b *testing.B) {
	const n, batch, draws = 1_000_000, 128, 1 << 20
	h := NewHasher(7)
	s := newState(NewLimits(policy.Policy{Version: 1, Capacity: 1 << 40, TokensPerSecond: 1 << 30}), NewBudget(n), &h)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("user:%012d", i)
		if r := s.allow(1, names[i], 1); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
	z := rand.NewZipf(rand.New(rand.NewSource(1)), 1.1, 1, n-1)
	picks := make([]int, draws)
	for i := range picks {
		picks[i] = int(z.Uint64())
	}
	keys := keycopy.Copies(names, picks)
	m := msg.Batch{Items: make([]msg.Item, 0, batch), Out: make([]msg.Reply, batch)}
	pos, allowed := 0, 0
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		m.Items = m.Items[:0]
		for range batch {
			k := keys[pos]
			m.Items = append(m.Items, msg.Item{Key: k, Hash: h.Sum(k), Cost: 1})
			pos = (pos + 1) % draws
		}
		s.batch(int64(2+i), &m)
		for _, r := range m.Out {
			if r.Decision.Allowed {
				allowed++
			}
		}
	}
	b.StopTimer()
	// The bucket is far too large to deny anything.
	if decided := (b.N + batch - 1) / batch * batch; allowed != decided {
		b.Fatalf("allowed %d of %d", allowed, decided)
	}
}

// BenchmarkCountBatch is the tally and publish of a part of 64 answers,
// three in four admitted, as a batch's part pays it before its answer;
// ns/op is per part.
func BenchmarkCountBatch(b *testing.B) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	s := New(NewLimits(p), clock.NewManual(0), NewBudget(10), NewMailbox(8, nil), &testHasher)
	m := msg.Batch{Items: make([]msg.Item, 64), Out: make([]msg.Reply, 64)}
	for i := range m.Out {
		m.Out[i].Decision.Allowed = i%4 != 0
	}
	for b.Loop() {
		s.countBatch(1, &m)
	}
	if got := s.stats.pub[msg.Allowed].Load(); got == 0 {
		b.Fatalf("published %d admissions", got)
	}
}
