package envoyrls_test

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
	"github.com/tokenshard/tokenshard/policy"
)

// boundedEngine is a factory of engines that track at most maxKeys keys.
func boundedEngine(maxKeys int) rlstest.Factory {
	return func(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
		e, err := engine.New(engine.Config{Policy: p, Clock: clk, Shards: 1, MaxKeys: maxKeys})
		if err != nil {
			t.Fatalf("engine.New: %v", err)
		}
		t.Cleanup(func() {
			if err := e.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return e
	}
}

// "A full key table fails a request only when none of its buckets already
// tracked lacks its cost": a client over its limit on x=1 that adds a value
// never seen (y=fresh) while the table is full is refused OVER_LIMIT, with
// its wait, not failed with an error that an Envoy failing open would
// admit. A request whose tracked buckets hold their costs still fails, and
// takes nothing.
func TestFullTableStillRefusesOverLimit(t *testing.T) {
	h := rlstest.Start(t, boundedEngine(2), edgesYAML)
	h.Ask(rlstest.Req("k", 0, rlstest.D("x=1"))) // x1: its one token taken
	h.Ask(rlstest.Req("k", 0, rlstest.D("s=1"))) // seven: 6 left; the table is full

	resp, err := h.Client.ShouldRateLimit(context.Background(), rlstest.Req("k", 0, rlstest.D("x=1"), rlstest.D("y=fresh")))
	if err != nil {
		t.Fatalf("over its limit, with a new key in a full table: %v, want OVER_LIMIT", err)
	}
	if resp.OverallCode != rlstest.OverLimit || resp.Statuses[0].GetCode() != rlstest.OverLimit || resp.Statuses[1].GetCode() != rlstest.OK {
		t.Fatalf("got %v, want OVER_LIMIT for x=1 alone", resp)
	}
	if got := hdr(resp.ResponseHeadersToAdd, "Retry-After"); got != "60" {
		t.Errorf("Retry-After %q, want 60 (x1 refills one a minute)", got)
	}

	_, err = h.Client.ShouldRateLimit(context.Background(), rlstest.Req("k", 0, rlstest.D("s=1"), rlstest.D("y=fresh")))
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("within its limit, with a new key in a full table: %v, want ResourceExhausted", err)
	}
	if got := h.Ask(rlstest.Req("k", 0, rlstest.D("s=1"))).Statuses[0].GetLimitRemaining(); got != 5 {
		t.Errorf("s=1 after the failed request: limit_remaining %d, want 5 (it took nothing)", got)
	}
}

// "a shadow descriptor whose bucket finds no room is reported without its
// numbers, never failing the request": the enforced descriptor's answer
// stands, refused or admitted.
func TestFullTableShadowDoesNotFailRequest(t *testing.T) {
	const yaml = `domain: k
descriptors:
  - key: x
    rate_limit: {unit: minute, requests_per_unit: 2, name: x2}
  - key: sh
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: sh1}
`
	h := rlstest.Start(t, boundedEngine(2), yaml)
	h.Ask(rlstest.Req("k", 0, rlstest.D("x=1")))
	h.Ask(rlstest.Req("k", 0, rlstest.D("sh=fill"))) // the table is full

	for _, want := range []rlsv3.RateLimitResponse_Code{rlstest.OK, rlstest.OverLimit} {
		resp, err := h.Client.ShouldRateLimit(context.Background(), rlstest.Req("k", 0, rlstest.D("x=1"), rlstest.D("sh=fresh")))
		if err != nil {
			t.Fatalf("a shadow descriptor with no room: %v, want %v", err, want)
		}
		if resp.OverallCode != want || resp.Statuses[1].GetCode() != rlstest.OK {
			t.Fatalf("got %v, want %v and the shadow descriptor OK", resp, want)
		}
		if resp.Statuses[1].GetDurationUntilReset() != nil {
			t.Errorf("the shadow descriptor with no bucket reports numbers: %v", resp.Statuses[1])
		}
	}
}
