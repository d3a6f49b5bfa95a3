package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// readyTimeout bounds the wait for one started redis-server to answer PING.
	readyTimeout = 10 * time.Second
	// pollEvery is the pause between readiness polls.
	pollEvery = 10 * time.Millisecond
	// pingTimeout bounds one PING exchange while polling.
	pingTimeout = 200 * time.Millisecond
	// logTail is how much of a server's log a startup failure shows.
	logTail = 2048
)

// errNoBinary means no redis-server executable was found.
var errNoBinary = errors.New("redistest: no redis-server binary on PATH, in /usr/bin or in /usr/sbin")

// errExited means a redis-server exited before it answered PING, most often
// because its port was taken; the caller may retry.
var errExited = errors.New("redistest: redis-server exited before answering PING")

// findBinary returns the path of redis-server: on PATH first, then the two
// places packages put it when PATH lacks them (Debian's is /usr/bin).
func findBinary() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/redis-server", "/usr/sbin/redis-server"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errNoBinary
}

// busOffset is how far above its port a cluster node listens for the
// other nodes (Redis Cluster's bus port).
const busOffset = 10000

// given holds every port freePort returned in this process, and each one's
// bus port: a test that kills its server expects the port to stay dead, or
// to get it back on Restart, while the package's other tests start servers
// beside it (t.Parallel).
var given struct {
	mu    sync.Mutex
	ports map[int]bool
}

// maxPort is the highest port a cluster node can have: redis-server exits
// at once when its bus port, busOffset above, would pass 65535, and a
// kernel may give a listener such a port: Linux does where the ephemeral
// range is set high.
const maxPort = 65535 - busOffset

// freePort asks the kernel for a free port on 127.0.0.1 by listening on :0
// and closing the listener, skipping the ports it gave out before (see
// given) and those above maxPort. This races: another process may take the
// port before redis-server binds it. The callers retry on errExited.
func freePort() (int, error) {
	given.mu.Lock()
	defer given.mu.Unlock()
	for range 100 {
		port, err := kernelPort()
		if err != nil {
			return 0, err
		}
		if port > maxPort || given.ports[port] || given.ports[port+busOffset] {
			continue
		}
		if given.ports == nil {
			given.ports = map[int]bool{}
		}
		given.ports[port], given.ports[port+busOffset] = true, true
		return port, nil
	}
	return 0, fmt.Errorf("redistest: 100 ports in a row from the kernel were given out before or above %d", maxPort)
}

// kernelPort is a port free on 127.0.0.1 as the kernel gives one to a
// listener on :0, closed again; a variable, for tests to stand in for the
// kernel's choice.
var kernelPort = func() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// process is one running redis-server. It is not safe for concurrent use;
// its owner (Server or the shared state) guards it.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed by the wait goroutine after cmd.Wait returns
}

// startProcess starts bin on port with no persistence, its working files in
// dir and its output appended to logPath, and waits until it answers PING.
// If it exits first the error wraps errExited; if it does not answer within
// readyTimeout it is killed. Either way the error ends with the log's tail.
//
// extra arguments follow the defaults and override them (redis-server takes
// the last of a repeated option), but for a configuration file, extra's
// first element if it is not an option: redis-server takes it only first.
func startProcess(bin string, port int, dir, logPath string, extra ...string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	var args []string
	if len(extra) > 0 && !strings.HasPrefix(extra[0], "--") {
		args, extra = []string{extra[0]}, extra[1:]
	}
	args = append(args, "--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", dir)
	args = append(args, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logf // an *os.File is handed to the child as is: no copying goroutine
	cmd.Stderr = logf
	err = cmd.Start()
	logf.Close() // the child holds its own descriptor
	if err != nil {
		return nil, fmt.Errorf("redistest: starting %s: %w", bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // reaps the child; a SIGKILLed child's error is expected
		close(p.done)
	}()

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(readyTimeout)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		if ping(addr, pingTimeout) == nil {
			return p, nil
		}
		if time.Now().After(deadline) {
			p.kill()
			return nil, fmt.Errorf("redistest: redis-server on %s did not answer PING within %v%s",
				addr, readyTimeout, tail(logPath))
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%w (%s, port %d)%s", errExited, p.cmd.ProcessState, port, tail(logPath))
		case <-tick.C:
		}
	}
}

// kill sends SIGKILL and returns once the process is reaped and its wait
// goroutine has closed done. Calling it on an exited process is harmless.
func (p *process) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	// Kill is SIGKILL on Unix. It fails only with os.ErrProcessDone, when
	// the wait goroutine has already reaped the child; done closes then too.
	_ = p.cmd.Process.Kill()
	<-p.done
}

// tail returns the last logTail bytes of the log at path, formatted to end
// an error message, or a note that it could not be read.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("\n(no log: %v)", err)
	}
	if len(b) > logTail {
		b = b[len(b)-logTail:]
	}
	s := strings.TrimRight(string(b), "\n")
	if s == "" {
		return fmt.Sprintf("\n(log %s is empty)", path)
	}
	return fmt.Sprintf("\nlast lines of %s:\n%s", filepath.Clean(path), s)
}
