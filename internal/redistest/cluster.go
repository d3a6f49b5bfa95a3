package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// envClusterAddrs names the variable that points tests at a Redis Cluster
// the user (or CI) started: its masters' addresses, joined by commas.
const envClusterAddrs = "TOKENSHARD_REDIS_CLUSTER_ADDRS"

// ClusterMasters is how many masters a cluster started here has. Each owns
// an equal range of the 16384 hash slots and has no replica.
const ClusterMasters = 3

// clusterReady bounds the wait for a new cluster to agree on its slots.
const clusterReady = 30 * time.Second

// clusterArgs make a redis-server a cluster node. A node that cannot reach
// another within the timeout marks it failed; without full coverage the
// slots of the other masters keep serving while one is down.
func clusterArgs(port int) []string {
	return []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes-" + strconv.Itoa(port) + ".conf",
		"--cluster-node-timeout", "1000",
		"--cluster-require-full-coverage", "no",
	}
}

// findCLI returns the path of redis-cli, which creates clusters.
func findCLI() (string, error) {
	if p, err := exec.LookPath("redis-cli"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/redis-cli", "/usr/sbin/redis-cli"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("redistest: no redis-cli binary on PATH, in /usr/bin or in /usr/sbin")
}

// clusterCreate bounds redis-cli --cluster create, whose wait for the nodes
// to join has no end of its own. A node drops a CLUSTER MEET whose
// handshake takes longer than the node timeout (a second here) and never
// tries it again: seen once on a loaded machine, where two of three nodes
// stayed strangers and the test waited until the binary's timeout. A
// create takes about 2 s on a quiet machine.
var clusterCreate = 30 * time.Second // a variable, for a test to shorten

// createCluster joins the nodes at addrs into one cluster with redis-cli
// --cluster create, replicas replicas to a master, then waits until every
// node reports cluster_state:ok and knows every slot. Its error shows the
// tail of each node's log (logs, in the order of addrs).
func createCluster(cli string, addrs, logs []string, replicas int) error {
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), clusterCreate)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.WaitDelay = time.Second // the output is a pipe: a child of redis-cli's may hold it open
	out, err := cmd.CombinedOutput()
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("not done within %v", clusterCreate)
	}
	if err == nil {
		err = waitCluster(cli, addrs)
	} else {
		err = fmt.Errorf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err != nil {
		for i, a := range addrs {
			err = fmt.Errorf("%w\n%s's log:\n%s", err, a, tail(logs[i]))
		}
	}
	return err
}

// createTries is how many times a cluster is started afresh, on new ports,
// when its nodes would not form one.
const createTries = 3

// formCluster runs form, which starts fresh nodes and joins them, until it
// succeeds, createTries times at most, running undo (which stops form's
// nodes) after each failure. It returns the last failure.
func formCluster(t testing.TB, form func() error, undo func()) error {
	t.Helper()
	for try := 1; ; try++ {
		err := form()
		if err == nil {
			return nil
		}
		undo()
		if try == createTries {
			return fmt.Errorf("%w\n(try %d of %d)", err, try, createTries)
		}
		t.Logf("%v\n(try %d of %d: starting the cluster again)", err, try, createTries)
	}
}

// waitCluster waits until every node at addrs reports cluster_state:ok with
// every slot assigned.
func waitCluster(cli string, addrs []string) error {
	deadline := time.Now().Add(clusterReady)
	for _, a := range addrs {
		host, port, _ := net.SplitHostPort(a)
		for {
			out, _ := exec.Command(cli, "-h", host, "-p", port, "cluster", "info").Output()
			info := string(out)
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384") {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("redistest: cluster node %s not ready within %v:\n%s", a, clusterReady, info)
			}
			time.Sleep(50 * time.Millisecond) // a real server converging, not a test's timing
		}
	}
	return nil
}

// Cluster is a private Redis Cluster of ClusterMasters masters on loopback,
// owned by one test, which may kill and restart its nodes (Node). Its nodes
// keep an append-only file synced on every write, so a node killed and
// restarted comes back with its keys and its slots.
type Cluster struct {
	cli   string
	nodes []*Server
}

// StartCluster starts ClusterMasters cluster nodes on free ports, joins them
// with redis-cli --cluster create and waits until the cluster is ready. It
// registers t.Cleanup to kill them. Without redis-server or redis-cli it
// skips loudly (fails under TOKENSHARD_REQUIRE_REDIS=1).
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	cli, err := findCLI()
	if err != nil {
		skipOrFail(t, err.Error()+".")
	}
	c := &Cluster{cli: cli}
	err = formCluster(t, func() error {
		c.nodes = c.nodes[:0]
		for range ClusterMasters {
			c.nodes = append(c.nodes, startNode(t, true))
		}
		return createCluster(cli, c.Addrs(), c.logs(), 0)
	}, func() {
		for _, n := range c.nodes {
			n.Kill()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// logs returns the paths of the nodes' logs.
func (c *Cluster) logs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.log
	}
	return out
}

// startNode starts one cluster node, with persistence if persist (an
// append-only file synced on every write) and the extra redis-server
// arguments, retrying the port race as Start does.
func startNode(t testing.TB, persist bool, extra ...string) *Server {
	t.Helper()
	bin, err := findBinary()
	if err != nil {
		skipOrFail(t, err.Error()+".")
	}
	dir := t.TempDir()
	s := &Server{bin: bin, dir: dir, log: filepath.Join(dir, "redis.log")}
	t.Cleanup(s.Kill)
	for try := 1; ; try++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("redistest: finding a free port: %v", err)
		}
		s.args = clusterArgs(port)
		if persist {
			s.args = append(s.args, "--appendonly", "yes", "--appendfsync", "always")
		}
		s.args = append(s.args, extra...)
		p, err := startProcess(bin, port, dir, s.log, s.args...)
		if err == nil {
			s.port, s.proc = port, p
			return s
		}
		if !errors.Is(err, errExited) || try == startTries {
			t.Fatalf("%v\n(try %d of %d)", err, try, startTries)
		}
	}
}

