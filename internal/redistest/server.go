package redistest

import (
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

const (
	// startTries bounds how many free ports Start tries; each try can lose
	// the race described at freePort.
	startTries = 3
	// restartFor bounds how long Restart keeps trying the same port while
	// something else still holds it.
	restartFor = 5 * time.Second
)

// Server is a private redis-server process owned by one test, which may kill
// and restart it on the same port (outage tests). It has no persistence: a
// restart comes back empty.
//
// Server is safe for concurrent use. The zero value is not usable; get one
// from Start. A Server must not be copied.
type Server struct {
	bin  string
	port int
	dir  string // the server's --dir and the home of its log; the test's TempDir
	log  string
	args []string // extra redis-server arguments (a cluster node's)

	mu   sync.Mutex
	proc *process // nil while killed; guarded by mu
	hung bool     // stopped by Hang; guarded by mu
}

// Start starts redis-server on a free 127.0.0.1 port with no persistence and
// waits until it answers PING. It registers t.Cleanup to kill the server.
// When no redis-server binary exists it skips the test loudly, or fails it
// under TOKENSHARD_REQUIRE_REDIS=1; when the server will not start it fails
// the test, showing the tail of the server's log.
func Start(t testing.TB) *Server { return start(t) }

// start is Start with extra redis-server arguments.
func start(t testing.TB, args ...string) *Server {
	t.Helper()
	bin, err := findBinary()
	if err != nil {
		skipOrFail(t, err.Error()+".")
	}
	dir := t.TempDir() // registered before the Kill cleanup, so removed after it
	s := &Server{bin: bin, dir: dir, log: filepath.Join(dir, "redis.log"), args: args}
	t.Cleanup(s.Kill)
	for try := 1; ; try++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("redistest: finding a free port: %v", err)
		}
		p, err := startProcess(bin, port, dir, s.log, args...)
		if err == nil {
			s.port, s.proc = port, p
			return s
		}
		if !errors.Is(err, errExited) || try == startTries {
			t.Fatalf("%v\n(try %d of %d)", err, try, startTries)
		}
	}
}

// Addr returns the server's address, 127.0.0.1:port. It does not change
// across Kill and Restart.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Kill stops the server with SIGKILL and returns once the process has been
// reaped. Killing a killed server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
	s.hung = false
}

// Hang stops the server with SIGSTOP: it keeps its connections and its
// port and answers nothing, as a hung host does, until Resume or the end of
// the test (a cleanup continues it, so that Kill can reap it).
func (s *Server) Hang(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		t.Fatalf("redistest: hanging %s, which is not running", s.Addr())
	}
	t.Cleanup(func() { s.Resume(t) })
	if err := freeze(s.proc.cmd.Process.Pid); err != nil {
		t.Fatalf("redistest: stopping %s: %v", s.Addr(), err)
	}
	s.hung = true
}

// Resume continues a server Hang stopped; it does nothing to a running one.
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		if err := thaw(s.proc.cmd.Process.Pid); err != nil {
			t.Errorf("redistest: continuing %s: %v", s.Addr(), err)
		}
	}
	s.hung = false
}

// up reports whether the server runs and is not stopped by Hang.
func (s *Server) up() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.hung
}

// Restart starts the server again on the same port and waits until it
// answers PING; a running server is killed first. While the port is still
// held (by a dying process or a stranger) it retries for up to a few
// seconds, then fails the test.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
	deadline := time.Now().Add(restartFor)
	for {
		p, err := startProcess(s.bin, s.port, s.dir, s.log, s.args...)
		if err == nil {
			s.proc = p
			return
		}
		if !errors.Is(err, errExited) || time.Now().After(deadline) {
			t.Fatalf("redistest: restarting on %s: %v", s.Addr(), err)
		}
		time.Sleep(50 * time.Millisecond) // the port is still bound: let it go
	}
}
