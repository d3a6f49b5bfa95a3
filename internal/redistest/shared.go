package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// defaultAddr is where a developer's or CI's Redis usually listens.
const defaultAddr = "127.0.0.1:6379"

// userPingTimeout bounds the PING to a server the user or the machine
// provides; it is not being started, so it answers at once or not at all.
const userPingTimeout = 2 * time.Second

// shared is the private redis-server that Addr starts when it must: one per
// test binary, started lazily, stopped by Stop. Everything in it is guarded
// by mu.
var shared struct {
	mu   sync.Mutex
	proc *process // nil until started, and after Stop
	addr string
	dir  string // os.MkdirTemp directory for --dir and the log; removed by Stop
	err  error  // a failed start, remembered so every later test fails fast
}

// Alone returns the address of a server that t may load as hard as a
// benchmark does: $TOKENSHARD_REDIS_ADDR if set (the user chose it), else a
// private redis-server of t's own (see Start), else, where there is no
// redis-server binary, Addr's. A benchmark run on the server that other
// test binaries share takes its one thread from their tests: in CI's step
// without -race, a math/big check of the decide script took 71 s beside
// bench's Redis table instead of 9 s.
func Alone(t testing.TB) string {
	t.Helper()
	if os.Getenv(envAddr) != "" {
		return Addr(t)
	}
	if _, err := findBinary(); err != nil {
		return Addr(t)
	}
	return Start(t).Addr()
}

// Addr returns the address of a real Redis server for integration tests, in
// this order:
//
//  1. $TOKENSHARD_REDIS_ADDR if set; if it does not answer PING the test
//     fails, since the user asked for it;
//  2. a server already answering PING on 127.0.0.1:6379;
//  3. a private redis-server (found on PATH, in /usr/bin or in /usr/sbin)
//     shared by the whole test binary: started once, lazily, and stopped by
//     Stop, which TestMain must call after m.Run.
//
// When none is possible it skips the test with a loud message saying the
// Redis integration tests did not run and how to enable them, or fails it
// under TOKENSHARD_REQUIRE_REDIS=1.
//
// The server may be shared with other tests and other test binaries, and
// nothing is flushed: tests must use keys of their own (a per-test prefix)
// and must not FLUSHDB or FLUSHALL. Addr is safe for concurrent use.
func Addr(t testing.TB) string {
	t.Helper()
	if addr := os.Getenv(envAddr); addr != "" {
		if err := ping(addr, userPingTimeout); err != nil {
			t.Fatalf("redistest: %s=%s does not answer PING: %v", envAddr, addr, err)
		}
		return addr
	}

	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.proc != nil {
		return shared.addr
	}
	if shared.err != nil {
		t.Fatalf("%v", shared.err)
	}
	if ping(defaultAddr, userPingTimeout) == nil {
		return defaultAddr
	}
	bin, err := findBinary()
	if err != nil {
		skipOrFail(t, fmt.Sprintf("%s is not set, nothing answers PING on %s, and\n"+
			"no redis-server binary was found on PATH, in /usr/bin or in /usr/sbin.", envAddr, defaultAddr))
	}
	if err := startShared(bin); err != nil {
		shared.err = err
		t.Fatalf("%v", err)
	}
	return shared.addr
}

// startShared starts the shared server, trying a few free ports (see the
// race at freePort). It holds no lock; Addr does.
func startShared(bin string) error {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	log := filepath.Join(dir, "redis.log")
	for try := 1; ; try++ {
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("redistest: finding a free port: %w", err)
		}
		p, err := startProcess(bin, port, dir, log)
		if err == nil {
			shared.proc, shared.dir = p, dir
			shared.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			return nil
		}
		if !errors.Is(err, errExited) || try == startTries {
			os.RemoveAll(dir)
			return fmt.Errorf("%w\n(shared server, try %d of %d)", err, try, startTries)
		}
	}
}

// Stop kills the shared private server, if Addr started one, and the shared
// cluster, if ClusterAddrs started one, waits until they are reaped and
// removes their files. It is safe to call always, and more than once; a
// later Addr or ClusterAddrs starts a new one if it needs one.
func Stop() {
	sharedCluster.mu.Lock()
	stopSharedCluster()
	sharedCluster.mu.Unlock()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.proc != nil {
		shared.proc.kill()
		os.RemoveAll(shared.dir)
	}
	shared.proc, shared.addr, shared.dir, shared.err = nil, "", "", nil
}
