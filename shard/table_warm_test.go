package shard

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// TestWarmHintsSurviveRehash: inserting between a warm and the lookups it
// hints (a batch creating keys) may rehash and move every slot; a warmed
// lookup must then find each key where it now is.
func TestWarmHintsSurviveRehash(t *testing.T) {
	tab := newTable(&testHasher)
	tab.maxGroups = 2
	var items []msg.Item
	for i := range 64 {
		k := fmt.Sprintf("k%d", i)
		h := testHasher.Sum(k)
		*tab.insert(h, k, false) = policy.Bucket{Tokens: int64(i)}
		items = append(items, msg.Item{Key: k, Hash: h})
	}
	tab.warm(items)
	for i := range 1000 {
		k := fmt.Sprintf("new%d", i)
		tab.insert(testHasher.Sum(k), k, false)
	}
	for i, it := range items {
		_, s := tab.segmentOf(it.Hash * mix)
		require.NotSame(t, tab.hints[i].seg, s, "the inserts rehashed %s's segment", it.Key)
	}
	for i, it := range items {
		b := tab.findWarmed(i, it.Hash, it.Key)
		require.NotNil(t, b, it.Key)
		require.Equal(t, int64(i), b.Tokens)
		require.Same(t, tab.find(it.Hash, it.Key), b, "the bucket in the table, not a copy left behind")
	}
	tab.unwarm()
	for _, hn := range tab.hints[:cap(tab.hints)] {
		require.Nil(t, hn.seg, "no segment kept alive")
	}
}

// TestFindWarmedAfterChanges: a warm's hints are only hints. Whatever the
// table does between a warm and its lookups (removes keys, the empty key
// among them, whose emptied slot reads as holding it; removes keys and
// creates them again; creates enough to split segments; shrinks a swept
// segment), and whichever item's hint a lookup is handed, findWarmed finds
// what find does.
func TestFindWarmedAfterChanges(t *testing.T) {
	e := testHasher.Sum("")
	tab := newTable(&testHasher)
	tab.insert(e, "", false)
	tab.warm([]msg.Item{{Key: "", Hash: e}})
	_, s := tab.segmentOf(e * mix)
	tab.remove(s, s.find(e*mix, ""))
	require.Nil(t, tab.findWarmed(0, e, ""), "the empty key, removed after it was warmed")
	tab.unwarm()

	key := func(i int) string {
		switch {
		case i == 0:
			return ""
		case i%11 == 0:
			return fmt.Sprintf("tenant:%d:user-too-long-to-inline", i) // in the arena
		case i%37 == 0:
			return strings.Repeat("L", longKey+i) // kept as its own string
		}
		return fmt.Sprintf("k%d", i)
	}
	const universe = 300
	for seed := uint64(1); seed <= 30; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			tab := newTable(&testHasher)
			tab.maxGroups = 1 + r.IntN(4)
			present := map[int]bool{}
			for i := range universe {
				if r.IntN(2) == 0 {
					tab.insert(testHasher.Sum(key(i)), key(i), false)
					present[i] = true
				}
			}
			for round := range 20 {
				items := []msg.Item{{Key: "", Hash: e}}
				for range 1 + r.IntN(40) {
					k := key(r.IntN(universe))
					items = append(items, msg.Item{Key: k, Hash: testHasher.Sum(k)})
				}
				tab.warm(items)
				for range r.IntN(60) {
					i := r.IntN(universe)
					k, h := key(i), testHasher.Sum(key(i))
					if !present[i] {
						tab.insert(h, k, false)
						present[i] = true
						continue
					}
					_, s := tab.segmentOf(h * mix)
					tab.remove(s, s.find(h*mix, k))
					delete(present, i)
					if r.IntN(2) == 0 {
						tab.shrink(s)
					}
					if r.IntN(3) == 0 {
						tab.insert(h, k, false) // created again, maybe elsewhere
						present[i] = true
					}
				}
				for i, it := range items {
					j := i
					if r.IntN(4) == 0 {
						j = r.IntN(len(items) + 1) // another item's hint, or none
					}
					require.Same(t, tab.find(it.Hash, it.Key), tab.findWarmed(j, it.Hash, it.Key),
						"round %d item %d (hint %d) %q", round, i, j, it.Key[:min(len(it.Key), 20)])
				}
				tab.unwarm()
			}
		})
	}
}
