// Command stress drives a tokenshard engine hard and checks that it keeps
// its contract: it never mints a token, never loses one, and never leaks a
// goroutine. Run it under the race detector:
//
//	go run -race ./stress -duration 60s
//
// Four checks run side by side, each on its own engine. The first three
// draw policies with per-key overrides (exact keys and '*' patterns) as well
// as plain ones, with rates per second and Refill rates of awkward periods
// (7 per 3 s, 1 per day, 1 per math.MaxInt64 ns, math.MaxInt64 per 1 ns, 100
// per minute), and with one to three bands beside the primary; and they cut
// over between them, so keys move between limits and bands are added,
// dropped and reshaped:
//
//   - linearizability (-check linearize): concurrent histories of Allow,
//     AllowBatch, AllowAll, Refund, Peek, ReplacePolicy and EvictFull under a
//     Manual clock advanced in epochs, checked with porcupine against
//     internal/model, the sequential specification; plus a cross-key check
//     that versions never go back in real time;
//   - differential: random single-goroutine traces replayed on the engine and
//     on the model, every answer and error compared (AllowAll, Peek and
//     Refund too); a failure prints a minimal reproduction. With -redis
//     host:port the traces are replayed on the Redis store
//     (engine/redisstore) at that server instead of the engine, in the
//     configurations the two share (no key bound, a clock that never steps
//     back, no snapshots); -redis-cluster host:port,... does the same on a
//     Redis Cluster, without AllowAll (which takes keys of one virtual
//     shard there);
//   - conservation: many goroutines of Allow, AllowBatch and AllowAll over a
//     skewed key set under the real monotonic clock, while a coordinator cuts
//     over policies (stale attempts included) and sweeps; no key is ever
//     admitted more than the credit its policy history could have granted,
//     band by band: capacity + refill over any window, across cutovers;
//     and versions never go back in real time across callers: no call, a
//     Policy read among them, reports a version older than one a call
//     that returned before it started reported;
//   - flood: millions of distinct keys against a small MaxKeys: memory stays
//     bounded, existing keys keep their budgets, sweeps free only full buckets.
//
// Whichever checks run, once they have all ended, each having closed its
// engines and stores, no goroutine they started may still be running (the
// summary's goroutines row): nothing outlives Close.
//
// A fifth, -check durability, is a measurement, left out of -check all: it
// starts its own redis-servers (on -durability-port and the ports after
// -durability-cluster-port), kills them with SIGKILL, and reports the tokens
// a crash mints under each persistence setting and a failover mints on a
// cluster of three masters with one replica each, with and without
// redisstore.WaitForReplicas and with a replica -durability-lag behind:
//
//	go run ./stress -check durability
//
// A sixth, -check leases, is left out of -check all too, since it needs
// Redis: on the server -redis names, or on a redis-server it starts on a
// free port, four stores in lease mode (engine/redisstore's
// Config.Leases), each with its own client, decide at the server's TIME
// over hot keys (asked far above any rate) and warm keys (asked in
// bursts), while the policy is cut over every -cutover-every (at least
// 200ms), capacity and rate raised and lowered, and halfway one store is
// killed (its client closed, its leases lost). Before each cutover and at
// the end, every key's admissions, all stores' together, must be within
// what its bucket can have given out since it was created: its capacity
// then plus the refill, read on the server's TIME, plus for the warm keys,
// whose buckets may fill and expire, the capacity raises; so no lease and
// no cutover tops a key up past those bounds (the warm keys' is loose:
// what a lease that outlives a cutover can mint passes it, see leases.go).
// It reports the tokens each store leased, returned and forfeited:
//
//	go run ./stress -check leases -duration 10s
//
// It prints a progress line every second (a progress bar on a terminal) and a
// summary table, and exits with status 1 on the first violated invariant,
// explaining it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// options are the command's flags; the tests build them directly.
type options struct {
	duration     time.Duration
	workers      int
	keys         int
	shards       int
	maxKeys      int
	cutoverEvery time.Duration
	sweepEvery   time.Duration
	seed         uint64
	checks       []string
	redis        string // host:port: the differential check replays on a Redis store there
	redisCluster string // host:port,...: the same on a Redis Cluster
	dur          durOptions
}

// check is one independent invariant check. run works until ctx ends (or its
// own work is done) and returns nil, a *Violation, or an error that stopped
// it from checking anything.
type check struct {
	name string
	run  func(ctx context.Context, o options, c *counters) error
}

var checks = []check{
	{"linearizability", runLinearizability},
	{"differential", runDifferential},
	{"conservation", runConservation},
	{"flood", runFlood},
	{"durability", runDurability}, // not in "all": it starts redis-servers on fixed ports
	{"leases", runLeases},         // not in "all": it needs Redis (-redis, or a redis-server it starts)
}

