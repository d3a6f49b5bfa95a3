package redistest

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// envReplicaClusterAddrs names the variable that points failover tests at a
// Redis Cluster of ClusterMasters masters with one replica each, which the
// user (or CI) started: every node's address, joined by commas. The tests
// kill a master of it and leave it healthy again (see ReplicaCluster), so
// its nodes must be daemons started from a configuration file (.ci/run
// starts such a cluster).
const envReplicaClusterAddrs = "TOKENSHARD_REDIS_REPLICA_CLUSTER_ADDRS"

// replicaHealthy bounds the wait for a replica cluster to be whole: every
// node agreeing on the slots, every master with a replica in sync. A killed
// master that rejoins as a replica resynchronises in full, which takes well
// under this for a test's keys.
const replicaHealthy = 30 * time.Second

// replicaArgs make a replica start its full synchronisation at once:
// Redis 7 waits 5 s by default for more replicas to share a diskless one.
var replicaArgs = []string{"--repl-diskless-sync-delay", "0"}

// ReplicaCluster is a Redis Cluster of ClusterMasters masters with one
// replica each, on loopback, for a test that fails a master over: Kill a
// master, watch its replica take its place (Role), then Restart the killed
// node, which comes back from its cluster configuration as a replica, and
// WaitHealthy. It is safe for concurrent use.
type ReplicaCluster struct {
	cli   string
	addrs []string
	nodes map[string]*Server // the nodes this package started, by address; nil for a cluster of $TOKENSHARD_REDIS_REPLICA_CLUSTER_ADDRS

	mu     sync.Mutex
	killed map[string]daemon // killed nodes of a cluster this package did not start: how to start them again
	hung   map[string]int    // stopped nodes (Hang), by address: their process IDs
}

// daemon is how to start again a node this package did not start: its
// executable and configuration file, as it reported them before its kill.
type daemon struct{ exe, conf string }

