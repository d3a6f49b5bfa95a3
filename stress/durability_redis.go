package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The redis-server processes of the durability check: started on fixed
// ports the caller chooses (so that runs beside other users of the machine
// can keep apart), killed with SIGKILL, restarted from the same data
// directory. Each process is started by startChild, in a process group of
// its own, by one goroutine that reaps it and closes done.

// durProc is one redis-server the durability check started.
type durProc struct {
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

// durReady bounds the wait for a started server to answer PING.
const durReady = 10 * time.Second

// durStart starts redis-server on port with its files in dir (created if
// missing) and args after the defaults, and waits until it answers PING.
func durStart(ctx context.Context, port int, dir string, args ...string) (*durProc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p := &durProc{port: port, dir: dir, args: args}
	return p, p.start(ctx)
}

func (p *durProc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

func (p *durProc) start(ctx context.Context) error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("durability: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(p.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := append([]string{"--port", strconv.Itoa(p.port), "--bind", "127.0.0.1", "--daemonize", "no", "--dir", p.dir}, p.args...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	done, err := startChild(cmd)
	logf.Close()
	if err != nil {
		return fmt.Errorf("durability: starting redis-server on %d: %w", p.port, err)
	}
	p.cmd, p.done = cmd, done
	deadline := time.Now().Add(durReady)
	for {
		err := durPing(p.addr())
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("durability: redis-server on port %d exited (port taken?); see %s", p.port, filepath.Join(p.dir, "redis.log"))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.kill()
			return fmt.Errorf("durability: redis-server on port %d does not answer PING: %w", p.port, errors.Join(err, ctx.Err()))
		}
		time.Sleep(10 * time.Millisecond) // a server starting
	}
}

// durPing sends PING on a connection of its own (not a go-redis pool,
// which redials in the background after many failures) and wants PONG.
func durPing(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(conn, buf); err != nil {
		return err
	}
	if string(buf) != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", buf)
	}
	return nil
}

// kill sends SIGKILL and waits until the process is reaped. Killing a
// dead process does nothing.
func (p *durProc) kill() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// restart starts the killed process again, same port, same directory.
func (p *durProc) restart(ctx context.Context) error {
	p.kill()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := p.start(ctx)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond) // the port is still held by the dead process
	}
}

// durCluster is a Redis Cluster of three masters with one replica each.
type durCluster struct {
	nodes []*durProc
	lag   *durLag // in front of nodes[0], or nil
	// first is the address the cluster knows nodes[0] by: the proxy's
	// when there is one.
	first string
}

// durStartCluster starts six nodes on ports base..base+5, their cluster
// bus on bus..bus+5, with no persistence and the given node timeout, and
// joins them with redis-cli --cluster create, one replica per master
// (nodes[0] is a master). With lag > 0, nodes[0] is known to the cluster
// by a durLag proxy on port base+6, so its replica lags it by lag. It
// returns once the cluster is whole (see healthy).
func durStartCluster(ctx context.Context, base, bus int, root string, nodeTimeout, lag time.Duration) (*durCluster, error) {
	cl := &durCluster{}
	var addrs []string
	for i := range 6 {
		args := []string{"--save", "", "--appendonly", "no", "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10),
			"--cluster-port", strconv.Itoa(bus + i), "--repl-diskless-sync-delay", "0"}
		if i == 0 && lag > 0 {
			args = append(args, "--cluster-announce-port", strconv.Itoa(base+6), "--cluster-announce-bus-port", strconv.Itoa(bus))
		}
		p, err := durStart(ctx, base+i, filepath.Join(root, strconv.Itoa(base+i)), args...)
		if err != nil {
			cl.kill()
			return nil, err
		}
		cl.nodes = append(cl.nodes, p)
		addrs = append(addrs, p.addr())
	}
	cl.first = addrs[0]
	if lag > 0 {
		l, err := durStartLag(net.JoinHostPort("127.0.0.1", strconv.Itoa(base+6)), addrs[0], lag)
		if err != nil {
			cl.kill()
			return nil, err
		}
		cl.lag, cl.first = l, l.ln.Addr().String()
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		cl.kill()
		return nil, fmt.Errorf("durability: %w", err)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	// redis-cli waits for the nodes to agree without a limit of its own: a
	// cluster that never does must fail the check, not hold it (as in
	// internal/redistest's createCluster).
	const create = 30 * time.Second
	cctx, cancel := context.WithTimeout(ctx, create)
	defer cancel()
	cmd := exec.CommandContext(cctx, cli, args...)
	cmd.WaitDelay = time.Second // the output is a pipe: a child of redis-cli's may hold it open
	if out, err := cmd.CombinedOutput(); err != nil {
		cl.kill()
		if cctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("not done within %v: %w", create, err)
		}
		return nil, fmt.Errorf("durability: redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := cl.waitHealthy(ctx); err != nil {
		cl.kill()
		return nil, err
	}
	return cl, nil
}

// waitHealthy waits until the cluster is whole (see healthy), for up to
// 30 seconds.
func (cl *durCluster) waitHealthy(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cl.healthy(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("durability: the cluster is not whole: %w", errors.Join(err, ctx.Err()))
		}
		time.Sleep(50 * time.Millisecond) // a cluster converging
	}
}

