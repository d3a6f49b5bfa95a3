package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// onBoth runs f on the shared server and on the shared cluster, each given
// as the address realStores takes.
func onBoth(t *testing.T, f func(t *testing.T, addr string)) {
	t.Run("one server", func(t *testing.T) { f(t, redisAddr(t)) })
	t.Run("cluster", func(t *testing.T) { f(t, clusterAddr(t)) })
}

// keymapPolicy refills a token an hour: a bucket a test drains must still
// be drained when a later store, opened since, finds it, however long a
// loaded machine takes to open it.
var keymapPolicy = policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerHour(1)}

// sameMapping fails unless a and b put each of n keys in the same shard.
func sameMapping(t *testing.T, a, b *redisstore.Store, n int) {
	t.Helper()
	for i := range n {
		k := fmt.Sprint("key:", i)
		require.Equal(t, redisstore.ShardOfStore(a, k), redisstore.ShardOfStore(b, k), "key %q", k)
	}
}

// TestKeyMapSharedByStores: stores opened at once on a fresh prefix all
// adopt the one seed the first stored, with the prefix's policy, and so
// map every key alike and share its bucket; a store opened later, after
// the others closed, reads the same seed (it survives a restart).
func TestKeyMapSharedByStores(t *testing.T) {
	onBoth(t, func(t *testing.T, addr string) {
		ctx := context.Background()
		p := prefix(t)
		stores := make([]*redisstore.Store, 6)
		var wg sync.WaitGroup
		for i := range stores {
			wg.Go(func() {
				s, err := redisstore.New(ctx, redisstore.Config{Client: anyClient(t, addr), Prefix: p, Policy: keymapPolicy, Timeout: slowMachine})
				if err != nil {
					t.Error(err)
					return
				}
				stores[i] = s
				if err := redisstore.Up(s); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		t.Cleanup(func() { cleanPrefix(anyClient(t, addr), p) })
		if t.Failed() {
			return
		}
		seed := redisstore.Seed(stores[0])
		require.Len(t, seed, 32, "16 bytes in hex")
		require.Equal(t, seed, anyClient(t, addr).HGet(ctx, redisstore.GlobalKey(p, "policy"), "seed").Val(), "the seed is stored with the prefix's policy")
		for _, s := range stores[1:] {
			require.Equal(t, seed, redisstore.Seed(s))
			sameMapping(t, stores[0], s, 1000)
		}

		d, err := stores[0].Allow(ctx, "k", 10)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		for _, s := range stores {
			require.NoError(t, s.Close())
		}
		later := realStores(t, addr, 1, redisstore.Config{Prefix: p, Policy: keymapPolicy})[0]
		require.Equal(t, seed, redisstore.Seed(later), "the seed survives a restart")
		sameMapping(t, stores[0], later, 1000)
		d, err = later.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.False(t, d.Allowed, "the later store finds the bucket the first drained")
	})
}

// TestKeyMapPerPrefix: two prefixes draw seeds of their own, and so place
// keys differently: any one key lands in the same shard by chance (1 in
// 16), so 1000 keys agree about 63 times; 200 is beyond any chance.
func TestKeyMapPerPrefix(t *testing.T) {
	onBoth(t, func(t *testing.T, addr string) {
		a := realStores(t, addr, 1, redisstore.Config{Policy: keymapPolicy})[0]
		b := realStores(t, addr, 1, redisstore.Config{Policy: keymapPolicy})[0]
		require.NotEqual(t, redisstore.Seed(a), redisstore.Seed(b))
		same := 0
		for i := range 1000 {
			k := fmt.Sprint("key:", i)
			if redisstore.ShardOfStore(a, k) == redisstore.ShardOfStore(b, k) {
				same++
			}
		}
		require.Less(t, same, 200, "two prefixes agree on %d of 1000 keys", same)
	})
}

// fnvShard is the unseeded mapping this package used before key maps:
// FNV-1a of the key's hash tag modulo n, which anyone can compute.
func fnvShard(key string, n int) int {
	t := key
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			t = key[i+1 : i+1+j]
		}
	}
	h := uint32(2166136261)
	for i := 0; i < len(t); i++ {
		h ^= uint32(t[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// TestClusterChosenKeysSpread: keys found by brute force to share one shard
// (so one master) under the unseeded hash land in every shard and on every
// master under a prefix's seed, and a batch of them writes buckets on
// every master.
func TestClusterChosenKeysSpread(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	p := prefix(t)
	s := realStores(t, strings.Join(addrs, ","), 1, redisstore.Config{Prefix: p, Policy: keymapPolicy})[0]
	var keys []string
	for i := 0; len(keys) < 480; i++ {
		if k := fmt.Sprint("attacker:", i); fnvShard(k, redisstore.DefaultVirtualShards) == 0 {
			keys = append(keys, k)
		}
	}
	per := make([]int, redisstore.DefaultVirtualShards)
	for _, k := range keys {
		per[redisstore.ShardOfStore(s, k)]++
	}
	for i, n := range per {
		require.NotZero(t, n, "shard %d holds none of the keys (per shard: %v)", i, per)
	}
	reqs := make([]engine.Request, len(keys))
	for i, k := range keys {
		reqs[i] = engine.Request{Key: k, Cost: 1}
	}
	out := make([]engine.Result, len(reqs))
	require.NoError(t, s.AllowBatch(context.Background(), reqs, out))
	owner := slotOwners(t, clusterClient(t, addrs))
	masters := map[string]int{}
	for i, k := range keys {
		require.NoError(t, out[i].Err)
		require.True(t, out[i].Decision.Allowed)
		masters[owner(redisstore.BucketKey(p, k))]++
	}
	require.Len(t, masters, redistest.ClusterMasters, "buckets per master: %v", masters)
}

// TestClusterKeyMapSurvivesGlobalLoss: the global keys lost (their master
// restarted empty) while the shards survive on the others: a new store
// reinstalls them with the seed the shards' copies hold, not one of its
// own, so the surviving buckets keep their shards. Every shard holds a
// copy of the seed.
func TestClusterKeyMapSurvivesGlobalLoss(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	ctx := context.Background()
	addr := strings.Join(addrs, ",")
	p := prefix(t)
	first := realStores(t, addr, 1, redisstore.Config{Prefix: p, Policy: keymapPolicy})[0]
	seed := redisstore.Seed(first)
	cc := clusterClient(t, addrs)
	policies, _, _ := redisstore.ShardStateKeys(p)
	for i, k := range policies {
		require.Equal(t, seed, cc.HGet(ctx, k, "seed").Val(), "shard %d's copy", i)
	}
	d, err := first.Allow(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.NoError(t, first.Close())

	for _, name := range []string{"policy", "history", "blobs"} {
		require.NoError(t, cc.Del(ctx, redisstore.GlobalKey(p, name)).Err())
	}
	again := realStores(t, addr, 1, redisstore.Config{Prefix: p, Policy: keymapPolicy})[0]
	require.Equal(t, seed, redisstore.Seed(again), "the seed of the shards' copies")
	require.Equal(t, seed, cc.HGet(ctx, redisstore.GlobalKey(p, "policy"), "seed").Val())
	d, err = again.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed, "the drained bucket is found in its shard")
}

// TestIgnoreKeyTags: a prefix that ignores tags places a key by all its
// bytes, so a client that writes one tag into its keys spreads over the
// shards; on a cluster AllowAll over keys in two shards is ErrCrossShard,
// on one server it decides them as one. The setting is stored with the
// prefix, and a store that sets it otherwise is refused, either way.
func TestIgnoreKeyTags(t *testing.T) {
	onBoth(t, func(t *testing.T, addr string) {
		ctx := context.Background()
		p := prefix(t)
		s := realStores(t, addr, 1, redisstore.Config{Prefix: p, Policy: keymapPolicy, IgnoreKeyTags: true})[0]
		require.Equal(t, "0", anyClient(t, addr).HGet(ctx, redisstore.GlobalKey(p, "policy"), "tags").Val())
		seen := map[int]bool{}
		a, b := "{victim}0", ""
		for i := range 400 {
			k := fmt.Sprint("{victim}", i)
			sh := redisstore.ShardOfStore(s, k)
			seen[sh] = true
			if b == "" && sh != redisstore.ShardOfStore(s, a) {
				b = k
			}
		}
		require.Len(t, seen, redisstore.DefaultVirtualShards, "keys of one tag spread over every shard")

		reqs := []engine.Request{{Key: a, Cost: 1}, {Key: b, Cost: 1}}
		d, i, err := s.AllowAll(ctx, reqs)
		if strings.Contains(addr, ",") {
			require.ErrorIs(t, err, redisstore.ErrCrossShard)
			require.Equal(t, 1, i)
		} else {
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}

		// a slow New would start degraded, with no error (see TestIgnoreKeyTagsRace)
		_, err = redisstore.New(ctx, redisstore.Config{Client: anyClient(t, addr), Prefix: p, Policy: keymapPolicy, Timeout: slowMachine})
		require.ErrorIs(t, err, redisstore.ErrKeyTags, "a store that honours tags on a prefix that ignores them")
		q := prefix(t)
		realStores(t, addr, 1, redisstore.Config{Prefix: q, Policy: keymapPolicy})
		require.Equal(t, "1", anyClient(t, addr).HGet(ctx, redisstore.GlobalKey(q, "policy"), "tags").Val())
		_, err = redisstore.New(ctx, redisstore.Config{Client: anyClient(t, addr), Prefix: q, Policy: keymapPolicy, IgnoreKeyTags: true, Timeout: slowMachine})
		require.ErrorIs(t, err, redisstore.ErrKeyTags, "a store that ignores tags on a prefix that honours them")
	})
}

// TestKeyMapAdoptedAfterLoss: Redis loses the prefix's state (a restart
// without persistence), and a store started then sets the prefix up anew
// with a seed of its own before a running store has called again. The
// running store's next call is refused by the shard it meets (its seed is
// not the shard's), adopts the prefix's key map and is sent again under
// it: every key keeps one bucket, so the two stores together admit its
// capacity, not twice it. The clock stands still.
func TestKeyMapAdoptedAfterLoss(t *testing.T) {
	onBoth(t, func(t *testing.T, addr string) {
		ctx := context.Background()
		p := prefix(t)
		pol := policy.Policy{Version: 1, Capacity: 8, TokensPerSecond: 1}
		clk := clock.NewManual(0)
		cfg := redisstore.Config{Prefix: p, Policy: pol, Clock: clk}
		old := realStores(t, addr, 1, cfg)[0]
		_, err := old.Allow(ctx, "warm", 1)
		require.NoError(t, err)
		cleanPrefix(anyClient(t, addr), p) // the loss
		fresh := realStores(t, addr, 1, cfg)[0]
		require.NotEqual(t, redisstore.Seed(old), redisstore.Seed(fresh), "the new store drew its own seed")

		const keys = 64
		for i := range keys {
			k := fmt.Sprint("key:", i)
			admitted := 0
			for _, s := range []*redisstore.Store{old, fresh, old, fresh} {
				for {
					d, err := s.Allow(ctx, k, 1)
					require.NoError(t, err)
					if !d.Allowed {
						break
					}
					admitted++
				}
			}
			require.Equal(t, int(pol.Capacity), admitted, "key %q: one bucket, shared", k)
		}
		require.Equal(t, redisstore.Seed(fresh), redisstore.Seed(old), "the running store adopted the prefix's map")
		sameMapping(t, old, fresh, 1000)
	})
}

// adoptedBeside is a store on a prefix that Redis then lost, and a store
// started after the loss, which set the prefix up anew with a seed of its
// own; the first has made no call since. The clock stands still.
func adoptedBeside(t *testing.T, addr string, pol policy.Policy) (old, fresh *redisstore.Store, p string) {
	t.Helper()
	p = prefix(t)
	cfg := redisstore.Config{Prefix: p, Policy: pol, Clock: clock.NewManual(0)}
	old = realStores(t, addr, 1, cfg)[0]
	_, err := old.Allow(context.Background(), "warm", 1)
	require.NoError(t, err)
	cleanPrefix(anyClient(t, addr), p) // the loss
	fresh = realStores(t, addr, 1, cfg)[0]
	require.NotEqual(t, redisstore.Seed(old), redisstore.Seed(fresh))
	return old, fresh, p
}

// TestKeyMapAdoptedAllOrNothing: on a cluster, an AllowAll over keys that
// share a virtual shard under the running store's old key map, but not
// under the prefix's, adopts the prefix's map and is ErrCrossShard, as a
// call under that map is; it takes nothing from any key.
func TestKeyMapAdoptedAllOrNothing(t *testing.T) {
	addr := clusterAddr(t)
	ctx := context.Background()
	pol := policy.Policy{Version: 1, Capacity: 8, TokensPerSecond: 1}
	old, fresh, _ := adoptedBeside(t, addr, pol)
	x, y := "x", ""
	for i := 0; y == ""; i++ {
		if k := fmt.Sprint("y", i); redisstore.ShardOfStore(old, x) == redisstore.ShardOfStore(old, k) &&
			redisstore.ShardOfStore(fresh, x) != redisstore.ShardOfStore(fresh, k) {
			y = k
		}
	}
	_, at, err := old.AllowAll(ctx, []engine.Request{{Key: x, Cost: 1}, {Key: y, Cost: 1}})
	require.ErrorIs(t, err, redisstore.ErrCrossShard)
	require.Equal(t, 1, at)
	require.Equal(t, redisstore.Seed(fresh), redisstore.Seed(old), "adopted")
	for _, k := range []string{x, y} {
		d, err := fresh.Peek(ctx, k)
		require.NoError(t, err)
		require.Equal(t, pol.Capacity, d.Remaining, "nothing taken from %q", k)
	}
}

// TestKeyMapStaleStoreReinstallsShardsMap: a running store that has not
// yet adopted the prefix's new key map meets the loss of the global keys
// alone (on a cluster, their master restarted empty): it reinstalls them
// with the map the surviving shards hold, not its own, and adopts it, so a
// bucket drained under that map is found.
func TestKeyMapStaleStoreReinstallsShardsMap(t *testing.T) {
	addr := clusterAddr(t)
	ctx := context.Background()
	pol := policy.Policy{Version: 1, Capacity: 8, TokensPerSecond: 1}
	old, fresh, p := adoptedBeside(t, addr, pol)
	d, err := fresh.Allow(ctx, "k", pol.Capacity)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	cc := anyClient(t, addr)
	for _, name := range []string{"policy", "history", "blobs"} {
		require.NoError(t, cc.Del(ctx, redisstore.GlobalKey(p, name)).Err())
	}
	d, err = old.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed, "k's drained bucket is found")
	require.Equal(t, redisstore.Seed(fresh), cc.HGet(ctx, redisstore.GlobalKey(p, "policy"), "seed").Val())
	require.Equal(t, redisstore.Seed(fresh), redisstore.Seed(old))
}

// TestKeyMapAdoptedUnderLoad: many callers of a running store meet the
// prefix's new key map at once (single Allows through the combiner, and
// batches), with leases on or off: none is answered by the failure rule,
// and no key admits more than its capacity between the two stores.
func TestKeyMapAdoptedUnderLoad(t *testing.T) {
	for _, leases := range []bool{false, true} {
		t.Run(fmt.Sprint("leases=", leases), func(t *testing.T) {
			addr := redisAddr(t)
			ctx := context.Background()
			p := prefix(t)
			pol := policy.Policy{Version: 1, Capacity: 20, TokensPerSecond: 1}
			// A Timeout no loaded machine reaches: a call the store failed to
			// send again under the new map is answered by the failure rule
			// at once, and one that looped would still end by it.
			cfg := redisstore.Config{Prefix: p, Policy: pol, Clock: clock.NewManual(0), Timeout: slowMachine}
			if leases {
				cfg.Leases = &redisstore.Leases{}
			}
			old := realStores(t, addr, 1, cfg)[0]
			_, err := old.Allow(ctx, "warm", 1)
			require.NoError(t, err)
			cleanPrefix(anyClient(t, addr), p)
			fresh := realStores(t, addr, 1, cfg)[0]
			const keys = 16
			var mu sync.Mutex
			admitted := map[string]int64{}
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					for r := range 40 {
						k := fmt.Sprint("key:", (g+r)%keys)
						s := old
						if r%3 == 0 {
							s = fresh
						}
						if g%2 == 0 {
							d, err := s.Allow(ctx, k, 1)
							if err != nil || d.Degraded {
								t.Errorf("Allow: %+v %v", d, err)
								return
							}
							if d.Allowed {
								mu.Lock()
								admitted[k]++
								mu.Unlock()
							}
						} else {
							out := make([]engine.Result, 2)
							k2 := fmt.Sprint("key:", (g+r+5)%keys)
							if err := s.AllowBatch(ctx, []engine.Request{{Key: k, Cost: 1}, {Key: k2, Cost: 1}}, out); err != nil {
								t.Errorf("AllowBatch: %v", err)
								return
							}
							for i, kk := range []string{k, k2} {
								if out[i].Err != nil || out[i].Decision.Degraded {
									t.Errorf("AllowBatch %d: %+v", i, out[i])
									return
								}
								if out[i].Decision.Allowed {
									mu.Lock()
									admitted[kk]++
									mu.Unlock()
								}
							}
						}
					}
				})
			}
			wg.Wait()
			require.Equal(t, redisstore.Seed(fresh), redisstore.Seed(old))
			for k, n := range admitted {
				require.LessOrEqual(t, n, pol.Capacity, "key %q", k)
			}
		})
	}
}

// TestKeyMapShardCopyWithoutSeed: a shard's policy hash with a version and
// no copy of the key map (as a cutover's prepare writes a shard whose
// master lost it) costs a call a round, in which the store writes the
// copy: no call is answered by the failure rule.
func TestKeyMapShardCopyWithoutSeed(t *testing.T) {
	onBoth(t, func(t *testing.T, addr string) {
		ctx := context.Background()
		p := prefix(t)
		s := realStores(t, addr, 1, redisstore.Config{Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 8, TokensPerSecond: 1}})[0]
		cc := anyClient(t, addr)
		policies, _, _ := redisstore.ShardStateKeys(p)
		for _, k := range policies {
			require.NoError(t, cc.HDel(ctx, k, "seed", "tags").Err())
		}
		read := map[int]bool{} // the shards whose copies the calls read: on one server, shard 0's alone
		for i := range 40 {
			k := fmt.Sprint("k", i)
			d, err := s.Allow(ctx, k, 1)
			require.NoError(t, err)
			require.False(t, d.Degraded)
			if strings.Contains(addr, ",") {
				read[redisstore.ShardOfStore(s, k)] = true
			} else {
				read[0] = true
			}
		}
		for i := range read {
			require.Equal(t, redisstore.Seed(s), cc.HGet(ctx, policies[i], "seed").Val(), "shard %d's copy is written again", i)
		}
	})
}

