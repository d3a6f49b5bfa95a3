package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// stopAfterRun runs the tests, then stops the shared server before goleak
// looks for goroutines, so its wait goroutine is gone by then.
type stopAfterRun struct{ m *testing.M }

func (s stopAfterRun) Run() int {
	defer Stop()
	return s.m.Run()
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(stopAfterRun{m}) }

// mustPing fails the test unless addr answers PING.
func mustPing(t *testing.T, addr string) {
	t.Helper()
	if err := ping(addr, 2*time.Second); err != nil {
		t.Fatalf("PING %s: %v", addr, err)
	}
}

// mustRefuse fails the test unless a TCP connection to addr is refused.
func mustRefuse(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("dial %s: connected, want connection refused", addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want connection refused", addr, err)
	}
}

func TestStartAnswersPing(t *testing.T) {
	s := Start(t)
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") {
		t.Errorf("Addr() = %q, want 127.0.0.1:port", s.Addr())
	}
	mustPing(t, s.Addr())
}

func TestKillRefusesConnections(t *testing.T) {
	s := Start(t)
	s.Kill()
	mustRefuse(t, s.Addr())
	s.Kill() // idempotent
	mustRefuse(t, s.Addr())
}

func TestRestartSamePort(t *testing.T) {
	s := Start(t)
	addr := s.Addr()
	for i := range 3 {
		s.Kill()
		mustRefuse(t, addr)
		s.Restart(t)
		if s.Addr() != addr {
			t.Fatalf("restart %d: Addr() = %s, want %s", i, s.Addr(), addr)
		}
		mustPing(t, addr)
	}
	s.Restart(t) // while running: kills, then starts again
	mustPing(t, addr)
}

func TestAddrAnswersPing(t *testing.T) {
	addr := Addr(t)
	mustPing(t, addr)
	if again := Addr(t); again != addr {
		t.Errorf("second Addr() = %s, want %s", again, addr)
	}
}

// TestSharedStartStop covers the private shared server directly, since Addr
// takes it only when nothing answers on 127.0.0.1:6379.
func TestSharedStartStop(t *testing.T) {
	bin, err := findBinary()
	if err != nil {
		skipOrFail(t, err.Error())
	}
	Stop() // whatever Addr may have started: this test starts its own
	shared.mu.Lock()
	err = startShared(bin)
	addr := shared.addr
	shared.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv(envAddr) == "" {
		if got := Addr(t); got != addr {
			t.Errorf("Addr() = %s, want the shared %s", got, addr)
		}
	}
	mustPing(t, addr)
	Stop()
	mustRefuse(t, addr)
	Stop() // safe again
}

// TestStartProcessPortTaken checks that a server whose port is held exits
// with errExited (which Start and Restart retry) and shows its log.
func TestStartProcessPortTaken(t *testing.T) {
	bin, err := findBinary()
	if err != nil {
		skipOrFail(t, err.Error())
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	p, err := startProcess(bin, l.Addr().(*net.TCPAddr).Port, dir, filepath.Join(dir, "redis.log"))
	if err == nil {
		p.kill()
		t.Fatal("startProcess on a held port succeeded")
	}
	if !errors.Is(err, errExited) || !strings.Contains(err.Error(), "already in use") {
		t.Errorf("startProcess = %v, want errExited with the log's bind error", err)
	}
}

func TestPingRejectsNonRedis(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	served := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		_, err = fmt.Fprint(c, "-NOAUTH Authentication required.\r\n")
		served <- err
	}()
	err = ping(l.Addr().String(), 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("ping = %v, want an error quoting the NOAUTH reply", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("fake server: %v", err)
	}
}

// recorder is a testing.TB that records Skipf and Fatalf instead of ending
// the test, so the skip-or-fail choice can be observed.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                        {}
func (r *recorder) Skipf(format string, a ...any)  { r.skipped = fmt.Sprintf(format, a...) }
func (r *recorder) Fatalf(format string, a ...any) { r.failed = fmt.Sprintf(format, a...) }

func TestSkipOrFail(t *testing.T) {
	t.Setenv(envRequire, "")
	r := &recorder{TB: t}
	skipOrFail(r, "no server here.")
	if r.failed != "" || !strings.Contains(r.skipped, "DID NOT RUN") ||
		!strings.Contains(r.skipped, "no server here.") || !strings.Contains(r.skipped, "apt-get install redis-server") {
		t.Errorf("without %s: skipped %q, failed %q; want a loud skip", envRequire, r.skipped, r.failed)
	}

	t.Setenv(envRequire, "1")
	r = &recorder{TB: t}
	skipOrFail(r, "no server here.")
	if r.skipped != "" || !strings.Contains(r.failed, "DID NOT RUN") || !strings.Contains(r.failed, envRequire+"=1") {
		t.Errorf("with %s=1: skipped %q, failed %q; want a failure", envRequire, r.skipped, r.failed)
	}
}

func TestAddrEnvUnreachableFails(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	t.Setenv(envAddr, closed)
	r := &recorder{TB: t}
	if got := Addr(r); got != closed {
		t.Errorf("Addr() = %q, want %q", got, closed)
	}
	if !strings.Contains(r.failed, envAddr) {
		t.Errorf("failed %q, want a failure naming %s", r.failed, envAddr)
	}
}

func TestAddrEnvUsed(t *testing.T) {
	s := Start(t)
	t.Setenv(envAddr, s.Addr())
	if got := Addr(t); got != s.Addr() {
		t.Errorf("Addr() = %s, want %s from %s", got, s.Addr(), envAddr)
	}
}

// TestFreePortNeverRepeats: a port freePort gave out, or its cluster bus
// port, is never given out again in the process, though the listener it
// came from is closed at once and the kernel may offer it again.
func TestFreePortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 300 {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] || seen[p+busOffset] || seen[p-busOffset] {
			t.Fatalf("freePort gave %d, which it gave before or is a bus port of one it gave", p)
		}
		seen[p] = true
	}
}