func (cl *durCluster) kill() {
	for _, p := range cl.nodes {
		p.kill()
	}
	if cl.lag != nil {
		cl.lag.close()
	}
}

// durNode is a line of CLUSTER NODES.
type durNode struct {
	id, addr, master string // master: a replica's master's ID
	isMaster, slots  bool
}

// nodesInfo reads CLUSTER NODES from the first live node.
func (cl *durCluster) nodesInfo(ctx context.Context) ([]durNode, error) {
	var firstErr error
	for _, p := range cl.nodes {
		ns, err := durNodes(ctx, p.addr())
		if err == nil {
			return ns, nil
		}
		firstErr = errors.Join(firstErr, err)
	}
	return nil, firstErr
}

// durNodes reads CLUSTER NODES at addr.
func durNodes(ctx context.Context, addr string) ([]durNode, error) {
	out, err := durDo(ctx, addr, "cluster", "nodes")
	if err != nil {
		return nil, err
	}
	var ns []durNode
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := durNode{id: f[0], addr: addr, isMaster: strings.Contains(f[2], "master"), slots: len(f) > 8}
		if f[3] != "-" {
			n.master = f[3]
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// healthy says why the cluster is not whole, or nil: every node sees
// cluster_state:ok and six nodes, every master serving slots has an online
// replica, every replica's link is up.
func (cl *durCluster) healthy(ctx context.Context) error {
	ns, err := cl.nodesInfo(ctx)
	if err != nil {
		return err
	}
	serving := map[string]bool{}
	for _, n := range ns {
		if n.isMaster && n.slots {
			serving[n.addr] = true
		}
	}
	if len(serving) != 3 {
		return fmt.Errorf("%d masters serve slots", len(serving))
	}
	for _, p := range cl.nodes {
		ns, err := durNodes(ctx, p.addr())
		if err != nil {
			return err
		}
		replicas := 0
		for _, n := range ns {
			if n.master != "" {
				replicas++
			}
		}
		if replicas != 3 {
			return fmt.Errorf("%s sees %d replicas", p.addr(), replicas)
		}
		out, err := durDo(ctx, p.addr(), "cluster", "info")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "cluster_state:ok") || !strings.Contains(out, "cluster_known_nodes:6") {
			return fmt.Errorf("%s: cluster not ok", p.addr())
		}
		repl, err := durDo(ctx, p.addr(), "info", "replication")
		if err != nil {
			return err
		}
		switch {
		case strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up"):
			return fmt.Errorf("%s: replica link down", p.addr())
		case serving[p.addr()] && !strings.Contains(repl, "state=online"):
			return fmt.Errorf("%s: master without an online replica", p.addr())
		}
	}
	return nil
}

// durDo sends one command to addr on a connection of its own and returns
// the reply as text.
func durDo(ctx context.Context, addr string, args ...any) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...).Result()
	if err != nil {
		return "", err
	}
	switch v := v.(type) {
	case string:
		return v, nil
	case []any:
		var b strings.Builder
		for _, x := range v {
			fmt.Fprintln(&b, x)
		}
		return b.String(), nil
	default:
		return fmt.Sprint(v), nil
	}
}
