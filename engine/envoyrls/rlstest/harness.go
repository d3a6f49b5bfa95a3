package rlstest

import (
	"context"
	"net"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/policy"
)

// Factory returns a new admitter running p on clk, with nothing in it: an
// engine, or a Redis store on a prefix of its own. It registers its own
// cleanup with t.Cleanup. The admitter must implement envoyrls.Peeker.
type Factory func(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter

// Harness is an envoyrls.Server on an admitter, served over gRPC on a
// loopback port, with a client connected to it.
type Harness struct {
	T      *testing.T
	Clock  *clock.Manual
	A      engine.Admitter
	Server *envoyrls.Server
	Client rlsv3.RateLimitServiceClient
}

// Parse parses each YAML text, failing t on an error.
func Parse(t *testing.T, yamls ...string) []*envoyrls.Config {
	t.Helper()
	cfgs := make([]*envoyrls.Config, len(yamls))
	for i, y := range yamls {
		c, err := envoyrls.ParseConfig([]byte(y))
		if err != nil {
			t.Fatalf("ParseConfig(configs[%d]): %v", i, err)
		}
		cfgs[i] = c
	}
	return cfgs
}

// Start parses yamls, builds an admitter for their policy with f on a manual
// clock at 0, and serves it on 127.0.0.1. Everything stops when t ends.
func Start(t *testing.T, f Factory, yamls ...string) *Harness {
	t.Helper()
	cfgs := Parse(t, yamls...)
	p, err := envoyrls.Policy(1, cfgs...)
	if err != nil {
		t.Fatalf("Policy: %v", err)
	}
	clk := clock.NewManual(0)
	a := f(t, p, clk)
	srv, err := envoyrls.NewServer(a, cfgs...)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		gs.Stop()
		<-served
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &Harness{T: t, Clock: clk, A: a, Server: srv, Client: rlsv3.NewRateLimitServiceClient(conn)}
}

// Ask sends one request and fails the test on an error.
func (h *Harness) Ask(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	h.T.Helper()
	resp, err := h.Client.ShouldRateLimit(context.Background(), req)
	if err != nil {
		h.T.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
		h.T.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
	}
	return resp
}

// Req is a request of domain for descs, with request-level hits_addend hits.
func Req(domain string, hits uint32, descs ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs, HitsAddend: hits}
}

// D is a descriptor of entries given as "key=value" (or "key=" for an empty
// value); the first '=' splits.
func D(entries ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for _, e := range entries {
		k, v, _ := strings.Cut(e, "=")
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

// DH is D with its own hits_addend.
func DH(hits uint64, entries ...string) *rlv3.RateLimitDescriptor {
	d := D(entries...)
	d.HitsAddend = wrapperspb.UInt64(hits)
	return d
}
