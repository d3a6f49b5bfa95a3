package redistest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// SentinelMaster is the name under which the sentinel of StartSentinel
// monitors its primary (redis.FailoverOptions.MasterName).
const SentinelMaster = "mymaster"

// Sentinel is a primary with one replica, watched by one Redis Sentinel,
// on loopback, for a test that fails the primary over: a client asks the
// sentinel at Addr where the primary is (redis.NewFailoverClient), and
// Failover makes the replica the primary. Each server is a private one (see
// Start), killed when the test ends. It is safe for concurrent use.
type Sentinel struct {
	cli      string
	nodes    [2]*Server // the primary and its replica, as started
	sentinel *Server
}

// StartSentinel starts a primary, its replica and a sentinel (a quorum of
// one) and waits until the replica is in sync and the sentinel has a link
// to it. It skips loudly without redis-server or redis-cli (fails under
// TOKENSHARD_REQUIRE_REDIS=1).
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	cli, err := findCLI()
	if err != nil {
		skipOrFail(t, err.Error()+".")
	}
	primary := start(t, replicaArgs...) // a primary's setting, kept by the replica that takes its place
	host, port, _ := net.SplitHostPort(primary.Addr())
	replica := start(t, append([]string{"--replicaof", host, port}, replicaArgs...)...)
	conf := filepath.Join(t.TempDir(), "sentinel.conf") // the sentinel rewrites it
	err = os.WriteFile(conf, fmt.Appendf(nil, "sentinel monitor %s %s %s 1\n"+
		"sentinel down-after-milliseconds %[1]s 1000\nsentinel failover-timeout %[1]s 10000\n",
		SentinelMaster, host, port), 0o644)
	if err != nil {
		t.Fatalf("redistest: writing %s: %v", conf, err)
	}
	s := &Sentinel{cli: cli, nodes: [2]*Server{primary, replica}, sentinel: start(t, conf, "--sentinel")}
	s.wait(t, func() error {
		out, err := runCLI(cli, s.Addr(), "sentinel", "replicas", SentinelMaster)
		if f := fields(out); err != nil || f["name"] != replica.Addr() || f["flags"] != "slave" || f["master-link-status"] != "ok" {
			return fmt.Errorf("the sentinel sees no replica %s in sync: %v %s", replica.Addr(), err, out)
		}
		return nil
	})
	return s
}

// fields reads redis-cli's output of a reply of field names and values, one
// a line, as SENTINEL REPLICAS gives for one replica.
func fields(out string) map[string]string {
	f := strings.Split(strings.TrimSpace(out), "\n")
	m := map[string]string{}
	for i := 0; i+1 < len(f); i += 2 {
		m[f[i]] = f[i+1]
	}
	return m
}

// Addr returns the sentinel's address.
func (s *Sentinel) Addr() string { return s.sentinel.Addr() }

// Primary returns the address the sentinel gives for the primary, or "" if
// it gives none.
func (s *Sentinel) Primary() string {
	out, err := runCLI(s.cli, s.Addr(), "sentinel", "get-master-addr-by-name", SentinelMaster)
	if f := strings.Fields(out); err == nil && len(f) == 2 {
		return net.JoinHostPort(f[0], f[1])
	}
	return ""
}

// Failover makes the replica the primary (SENTINEL FAILOVER, which does not
// pause the old primary's clients: writes it takes until the switch are
// lost) and returns the old primary and the new one once the sentinel
// names the new one. The old primary is turned into its replica later.
// While the sentinel finds no replica to promote (NOGOODSLAVE: it promotes
// only a replica whose INFO it read in the last 5 s, and reads it every
// 10 s), Failover asks again.
func (s *Sentinel) Failover(t testing.TB) (from, to string) {
	t.Helper()
	from = s.Primary()
	for _, n := range s.nodes {
		if n.Addr() != from {
			to = n.Addr()
		}
	}
	s.wait(t, func() error {
		// redis-cli prints an error reply without "ERR" or "(error)" when
		// its output is not a terminal: only OK is a success
		out, err := runCLI(s.cli, s.Addr(), "sentinel", "failover", SentinelMaster)
		if err != nil || strings.TrimSpace(out) != "OK" {
			return fmt.Errorf("SENTINEL FAILOVER: %v %s", err, out)
		}
		return nil
	})
	s.wait(t, func() error {
		if p := s.Primary(); p != to {
			return fmt.Errorf("the sentinel names %q as the primary, not %s", p, to)
		}
		return nil
	})
	return from, to
}

// wait polls ready until it returns nil, failing the test if it does not
// within replicaHealthy.
func (s *Sentinel) wait(t testing.TB, ready func() error) {
	t.Helper()
	deadline := time.Now().Add(replicaHealthy)
	for {
		err := ready()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: sentinel %s: %v", s.Addr(), err)
		}
		time.Sleep(50 * time.Millisecond) // servers converging, not a test's timing
	}
}
