package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

type stopRedis struct{ m *testing.M }

func (s stopRedis) Run() int { defer redistest.Stop(); return s.m.Run() }

// asCommand, set in a process's environment, makes the test binary the
// command itself (see process_test.go).
const asCommand = "TOKENSHARD_RLS_TEST_AS_COMMAND"

func TestMain(m *testing.M) {
	if os.Getenv(asCommand) == "1" {
		main()
		os.Exit(0)
	}
	_ = os.Unsetenv(passwordEnv) // the tests give the password they mean to
	goleak.VerifyTestMain(stopRedis{m})
}

var prefixes atomic.Int64

// storeOn returns a suite factory of Redis stores on client, each on a
// prefix of its own, whose keys it deletes when the test ends.
func storeOn(client func(t *testing.T) redis.UniversalClient) rlstest.Factory {
	return func(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
		t.Helper()
		c := client(t)
		prefix := fmt.Sprintf("envoyrls-test:%d:%d:", time.Now().UnixNano(), prefixes.Add(1))
		deleteKeys(t, c, prefix) // after the store's Close (cleanups run last first), which may write
		s, err := redisstore.New(context.Background(), redisstore.Config{Client: c, Prefix: prefix, Policy: p, Clock: clk, Timeout: answersTimeout})
		if err != nil {
			t.Fatalf("redisstore.New: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
}

// earlierDeployment makes a fresh prefix, named from name, on the test
// Redis, and a store on it that has installed the policy of another
// configuration (rlstest.TreeYAML's, version 1), as an earlier deployment
// would have; it returns the server's address, the prefix and that store.
func earlierDeployment(t *testing.T, name string) (addr, prefix string, store *redisstore.Store) {
	t.Helper()
	addr = redistest.Addr(t)
	prefix = name + ":" + time.Now().Format("150405.000000000") + ":"
	old, err := envoyrls.Policy(1, rlstest.Parse(t, rlstest.TreeYAML)...)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	deleteKeys(t, client, prefix)
	store, err = redisstore.New(context.Background(), redisstore.Config{Client: client, Prefix: prefix, Policy: old, Timeout: answersTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return addr, prefix, store
}

// deleteKeys deletes every key under prefix when t ends (registered before
// the client's own cleanup, so it runs first).
func deleteKeys(t *testing.T, c redis.UniversalClient, prefix string) {
	t.Cleanup(func() {
		ctx := context.Background()
		del := func(ctx context.Context, node *redis.Client) error {
			iter := node.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for key := range iter.Vals(ctx) {
				node.Del(ctx, key)
			}
			return iter.Err()
		}
		var err error
		if cc, ok := c.(*redis.ClusterClient); ok {
			err = cc.ForEachMaster(ctx, del)
		} else {
			err = del(ctx, c.(*redis.Client))
		}
		if err != nil {
			t.Errorf("deleting the test's keys: %v", err)
		}
	})
}

// singleStore and clusterStore are suite factories of Redis stores on the
// shared server and on the cluster, each on a prefix of its own.
var (
	singleStore = storeOn(func(t *testing.T) redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		return c
	})
	clusterStore = storeOn(func(t *testing.T) redis.UniversalClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		return c
	})
)

func TestSuiteRedis(t *testing.T) {
	rlstest.Run(t, singleStore)
}

func TestSuiteRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a Redis Cluster: not in -short")
	}
	rlstest.Run(t, clusterStore)
}

// TestRedisDownIsAnError: when Redis cannot answer, the RLS answers with a
// gRPC error, so that Envoy's failure mode decides, never with the store's
// fail-closed denial or fail-open admission.
func TestRedisDownIsAnError(t *testing.T) {
	srv := redistest.Start(t)
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("FailOpen=%v", failOpen), func(t *testing.T) {
			factory := func(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
				c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
				t.Cleanup(func() { _ = c.Close() })
				s, err := redisstore.New(context.Background(), redisstore.Config{
					Client: c, Policy: p, Clock: clk, FailOpen: failOpen, Timeout: answersTimeout, // Redis down refuses within go-redis's dial retries
					Prefix: fmt.Sprintf("down:%d:", prefixes.Add(1)),
				})
				if err != nil {
					t.Fatalf("redisstore.New: %v", err)
				}
				t.Cleanup(func() { _ = s.Close() })
				return s
			}
			h := rlstest.Start(t, factory, rlstest.TreeYAML)
			resp := h.Ask(rlstest.Req("storefront", 0, rlstest.D("region=x"), rlstest.D("export=y")))
			if resp.OverallCode != rlstest.OK {
				t.Fatalf("with Redis up: %v", resp)
			}
			srv.Kill()
			defer srv.Restart(t)
			_, err := h.Client.ShouldRateLimit(context.Background(), rlstest.Req("storefront", 0, rlstest.D("region=x"), rlstest.D("export=z")))
			if status.Code(err) != codes.Unavailable {
				t.Errorf("two descriptors, Redis down: %v, want Unavailable", err)
			}
			_, err = h.Client.ShouldRateLimit(context.Background(), rlstest.Req("storefront", 0, rlstest.D("region=x")))
			if status.Code(err) != codes.Unavailable {
				t.Errorf("one descriptor, Redis down: %v, want Unavailable", err)
			}
		})
	}
}

