package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mainProc is the command run by a test: the test binary running main (see
// TestMainSignal), in a process group of its own, as a shell runs a job.
type mainProc struct {
	cmd   *exec.Cmd
	lines chan string     // stdout's and stderr's
	out   strings.Builder // the lines read
	ended bool
}

func startMain(t *testing.T, args ...string) *mainProc {
	t.Helper()
	m := &mainProc{lines: make(chan string, 1<<16)}
	m.cmd = exec.Command(os.Args[0], "-test.run=^TestMainSignal$")
	// a command killed leaves its temporary directories: in the test's
	m.cmd.Env = append(os.Environ(), envMainArgs+"="+strings.Join(args, "\n"), "TMPDIR="+t.TempDir())
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := m.cmd.StdoutPipe()
	require.NoError(t, err)
	stderr, err := m.cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, m.cmd.Start())
	var wg sync.WaitGroup
	for _, r := range []io.Reader{stdout, stderr} {
		wg.Go(func() {
			for sc := bufio.NewScanner(r); sc.Scan(); {
				m.lines <- sc.Text()
			}
		})
	}
	go func() { wg.Wait(); close(m.lines) }()
	t.Cleanup(func() {
		if !m.ended {
			_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
			_ = m.cmd.Wait()
		}
	})
	return m
}

// waitLine reads the output until a line contains s.
func (m *mainProc) waitLine(t *testing.T, s string) {
	t.Helper()
	for l := range m.lines {
		m.out.WriteString(l + "\n")
		if strings.Contains(l, s) {
			return
		}
	}
	t.Fatalf("the command ended without printing %q\n%s", s, m.out.String())
}

// wait drains the output and returns how the command ended.
func (m *mainProc) wait(t *testing.T) syscall.WaitStatus {
	t.Helper()
	for l := range m.lines {
		m.out.WriteString(l + "\n")
	}
	err := m.cmd.Wait()
	m.ended = true
	var ee *exec.ExitError
	if err == nil || !errors.As(err, &ee) {
		return 0
	}
	ws, _ := ee.Sys().(syscall.WaitStatus)
	return ws
}

// procStat is what /proc/pid/stat says of a process.
type procStat struct {
	comm       string
	state      byte
	ppid, pgrp int
}

func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, false
	}
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return procStat{}, false
	}
	f := strings.Fields(string(b[end+1:])) // state ppid pgrp ...
	if len(f) < 3 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	pgrp, _ := strconv.Atoi(f[2])
	return procStat{comm: string(b[open+1 : end]), state: f[0][0], ppid: ppid, pgrp: pgrp}, true
}

// alive says whether pid is a redis-server that has not exited (a zombie
// no one reaped has).
func alive(pid int) bool {
	st, ok := readStat(pid)
	return ok && st.comm == "redis-server" && st.state != 'Z' && st.state != 'X'
}

// serverOf waits for the redis-server child of pid and returns its pid,
// polling /proc; the test kills it at its end if it is still alive.
func serverOf(t *testing.T, m *mainProc) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ents, err := os.ReadDir("/proc")
		require.NoError(t, err)
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if st, ok := readStat(pid); ok && st.ppid == m.cmd.Process.Pid && st.comm == "redis-server" {
				t.Cleanup(func() {
					if alive(pid) {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				})
				return pid
			}
		}
		require.True(t, time.Now().Before(deadline), "the command started no redis-server in a minute\n%s", m.out.String())
		time.Sleep(10 * time.Millisecond) // polling /proc, not synchronising
	}
}

// requireGone waits until the redis-server pid has exited.
func requireGone(t *testing.T, pid int, why string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for alive(pid) {
		require.True(t, time.Now().Before(deadline), "redis-server %d still runs 30s after the command ended (%s)", pid, why)
		time.Sleep(10 * time.Millisecond) // polling /proc, not synchronising
	}
}