// main runs the checks until -duration ends or an interrupt or SIGTERM
// comes. A signal ends them as the end of -duration does, so that they
// clean up (a Redis check deletes its keys, a redis-server started is
// stopped), and each check that ends after it is reported interrupted, not
// failed; then the command ends by that signal, as a shell expects of a
// program it interrupted, and so not with a failed check's status (a
// failure before it is in the report, and said again). That reaches the
// shell from a built binary (go build ./stress); go run reports a child's
// death by a signal as status 1. A second signal ends the process at once,
// by that signal, after killing the redis-servers the checks started
// (killChildren); their keys on a server the command was given stay.
func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	caught := make(chan os.Signal, 1)
	done, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case sig := <-sigs:
			fmt.Fprintf(os.Stderr, "stress: %v: the checks are ending, and cleaning up; a second signal ends the command at once\n", sig)
			caught <- sig
			cancel()
		case <-done:
			return
		}
		select {
		case sig := <-sigs:
			killChildren()
			fmt.Fprintf(os.Stderr, "stress: %v again: ended at once, before the checks cleaned up\n", sig)
			endBy(sig)
		case <-done:
		}
	}()
	status := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	signal.Stop(sigs) // from here a signal has its default effect
	close(done)
	<-watched
	select {
	case sig := <-caught:
		msg := "the checks ran for less than -duration"
		if status != 0 {
			msg += fmt.Sprintf(", and would have exited %d", status)
		}
		fmt.Fprintf(os.Stderr, "stress: interrupted by %v: %s\n", sig, msg)
		endBy(sig)
	default:
	}
	os.Exit(status)
}

