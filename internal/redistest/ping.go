package redistest

import (
	"bufio"
	"fmt"
	"net"
	"time"
)

// pingRequest is PING as a RESP array of one bulk string.
const pingRequest = "*1\r\n$4\r\nPING\r\n"

// ping dials addr, sends PING and reads one reply line, all within timeout.
// It returns nil only for the reply +PONG; an error reply (-LOADING,
// -NOAUTH, ...) or anything else is an error.
func ping(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.Write([]byte(pingRequest)); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("redistest: PING %s: reading reply: %w", addr, err)
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("redistest: PING %s: reply %q, want +PONG", addr, line)
	}
	return nil
}
