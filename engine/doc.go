// Package engine is tokenshard's public API: a keyed token-bucket admission
// engine with exact integer arithmetic, a hard bound on tracked keys, and
// policy cutovers that give nobody free tokens.
//
// New starts one goroutine per shard. Allow and AllowBatch route each key by
// a per-engine seeded hash to the shard that owns it, and the shard decides
// inside its own goroutine at its own clock reading. ReplacePolicy and
// EvictFull go through a coordinator that serialises them. Close stops every
// goroutine the engine started.
//
// A single Allow costs one goroutine hand-off (send, decide, reply), so for
// throughput prefer AllowBatch: one message per shard carries many requests,
// decided at one clock reading.
//
// The sections below are the engine's contract. engine/admissiontest checks
// it against the Engine and against engine/redisstore's Store, whose package
// doc says where a store differs.
//
// # Units and refill
//
// A limit's rate is N tokens every P nanoseconds: TokensPerSecond n is N = n
// and P = 1s, exactly; Refill is any policy.Rate (policy.PerMinute(100) is
// 100 every minute). One token of that limit is P units, so the refill adds
// exactly N units per nanosecond; for a rate per second a token is
// policy.UnitsPerToken (1e9) units. A Policy is valid if and only if its
// Version and Capacity are at least 1 and it has exactly one rate:
// TokensPerSecond at least 1, or TokensPerSecond 0 and a Refill whose Tokens
// and Per are at least 1. Every such int64 is legal, up to math.MaxInt64. A
// cost is legal from 1 to the least capacity of the key's bands (below).
//
// A key's bucket is created full, by the first request decided for it (Peek
// and Refund create none). Before each decision the shard refills it to its
// clock reading now:
//
//	units = min(capacity*P, units + (now-last)*N)
//
// exactly, in 128-bit integers: no floating point, and no part of a token is
// ever rounded away.
//
// # Decisions
//
// A request for cost tokens is allowed if and only if units >= cost*P, and
// then takes cost*P units. A denial takes nothing and keeps the refilled
// balance, so fractional credit is never lost. The Decision describes the
// bucket after the request:
//
//	Remaining  = floor(units / P)
//	RetryAfter = ceil((cost*P - units) / N) ns if denied, else 0
//	ResetAfter = ceil((capacity*P - units) / N) ns, 0 when full
//
// with both durations saturated at math.MaxInt64. RetryAfter is an estimate,
// not a reservation: other callers may spend the tokens first.
//
// # Debts
//
// Charge takes tokens without a decision, for a cost known after the work:
// it may take a band below zero, down to minus its capacity (the rest is
// forgiven), and units is then negative, a debt. Every formula above holds
// as written: the refill repays the debt first, Remaining is negative,
// RetryAfter and ResetAfter count the time to repay it, a bucket in debt is
// not full and is never evicted, Refund repays it, a snapshot keeps it,
// and a cutover keeps it, clamped to the new floor (minus the new
// capacity) if that is shallower, a change of period rounding it toward
// more debt, never less.
//
// # Bands
//
// A key's limit may have more bands than its primary one (the Capacity and
// rate of its policy or override): the bands of policy.Policy.Bands, or of
// its override's Bands, up to policy.MaxBands of them. Each band is a bucket
// of its own capacity and rate, refilled as above, and all of them are
// decided at once: a request is allowed only if every band holds its cost,
// and then the cost is taken from every band; a denial takes nothing from
// any (each still refills to now). A cost above any band's capacity is
// ErrCostExceedsCapacity. RetryAfter is the time until every band holds the
// cost: the longest of the bands' waits. Decision.Band names the band that
// bound the decision, and Remaining, Limit and ResetAfter are that band's:
// on a denial the band with the longest wait (as reported: saturated, so
// waits past 292 years tie), when allowed the band with the fewest whole
// tokens left, ties going to the primary band and then to the bands in
// order. The primary band is named by its override's Name, or ""
// for the policy's own limit, so a key of one band always decides with Band
// "" or its override's Name. A key is full, for eviction, only when every
// band is full.
//
// # Errors
//
// One decision (an Allow, or one request of AllowBatch) fails with the first
// of these that applies, checked in this order by the caller:
//
//  1. ErrNotInitialized: the Engine is the zero Engine or nil.
//  2. ErrInvalidKey: the key is blank (strings.TrimSpace leaves nothing) or
//     longer than Config.MaxKeyBytes.
//  3. ErrInvalidCost: the cost is below 1.
//  4. ErrClosed: the engine is closed.
//  5. ErrNilContext for a nil context, else the context's error if it is
//     done (ErrClosed instead if Close has begun by then, wherever the call
//     finds the context done: before it sends, or while it waits).
//
// and then by the key's shard, at its clock reading:
//
//  6. ErrCostExceedsCapacity: the cost is above the key's own capacity
//     (with bands, the least band's). It wraps ErrInvalidCost, so errors.Is
//     matches either.
//  7. ErrClockRegression: the reading is earlier than the latest one the
//     shard has acted on.
//  8. ErrKeyCapacity: the key is not tracked and Config.MaxKeys keys are.
//
// An error changes nothing and comes with the zero Decision; a denial is a
// Decision, never an error. A call waiting for room in a full mailbox gets
// ErrClosed if the engine closes and the context's error if its context
// ends (ErrClosed if both); once a shard has taken the request, the call
// returns its answer whatever the context does. Peek, Refund and Charge
// follow the same order, less the steps that cannot apply to them; ReplacePolicy,
// EvictFull and Snapshot state their own.
//
// # Batches
//
// AllowBatch sends each shard one message with its part of the requests.
// Each shard decides its part in request order at one clock reading, so
// every result is what the same Allow calls made one by one, in that order,
// at that instant would give. Parts on different shards may be decided at
// different readings, and during a cutover under different versions; which
// of several new keys on different shards meet the key bound first is not
// specified.
//
// AllowBatch returns nil when every part reached its shard; a request's own
// error is then only in its result. Otherwise it returns ErrClosed,
// ErrNilContext or the context's error (so also when no request needed a
// shard), and writes that error into every result that was not decided.
// An out slice shorter than reqs is ErrInvalidConfig, and then nothing is
// decided.
//
// # Key bound and eviction
//
// At every instant at most Config.MaxKeys keys are tracked, by all shards
// together. A new key that finds the bound reached gets ErrKeyCapacity;
// tracked keys are still served. KeyCount never blocks, never exceeds
// MaxKeys, and counts exactly every creation and eviction whose call has
// returned.
//
// Eviction removes a bucket only if it is full at the clock reading that
// judges it, and a pass that completes removes every such bucket its shard
// held when the pass began; keys created meanwhile survive it. A depleted or
// partly refilled bucket is never removed, however old: a full bucket is
// what a new key would get, so dropping it changes no future answer under
// the policy in force. A cutover that raises a key's capacity is the one
// place where the two part: a bucket kept full keeps its tokens (raising a
// capacity tops nobody up), while a key dropped full comes back as any new
// key does, with the new capacity.
// Engine.EvictFull says how a pass is sliced and judged.
// Background sweeps evict by the same rule: every Config.SweepEvery, and,
// when a new key finds the bound reached, as pressure sweeps spaced as
// PressureSweepGap says. Engine.ReclaimAfter estimates when a slot will next
// be free.
//
// # Policy cutover
//
// Engine.ReplacePolicy is a compare-and-set on the version in force, in two
// phases: every shard takes its cutover reading and stops serving (prepare),
// then every shard switches (publish). Each bucket keeps what it earned
// under its key's old limit up to its shard's cutover reading, is clamped to
// the capacity its key resolves to under the new policy, and refills at the
// new limit from then on; raising a capacity tops nobody up. Bands are
// matched by name, the primary with the primary: a band keeps its balance
// the same way; where its period changes, the balance moves to the new unit
// rounding down (floor(units*Pnew/Pold): a cutover may lose part of a unit,
// never mint one), the only rounding anywhere; a band new in the policy
// starts full, so it only ever restricts; a band the policy no longer has is
// dropped. A band is known only by its name: renaming one is dropping it and
// adding another, which starts full, so keep a band's name to keep its
// balance. No caller sees the new version and then the old one, and every
// call that starts after ReplacePolicy returns sees the new version. A
// context that ends, or a Close that starts, before publish aborts the
// cutover everywhere; once publish has begun, the cutover completes.
// Restore applies the same rule to a snapshot taken under another policy.
//
// # Close
//
// Engine.Close answers every request a shard has already taken; every other
// request, and every later call, gets ErrClosed. Every Close, concurrent or
// later, returns only after every goroutine the engine started has exited.
// KeyCount, Policy, Stats and ReclaimAfter keep answering after Close.
//
// # Ownership
//
// Bucket state is read and written only by the shard goroutine that owns it
// (package shard); no lock guards it. The Engine itself holds immutable
// configuration, the shards' mailboxes, the atomic key budget that all shards
// share, the current policy (an atomic pointer written only by the coordinator
// while it holds the coordinator slot) and the pools of reusable messages. A
// pooled message belongs to exactly one call between Get and Put.
package engine