// TestFreePortLeavesRoomForBusPort: freePort gives no port a cluster node
// cannot have, whose bus would listen busOffset above 65535
// (redis-server: "Your Redis port number must be 55535 or less"), whatever
// the kernel offers: here it offers such ports first.
func TestFreePortLeavesRoomForBusPort(t *testing.T) {
	offers := []int{65535, maxPort + 1, 60999, 23456}
	real := kernelPort
	t.Cleanup(func() { kernelPort = real })
	kernelPort = func() (int, error) {
		if len(offers) == 0 {
			return 0, errors.New("the test's kernel has no port left to offer")
		}
		p := offers[0]
		offers = offers[1:]
		return p, nil
	}
	p, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	if p != 23456 {
		t.Fatalf("freePort gave %d; want 23456, the first offer whose cluster bus port exists", p)
	}
	given.mu.Lock()
	delete(given.ports, p)
	delete(given.ports, p+busOffset)
	given.mu.Unlock()
}

// TestAlone: a test that loads its server gets one of its own, not the
// shared one, unless the user named a server.
func TestAlone(t *testing.T) {
	if _, err := findBinary(); err != nil {
		skipOrFail(t, err.Error())
	}
	t.Setenv(envAddr, "")
	shared := Addr(t)
	own := Alone(t)
	if own == shared {
		t.Fatalf("Alone() = %s, the shared server", own)
	}
	if err := ping(own, time.Second); err != nil {
		t.Fatalf("Alone()'s server %s: %v", own, err)
	}
	if again := Alone(t); again == own {
		t.Errorf("two calls of Alone share %s", own)
	}
	s := Start(t)
	t.Setenv(envAddr, s.Addr())
	if got := Alone(t); got != s.Addr() {
		t.Errorf("Alone() = %s, want %s from %s", got, s.Addr(), envAddr)
	}
}

// clusterInfo is one node's CLUSTER INFO, through redis-cli.
func clusterInfo(t *testing.T, addr string) string {
	t.Helper()
	cli, err := findCLI()
	if err != nil {
		skipOrFail(t, err.Error())
	}
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command(cli, "-h", host, "-p", port, "cluster", "info").Output()
	if err != nil {
		t.Fatalf("cluster info %s: %v", addr, err)
	}
	return string(out)
}

func TestStartClusterServesEverySlot(t *testing.T) {
	c := StartCluster(t)
	if len(c.Addrs()) != ClusterMasters {
		t.Fatalf("Addrs() = %v, want %d masters", c.Addrs(), ClusterMasters)
	}
	for _, a := range c.Addrs() {
		info := clusterInfo(t, a)
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") ||
			!strings.Contains(info, "cluster_known_nodes:3") {
			t.Fatalf("node %s: %s", a, info)
		}
	}
	// A master killed and restarted rejoins with its slots.
	c.Node(1).Kill()
	mustRefuse(t, c.Addrs()[1])
	c.Node(1).Restart(t)
	c.Wait(t)
}

func TestClusterAddrsShared(t *testing.T) {
	addrs := ClusterAddrs(t)
	if again := ClusterAddrs(t); strings.Join(again, ",") != strings.Join(addrs, ",") {
		t.Errorf("second ClusterAddrs() = %v, want %v", again, addrs)
	}
	for _, a := range addrs {
		if info := clusterInfo(t, a); !strings.Contains(info, "cluster_state:ok") {
			t.Fatalf("node %s: %s", a, info)
		}
	}
}

