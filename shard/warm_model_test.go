//go:build !race

// Not under the race detector: the warmed path is the shard goroutine's
// alone, which the shard's other tests run under it, and the math/big
// model this test checks it against ran eight times slower there, the
// longest test of CI's race step. `go test work` without -race runs it,
// and so does CI, after the race step.

package shard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// askClock hands the shard a reading only when the test gives one (tick),
// so the test knows when the shard is inside a reading: a batch part's, a
// group's, a prepare's. Each Now waits for the test, or for quit at the
// end, so a failed test never leaves the shard stuck in it.
type askClock struct {
	ask  chan struct{}
	at   chan int64
	quit chan struct{}
}

func (c *askClock) Now() int64 {
	select {
	case c.ask <- struct{}{}:
	case <-c.quit:
		return 0
	}
	select {
	case now := <-c.at:
		return now
	case <-c.quit:
		return 0
	}
}

// tick waits for the shard to read the clock and hands it now.
func (c *askClock) tick(now int64) {
	<-c.ask
	c.at <- now
}

// TestWarmedPathMatchesModel: on one shard tracking well past warmFrom
// keys, so every batch part and every group of single requests takes the
// warmed lookups (where the build can prefetch), the loop's answers are
// the math/big model's, request by request. Batches and groups repeat keys
// (the item just before with the same cost or another, and items further
// back), create keys (enough to rehash the slots the hints point at, and
// at the end more than the key bound allows), ask more than a capacity,
// mix short keys, keys in the arena and keys kept as their own string,
// keys whose bands live in the level store and keys of an override held by
// the bucket alone, across clock advances and two cutovers. A part is
// decided in order and a group newest first (serveAllows), each at one
// reading. After each round the balance of every key it named is the
// model's, and at the end every key's is.
func TestWarmedPathMatchesModel(t *testing.T) {
	const known = 40_000
	const sec = int64(time.Second)
	minute, err := policy.NewBands(policy.Band{Name: "minute", Capacity: 8, Refill: policy.PerMinute(8)})
	require.NoError(t, err)
	hourly, err := policy.NewBands(policy.Band{Name: "hour", Capacity: 10, Refill: policy.PerHour(360)})
	require.NoError(t, err)
	overrides := func(c, r int64, b *policy.BandSet) *policy.OverrideSet {
		o, err := policy.NewOverrideSet(policy.Override{Match: "o:*", Capacity: c, TokensPerSecond: r, Bands: b, Name: "o"})
		require.NoError(t, err)
		return o
	}
	pols := []policy.Policy{
		{Version: 1, Capacity: 7, TokensPerSecond: 3, Bands: minute, Overrides: overrides(4, 2, nil)},
		{Version: 2, Capacity: 5, Refill: policy.Rate{Tokens: 7, Per: 3 * time.Second}, Overrides: overrides(6, 1, hourly)},
		{Version: 3, Capacity: 9, TokensPerSecond: 2, Bands: hourly, Overrides: overrides(3, 5, nil)},
	}
	key := func(i int) string {
		switch {
		case i%1009 == 0:
			return fmt.Sprintf("long:%d:%s", i, strings.Repeat("x", longKey)) // its own string
		case i%3 == 0:
			return fmt.Sprintf("o:%d", i) // the override's: a Bucket alone under version 1
		case i%7 == 0:
			return fmt.Sprintf("a-key-long-enough-for-the-arena:%d", i) // past inlineKey
		}
		return fmt.Sprintf("u:%d", i)
	}
	const maxKeys = known + 2000 // the last rounds' new keys meet the bound

	clk := &askClock{ask: make(chan struct{}), at: make(chan int64), quit: make(chan struct{})}
	closing, stop, exited := make(chan struct{}), make(chan struct{}), make(chan struct{})
	const maxGroup = 256
	mb := NewMailbox(1024, closing) // room for a round's peeks: a part's keys and a group's
	s := New(NewLimits(pols[0]), clk, NewBudget(int64(maxKeys)), mb, &testHasher)
	go func() {
		defer close(exited)
		s.Run(stop)
	}()
	stopped := false
	shut := func() {
		if stopped {
			return
		}
		stopped = true
		close(clk.quit)
		close(closing)
		mb.Close()
		close(stop)
		<-exited
	}
	t.Cleanup(shut)

	m := model.New(pols[0], maxKeys, 2*longKey)
	ctx := context.Background()
	var log []string // what happened, for a failure's message
	check := func(what string, i int, it msg.Item, got msg.Reply, now int64) {
		d, err := m.Allow(now, it.Key, it.Cost)
		want := msg.Reply{Decision: d, Err: shardErr(err)}
		if !sameReply(want, got) {
			require.Equal(t, want, got, "%s item %d: key %.40q cost %d at %d\nlog:\n%s",
				what, i, it.Key, it.Cost, now, strings.Join(log[max(0, len(log)-20):], "\n"))
		}
	}
	item := func(i int, cost int64) msg.Item {
		return msg.Item{Key: key(i), Hash: testHasher.Sum(key(i)), Cost: cost}
	}

	// Fill the table through batch parts of 1000 new keys, costs spread so
	// the balances differ; past warmFrom these parts are warmed too.
	now := sec
	for lo := 0; lo < known; lo += 1000 {
		var items []msg.Item
		for i := lo; i < min(lo+1000, known); i++ {
			items = append(items, item(i, 1+int64(i%4)))
		}
		b := &msg.Batch{Items: items, Out: make([]msg.Reply, len(items)), Done: make(chan int, 1)}
		require.NoError(t, mb.SendBatch(ctx, b))
		clk.tick(now)
		<-b.Done
		for i, it := range items {
			check("fill", i, it, b.Out[i], now)
		}
	}
	require.Equal(t, known, m.KeyCount())
	require.Equal(t, canPrefetch, s.State().worthWarming(2), "past warmFrom keys, where the build can prefetch")

	r := rand.New(rand.NewPCG(11, 12))
	next := known // the next new key
	// reqs returns n requests: repeats of the item just before (same cost,
	// or another), of an item further back, new keys, and known ones.
	reqs := func(n int) []msg.Item {
		var out []msg.Item
		for j := range n {
			cost := 1 + r.Int64N(4)
			if r.IntN(10) == 0 {
				cost = 1 + r.Int64N(10) // some above a capacity
			}
			switch c := r.IntN(20); {
			case j > 0 && c < 5: // the key and cost just before
				out = append(out, out[j-1])
			case j > 0 && c < 7: // the key just before, another cost maybe
				out = append(out, msg.Item{Key: out[j-1].Key, Hash: out[j-1].Hash, Cost: cost})
			case j > 1 && c < 10: // a key further back
				k := out[r.IntN(j-1)]
				out = append(out, msg.Item{Key: k.Key, Hash: k.Hash, Cost: cost})
			case c < 13:
				out = append(out, item(next, cost))
				next++
			default:
				out = append(out, item(r.IntN(next), cost))
			}
		}
		return out
	}

	const rounds = 60
	ver := 0
	for round := range rounds {
		now += []int64{0, 1, 333_333_333, sec, 7 * sec}[r.IntN(5)]
		if round == rounds/3 || round == 2*rounds/3 {
			ver++
			prep := make(chan error, 1)
			go func() { prep <- mb.Prepare(ctx, NewLimits(pols[ver]), &msg.Prepare{Done: make(chan error, 1)}) }()
			clk.tick(now)
			require.NoError(t, <-prep)
			require.True(t, mb.Publish())
			require.NoError(t, m.ReplacePolicy(now, pols[ver], int64(ver)))
			log = append(log, fmt.Sprintf("round %d: cutover to %+v at %d", round, pols[ver], now))
		}
		// A batch part, and while the shard is inside its reading a group
		// of single requests, which it then takes as one.
		items := reqs(1 + r.IntN(300))
		group := reqs(1 + r.IntN(maxGroup))
		b := &msg.Batch{Items: items, Out: make([]msg.Reply, len(items)), Done: make(chan int, 1)}
		require.NoError(t, mb.SendBatch(ctx, b))
		<-clk.ask
		singles := make([]*msg.Single, len(group))
		for j, it := range group {
			singles[j] = &msg.Single{Key: it.Key, Hash: it.Hash, Cost: it.Cost, Done: make(chan struct{}, 1)}
			require.NoError(t, mb.SendSingle(ctx, singles[j]))
		}
		clk.at <- now
		<-b.Done
		log = append(log, fmt.Sprintf("round %d: batch of %d at %d", round, len(items), now))
		for i, it := range items {
			check(fmt.Sprintf("round %d batch", round), i, it, b.Out[i], now)
		}
		clk.tick(now) // the group's reading
		for _, a := range singles {
			a.Wait(msg.WaitYields(1))
		}
		log = append(log, fmt.Sprintf("round %d: group of %d at %d", round, len(group), now))
		for j := len(group) - 1; j >= 0; j-- { // newest first
			check(fmt.Sprintf("round %d group", round), j, group[j], singles[j].Reply, now)
		}
		// Every key the round named, peeked at once: a decision made on a
		// copy of a bucket (a slot a rehash left behind) answers right but
		// leaves the bucket in the table as it was, which a refill would
		// soon hide.
		peeks, seen := singles[:0], map[string]bool{}
		for _, it := range append(items, group...) {
			if !seen[it.Key] {
				seen[it.Key] = true
				peeks = append(peeks, &msg.Single{Op: msg.OpPeek, Key: it.Key, Hash: it.Hash, Done: make(chan struct{}, 1)})
				require.NoError(t, mb.SendSingle(ctx, peeks[len(peeks)-1]))
			}
		}
		// The shard may take them in several groups, a reading each: peeks
		// change nothing, so any grouping answers the same.
		answered := make(chan struct{})
		go func() {
			for _, a := range peeks {
				a.Wait(msg.WaitYields(1))
			}
			close(answered)
		}()
		for waiting := true; waiting; {
			select {
			case <-clk.ask:
				clk.at <- now
			case <-answered:
				waiting = false
			}
		}
		for _, a := range peeks {
			d, err := m.Peek(now, a.Key)
			if want := (msg.Reply{Decision: d, Err: shardErr(err)}); !sameReply(want, a.Reply) {
				require.Equal(t, want, a.Reply, "round %d: the balance of %.40q after it", round, a.Key)
			}
		}
	}
	shut()
	require.Greater(t, next, maxKeys, "the last rounds met the key bound")
	require.Equal(t, m.KeyCount(), s.State().keyCount())
	for i := range next {
		k := key(i)
		var got msg.Reply
		s.State().peek(now, k, testHasher.Sum(k), &got)
		d, err := m.Peek(now, k)
		if want := (msg.Reply{Decision: d, Err: shardErr(err)}); !sameReply(want, got) {
			require.Equal(t, want, got, "final balance of %.40q", k)
		}
	}
}

// shardErr is the shard's error for the model's err.
func shardErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, model.ErrCostExceedsCapacity):
		return msg.ErrCostExceedsCapacity
	case errors.Is(err, model.ErrKeyCapacity):
		return msg.ErrKeyCapacity
	case errors.Is(err, model.ErrClockRegression):
		return msg.ErrClockRegression
	}
	return err
}

// sameReply compares two replies field by field (a Band by its name),
// without reflection: the test compares tens of thousands.
func sameReply(a, b msg.Reply) bool {
	x, y := a.Decision, b.Decision
	return a.Err == b.Err && x.Allowed == y.Allowed && x.Remaining == y.Remaining &&
		x.RetryAfter == y.RetryAfter && x.Version == y.Version && x.Limit == y.Limit &&
		x.ResetAfter == y.ResetAfter && x.Band.String() == y.Band.String()
}
