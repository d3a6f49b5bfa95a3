package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// process is the command run as a process of its own: the test binary,
// which TestMain makes the command when asCommand is set.
type process struct {
	t      *testing.T
	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan error
}

func startProcess(t *testing.T, args ...string) *process {
	t.Helper()
	p := &process{t: t, cmd: exec.Command(os.Args[0], args...), stderr: &syncBuffer{}, exited: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), asCommand+"=1")
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// await polls the process's stderr until it holds want.
func (p *process) await(want string) {
	p.t.Helper()
	pace := time.NewTicker(10 * time.Millisecond)
	defer pace.Stop()
	timeout := time.After(20 * time.Second)
	for !strings.Contains(p.stderr.String(), want) {
		select {
		case err := <-p.exited:
			p.exited <- err
			p.t.Fatalf("the command exited (%v) before saying %q; stderr:\n%s", err, want, p.stderr)
		case <-timeout:
			p.t.Fatalf("the command does not say %q; stderr:\n%s", want, p.stderr)
		case <-pace.C:
		}
	}
}

func (p *process) signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
}

// TestProcessSignals: SIGHUP makes the command read -config at once, and
// it goes on serving (a signal it did not handle would end it, requests in
// flight and all); SIGTERM stops it, and it exits 0.
func TestProcessSignals(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(limitsYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, "-config", dir, "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-poll", "1h")
	p.await("serving RLS on")
	raised := strings.Replace(limitsYAML, "requests_per_unit: 2", "requests_per_unit: 10", 1)
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(raised), 0o600); err != nil {
		t.Fatal(err)
	}
	p.signal(syscall.SIGHUP)
	p.await("reloaded 1 files")
	p.signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		p.exited <- err
		if err != nil {
			t.Errorf("exit at SIGTERM: %v, want 0; stderr:\n%s", err, p.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the command does not stop at SIGTERM; stderr:\n%s", p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "stopped") {
		t.Errorf("stderr does not say it stopped:\n%s", p.stderr)
	}
}

// TestProcessLogsInUTC: every line the command writes, go-redis's own
// (a dial to a Redis that is down) included, is stamped in UTC after the
// command's name, whatever the machine's time zone.
func TestProcessLogsInUTC(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(limitsYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String() // nothing listens there once closed
	_ = l.Close()
	t.Setenv("TZ", "Etc/GMT+5") // the process's zone: five hours behind UTC
	p := startProcess(t, "-config", dir, "-grpc", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-redis", down, "-poll", "1h")
	p.await("failed to dial")
	p.signal(syscall.SIGTERM)
	<-p.exited
	p.exited <- nil
	stamp := regexp.MustCompile(`^\d{4}/\d\d/\d\d (\d\d):\d\d:\d\d tokenshard-rls: `)
	for line := range strings.Lines(p.stderr.String()) {
		m := stamp.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("a line not stamped as the command's: %q", line)
			continue
		}
		if h, now := m[1], time.Now().UTC(); h != now.Format("15") && h != now.Add(-time.Hour).Format("15") {
			t.Errorf("a line not stamped in UTC (hour %s, UTC %s): %q", h, now.Format("15"), line)
		}
	}
}
