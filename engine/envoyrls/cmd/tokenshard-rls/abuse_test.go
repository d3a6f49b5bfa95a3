package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
)

// rawClient is an HTTP/2 client on a connection of its own that sends
// ShouldRateLimit requests and grants no flow-control window: the server
// can send it headers, never an answer's message.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	fr   *http2.Framer
	hdr  []byte // the request's header block
	msg  []byte // the request, framed as gRPC frames a message
	next uint32 // the next stream id
}

func dialRaw(t *testing.T, addr string, req *rlsv3.RateLimitRequest) *rawClient {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	c := &rawClient{t: t, conn: conn, fr: http2.NewFramer(conn, conn), next: 1}
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	body, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	c.msg = binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body)))
	c.msg = append(c.msg, body...)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "rls"},
		{":path", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	c.hdr = hb.Bytes()
	return c
}

// send sends one request on a new stream and returns its id.
func (c *rawClient) send() uint32 {
	c.t.Helper()
	id := c.next
	c.next += 2
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hdr, EndHeaders: true}); err != nil {
		c.t.Fatal(err)
	}
	if err := c.fr.WriteData(id, true, c.msg); err != nil {
		c.t.Fatal(err)
	}
	return id
}

// TestUnreadAnswersAreBounded: a client that sends requests and never
// reads their answers holds at most -max-streams of them on the server;
// the stream after is refused, not taken and its answer held too.
func TestUnreadAnswersAreBounded(t *testing.T) {
	c := startCommand(t)
	raw := dialRaw(t, c.addrs[0], rlstest.Req("gw", 0, rlstest.D("route=r")))
	const streams = 250 // -max-streams' default
	for range streams + 1 {
		raw.send()
	}
	last := raw.next - 2
	headers, refused := map[uint32]bool{}, false
	for len(headers) < streams || !refused {
		f, err := raw.fr.ReadFrame()
		if err != nil {
			t.Fatalf("after the answers' headers of %d streams (stream %d refused: %v): %v", len(headers), last, refused, err)
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			if headers[f.StreamID] = true; len(headers) > streams {
				t.Fatalf("%d unread answers taken on one connection; want at most %d", len(headers), streams)
			}
		case *http2.RSTStreamFrame:
			if f.StreamID != last || f.ErrCode != http2.ErrCodeRefusedStream {
				t.Fatalf("stream %d reset with %v; want stream %d refused", f.StreamID, f.ErrCode, last)
			}
			refused = true
		}
	}
	if headers[last] {
		t.Fatalf("stream %d answered; want it refused", last)
	}
}

// TestMetricsIdleConnectionsClose: a connection to -metrics kept alive
// after a scrape is closed once idle for metricsIdle, not kept for ever.
func TestMetricsIdleConnectionsClose(t *testing.T) {
	const idle = 100 * time.Millisecond
	c := startCommandHooks(t, limitsYAML, hooks{metricsIdle: idle})
	conn, err := net.Dial("tcp", c.addrs[1])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /metrics HTTP/1.1\r\nHost: rls\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("scrape: %v, %v, close %v", resp.Status, err, resp.Close)
	}
	_ = resp.Body.Close()
	start := time.Now()
	if err := conn.SetReadDeadline(start.Add(100 * idle)); err != nil {
		t.Fatal(err)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection after %v: %v, want the server's close (EOF)", time.Since(start), err)
	}
}

// TestLongRequestsAreRefused: a request longer than -max-request-bytes
// (1 MiB) is refused ResourceExhausted; one of exactly that length is
// answered.
func TestLongRequestsAreRefused(t *testing.T) {
	c := startCommand(t)
	const bound = 1 << 20
	req := rlstest.Req("gw", 0, rlstest.D("route=r"))
	entry := req.Descriptors[0].Entries[0]
	entry.Value = strings.Repeat("v", bound-proto.Size(req))
	entry.Value = entry.Value[proto.Size(req)-bound:] // less the lengths' longer varints
	if n := proto.Size(req); n != bound {
		t.Fatalf("request of %d bytes, want %d", n, bound)
	}
	if _, err := c.rls.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatalf("%d bytes: %v", bound, err)
	}
	entry.Value += "v"
	if _, err := c.rls.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("%d bytes: %v, want ResourceExhausted", proto.Size(req), err)
	}
}

