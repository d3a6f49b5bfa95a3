package redistest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// SentinelMaster is the name under which the sentinels of StartSentinel
// monitor their primary (redis.FailoverOptions.MasterName).
const SentinelMaster = "mymaster"

// Sentinel is a primary with replicas, watched by Redis Sentinels, on
// loopback, for a test that fails the primary over: a client asks the
// sentinels at Addrs where the primary is (redis.NewFailoverClient), and
// Failover makes a replica the primary; Node gives a test a data node to
// kill or hang, Sentinels the sentinels. Each server is a private one (see
// Start), killed when the test ends. It is safe for concurrent use.
type Sentinel struct {
	cli       string
	nodes     []*Server // the primary and its replicas, as started
	sentinels []*Server
}

// StartSentinel starts a primary, its replica and one sentinel (a quorum
// of one); see StartSentinels.
func StartSentinel(t testing.TB) *Sentinel { return StartSentinels(t, 1, 1) }

// StartSentinels starts a primary, replicas replicas of it and sentinels
// sentinels (a quorum of a majority, a primary down after 1 s without an
// answer) and waits until every replica is in sync and each sentinel has a
// link to every replica and knows the other sentinels. It skips loudly
// without redis-server or redis-cli (fails under TOKENSHARD_REQUIRE_REDIS=1).
func StartSentinels(t testing.TB, replicas, sentinels int) *Sentinel {
	t.Helper()
	cli, err := findCLI()
	if err != nil {
		skipOrFail(t, err.Error()+".")
	}
	primary := start(t, replicaArgs...) // a primary's setting, kept by a replica that takes its place
	host, port, _ := net.SplitHostPort(primary.Addr())
	s := &Sentinel{cli: cli, nodes: []*Server{primary}}
	for range replicas {
		s.nodes = append(s.nodes, start(t, append([]string{"--replicaof", host, port}, replicaArgs...)...))
	}
	for range sentinels {
		conf := filepath.Join(t.TempDir(), "sentinel.conf") // the sentinel rewrites it
		err = os.WriteFile(conf, fmt.Appendf(nil, "sentinel monitor %s %s %s %d\n"+
			"sentinel down-after-milliseconds %[1]s 1000\nsentinel failover-timeout %[1]s 10000\n",
			SentinelMaster, host, port, sentinels/2+1), 0o644)
		if err != nil {
			t.Fatalf("redistest: writing %s: %v", conf, err)
		}
		s.sentinels = append(s.sentinels, start(t, conf, "--sentinel"))
	}
	s.wait(t, func() error {
		for _, sn := range s.sentinels {
			out, err := runCLI(cli, sn.Addr(), "sentinel", "replicas", SentinelMaster)
			if err != nil {
				return err
			}
			linked := 0
			for _, f := range records(out) {
				if f["flags"] == "slave" && f["master-link-status"] == "ok" {
					linked++
				}
			}
			if linked != replicas {
				return fmt.Errorf("sentinel %s sees %d replicas in sync, not %d: %s", sn.Addr(), linked, replicas, out)
			}
			out, err = runCLI(cli, sn.Addr(), "sentinel", "sentinels", SentinelMaster)
			if n := len(records(out)); err != nil || n != sentinels-1 {
				return fmt.Errorf("sentinel %s knows %d other sentinels, not %d: %v", sn.Addr(), n, sentinels-1, err)
			}
		}
		return nil
	})
	return s
}

// records reads redis-cli's output of SENTINEL REPLICAS or SENTINEL
// SENTINELS, when it is not a terminal: each record's field names and
// values, one a line, each record starting with its "name".
func records(out string) []map[string]string {
	var rs []map[string]string
	f := strings.Split(strings.TrimSpace(out), "\n")
	for i := 0; i+1 < len(f); i += 2 {
		if f[i] == "name" {
			rs = append(rs, map[string]string{})
		}
		if len(rs) > 0 {
			rs[len(rs)-1][f[i]] = f[i+1]
		}
	}
	return rs
}

// Addrs returns the sentinels' addresses.
func (s *Sentinel) Addrs() []string {
	var a []string
	for _, sn := range s.sentinels {
		a = append(a, sn.Addr())
	}
	return a
}

// Addr returns the first sentinel's address.
func (s *Sentinel) Addr() string { return s.sentinels[0].Addr() }

// Sentinels returns the sentinel servers, to hang one (Server.Hang).
func (s *Sentinel) Sentinels() []*Server { return slices.Clone(s.sentinels) }

// Node returns the data node at addr, primary or replica, to kill,
// restart or hang, or nil.
func (s *Sentinel) Node(addr string) *Server {
	for _, n := range s.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// Primary returns the address the first sentinel that runs and answers
// gives for the primary, or "" if none does.
func (s *Sentinel) Primary() string {
	for _, sn := range s.sentinels {
		if !sn.up() {
			continue // a hung sentinel would hold redis-cli
		}
		out, err := runCLI(s.cli, sn.Addr(), "sentinel", "get-master-addr-by-name", SentinelMaster)
		if f := strings.Fields(out); err == nil && len(f) == 2 {
			return net.JoinHostPort(f[0], f[1])
		}
	}
	return ""
}

// Failover makes a replica the primary (SENTINEL FAILOVER, which does not
// pause the old primary's clients: writes it takes until the switch are
// lost) and returns the old primary and the new one once a sentinel names
// the new one. The old primary is turned into a replica later, at a
// sentinel's next INFO of it (every 10 s). While the sentinel finds no
// replica to promote (NOGOODSLAVE: it promotes only a replica whose INFO
// it read in the last 5 s), Failover asks again.
func (s *Sentinel) Failover(t testing.TB) (from, to string) {
	t.Helper()
	from = s.Primary()
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
		if to = s.Primary(); to == from || to == "" {
			return fmt.Errorf("the sentinels still name %q as the primary", to)
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
			t.Fatalf("redistest: sentinels %v: %v", s.Addrs(), err)
		}
		time.Sleep(50 * time.Millisecond) // servers converging, not a test's timing
	}
}