// run parses args, runs the selected checks side by side, reports, and
// returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if err != nil {
		return 2
	}
	return runChecks(ctx, o, stdout)
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("stress", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var names string
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long to run")
	fs.IntVar(&o.workers, "workers", 16, "goroutines calling Allow and AllowBatch")
	fs.IntVar(&o.keys, "keys", 1000, "distinct keys in the skewed (Zipf) key set")
	fs.IntVar(&o.shards, "shards", 0, "engine shards (0 = GOMAXPROCS)")
	fs.IntVar(&o.maxKeys, "maxkeys", 100_000, "engine MaxKeys for the load checks")
	fs.DurationVar(&o.cutoverEvery, "cutover-every", 50*time.Millisecond, "period of ReplacePolicy attempts")
	fs.DurationVar(&o.sweepEvery, "sweep-every", 100*time.Millisecond, "period of EvictFull calls")
	fs.Uint64Var(&o.seed, "seed", 0, "random seed (0 = from the time; printed either way)")
	fs.StringVar(&names, "check", "all", "comma-separated checks: "+checkNames()+", or all")
	fs.StringVar(&o.redis, "redis", "", "Redis `host:port`: the differential check replays its traces on a Redis store there\n"+
		"instead of the engine (fresh key prefixes, deleted after each trace), and the leases check runs its stores there\n"+
		"instead of on a redis-server of its own; other checks still use engines")
	fs.StringVar(&o.redisCluster, "redis-cluster", "", "Redis Cluster masters `host:port,host:port,...`: as -redis, on a cluster")
	fs.IntVar(&o.dur.keys, "durability-keys", 1000, "durability: keys drained before a crash, and loaded through a failover")
	fs.IntVar(&o.dur.runs, "durability-runs", 5, "durability: failovers measured with and without WAIT, each on a fresh cluster (0 = none)")
	fs.IntVar(&o.dur.port, "durability-port", 6500, "durability: the port of the redis-server it crashes; its cluster's buses use the six from 10 above")
	fs.IntVar(&o.dur.clusterPort, "durability-cluster-port", 32001, "durability: the first of the six ports of its cluster, and a seventh after them for -durability-lag's proxy")
	fs.DurationVar(&o.dur.lag, "durability-lag", 10*time.Millisecond, "durability: failovers also measured with the killed master's replica this far behind (0 = not)")
	fs.DurationVar(&o.dur.nodeTimeout, "durability-node-timeout", time.Second, "durability: the cluster's cluster-node-timeout")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 { // flag parsing stops at it: the flags after it would be ignored
		err := fmt.Errorf("stress: unexpected argument %q: the checks are named with -check, and every flag goes before any other word", fs.Arg(0))
		fmt.Fprintln(stderr, err)
		return o, err
	}
	if o.seed == 0 {
		o.seed = uint64(time.Now().UnixNano())
	}
	switch {
	case o.duration <= 0, o.workers < 1, o.keys < 1, o.shards < 0, o.maxKeys < 1,
		o.cutoverEvery <= 0, o.sweepEvery <= 0, o.dur.runs < 0, o.dur.nodeTimeout <= 0, o.dur.lag < 0:
		err := fmt.Errorf("stress: -duration, -workers, -keys, -maxkeys, -cutover-every, -sweep-every and -durability-node-timeout must be positive, -shards, -durability-runs and -durability-lag >= 0")
		fmt.Fprintln(stderr, err)
		return o, err
	}
	add := func(n string) { // a check named twice runs once
		if !slices.Contains(o.checks, n) {
			o.checks = append(o.checks, n)
		}
	}
	for _, n := range strings.Split(names, ",") {
		n = strings.TrimSpace(n)
		if full, ok := checkAliases[n]; ok {
			n = full
		}
		if n == "all" { // beside the checks all leaves out, it adds to them
			for _, c := range checks {
				if c.name != "durability" && c.name != "leases" {
					add(c.name)
				}
			}
			continue
		}
		if !isCheck(n) {
			err := fmt.Errorf("stress: unknown check %q (have %s)", n, checkNames())
			fmt.Fprintln(stderr, err)
			return o, err
		}
		add(n)
	}
	if slices.Contains(o.checks, "durability") && (o.dur.port < 1 || o.dur.port+15 > 65535 || o.dur.clusterPort < 1 || o.dur.clusterPort+6 > 65535) {
		err := fmt.Errorf("stress: -durability-port must be in [1, 65520] (its cluster's buses are the six from 10 above it), -durability-cluster-port in [1, 65529] (six ports and a seventh for -durability-lag's proxy)")
		fmt.Fprintln(stderr, err)
		return o, err
	}
	if slices.Contains(o.checks, "durability") && o.dur.keys <= o.workers {
		err := fmt.Errorf("stress: -durability-keys must be more than -workers")
		fmt.Fprintln(stderr, err)
		return o, err
	}
	durationSet := false
	fs.Visit(func(f *flag.Flag) { durationSet = durationSet || f.Name == "duration" })
	if slices.Contains(o.checks, "durability") && !durationSet {
		o.duration = durDuration // it ends when its measurements are done
	}
	if o.redis != "" && o.redisCluster != "" {
		err := fmt.Errorf("stress: -redis and -redis-cluster exclude each other")
		fmt.Fprintln(stderr, err)
		return o, err
	}
	if strings.Contains(o.redis, ",") {
		err := fmt.Errorf("stress: -redis takes one host:port; give a cluster's masters to -redis-cluster")
		fmt.Fprintln(stderr, err)
		return o, err
	}
	if err := checkAddrs(o); err != nil {
		fmt.Fprintln(stderr, err)
		return o, err
	}
	if o.redis != "" && !slices.Contains(o.checks, "differential") && !slices.Contains(o.checks, "leases") {
		err := fmt.Errorf("stress: -redis applies only to the differential and leases checks; add -check differential or -check leases")
		fmt.Fprintln(stderr, err)
		return o, err
	}
	if o.redisCluster != "" && !slices.Contains(o.checks, "differential") {
		err := fmt.Errorf("stress: -redis-cluster applies only to the differential check; add -check differential")
		fmt.Fprintln(stderr, err)
		return o, err
	}
	return o, nil
}

// checkAddrs checks that -redis and every address of -redis-cluster is a
// host:port, the port a number in [1, 65535]: go-redis dials its default,
// 127.0.0.1:6379, for an empty one, a server the command was not given,
// and a port that is not a number fails only at the first dial, once the
// checks have started.
func checkAddrs(o options) error {
	check := func(flag, addr string) error {
		_, port, err := net.SplitHostPort(addr)
		if err != nil || port == "" {
			return fmt.Errorf("stress: %s: %q is not a host:port", flag, addr)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("stress: %s: %q is not a host:port: its port must be a number in [1, 65535]", flag, addr)
		}
		return nil
	}
	if o.redis != "" {
		if err := check("-redis", o.redis); err != nil {
			return err
		}
	}
	if o.redisCluster != "" {
		for _, a := range strings.Split(o.redisCluster, ",") {
			if err := check("-redis-cluster", a); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkAliases are other names -check takes.
var checkAliases = map[string]string{"linearize": "linearizability", "lin": "linearizability", "diff": "differential"}

func checkNames() string {
	var names []string
	for _, c := range checks {
		names = append(names, c.name)
	}
	return strings.Join(names, ", ")
}

func isCheck(name string) bool {
	return slices.ContainsFunc(checks, func(c check) bool { return c.name == name })
}