// TestGRPCIdleConnectionsClose: a -grpc connection without a request in
// flight for grpcIdle is told to go (GOAWAY), also one whose request's
// header block was left halfway.
func TestGRPCIdleConnectionsClose(t *testing.T) {
	const idle = 100 * time.Millisecond
	c := startCommandHooks(t, limitsYAML, hooks{grpcIdle: idle})
	for _, halfway := range []bool{false, true} {
		raw := dialRaw(t, c.addrs[0], rlstest.Req("gw", 0, rlstest.D("route=r")))
		if halfway {
			if err := raw.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: raw.hdr[:len(raw.hdr)/2]}); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		if err := raw.conn.SetReadDeadline(start.Add(100 * idle)); err != nil {
			t.Fatal(err)
		}
		for {
			f, err := raw.fr.ReadFrame()
			if err != nil {
				t.Fatalf("halfway %v: after %v: %v, want GOAWAY", halfway, time.Since(start), err)
			}
			if _, ok := f.(*http2.GoAwayFrame); ok {
				break
			}
		}
	}
}

// TestMetricsSlowBodyCloses: a request to -metrics whose body trickles in
// is cut off after metricsRead, its connection closed, not kept for as
// long as the body takes.
func TestMetricsSlowBodyCloses(t *testing.T) {
	const read = 200 * time.Millisecond
	c := startCommandHooks(t, limitsYAML, hooks{metricsRead: read})
	conn, err := net.Dial("tcp", c.addrs[1])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /metrics HTTP/1.1\r\nHost: rls\r\nContent-Length: 1000\r\n\r\nx"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := conn.SetReadDeadline(start.Add(50 * read)); err != nil {
		t.Fatal(err)
	}
	// The server reads the body to its end before it answers: the answer,
	// and the close, come once that read fails.
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("body trickling in after %v: %v, want the server's close (EOF)", time.Since(start), err)
	}
}

// stuck opens a stream whose request never ends: its message is sent
// halfway.
func (c *rawClient) stuck() {
	c.t.Helper()
	id := c.next
	c.next += 2
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hdr, EndHeaders: true}); err != nil {
		c.t.Fatal(err)
	}
	if err := c.fr.WriteData(id, false, c.msg[:len(c.msg)/2]); err != nil {
		c.t.Fatal(err)
	}
}

// sync returns once the server has read every frame sent before: it
// answers frames in order, and a PING at once.
func (c *rawClient) sync() {
	c.t.Helper()
	data := [8]byte{'s', 'y', 'n', 'c'}
	if err := c.fr.WritePing(false, data); err != nil {
		c.t.Fatal(err)
	}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatal(err)
		}
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() && p.Data == data {
			return
		}
	}
}

// TestInFlightBoundAcrossConnections: requests whose messages never end
// hold at most -max-in-flight streams, all connections together; the
// requests beyond are refused ResourceExhausted until those end, and a
// request answered holds none.
func TestInFlightBoundAcrossConnections(t *testing.T) {
	c := startCommand(t, "-max-in-flight", "4", "-max-streams", "2")
	var raws []*rawClient
	for range 2 {
		raw := dialRaw(t, c.addrs[0], rlstest.Req("gw", 0, rlstest.D("route=r")))
		raw.stuck()
		raw.stuck()
		raw.sync()
		raws = append(raws, raw)
	}
	_, err := c.rls.ShouldRateLimit(context.Background(), rlstest.Req("gw", 0, rlstest.D("route=r")))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("beside 4 requests in flight: %v, want ResourceExhausted", err)
	}
	_ = raws[0].conn.Close() // its two streams end, in time
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.rls.ShouldRateLimit(context.Background(), rlstest.Req("gw", 0, rlstest.D("route=r")))
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("after a connection holding two closed: %v", err)
		}
	}
	for i := range 10 { // a request answered is no longer in flight
		if _, err := c.rls.ShouldRateLimit(context.Background(), rlstest.Req("gw", 0, rlstest.D("route=r"))); err != nil {
			t.Fatalf("request %d beside 2 in flight: %v", i, err)
		}
	}
}