// TestIgnoreKeyTagsRace: stores opened at once on a fresh prefix, half of
// them set to ignore tags, agree on the one setting the first stored: every
// store of that setting opens, and every store of the other fails with
// ErrKeyTags, never a store placing keys by a setting the prefix does not
// hold.
func TestIgnoreKeyTagsRace(t *testing.T) {
	onBoth(t, func(t *testing.T, addr string) {
		for range 5 {
			p := prefix(t)
			t.Cleanup(func() { cleanPrefix(anyClient(t, addr), p) })
			errs := make([]error, 8)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Go(func() {
					// A slow New would start degraded, with no error and no
					// setting checked: 5 s, as newStore gives, on a loaded
					// machine; a Peek proves it reached Redis (a degraded
					// one is ErrNotReady, which the check below refuses).
					s, err := redisstore.New(context.Background(), redisstore.Config{Client: anyClient(t, addr), Prefix: p, Policy: keymapPolicy, IgnoreKeyTags: i%2 == 0, Timeout: 5 * time.Second})
					if err == nil {
						t.Cleanup(func() { _ = s.Close() })
						_, err = s.Peek(context.Background(), "k")
					}
					errs[i] = err
				})
			}
			wg.Wait()
			opened := map[bool]int{}
			for i, err := range errs {
				if err == nil {
					opened[i%2 == 0]++
					continue
				}
				require.ErrorIs(t, err, redisstore.ErrKeyTags, "store %d", i)
			}
			require.Len(t, opened, 1, "stores of both settings opened on one prefix: %v", opened)
			for _, n := range opened {
				require.Equal(t, len(errs)/2, n)
			}
		}
	})
}