// TestMainInterruptSparesServers: the redis-servers the command starts are
// in a process group of their own, so that an interrupt a terminal sends to
// the command's group (Ctrl-C) reaches the command alone, which ends its
// checks and kills them; they were in the command's group, and shut down
// on the interrupt while the checks still used them.
func TestMainInterruptSparesServers(t *testing.T) {
	durNeedRedis(t)
	m := startMain(t, "-check", "leases", "-duration", "5m", "-seed", "5")
	srv := serverOf(t, m)
	m.waitLine(t, "decisions/s")
	st, ok := readStat(srv)
	require.True(t, ok)
	assert.NotEqual(t, m.cmd.Process.Pid, st.pgrp, "the redis-server is in the command's process group")
	require.NoError(t, syscall.Kill(-m.cmd.Process.Pid, syscall.SIGINT))
	ws := m.wait(t)
	assert.True(t, ws.Signaled() && ws.Signal() == syscall.SIGINT, "the command did not end by the interrupt: %v\n%s", ws, m.out.String())
	assert.Regexp(t, `(?m)^\| leases +\| interrupted`, m.out.String())
	assert.Contains(t, m.out.String(), "stress: interrupted by interrupt: the checks ran for less than -duration\n")
	requireGone(t, srv, "interrupted")
}

// TestMainDeathKillsServers: however the command ends, the redis-servers it
// started end with it: killed with SIGKILL, or by a second SIGTERM that
// comes before the checks have cleaned up, they ran on, orphans. The
// second SIGTERM comes while the check's cleanup waits on its server,
// stopped (SIGSTOP) so that it cannot answer before its timeouts.
func TestMainDeathKillsServers(t *testing.T) {
	durNeedRedis(t)
	for _, tc := range []struct {
		name   string
		twice  bool
		signal syscall.Signal
	}{
		{"SIGKILL", false, syscall.SIGKILL},
		{"SIGTERM twice", true, syscall.SIGTERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := startMain(t, "-check", "leases", "-duration", "5m", "-seed", "6")
			srv := serverOf(t, m)
			m.waitLine(t, "decisions/s")
			if tc.twice {
				require.NoError(t, syscall.Kill(srv, syscall.SIGSTOP))
				require.NoError(t, m.cmd.Process.Signal(tc.signal))
				m.waitLine(t, "a second signal ends the command at once")
			}
			require.NoError(t, m.cmd.Process.Signal(tc.signal))
			ws := m.wait(t)
			assert.True(t, ws.Signaled() && ws.Signal() == tc.signal, "the command did not end by %v: %v\n%s", tc.signal, ws, m.out.String())
			requireGone(t, srv, tc.name)
		})
	}
}

// TestKillChildren: killChildren kills every child startChild started and
// not yet reaped, and the processes the child started (a redis-server's
// save child, here a shell's sleep), and a start after it is refused; a
// child is in a process group of its own.
func TestKillChildren(t *testing.T) {
	bin, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep command")
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh command")
	}
	t.Cleanup(func() {
		children.mu.Lock()
		children.killed = false // the package's other tests start servers
		children.mu.Unlock()
	})
	var dones []chan struct{}
	for range 2 {
		cmd := exec.Command(bin, "600")
		done, err := startChild(cmd)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
		pgid, err := syscall.Getpgid(cmd.Process.Pid)
		require.NoError(t, err)
		assert.Equal(t, cmd.Process.Pid, pgid, "the child is not the leader of a group of its own")
		dones = append(dones, done)
	}
	// A child that started one of its own, in its group, and prints its pid.
	cmd := exec.Command(sh, "-c", "sleep 600 & echo $!; wait")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	done, err := startChild(cmd)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	dones = append(dones, done)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	grandchild, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Kill(grandchild, syscall.SIGKILL) })
	// Its child, by its group: before it has run sleep it is a copy of the
	// shell, and a pid reused after it ended is not in the group.
	running := func() bool {
		st, ok := readStat(grandchild)
		return ok && st.pgrp == cmd.Process.Pid && st.state != 'Z' && st.state != 'X'
	}
	require.True(t, running(), "the shell's child is not running in its group")
	killChildren()
	for _, done := range dones {
		select {
		case <-done:
		case <-time.After(30 * time.Second): // a bound on a failure, not a wait for success
			t.Fatal("a child still runs 30s after killChildren")
		}
	}
	for deadline := time.Now().Add(30 * time.Second); running(); {
		require.True(t, time.Now().Before(deadline), "the child's own child still runs 30s after killChildren")
		time.Sleep(10 * time.Millisecond) // polling /proc, not synchronising
	}
	_, err = startChild(exec.Command(bin, "600"))
	assert.ErrorIs(t, err, errEnding)
}