// Addrs returns the masters' addresses, which do not change across Kill and
// Restart.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Addr()
	}
	return out
}

// Node returns the i-th master's server, to kill and restart.
func (c *Cluster) Node(i int) *Server { return c.nodes[i] }

// Wait waits until every node reports cluster_state:ok with every slot
// served (after a node's restart, say), failing the test otherwise.
func (c *Cluster) Wait(t testing.TB) {
	t.Helper()
	if err := waitCluster(c.cli, c.Addrs()); err != nil {
		t.Fatal(err)
	}
}

// CLI runs redis-cli with args (for example --cluster reshard) and returns
// its combined output, failing the test if it fails.
func (c *Cluster) CLI(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(c.cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// sharedCluster is the private cluster ClusterAddrs starts when it must: one
// per test binary, started lazily, stopped by Stop. Guarded by mu.
var sharedCluster struct {
	mu    sync.Mutex
	procs []*process
	addrs []string
	dir   string
	err   error
}

// ClusterAddrs returns the masters' addresses of a real Redis Cluster for
// integration tests: $TOKENSHARD_REDIS_CLUSTER_ADDRS (comma-separated) if set,
// failing the test if one does not answer PING; else a private cluster of
// ClusterMasters masters shared by the whole test binary, started once,
// lazily, without persistence, and stopped by Stop. Like Addr's server it is
// shared: tests use keys of their own and flush nothing. Without
// redis-server or redis-cli it skips loudly (fails under
// TOKENSHARD_REQUIRE_REDIS=1).
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	if env := os.Getenv(envClusterAddrs); env != "" {
		addrs := strings.Split(env, ",")
		for _, a := range addrs {
			if err := ping(a, userPingTimeout); err != nil {
				t.Fatalf("redistest: %s: %s does not answer PING: %v", envClusterAddrs, a, err)
			}
		}
		return addrs
	}
	sharedCluster.mu.Lock()
	defer sharedCluster.mu.Unlock()
	if sharedCluster.addrs != nil {
		return sharedCluster.addrs
	}
	if sharedCluster.err != nil {
		t.Fatalf("%v", sharedCluster.err)
	}
	bin, err := findBinary()
	if err != nil {
		skipOrFail(t, err.Error()+".")
	}
	cli, err := findCLI()
	if err != nil {
		skipOrFail(t, err.Error()+".")
	}
	if err := formCluster(t, func() error { return startSharedCluster(bin, cli) }, stopSharedCluster); err != nil {
		sharedCluster.err = err
		t.Fatal(err)
	}
	return sharedCluster.addrs
}

func startSharedCluster(bin, cli string) error {
	dir, err := os.MkdirTemp("", "redistest-cluster-")
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	sharedCluster.dir = dir
	var addrs, logs []string
	for i := range ClusterMasters {
		nd := filepath.Join(dir, strconv.Itoa(i))
		logs = append(logs, filepath.Join(nd, "redis.log"))
		if err := os.Mkdir(nd, 0o755); err != nil {
			return fmt.Errorf("redistest: %w", err)
		}
		for try := 1; ; try++ {
			port, err := freePort()
			if err != nil {
				return fmt.Errorf("redistest: finding a free port: %w", err)
			}
			p, err := startProcess(bin, port, nd, logs[i], clusterArgs(port)...)
			if err == nil {
				sharedCluster.procs = append(sharedCluster.procs, p)
				addrs = append(addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
				break
			}
			if !errors.Is(err, errExited) || try == startTries {
				return fmt.Errorf("%w\n(shared cluster node %d, try %d of %d)", err, i, try, startTries)
			}
		}
	}
	if err := createCluster(cli, addrs, logs, 0); err != nil {
		return err
	}
	sharedCluster.addrs = addrs
	return nil
}

// stopSharedCluster kills the shared cluster's nodes; mu is held.
func stopSharedCluster() {
	for _, p := range sharedCluster.procs {
		p.kill()
	}
	if sharedCluster.dir != "" {
		os.RemoveAll(sharedCluster.dir)
	}
	sharedCluster.procs, sharedCluster.addrs, sharedCluster.dir, sharedCluster.err = nil, nil, "", nil
}

// RestartEmpty kills the i-th master, deletes its data (its append-only
// files; the cluster configuration stays, so it keeps its slots) and
// starts it again: a master that lost its data, as one without persistence
// does. It waits until the cluster is ready again.
func (c *Cluster) RestartEmpty(t testing.TB, i int) {
	t.Helper()
	s := c.nodes[i]
	s.Kill()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "appendonly") || strings.HasSuffix(e.Name(), ".rdb") {
			if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.Restart(t)
	c.Wait(t)
}
