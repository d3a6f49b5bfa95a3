package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/internal/redistest"
)

// envMainArgs, when set, makes TestMainSignal run main with these
// arguments (one a line) in place of the test: the test binary as the
// command, for a test that signals it.
const envMainArgs = "STRESS_TEST_MAIN_ARGS"

// TestMainSignal: SIGTERM (or an interrupt) mid-run ends the checks as the
// end of -duration does, so the differential check deletes its keys on the
// Redis it was given, and then the command ends by that signal, as a shell
// or a CI runner expects of a program it stopped: neither status 0 (it ran
// for less than asked) nor a failed check's. It used to die at once, its
// keys left on the server for good (a store on a Manual clock sets no
// expiry).
func TestMainSignal(t *testing.T) {
	if args := os.Getenv(envMainArgs); args != "" {
		os.Args = append([]string{"stress"}, strings.Split(args, "\n")...)
		main()
		return
	}
	srv := redistest.Start(t) // a server of its own: its whole key space is the command's
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })

	cmd := exec.Command(os.Args[0], "-test.run=^TestMainSignal$")
	cmd.Env = append(os.Environ(), envMainArgs+"="+strings.Join([]string{"-check", "differential", "-redis", srv.Addr(), "-duration", "5m", "-seed", "4"}, "\n"))
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		for sc := bufio.NewScanner(stdout); sc.Scan(); {
			lines <- sc.Text()
		}
	}()
	var out strings.Builder
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()

	// Wait until the command has written keys (polling a real server).
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := rdb.DBSize(ctx).Result()
		require.NoError(t, err)
		if n > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the command wrote no key in a minute")
		time.Sleep(10 * time.Millisecond) // polling the server, not synchronising
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	for l := range lines {
		out.WriteString(l + "\n")
	}
	err = cmd.Wait()
	killed = true
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "exit: %v\n%s%s", err, out.String(), stderr.String())
	ws, _ := ee.Sys().(syscall.WaitStatus)
	assert.True(t, ws.Signaled() && ws.Signal() == syscall.SIGTERM, "the end of a run cut short by SIGTERM: %v\n%s%s", err, out.String(), stderr.String())
	assert.Contains(t, stderr.String(), "stress: interrupted")
	n, err := rdb.DBSize(ctx).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "keys the command left on the server it was given\n%s%s", out.String(), stderr.String())
}