// TestReplicasReload: two servers on one Redis prefix, as two replicas of the
// command. After the first reloads, the second, whose store has not met the
// new version, reloads the same files without a cutover of its own, and both
// decide from one bucket under the new limit.
func TestReplicasReload(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := fmt.Sprintf("envoyrls-replicas:%d:", time.Now().UnixNano())
	cleaner := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = cleaner.Close() })
	deleteKeys(t, cleaner, prefix)
	shared := func(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
		t.Helper()
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.New(context.Background(), redisstore.Config{Client: c, Prefix: prefix, Policy: p, Timeout: answersTimeout})
		if err != nil {
			t.Fatalf("redisstore.New: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a := rlstest.Start(t, shared, rlstest.TreeYAML)
	b := rlstest.Start(t, shared, rlstest.TreeYAML)
	raised := rlstest.Parse(t, strings.Replace(rlstest.TreeYAML, "requests_per_unit: 12\n", "requests_per_unit: 36\n", 1))
	if err := a.Server.Reload(context.Background(), raised...); err != nil {
		t.Fatalf("replica a: Reload: %v", err)
	}
	if err := b.Server.Reload(context.Background(), raised...); err != nil {
		t.Fatalf("replica b: Reload: %v", err)
	}
	if va, vb := a.A.Policy().Version, b.A.Policy().Version; va != 2 || vb != 2 {
		t.Errorf("versions %d and %d, want 2 and 2: one cutover", va, vb)
	}
	ra := a.Ask(rlstest.Req("storefront", 30, rlstest.D("region=shared")))
	rb := b.Ask(rlstest.Req("storefront", 0, rlstest.D("region=shared")))
	if ra.Statuses[0].GetLimitRemaining() != 6 || rb.Statuses[0].GetLimitRemaining() != 5 ||
		rb.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 36 {
		t.Errorf("replica a: %v; replica b: %v; want one bucket of 36 left at 6 then 5", ra.Statuses[0], rb.Statuses[0])
	}
}

// TestCommandReportsAnotherReplicasPolicy: during a rolling deploy a
// replica whose files are older than another's enforces the prefix's
// policy, the other's, while its answers report its own limits: it says
// so once on stderr and in tokenshard_rls_foreign_policy, and says so
// again once its files match.
func TestCommandReportsAnotherReplicasPolicy(t *testing.T) {
	old, newer, raised := twoReplicas(t, "envoyrls-foreign")
	newer.write("limits.yaml", raised)
	if err := newer.reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	old.ask("gw", "route=/a") // its store meets the new version
	polled := func(c *command) {
		c.poll <- time.Time{}
		c.poll <- time.Time{} // taken once the first poll is done
	}
	polled(old)
	if s := old.stderr.String(); !strings.Contains(s, "another replica installed its configuration") {
		t.Errorf("stderr does not report the other replica's policy:\n%s", s)
	}
	if m := old.scrape(); !strings.Contains(m, "tokenshard_rls_foreign_policy 1") {
		t.Errorf("metrics lack the foreign policy:\n%s", m)
	}
	if n := strings.Count(old.stderr.String(), "another replica installed"); n != 1 {
		t.Errorf("reported %d times, want once", n)
	}
	polled(newer)
	if strings.Contains(newer.stderr.String(), "another replica installed") {
		t.Errorf("the replica whose configuration is in force reports it as another's:\n%s", newer.stderr)
	}

	old.write("limits.yaml", raised)
	if err := old.reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	polled(old)
	if s := old.stderr.String(); !strings.Contains(s, "is this configuration's again") {
		t.Errorf("stderr does not report the match:\n%s", s)
	}
	if m := old.scrape(); !strings.Contains(m, "tokenshard_rls_foreign_policy 0") {
		t.Errorf("metrics still show a foreign policy:\n%s", m)
	}
}

// twoReplicas starts two commands on a fresh prefix named after name, on
// the shared Redis, and returns them with limitsYAML's limit raised: a
// configuration neither has yet.
func twoReplicas(t *testing.T, name string) (a, b *command, raised string) {
	t.Helper()
	addr := redistest.Addr(t)
	prefix := fmt.Sprintf("%s:%d:", name, time.Now().UnixNano())
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	deleteKeys(t, c, prefix)
	a = startCommand(t, "-redis", addr, "-redis-prefix", prefix, "-redis-timeout", slowMachine)
	b = startCommand(t, "-redis", addr, "-redis-prefix", prefix, "-redis-timeout", slowMachine)
	return a, b, strings.Replace(limitsYAML, "requests_per_unit: 2", "requests_per_unit: 50", 1)
}

// TestRollingDeployIsNotAnotherReplicasPolicy: files pushed to every replica
// at once reach each at its own poll. The replica that polls second has met
// the first's cutover to the same files, so it reloads them and is in step:
// nothing to report. It must not first call that policy another replica's,
// on stderr and in tokenshard_rls_foreign_policy, for a poll.
func TestRollingDeployIsNotAnotherReplicasPolicy(t *testing.T) {
	first, second, raised := twoReplicas(t, "envoyrls-rolling")
	first.write("limits.yaml", raised)
	second.write("limits.yaml", raised)
	if err := first.reload(); err != nil {
		t.Fatalf("first: reload: %v", err)
	}
	second.ask("gw", "route=/a") // serving traffic, its store meets the new version
	if err := second.reload(); err != nil {
		t.Fatalf("second: reload: %v", err)
	}
	if s := second.stderr.String(); strings.Contains(s, "another replica installed") {
		t.Errorf("the replica that reloaded the same files second reports another's policy:\n%s", s)
	}
	if m := second.scrape(); !strings.Contains(m, "tokenshard_rls_foreign_policy 0") {
		t.Errorf("metrics show a foreign policy after the same files were reloaded:\n%s", m)
	}
}

// TestRedisURL: -redis and -redis-cluster take addresses or a URL, whose
// user, password, database and TLS reach the client, with the options the
// store needs; TOKENSHARD_RLS_REDIS_PASSWORD takes the URL's password's
// place; a URL go-redis cannot read is a usage error.
func TestRedisURL(t *testing.T) {
	parse := func(args ...string) (options, error) {
		t.Helper()
		var stderr syncBuffer
		return parseFlags(append([]string{"-config", "d"}, args...), &stderr)
	}
	o, err := parse("-redis", "rediss://ops:s3cret@cache.internal:6380/3")
	if err != nil {
		t.Fatal(err)
	}
	if r := o.redis; r.Addr != "cache.internal:6380" || r.Username != "ops" || r.Password != "s3cret" || r.DB != 3 || r.TLSConfig == nil ||
		!r.ContextTimeoutEnabled || r.DialerRetries != 1 || o.cluster != nil {
		t.Errorf("-redis URL: %+v", r)
	}
	o, err = parse("-redis", "127.0.0.1:6379")
	if err != nil {
		t.Fatal(err)
	}
	if r := o.redis; r.Addr != "127.0.0.1:6379" || r.Password != "" || r.TLSConfig != nil || !r.ContextTimeoutEnabled || r.DialerRetries != 1 {
		t.Errorf("-redis address: %+v", r)
	}
	o, err = parse("-redis-cluster", "redis://:s3cret@n1:7000?addr=n2:7001&addr=n3:7002")
	if err != nil {
		t.Fatal(err)
	}
	if c := o.cluster; strings.Join(c.Addrs, ",") != "n1:7000,n2:7001,n3:7002" || c.Password != "s3cret" ||
		!c.ContextTimeoutEnabled || c.DialerRetries != 1 || o.redis != nil {
		t.Errorf("-redis-cluster URL: %+v", c)
	}
	o, err = parse("-redis-cluster", "n1:7000,n2:7001")
	if err != nil {
		t.Fatal(err)
	}
	if c := o.cluster; strings.Join(c.Addrs, ",") != "n1:7000,n2:7001" || !c.ContextTimeoutEnabled || c.DialerRetries != 1 {
		t.Errorf("-redis-cluster addresses: %+v", c)
	}

	t.Setenv(passwordEnv, "from-env")
	for _, args := range [][]string{{"-redis", "redis://:s3cret@h:1"}, {"-redis", "h:1"}, {"-redis-cluster", "redis://:s3cret@h:1"}} {
		o, err := parse(args...)
		if err != nil {
			t.Fatal(err)
		}
		pw := ""
		if o.redis != nil {
			pw = o.redis.Password
		} else {
			pw = o.cluster.Password
		}
		if pw != "from-env" {
			t.Errorf("%q with %s set: password %q", args, passwordEnv, pw)
		}
	}

	for _, args := range [][]string{
		{"-redis", "redis://h:1/notadb"}, {"-redis", "http://h:1"}, {"-redis-cluster", "redis://h:1?bogus=1"},
		{"-redis-cluster", "redis://h:1?read_only=true"}, {"-redis-cluster", "redis://h:1?route_by_latency=true"},
		{"-redis", "redis://:s3cret%zz@h:1"}, // an escape that is not one
	} {
		_, err := parse(args...)
		if !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: the error shows the password: %v", args, err)
		}
	}
}

// TestCommandRedisPassword: on a Redis that requires a password, the
// command serves with the password in -redis's URL or in
// TOKENSHARD_RLS_REDIS_PASSWORD, and without it, or with a wrong one, stops
// at start saying why.
func TestCommandRedisPassword(t *testing.T) {
	srv := redistest.Start(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	if err := admin.ConfigSet(context.Background(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	url := "redis://:s3cret@" + srv.Addr() + "/2"
	cmd := startCommand(t, "-redis", url, "-redis-timeout", slowMachine)
	if got := overall(cmd.ask("gw", "route=/a")); got != "OK" {
		t.Fatalf("with the password in the URL: %s\n%s", got, cmd.stderr)
	}
	if err := cmd.stop(); err != nil {
		t.Fatal(err)
	}

	t.Setenv(passwordEnv, "s3cret")
	cmd = startCommand(t, "-redis", srv.Addr(), "-redis-prefix", "from-env:", "-redis-timeout", slowMachine)
	if got := overall(cmd.ask("gw", "route=/a")); got != "OK" {
		t.Fatalf("with the password in %s: %s\n%s", passwordEnv, got, cmd.stderr)
	}
	if err := cmd.stop(); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(limitsYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	for pw, want := range map[string]string{"": "NOAUTH", "wrong": "WRONGPASS"} {
		t.Setenv(passwordEnv, pw)
		var stderr syncBuffer
		err := run(context.Background(), []string{"-config", dir, "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-redis", srv.Addr()}, &stderr, hooks{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("password %q: run: %v, want an error saying %s", pw, err, want)
		}
		if err == nil || !strings.Contains(err.Error(), "give Redis's password in "+passwordEnv) {
			t.Errorf("password %q: run: %v, want it to say where the password goes", pw, err)
		}
	}
}

// TestPortInUseChangesNoPolicy: a replica that cannot listen (its -grpc or
// -metrics address taken) stops with an error naming the address, before
// it installs its configuration on the Redis prefix: a replica that never
// served must not change the limits the others enforce.
func TestPortInUseChangesNoPolicy(t *testing.T) {
	addr, prefix, store := earlierDeployment(t, "envoyrls-cmd-port")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(limitsYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"-grpc", "-metrics"} {
		args := []string{"-config", dir, "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0",
			"-redis", addr, "-redis-prefix", prefix, "-redis-timeout", slowMachine, flag, taken.Addr().String()}
		var stderr syncBuffer
		err := run(context.Background(), args, &stderr, hooks{})
		if err == nil || !strings.Contains(err.Error(), taken.Addr().String()) {
			t.Errorf("%s on a taken address: %v, want an error naming it", flag, err)
		}
	}
	if _, err := store.Peek(context.Background(), "{gw}/route~|/x"); err != nil {
		t.Fatal(err)
	}
	if v := store.Policy().Version; v != 1 {
		t.Errorf("version %d on the prefix, want 1: a replica that could not listen installed its configuration", v)
	}
}
