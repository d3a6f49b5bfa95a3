package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
)

// syncBuffer is a bytes.Buffer safe for the command's and the test's
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// command is a running tokenshard-rls.
type command struct {
	t        *testing.T
	dir      string
	stderr   *syncBuffer
	poll     chan time.Time
	polled   chan struct{} // the end of a poll, if the last is not yet taken (see pollOnce)
	reloaded chan error
	retry    chan time.Time // the retries of a command started without Redis
	settled  chan settled
	cancel   context.CancelFunc
	exited   chan error
	rls      rlsv3.RateLimitServiceClient
	health   healthpb.HealthClient
	metrics  string
	addrs    [2]string // the gRPC and metrics listeners' addresses
}

const limitsYAML = `domain: gw
descriptors:
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 2}
`

func startCommand(t *testing.T, extra ...string) *command {
	t.Helper()
	return startCommandWith(t, limitsYAML, extra...)
}

// startCommandWith is startCommand with limits.yaml holding yaml.
func startCommandWith(t *testing.T, yaml string, extra ...string) *command {
	t.Helper()
	return startCommandHooks(t, yaml, hooks{}, extra...)
}

// startCommandHooks is startCommandWith with the hooks of hk that the
// command type does not drive (grpcIdle, metricsIdle, metricsRead).
func startCommandHooks(t *testing.T, yaml string, hk hooks, extra ...string) *command {
	t.Helper()
	c := &command{
		t: t, dir: t.TempDir(), stderr: &syncBuffer{},
		poll: make(chan time.Time), polled: make(chan struct{}, 1), reloaded: make(chan error, 1), exited: make(chan error, 1),
		retry: make(chan time.Time), settled: make(chan settled, 1),
	}
	c.write("limits.yaml", yaml)
	ready := make(chan [2]string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	args := append([]string{"-config", c.dir, "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0"}, extra...)
	go func() {
		c.exited <- run(ctx, args, c.stderr, hooks{
			poll:     c.poll,
			ready:    func(g, m string) { ready <- [2]string{g, m} },
			reloaded: func(err error) { c.reloaded <- err },
			polled: func() {
				select {
				case c.polled <- struct{}{}:
				default:
				}
			},
			retry:       c.retry,
			settled:     func(reached bool, err error) { c.settled <- settled{reached, err} },
			metricsIdle: hk.metricsIdle,
			grpcIdle:    hk.grpcIdle,
			metricsRead: hk.metricsRead,
		})
	}()
	var addrs [2]string
	select {
	case addrs = <-ready:
	case err := <-c.exited:
		cancel()
		t.Fatalf("run: %v; stderr: %s", err, c.stderr)
	}
	conn, err := grpc.NewClient(addrs[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		<-c.exited
		t.Fatal(err)
	}
	c.rls, c.health, c.metrics = rlsv3.NewRateLimitServiceClient(conn), healthpb.NewHealthClient(conn), "http://"+addrs[1]+"/metrics"
	c.addrs = addrs
	t.Cleanup(func() {
		_ = conn.Close()
		c.stop()
	})
	return c
}

// settled is the outcome of a retry of a command started without Redis.
type settled struct {
	reached bool
	err     error
}

func (c *command) write(name, data string) {
	c.t.Helper()
	if err := os.WriteFile(filepath.Join(c.dir, name), []byte(data), 0o600); err != nil {
		c.t.Fatal(err)
	}
}

// reload makes the command read the directory and returns the reload's
// outcome.
func (c *command) reload() error {
	c.poll <- time.Time{}
	return <-c.reloaded
}

// pollOnce makes the command poll and waits until that poll has ended.
// Polls made by reload before it have ended too, and told polled first.
func (c *command) pollOnce() {
	select {
	case <-c.polled:
	default:
	}
	timeout := time.After(10 * time.Second)
	select {
	case c.poll <- time.Time{}:
	case <-timeout:
		c.t.Fatalf("the command does not poll; stderr: %s", c.stderr)
	}
	select {
	case <-c.polled:
	case <-timeout:
		c.t.Fatalf("the poll does not end; stderr: %s", c.stderr)
	}
}

// stop signals the command and returns what run returned (once).
func (c *command) stop() error {
	c.cancel()
	err, ok := <-c.exited
	if ok {
		close(c.exited)
	}
	return err
}

func (c *command) ask(domain string, descs ...string) *rlsv3.RateLimitResponse {
	c.t.Helper()
	resp, err := c.rls.ShouldRateLimit(context.Background(), rlstest.Req(domain, 0, rlstest.D(descs...)))
	if err != nil {
		c.t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func (c *command) scrape() string {
	c.t.Helper()
	resp, err := http.Get(c.metrics)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return string(b)
}

func overall(resp *rlsv3.RateLimitResponse) string {
	return resp.GetOverallCode().String()
}

// TestCommand: the command serves the RLS, health and metrics, reloads a
// changed directory without topping anyone up, keeps the last good
// configuration when a file is invalid and says so, and stops cleanly.
func TestCommand(t *testing.T) { testCommand(t) }

// slowMachine (-redis-timeout) and answersTimeout (Config.Timeout) bound
// each Redis exchange of the tests that check answers, not timing: the
// store's default, 250 ms, can run out on a loaded machine, in the cutover
// a reload makes on a cluster most of all, and the answer would then be
// the failure rule's. The tests of outages keep the default.
const (
	slowMachine    = "10s"
	answersTimeout = 10 * time.Second
)

// TestCommandRedis is TestCommand on a Redis store.
func TestCommandRedis(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := "envoyrls-cmd-test:" + time.Now().Format("150405.000000000") + ":"
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	deleteKeys(t, c, prefix)
	testCommand(t, "-redis", addr, "-redis-prefix", prefix, "-redis-timeout", slowMachine)
}

// TestCommandRedisLeased is TestCommand on a Redis store with -leases, and
// a limit large enough to be leased admits exactly its requests_per_unit.
// The command runs on the real clock, so the limit is 1000 a year, a token
// every 8.76 hours: at 1000 an hour, a token every 3.6 s, a loaded machine
// took long enough over the 1100 requests to refill one, and admitted 1001.
func TestCommandRedisLeased(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := "envoyrls-cmd-leased-test:" + time.Now().Format("150405.000000000") + ":"
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	deleteKeys(t, c, prefix)
	testCommand(t, "-redis", addr, "-redis-prefix", prefix, "-leases", "-redis-timeout", slowMachine)

	deleteKeys(t, c, prefix)
	cmd := startCommand(t, "-redis", addr, "-redis-prefix", prefix, "-leases", "-redis-timeout", slowMachine)
	cmd.write("limits.yaml", strings.Replace(limitsYAML, "unit: minute, requests_per_unit: 2", "unit: year, requests_per_unit: 1000", 1))
	if err := cmd.reload(); err != nil {
		t.Fatalf("reload: %v\n%s", err, cmd.stderr)
	}
	ok := 0
	for range 1100 {
		if overall(cmd.ask("gw", "route=/hot")) == "OK" {
			ok++
		}
	}
	if ok != 1000 {
		t.Errorf("a fresh key admitted %d of 1100 requests, want exactly 1000", ok)
	}
	if err := cmd.stop(); err != nil {
		t.Errorf("run after cancel: %v", err)
	}
}

// TestCommandRedisCluster is TestCommand on a Redis Cluster.
func TestCommandRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a Redis Cluster: not in -short")
	}
	addrs := redistest.ClusterAddrs(t)
	prefix := "envoyrls-cmd-cluster-test:" + time.Now().Format("150405.000000000") + ":"
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	deleteKeys(t, c, prefix)
	testCommand(t, "-redis-cluster", strings.Join(addrs, ","), "-redis-prefix", prefix, "-redis-timeout", slowMachine)
}

func testCommand(t *testing.T, extra ...string) {
	c := startCommand(t, extra...)
	h, err := c.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v, %v", h, err)
	}
	for i, want := range []string{"OK", "OK", "OVER_LIMIT"} {
		if got := overall(c.ask("gw", "route=/a")); got != want {
			t.Errorf("request %d: %s, want %s", i, got, want)
		}
	}
	if _, err := c.rls.ShouldRateLimit(context.Background(), rlstest.Req("", 0, rlstest.D("route=/a"))); err == nil {
		t.Error("a request without a domain: no error")
	}
	m := c.scrape()
	for _, want := range []string{
		`tokenshard_rls_requests_total{answer="ok"} 2`,
		`tokenshard_rls_requests_total{answer="over_limit"} 1`,
		`tokenshard_rls_requests_total{answer="error"} 1`,
		`tokenshard_rls_reloads_total{result="error"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, m)
		}
	}
	if len(extra) == 0 && !strings.Contains(m, "tokenshard_decisions_total") || len(extra) > 0 && !strings.Contains(m, "tokenshard_store_decisions_total") {
		t.Errorf("metrics lack the admitter's series:\n%s", m)
	}

	// An invalid file: reported with its name and line, the last good
	// configuration kept.
	c.write("bad.yaml", "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	if err := c.reload(); !errors.Is(err, envoyrls.ErrUnknownUnit) {
		t.Errorf("reload with an invalid file: %v", err)
	}
	if s := c.stderr.String(); !strings.Contains(s, "bad.yaml") || !strings.Contains(s, "line 4") || !strings.Contains(s, "keeping the last good configuration") {
		t.Errorf("stderr does not report the invalid file and its line:\n%s", s)
	}
	if got := overall(c.ask("gw", "route=/a")); got != "OVER_LIMIT" {
		t.Errorf("after the invalid file: %s", got)
	}
	if got := overall(c.ask("gw", "route=/b")); got != "OK" {
		t.Errorf("after the invalid file, a fresh route: %s", got)
	}

	// A valid change raising the limit: /a stays spent, /c gets 10.
	if err := os.Remove(filepath.Join(c.dir, "bad.yaml")); err != nil {
		t.Fatal(err)
	}
	c.write("limits.yaml", strings.Replace(limitsYAML, "requests_per_unit: 2", "requests_per_unit: 10", 1))
	if err := c.reload(); err != nil {
		t.Fatalf("reload: %v\n%s", err, c.stderr)
	}
	if got := overall(c.ask("gw", "route=/a")); got != "OVER_LIMIT" {
		t.Errorf("raised limit, spent route: %s, want OVER_LIMIT (no top-up)", got)
	}
	resp := c.ask("gw", "route=/c")
	if got := resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 10 || overall(resp) != "OK" {
		t.Errorf("raised limit, fresh route: %v", resp)
	}
	if !strings.Contains(c.scrape(), `tokenshard_rls_reloads_total{result="ok"} 1`) {
		t.Errorf("reloads not counted:\n%s", c.scrape())
	}

	if err := c.stop(); err != nil {
		t.Errorf("run after cancel: %v", err)
	}
}

// TestCommandRefusesAtStart: a bad flag or an invalid configuration stops
// the command before it serves.
func TestCommandRefusesAtStart(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: d\nbogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// envoyproxy/ratelimit's runtime root, its files one level down: no
	// limits at all unless refused.
	runtimeRoot := t.TempDir()
	if err := os.Mkdir(filepath.Join(runtimeRoot, "config"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(runtimeRoot, "config", "a.yaml"), []byte(limitsYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	for _, c := range []struct {
		args []string
		want error
	}{
		{[]string{}, errUsage},
		{[]string{"-config", dir, "-redis", "x:1", "-redis-cluster", "y:1"}, errUsage},
		{[]string{"-config", dir, "-leases"}, errUsage},
		{[]string{"-config", dir, "-redis", "x:1", "-max-keys", "5"}, errUsage},
		{[]string{"-config", dir, "-redis-cluster", "x:1", "-max-keys", "5"}, errUsage},
		{[]string{"-config", filepath.Join(runtimeRoot, "config"), "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-max-keys", "-1"}, errUsage},
		{[]string{"-config", filepath.Join(runtimeRoot, "config"), "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-max-streams", "0"}, errUsage},
		{[]string{"-config", filepath.Join(runtimeRoot, "config"), "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-max-streams", "4294967296"}, errUsage},
		{[]string{"-config", filepath.Join(runtimeRoot, "config"), "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-max-request-bytes", "0"}, errUsage},
		{[]string{"-config", filepath.Join(runtimeRoot, "config"), "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-max-in-flight", "0"}, errUsage},
		{[]string{"-config", dir, "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-poll", "1ns"}, errUsage},
		{[]string{"-config", dir, "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-poll", "999ms"}, errUsage},
		{[]string{"-config", dir, "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0"}, envoyrls.ErrUnknownField},
		{[]string{"-config", runtimeRoot, "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0"}, errNoConfig},
	} {
		if err := run(context.Background(), c.args, &stderr, hooks{}); !errors.Is(err, c.want) {
			t.Errorf("run(%q): %v, want %v", c.args, err, c.want)
		}
	}
}

// TestCommandRedisOnClusterNode: -redis naming a node of a Redis Cluster
// stops the command at start, saying to name the nodes with -redis-cluster.
func TestCommandRedisOnClusterNode(t *testing.T) {
	if testing.Short() {
		t.Skip("a Redis Cluster: not in -short")
	}
	addrs := redistest.ClusterAddrs(t)
	prefix := "envoyrls-cmd-cluster-node-test:" + time.Now().Format("150405.000000000") + ":"
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	deleteKeys(t, c, prefix)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(limitsYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	err := run(context.Background(), []string{"-config", dir, "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0",
		"-redis", addrs[0], "-redis-prefix", prefix, "-redis-timeout", slowMachine}, &stderr, hooks{})
	if err == nil || !strings.Contains(err.Error(), "name its nodes with -redis-cluster, not -redis") {
		t.Errorf("-redis on a cluster node: %v, want it to say -redis-cluster", err)
	}
}

// TestCommandInstallsItsConfiguration: a Redis prefix holding another
// configuration's policy (an earlier deployment's) gets the command's, at
// the next version.
func TestCommandInstallsItsConfiguration(t *testing.T) {
	addr, prefix, store := earlierDeployment(t, "envoyrls-cmd-install")
	c := startCommand(t, "-redis", addr, "-redis-prefix", prefix, "-redis-timeout", slowMachine)
	resp := c.ask("gw", "route=/x")
	if got := resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 2 || overall(resp) != "OK" {
		t.Errorf("the command's limit: %v", resp)
	}
	// The store of the earlier deployment meets the new version at its
	// next call.
	if _, err := store.Peek(context.Background(), "{gw}/route~|/x"); err != nil {
		t.Fatal(err)
	}
	if v := store.Policy().Version; v != 2 {
		t.Errorf("version %d on the prefix, want 2", v)
	}
}

// TestCommandStartedWithoutRedis: a replica started while Redis is down
// cannot compare its configuration with the prefix's, whose policy its
// store does not yet know. Once Redis answers and the prefix holds another
// configuration's policy (an earlier deployment's, written back before the
// replica reaches it), the replica installs its own, as it would have at
// start: it enforces the limits it reports.
func TestCommandStartedWithoutRedis(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	prefix := "envoyrls-cmd-down:"
	c := startCommand(t, "-redis", srv.Addr(), "-redis-prefix", prefix)

	srv.Restart(t)
	old, err := envoyrls.Policy(1, rlstest.Parse(t, rlstest.TreeYAML)...)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	store, err := redisstore.New(context.Background(), redisstore.Config{Client: client, Prefix: prefix, Policy: old, Timeout: answersTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	// The command's store tries again at each retry; go-redis's dialer may
	// hold new connections off for up to a second after the refusals.
	pace := time.NewTicker(20 * time.Millisecond)
	defer pace.Stop()
	for tries := 0; ; tries++ {
		select {
		case c.retry <- time.Time{}:
		case <-time.After(10 * time.Second):
			t.Fatalf("the command does not retry; stderr: %s", c.stderr)
		}
		r := <-c.settled
		if r.err != nil {
			t.Fatalf("settling the start: %v; stderr: %s", r.err, c.stderr)
		}
		if r.reached {
			break
		}
		if tries == 500 {
			t.Fatalf("the command's store did not reach Redis; stderr: %s", c.stderr)
		}
		<-pace.C
	}
	for i, want := range []string{"OK", "OK", "OVER_LIMIT"} { // 2 a minute
		resp := c.ask("gw", "route=/x")
		if overall(resp) != want || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 2 {
			t.Fatalf("request %d: %v, want %s under the command's limit", i+1, resp, want)
		}
	}
	if !strings.Contains(c.stderr.String(), "reached Redis, policy version 2") {
		t.Errorf("stderr does not say the command reached Redis: %s", c.stderr)
	}
}

// TestCommandDirectoryGone: a -config directory that cannot be read is
// reported once, as an invalid file is, not at every poll; once it is back
// with a change, the change is installed.
func TestCommandDirectoryGone(t *testing.T) {
	c := startCommand(t)
	moved := c.dir + ".away"
	if err := os.Rename(c.dir, moved); err != nil {
		t.Fatal(err)
	}
	if err := c.reload(); err == nil {
		t.Fatal("reload of a missing directory: no error")
	}
	// The same error: neither reported nor counted again. The second send
	// is taken once the first poll is done.
	c.poll <- time.Time{}
	c.poll <- time.Time{}
	// Back, whole, with a change: a poll under way may install it, and the
	// next one finds nothing new; the outcome is the same.
	changed := strings.Replace(limitsYAML, "requests_per_unit: 2", "requests_per_unit: 10", 1)
	if err := os.WriteFile(filepath.Join(moved, "limits.yaml"), []byte(changed), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(moved, c.dir); err != nil {
		t.Fatal(err)
	}
	if err := c.reload(); err != nil {
		t.Fatalf("reload once the directory is back: %v\n%s", err, c.stderr)
	}
	if n := strings.Count(c.stderr.String(), "reload: "); n != 1 {
		t.Errorf("%d reload errors reported, want 1:\n%s", n, c.stderr)
	}
	if m := c.scrape(); !strings.Contains(m, `tokenshard_rls_reloads_total{result="error"} 1`) {
		t.Errorf("reload errors counted:\n%s", m)
	}
	if got := c.ask("gw", "route=/x").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 10 {
		t.Errorf("limit %d after the directory came back, want 10", got)
	}
}

// TestCommandEmptiedDirectory: a -config directory left without a file (a
// volume unmounted, a deploy gone wrong) keeps the last good
// configuration, as a directory that cannot be read does, rather than
// serve no limits at all.
func TestCommandEmptiedDirectory(t *testing.T) {
	c := startCommand(t)
	if err := os.Remove(filepath.Join(c.dir, "limits.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := c.reload(); !errors.Is(err, errNoConfig) {
		t.Fatalf("reload of an empty directory: %v, want errNoConfig", err)
	}
	if got := c.ask("gw", "route=/x").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 2 {
		t.Errorf("limit %d after the directory emptied, want the last good configuration's 2", got)
	}
}

// TestCommandRedisDownAnswersAtOnce: with Redis gone, the command answers
// Unavailable at once, not after its Redis timeout: Envoy, whose own
// timeout is 20 ms by default, can then apply its failure mode on the
// command's answer rather than on its own deadline.
func TestCommandRedisDownAnswersAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	c := startCommand(t, "-redis", srv.Addr(), "-redis-prefix", "envoyrls-cmd-gone:", "-redis-timeout", "5s")
	if got := overall(c.ask("gw", "route=/x")); got != "OK" {
		t.Fatalf("with Redis up: %s", got)
	}
	srv.Kill()
	defer srv.Restart(t)
	// go-redis's default dial retries take 400 ms a request, and waiting
	// out the Redis timeout 5 s: each request is held to well under the
	// latter, and two of three to under the former, which a loaded machine
	// stretching one request's few ms (to 200 ms and more) does not reach.
	fast := 0
	for i := range 3 {
		start := time.Now()
		_, err := c.rls.ShouldRateLimit(context.Background(), rlstest.Req("gw", 0, rlstest.D("route=/x")))
		took := time.Since(start)
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("request %d with Redis down: %v, want Unavailable", i+1, err)
		}
		if took > 2*time.Second {
			t.Errorf("request %d with Redis down took %v; want a few milliseconds", i+1, took)
		}
		if took < 300*time.Millisecond {
			fast++
		}
	}
	if fast < 2 {
		t.Errorf("%d of 3 requests with Redis down took under 300 ms; want a few milliseconds each", fast)
	}
}

// TestCommandReportsRedisOutage: a poll after which requests were answered
// Unavailable logs how many, with the store's last error, one line a poll
// however many failed (a check-only request, whose Peek tells OnError
// nothing, counted too), and a poll after none failed logs nothing; once
// Redis decides again, the next poll says so. Every line carries the time.
func TestCommandReportsRedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	prefix := "envoyrls-cmd-outage:" + time.Now().Format("150405.000000000") + ":"
	c := startCommand(t, "-redis", srv.Addr(), "-redis-prefix", prefix)
	if got := overall(c.ask("gw", "route=/x")); got != "OK" {
		t.Fatalf("with Redis up: %s", got)
	}
	c.pollOnce()
	if s := c.stderr.String(); strings.Contains(s, "Redis: ") {
		t.Fatalf("an outage reported while Redis answered:\n%s", s)
	}

	srv.Kill()
	for i, d := range []*rlv3.RateLimitDescriptor{rlstest.D("route=/x"), rlstest.D("route=/x"), rlstest.DH(0, "route=/x")} {
		if _, err := c.rls.ShouldRateLimit(context.Background(), rlstest.Req("gw", 0, d)); status.Code(err) != codes.Unavailable {
			t.Fatalf("request %d with Redis down: %v, want Unavailable", i+1, err)
		}
	}
	c.pollOnce()
	c.pollOnce() // no request failed since: no line
	s := c.stderr.String()
	if n := strings.Count(s, "Redis: "); n != 1 {
		t.Fatalf("%d outage reports for one poll after the failures, want 1:\n%s", n, s)
	}
	if !strings.Contains(s, "3 requests answered Unavailable and 2 errors") || !strings.Contains(s, "connection refused") {
		t.Errorf("the report does not count the 3 requests and the store's 2 errors, or name the error:\n%s", s)
	}

	srv.Restart(t)
	// go-redis's dialer may hold new connections off for up to a second
	// after the refusals.
	pace := time.NewTicker(20 * time.Millisecond)
	defer pace.Stop()
	for tries := 0; ; tries++ {
		_, err := c.rls.ShouldRateLimit(context.Background(), rlstest.Req("gw", 0, rlstest.D("route=/x")))
		if err == nil {
			break
		}
		if tries == 500 {
			t.Fatalf("Redis restarted, the command still answers %v", err)
		}
		<-pace.C
	}
	c.pollOnce() // reports the errors met while reconnecting, if any
	c.ask("gw", "route=/x")
	c.pollOnce()
	s = c.stderr.String()
	if again := strings.LastIndex(s, "Redis decides again"); again < strings.LastIndex(s, "Redis: ") {
		t.Fatalf("no report that Redis decides again after the last outage report:\n%s", s)
	}
	stamped := regexp.MustCompile(`^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d tokenshard-rls: `)
	for line := range strings.Lines(c.stderr.String()) {
		if !stamped.MatchString(line) {
			t.Errorf("a line without the time: %q", line)
		}
	}
}

// TestCommandStopEndsHealthWatch: at SIGTERM a health Watch stream is told
// NOT_SERVING and then ended, so that a client watching health (gRPC's
// client-side health checking keeps one open) does not hold the stop for
// the whole -drain.
func TestCommandStopEndsHealthWatch(t *testing.T) {
	c := startCommand(t, "-drain", "30s")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := c.health.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first status: %v, %v", r, err)
	}
	c.cancel()
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("status at stop: %v, %v", r, err)
	}
	if r, err := w.Recv(); err != io.EOF {
		t.Errorf("after NOT_SERVING: %v, %v; want the stream ended (EOF)", r, err)
	}
	select {
	case err := <-c.exited:
		close(c.exited)
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(15 * time.Second): // -drain is 30 s
		t.Fatal("run still draining for an open health Watch")
	}
}
