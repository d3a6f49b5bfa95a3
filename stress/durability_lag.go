package main

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// durLag is a TCP proxy in front of a master that makes its replica lag:
// what the master sends on a replication connection (one whose client sent
// REPLCONF or PSYNC) reaches the replica lag later, and what has not
// reached it when the master's side closes is dropped. It stands for a
// replica behind a slower link than the clients', or behind a busy
// master: the window of writes a client has seen acknowledged and the
// replica has not received. Other connections pass at once.
type durLag struct {
	ln  net.Listener
	to  string
	lag time.Duration
	wg  sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// durStartLag listens on addr and forwards to to.
func durStartLag(addr, to string, lag time.Duration) (*durLag, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &durLag{ln: ln, to: to, lag: lag, conns: map[net.Conn]struct{}{}}
	l.wg.Go(l.accept)
	return l, nil
}

// close stops the proxy and every connection, and waits for its goroutines.
func (l *durLag) close() {
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.ln.Close()
	l.wg.Wait()
}

// track registers conns for close; false once the proxy is closed.
func (l *durLag) track(conns ...net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		l.conns[c] = struct{}{}
	}
	return true
}

func (l *durLag) untrack(conns ...net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(l.conns, c)
	}
}

func (l *durLag) accept() {
	for {
		down, err := l.ln.Accept()
		if err != nil {
			return // closed
		}
		l.wg.Go(func() { l.serve(down) })
	}
}

// durChunk is bytes from the master due at the replica at due.
type durChunk struct {
	due time.Time
	b   []byte
}

func (l *durLag) serve(down net.Conn) {
	up, err := net.DialTimeout("tcp", l.to, time.Second)
	if err != nil {
		down.Close()
		return
	}
	if !l.track(down, up) {
		return
	}
	defer l.untrack(down, up)
	var repl, dead atomic.Bool
	l.wg.Go(func() { // client to master, at once
		defer l.untrack(down, up)
		buf := make([]byte, 32<<10)
		for {
			n, err := down.Read(buf)
			if n > 0 {
				if bytes.Contains(buf[:n], []byte("REPLCONF")) || bytes.Contains(buf[:n], []byte("PSYNC")) {
					repl.Store(true)
				}
				if _, werr := up.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	q := make(chan durChunk, 1<<16)
	l.wg.Go(func() { // the delayed stream to the replica
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d) // the link's delay
			}
			if dead.Load() {
				continue // the master died: what is still on the way is lost
			}
			if _, err := down.Write(c.b); err != nil {
				dead.Store(true)
			}
		}
	})
	defer close(q)
	buf := make([]byte, 32<<10)
	for {
		n, err := up.Read(buf)
		if n > 0 {
			if repl.Load() {
				q <- durChunk{time.Now().Add(l.lag), bytes.Clone(buf[:n])}
			} else if _, werr := down.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dead.Store(true)
			return
		}
	}
}