func TestParseClusterNodes(t *testing.T) {
	out := `0cb0 127.0.0.1:30011@40011 myself,master - 0 1796432231000 1 connected 0-5460
8bee 127.0.0.1:30013@40013,host master,fail - 0 1796432231087 3 disconnected
5988 127.0.0.1:30015@40015 slave 0cb0 0 1796432231087 1 connected
`
	got, err := parseClusterNodes(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []ClusterNode{
		{ID: "0cb0", Addr: "127.0.0.1:30011", Master: true, Slots: true},
		{ID: "8bee", Addr: "127.0.0.1:30013", Master: true, Failed: true},
		{ID: "5988", Addr: "127.0.0.1:30015", MasterID: "0cb0"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("parseClusterNodes:\n got %+v\nwant %+v", got, want)
	}
	if _, err := parseClusterNodes("0cb0 127.0.0.1:30011@40011 master\n"); err == nil {
		t.Fatal("a short line parsed")
	}
}

// TestCreateClusterBounded: a redis-cli --cluster create that never ends
// (its wait for the nodes to join has no end of its own) fails within
// clusterCreate, naming the wait and showing each node's log, instead of
// holding the test binary until its timeout.
func TestCreateClusterBounded(t *testing.T) {
	dir := t.TempDir()
	cli := filepath.Join(dir, "redis-cli")
	if err := os.WriteFile(cli, []byte("#!/bin/sh\necho Waiting for the cluster to join\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "redis.log")
	if err := os.WriteFile(log, []byte("a line of the node's log\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { clusterCreate = d }(clusterCreate)
	clusterCreate = 200 * time.Millisecond
	start := time.Now()
	err := createCluster(cli, []string{"127.0.0.1:1"}, []string{log}, 0)
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("createCluster took %v with a bound of %v", took, clusterCreate)
	}
	if err == nil {
		t.Fatal("createCluster of a redis-cli that never ends: no error")
	}
	for _, want := range []string{"not done within", "Waiting for the cluster to join", "a line of the node's log"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not show %q:\n%v", want, err)
		}
	}
}

// TestFormClusterRetries: a cluster that would not form is started again,
// its nodes stopped first, createTries times in all; then the last
// failure is the error.
func TestFormClusterRetries(t *testing.T) {
	forms, undos := 0, 0
	err := formCluster(t, func() error {
		if forms++; forms < createTries {
			return fmt.Errorf("form %d failed", forms)
		}
		return nil
	}, func() { undos++ })
	if err != nil || forms != createTries || undos != createTries-1 {
		t.Errorf("formed on the last try: err %v, %d forms, %d undos; want nil, %d, %d", err, forms, undos, createTries, createTries-1)
	}
	forms, undos = 0, 0
	err = formCluster(t, func() error { forms++; return fmt.Errorf("form %d failed", forms) }, func() { undos++ })
	want := fmt.Sprintf("form %d failed\n(try %d of %d)", createTries, createTries, createTries)
	if err == nil || err.Error() != want || forms != createTries || undos != createTries {
		t.Errorf("never formed: err %v, %d forms, %d undos; want %q, %d, %d", err, forms, undos, want, createTries, createTries)
	}
}

// TestRunCLIErrorReplies: an error reply is an error whatever its code
// (redis-cli prints it bare and exits 0 out of a terminal), and a reply
// that is not one is not.
func TestRunCLIErrorReplies(t *testing.T) {
	cli, err := findCLI()
	if err != nil {
		skipOrFail(t, err.Error())
	}
	s := Start(t)
	for _, bad := range [][]string{
		{"nosuchcommand"},                  // ERR
		{"lpush", "redistest:string", "x"}, // WRONGTYPE, after the SET below
		{"sentinel", "failover", "nosuch"}, // ERR or unknown command: not a sentinel
	} {
		if bad[0] == "lpush" {
			_, err := runCLI(cli, s.Addr(), "set", "redistest:string", "v")
			if err != nil {
				t.Fatal(err)
			}
		}
		if out, err := runCLI(cli, s.Addr(), bad...); err == nil {
			t.Errorf("%v: %q is not an error", bad, out)
		}
	}
	for _, good := range [][]string{{"ping"}, {"info", "server"}, {"role"}, {"get", "redistest:string"}} {
		if out, err := runCLI(cli, s.Addr(), good...); err != nil {
			t.Errorf("%v: %v (%q)", good, err, out)
		}
	}
}