// GetReplicaCluster returns a replica cluster for a failover test:
// $TOKENSHARD_REDIS_REPLICA_CLUSTER_ADDRS if set (failing the test if that
// cluster is not whole within a few seconds), else a private one it
// starts, with no persistence, a node timeout of one second and no delay
// before a replica's full synchronisation, killed
// when the test ends. Either way the test has the cluster to itself while
// it runs; it must leave the cluster of the variable whole, for the next
// run (Kill registers a cleanup that does, if the test has not). It
// skips loudly without redis-server or redis-cli (fails under
// TOKENSHARD_REQUIRE_REDIS=1).
func GetReplicaCluster(t testing.TB) *ReplicaCluster {
	t.Helper()
	cli, err := findCLI()
	if err != nil {
		skipOrFail(t, err.Error()+".")
	}
	c := &ReplicaCluster{cli: cli, killed: map[string]daemon{}, hung: map[string]int{}}
	if env := os.Getenv(envReplicaClusterAddrs); env != "" {
		c.addrs = strings.Split(env, ",")
		if len(c.addrs) != 2*ClusterMasters {
			t.Fatalf("redistest: %s has %d addresses, want %d (%d masters, one replica each)",
				envReplicaClusterAddrs, len(c.addrs), 2*ClusterMasters, ClusterMasters)
		}
		for _, a := range c.addrs {
			if err := ping(a, userPingTimeout); err != nil {
				t.Fatalf("redistest: %s: %s does not answer PING: %v", envReplicaClusterAddrs, a, err)
			}
		}
		c.WaitHealthy(t)
		return c
	}
	err = formCluster(t, func() error {
		c.nodes, c.addrs = map[string]*Server{}, nil
		var logs []string
		for range 2 * ClusterMasters {
			s := startNode(t, false, replicaArgs...)
			c.nodes[s.Addr()] = s
			c.addrs = append(c.addrs, s.Addr())
			logs = append(logs, s.log)
		}
		return createCluster(cli, c.addrs, logs, 1)
	}, func() {
		for _, s := range c.nodes {
			s.Kill()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	c.WaitHealthy(t)
	return c
}

// Addrs returns every node's address, masters and replicas: they do not
// change across Kill and Restart, but their roles do (see Nodes).
func (c *ReplicaCluster) Addrs() []string { return append([]string(nil), c.addrs...) }

// ClusterNode is one node as CLUSTER NODES describes it.
type ClusterNode struct {
	ID, Addr string
	Master   bool   // a master (with or without slots)
	MasterID string // a replica's master's ID; "" for a master
	Failed   bool   // flagged fail or fail? by the node asked
	Slots    bool   // serves at least one slot
}

// Nodes returns the cluster's nodes as the first node that answers
// CLUSTER NODES sees them.
func (c *ReplicaCluster) Nodes(t testing.TB) []ClusterNode {
	t.Helper()
	nodes, err := c.nodesNow()
	if err != nil {
		t.Fatal(err)
	}
	return nodes
}

func (c *ReplicaCluster) nodesNow() ([]ClusterNode, error) {
	var firstErr error
	for _, a := range c.addrs {
		out, err := c.run(a, "cluster", "nodes")
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		return parseClusterNodes(out)
	}
	return nil, firstErr
}

// parseClusterNodes reads CLUSTER NODES: "id ip:port@bus[,host] flags
// master ping pong epoch link slot...".
func parseClusterNodes(out string) ([]ClusterNode, error) {
	var nodes []ClusterNode
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 8 {
			return nil, fmt.Errorf("redistest: CLUSTER NODES line %q", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		flags := "," + f[2] + ","
		n := ClusterNode{
			ID:     f[0],
			Addr:   addr,
			Master: strings.Contains(flags, ",master,"),
			Failed: strings.Contains(flags, ",fail,") || strings.Contains(flags, ",fail?,"),
			Slots:  len(f) > 8,
		}
		if f[3] != "-" {
			n.MasterID = f[3]
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// Role returns what the node at addr says it is: "master" or "slave" (the
// first line of ROLE), or an error if it does not answer.
func (c *ReplicaCluster) Role(addr string) (string, error) {
	out, err := c.run(addr, "role")
	if err != nil {
		return "", err
	}
	role, _, _ := strings.Cut(out, "\n")
	return strings.TrimSpace(role), nil
}

// run runs redis-cli against the node at addr (see runCLI).
func (c *ReplicaCluster) run(addr string, args ...string) (string, error) {
	return runCLI(c.cli, addr, args...)
}

// runCLI runs the redis-cli at cli against the server at addr and returns
// its output; a reply that is an error, or no connection, is an error.
// Out of a terminal redis-cli prints an error reply as its code and
// message ("ERR ...", "NOGOODSLAVE ...", "LOADING ..."), and exits 0.
func runCLI(cli, addr string, args ...string) (string, error) {
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command(cli, append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	s := string(out)
	if err != nil || strings.HasPrefix(s, "Could not connect") || errorReply.MatchString(s) ||
		strings.HasPrefix(s, "(error)") {
		return s, fmt.Errorf("redistest: redis-cli -p %s %s: %v: %s", port, strings.Join(args, " "), err, strings.TrimSpace(s))
	}
	return s, nil
}

// errorReply matches redis-cli's output of an error reply: one line, a code
// in capitals, a space.
var errorReply = regexp.MustCompile(`^[A-Z][A-Z_]+ [^\n]*\s*$`)

// info returns the fields of INFO section at addr.
func (c *ReplicaCluster) info(addr, section string) (map[string]string, error) {
	out, err := c.run(addr, "info", section)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for line := range strings.Lines(out) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// Kill stops the node at addr with SIGKILL and returns once it refuses
// connections. A node of $TOKENSHARD_REDIS_REPLICA_CLUSTER_ADDRS must be a
// daemon started from a configuration file (INFO server's config_file), so
// that Restart can start it again; its process ID is INFO server's
// process_id. For such a node Kill registers a cleanup that restarts it,
// if the test has not, and waits until the cluster is whole.
func (c *ReplicaCluster) Kill(t testing.TB, addr string) {
	t.Helper()
	if s := c.nodes[addr]; s != nil {
		s.Kill() // a private cluster ends with the test
		return
	}
	t.Cleanup(func() {
		c.mu.Lock()
		_, down := c.killed[addr]
		c.mu.Unlock()
		if down {
			c.Restart(t, addr)
			c.WaitHealthy(t)
		}
	})
	pid, info := c.process(t, addr)
	d := daemon{exe: info["executable"], conf: info["config_file"]}
	if d.exe == "" || d.conf == "" {
		t.Fatalf("redistest: %s was not started from a configuration file (INFO server: executable %q, config_file %q): "+
			"it could not be restarted after the kill", addr, d.exe, d.conf)
	}
	if mode, err := c.run(addr, "config", "get", "daemonize"); err != nil || !strings.Contains(mode, "yes") {
		t.Fatalf("redistest: %s does not run as a daemon (CONFIG GET daemonize: %q %v): it could not be restarted after the kill", addr, mode, err)
	}
	c.mu.Lock()
	c.killed[addr] = d
	c.mu.Unlock()
	if err := kill(pid); err != nil {
		t.Fatalf("redistest: killing %s (pid %d): %v", addr, pid, err)
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		conn, err := net.DialTimeout("tcp", addr, pingTimeout)
		if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
			return
		}
		if err == nil {
			conn.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: %s still accepts connections %v after SIGKILL", addr, readyTimeout)
		}
		time.Sleep(pollEvery) // a process dying, not a test's timing
	}
}

// process returns the process ID of the node at addr and its INFO server
// section, failing the test if it cannot read them.
func (c *ReplicaCluster) process(t testing.TB, addr string) (int, map[string]string) {
	t.Helper()
	info, err := c.info(addr, "server")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(info["process_id"])
	if err != nil || pid <= 1 {
		t.Fatalf("redistest: %s: INFO server process_id %q", addr, info["process_id"])
	}
	return pid, info
}

// Hang stops the node at addr with SIGSTOP, as a machine that froze: its
// connections stay open and new ones are accepted, but it answers nothing.
// Resume continues it (a cleanup does, if the test has not); a master the
// cluster failed over meanwhile then rejoins as a replica.
func (c *ReplicaCluster) Hang(t testing.TB, addr string) {
	t.Helper()
	pid, _ := c.process(t, addr)
	c.mu.Lock()
	c.hung[addr] = pid
	c.mu.Unlock()
	t.Cleanup(func() { c.Resume(t, addr) })
	if err := freeze(pid); err != nil {
		t.Fatalf("redistest: stopping %s (pid %d): %v", addr, pid, err)
	}
}

// Resume continues the node at addr that Hang stopped; any other node is
// left alone.
func (c *ReplicaCluster) Resume(t testing.TB, addr string) {
	t.Helper()
	c.mu.Lock()
	pid, ok := c.hung[addr]
	delete(c.hung, addr)
	c.mu.Unlock()
	if ok {
		if err := thaw(pid); err != nil {
			t.Errorf("redistest: continuing %s (pid %d): %v", addr, pid, err)
		}
	}
}

// Restart starts the killed node at addr again, on the same port with the
// same cluster configuration file, so it rejoins the cluster (as a replica,
// if its replica took its place meanwhile), and waits until it answers
// PING. A node that is not down is left alone.
func (c *ReplicaCluster) Restart(t testing.TB, addr string) {
	t.Helper()
	if s := c.nodes[addr]; s != nil {
		s.mu.Lock()
		down := s.proc == nil
		s.mu.Unlock()
		if down {
			s.Restart(t)
		}
		return
	}
	c.mu.Lock()
	d, ok := c.killed[addr]
	delete(c.killed, addr)
	c.mu.Unlock()
	if !ok {
		return
	}
	// The configuration says daemonize yes (Kill checked): the process
	// started here forks the server and exits, and the server's output
	// goes nowhere, as it did before.
	cmd := exec.Command(d.exe, d.conf)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("redistest: restarting %s (%s %s): %v\n%s", addr, d.exe, d.conf, err, out)
	}
	deadline := time.Now().Add(readyTimeout)
	for ping(addr, pingTimeout) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: %s restarted from %s does not answer PING within %v", addr, d.conf, readyTimeout)
		}
		time.Sleep(pollEvery) // a server starting, not a test's timing
	}
}

// WaitHealthy waits until the cluster is whole, failing the test if it is
// not within replicaHealthy: every node answers with cluster_state:ok and
// every slot served, and ClusterMasters masters serve the slots, each with
// a replica that no node flags failed and whose link to it is up.
func (c *ReplicaCluster) WaitHealthy(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(replicaHealthy)
	for {
		err := c.healthy()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: the replica cluster %v is not whole within %v: %v", c.addrs, replicaHealthy, err)
		}
		time.Sleep(50 * time.Millisecond) // a real cluster converging, not a test's timing
	}
}

// healthy says why the cluster is not whole, or nil.
func (c *ReplicaCluster) healthy() error {
	for _, a := range c.addrs {
		out, err := c.run(a, "cluster", "info")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "cluster_state:ok") || !strings.Contains(out, "cluster_slots_ok:16384") {
			return fmt.Errorf("%s: %s", a, strings.TrimSpace(out))
		}
		nodes, err := c.run(a, "cluster", "nodes")
		if err != nil {
			return err
		}
		ns, err := parseClusterNodes(nodes)
		if err != nil {
			return err
		}
		if len(ns) != len(c.addrs) {
			return fmt.Errorf("%s knows %d nodes, want %d", a, len(ns), len(c.addrs))
		}
		masters := map[string]bool{} // serving masters: has a replica in sync
		for _, n := range ns {
			if n.Failed {
				return fmt.Errorf("%s flags %s failed", a, n.Addr)
			}
			if n.Master && n.Slots {
				masters[n.ID] = false
			}
		}
		if len(masters) != ClusterMasters {
			return fmt.Errorf("%s sees %d masters serving slots, want %d", a, len(masters), ClusterMasters)
		}
		for _, n := range ns {
			if n.Master {
				continue
			}
			if _, ok := masters[n.MasterID]; !ok {
				return fmt.Errorf("%s: replica %s of %s, not a serving master", a, n.Addr, n.MasterID)
			}
			info, err := c.info(n.Addr, "replication")
			if err != nil {
				return err
			}
			if info["master_link_status"] != "up" || info["master_sync_in_progress"] != "0" {
				return fmt.Errorf("replica %s: master_link_status %q, master_sync_in_progress %q",
					n.Addr, info["master_link_status"], info["master_sync_in_progress"])
			}
			masters[n.MasterID] = true
		}
		for id, ok := range masters {
			if !ok {
				return fmt.Errorf("%s: master %s has no replica", a, id)
			}
		}
	}
	return nil
}
