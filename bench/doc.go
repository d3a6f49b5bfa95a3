// Command bench measures tokenshard side by side with what a service would
// use instead, in one run on one machine, and prints ratios to the best peer:
//
//	go run ./bench          # the full table, under 3 minutes
//	go run ./bench -quick   # a shorter run, under 30 seconds
//	go run ./bench -redis 127.0.0.1:6379 -parts redis   # only the Redis table
//
// Contenders: tokenshard Allow and AllowBatch (16, 64 and 128 per call);
// golang.org/x/time/rate in a map under one mutex and in 64 mutex shards,
// the latter also 64 keys per reading of the clock (AllowN(t, 1)), the
// peer of a batch;
// github.com/sethvargo/go-limiter's memorystore; and the floor, the policy
// arithmetic on a plain map from one goroutine with no synchronisation.
// Scenarios: one hot key, 100,000 keys uniform, 1,000,000 keys Zipf (s=1.1),
// and 100,000 keys whose one token each warm-up spent and the policy
// refills a minute later, so every request is denied; with 8 goroutines
// per core at GOMAXPROCS 1 and 2. Then retained heap per key at 1,000,000
// keys, the latency of a single Allow, and the longest admission stall
// while EvictFull, Snapshot and ReplacePolicy cover 1,000,000 keys.
//
// With -redis ADDR, a last table measures decisions per second through
// engine/redisstore on that Redis server (Allow, AllowBatch 16 and 128)
// beside redis_rate (its Allow, and its script pipelined 16 and 128 at a
// time) and the in-process engine on the same keys, at 1, 16 and 64
// goroutines, with the Redis CPU each spends per decision: about a minute
// on 2 cores, 30 seconds with -quick. It writes only under a fresh key
// prefix, deleted afterwards.
//
// With -parts envoyrls (only when named), a table measures ShouldRateLimit
// of engine/envoyrls's Envoy rate limit service, requests of one and of
// three limited descriptors, all admitted: over gRPC on loopback (grpc-go
// server and client, one connection, 1 and 64 concurrent calls), with
// requests per second and p50 and p99 latency, beside a server that always
// answers OK (the cost of gRPC alone), and called in process; on the engine
// and, with -redis or -redis-cluster, on redisstore. About 20 seconds, 5
// with -quick; it runs at the starting GOMAXPROCS, not -cpu's:
//
//	go run ./bench -parts envoyrls -redis 127.0.0.1:6379
//
// With -parts leases (only when named; it needs -redis or -redis-cluster,
// and says it was skipped without), tables measure engine/redisstore's
// leases (Config.Leases, at their defaults) as a service's replicas use
// them: in separate processes, this binary run again as its workers, each
// with its own limiter, all on one Redis and the same 16 keys, whose quota
// (capacity 2^40) is far above the demand, so every request is admitted.
// First the latency of one Allow from one goroutine per process (p50, p99,
// p99.9), at 1 and 4 processes, leased beside the in-process engine and
// the store without leases; then decisions per second of 4 processes of 16
// goroutines, leased, without leases, redis_rate and the engine, with the
// share decided locally, and the Redis CPU (INFO CPU) and script calls
// (INFO commandstats) per admitted decision over the same window; then
// whether each goal of leases is met: p50 within 2x the engine's and p99
// under 50 µs, 20x redis_rate's and 10x the store's decisions per second
// without leases, and at most 1/20 of its Redis CPU per admitted decision.
// About a minute (each cell the median of 3 rounds of a second), 5 seconds
// with -quick. With -cpuprofile PREFIX each worker writes a CPU profile of
// its window (the last round's):
//
//	go run ./bench -parts leases -redis 127.0.0.1:6379
//	go run ./bench -parts leases -redis 127.0.0.1:6379 -cpuprofile /tmp/lease
//	go tool pprof -top /tmp/lease.leased.4x16.0.pprof
//
// The same benchmark bodies run under `go test -bench . ./bench`, for
// benchstat.
//
// # Performance notes
//
// Some choices in the code rest on a measurement. The code says why in a
// line; the figures are here, each with the command that reproduces it.
// The decision-time figures come from interleaved runs before and after the
// change, compared with benchstat. All were taken on the machine the change
// was made on: rerun them before relying on them.
//
// A single call's wait (msg.WaitYields): on 2 cores, for one hot key, four
// yields before parking were 6-9% faster than two, and five 4% faster than
// four, with no difference for 100,000 keys; three were 13% slower than
// four; six and eight were no faster than five for one key, and eight 16%
// slower for 100,000 keys. Change the count WaitYields returns and run
//
//	go test -bench 'BenchmarkAllow$' -cpu 2 -count 10 ./engine
//
// What a single call's hand-off costs alone (BenchmarkHandoffFloor: the
// same callers pushing to an owner goroutine and yielding until it answers,
// nothing decided), beside the hot key's rows, six interleaved rounds,
// benchstat medians: on 1 core 119 ns, 1.19x go-limiter's whole decision
// (100 ns), tokenshard's Allow 289 ns; on 2 cores 228 ns, 1.37x (166 ns),
// Allow 257 ns. On 1 core the caller's and the shard's work add up to the
// hand-off, where on 2 they overlap; no owner goroutine comes within 1.5x
// of a mutex there with much more than 30 ns of work per call.
//
//	go test -run '^$' -bench 'HandoffFloor|Decide/scenario=hot/contender=(tokenshard_Allow|go-limiter_memorystore)$' -cpu 1,2 -count 6 ./bench
//
// A batch call's wait (msg.AwaitPart), against blocking at once: on 2
// cores, AllowBatch of 16 took 9 to 21% less time per decision (one hot
// key, 100,000 uniform keys, 1,000,000 Zipf keys) and of 128 16% less on
// the hot key and 6% less on the Zipf keys, though a noisier set of runs
// showed no significant change at 2 cores; on 1 core, batches of 16 took 6
// to 12% less, and of 128 no less. With the counts of WaitYields, 5 yields
// on 2 cores were as fast as 10 on every row, and 5% faster than 2 on one
// of four:
//
//	go test -bench 'BenchmarkDecide/./contender=tokenshard_AllowBatch_(16|128)$' -cpu 1,2 -count 10 ./bench
//
// Clearing a batch call's answers before the call is pooled again, although
// the shard overwrites them (engine's batchCall.reset): without the clear,
// AllowBatch of 128 on 2 cores took 58% longer on the hot key and 6% longer
// on Zipf keys, over 8 pairs of runs:
//
//	go test -bench 'BenchmarkDecide/scenario=(hot|zipf)/contender=tokenshard_AllowBatch_128$' -cpu 2 -count 8 ./bench
//
// Yielding on the processor's own run queue (package internal/yield): with
// runtime.Gosched in Local's place and nothing else changed, a single Allow
// took 21-24% longer on 1 core and about twice as long on 2 (hot and Zipf
// keys), in interleaved runs; -tags purego shows the same on the Allow rows:
//
//	go test -run '^$' -bench 'BenchmarkDecide/scenario=(hot|zipf)/contender=tokenshard_Allow$' -cpu 1,2 -count 10 ./bench
//
// The runtime's seeded hash for keys, linked to (shard's Hasher):
// hash/maphash.String reaches the same hash about 1.1 ns later per key, and
// with Sum swapped for it, hot-key AllowBatch of 16 and 128 on 1 core took
// 5-8% longer per decision (3-5% in a third set, 4% on Zipf keys at 128),
// with no difference on Allow; xxhash seeded with the seed (-tags
// purego) takes about twice as long per key:
//
//	go test -run '^$' -bench BenchmarkHash -cpu 1 -count 10 ./shard
//	go test -run '^$' -bench 'BenchmarkDecide/scenario=(hot|zipf)/contender=tokenshard_AllowBatch_(16|128)$' -cpu 1 -count 10 ./bench
//
// Serving data, or yielding, between slices of background work such as
// snapshot chunks (package shard, Shard.turn's steps 3 to 5): without it,
// on one core the snapshot writer and the shard handed the core to each
// other chunk after chunk while callers waited 90 ms (the Snapshot row of
// the stall table):
//
//	go run ./bench -parts latency -cpu 1
//
// Serving waiting data after every cutover (Shard.turn's step 2): without
// it, 70 cutovers in a row held a request up for half a second (the
// ReplacePolicy x70 row of the same table):
//
//	go run ./bench -parts latency
//
// How many script calls of single Allows redisstore keeps in flight per
// destination (maxInFlight in engine/redisstore/combine.go), in interleaved
// rounds of the 16-goroutine cells of the Redis table (a probe built on
// this package's Redis runners: one-second rounds, the store's and
// redis_rate's alternating, three of each, medians; whole runs of the
// command below came out higher on the hot key), one Redis sharing the 2
// cores: 2 calls gave 1.42-1.47x redis_rate's decisions per second
// on a hot key and 1.23-1.27x on 100,000 keys, with 0.60x its Redis CPU
// per decision there; 3 were within noise of 2 (1.37-1.42x, 1.25-1.29x)
// for 0.65-0.66x the CPU, as each call carries fewer requests (5.2 against
// 7.5). Before drainers yielded (below), 4 reached 1.00-1.01x on 100,000
// keys for 0.87-0.89x the CPU, 6 were slower, and 1 made calls of 8
// requests but was 0.71-0.77x as fast there.
//
// A drainer yielding to the callers it has just answered before it takes
// its next batch (drain in the same file): without the yield the callers
// ran only after the next call had left, and at 16 goroutines calls
// carried 4.9-5.1 requests, nearly half of the calls a caller's lone
// request; with it, 7.5-7.6. In interleaved rounds like those above,
// without it: 1.07-1.08x on the hot key and 0.96-1.00x on 100,000 keys;
// with runtime.Gosched in place of the yield on the processor's own run
// queue (what -tags purego builds), 1.25-1.32x and 1.12-1.15x; as built,
// 1.33-1.43x and 1.13-1.28x. Change the code and run
//
//	go run ./bench -redis ADDR -parts redis
package main
