package envoyrls_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
	"github.com/tokenshard/tokenshard/policy"
)

// degradedEngine is an engine whose every decision is marked Degraded, as
// a store's failure rule marks its answers: allowed or denied, no bucket's.
type degradedEngine struct{ *engine.Engine }

func (e degradedEngine) Allow(ctx context.Context, key string, cost int64) (engine.Decision, error) {
	d, err := e.Engine.Allow(ctx, key, cost)
	d.Degraded = err == nil
	return d, err
}

func (e degradedEngine) AllowAll(ctx context.Context, reqs []engine.Request) (engine.Decision, int, error) {
	d, i, err := e.Engine.AllowAll(ctx, reqs)
	d.Degraded = err == nil
	return d, i, err
}

func (e degradedEngine) AllowBatch(ctx context.Context, reqs []engine.Request, out []engine.Result) error {
	err := e.Engine.AllowBatch(ctx, reqs, out)
	for i := range reqs {
		out[i].Decision.Degraded = out[i].Err == nil
	}
	return err
}

func (e degradedEngine) Peek(ctx context.Context, key string) (engine.Decision, error) {
	d, err := e.Engine.Peek(ctx, key)
	d.Degraded = err == nil
	return d, err
}

// degradedYAML has two enforced entries and a shadow one.
const degradedYAML = `domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: s
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 10}
`

// requestShapes are a request of degradedYAML of each shape: one key
// (Allow), several (AllowAll), a check-only descriptor (Peek) and a shadow
// one (AllowBatch).
func requestShapes() map[string]*rlsv3.RateLimitRequest {
	return map[string]*rlsv3.RateLimitRequest{
		"one key":    rlstest.Req("d", 0, rlstest.D("a=1")),
		"two keys":   rlstest.Req("d", 0, rlstest.D("a=1"), rlstest.D("b=2")),
		"check only": rlstest.Req("d", 0, rlstest.DH(0, "a=1")),
		"shadow":     rlstest.Req("d", 0, rlstest.D("s=3")),
	}
}

// A degraded answer, admitted or not, is gRPC Unavailable, never an OK:
// Envoy's failure_mode_deny decides, not the failure rule's guess. Each
// shape of request is covered: one key (Allow), several (AllowAll), a
// check-only descriptor (Peek) and a shadow one (AllowBatch).
func TestDegradedIsUnavailable(t *testing.T) {
	h := rlstest.Start(t, func(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
		return degradedEngine{newEngine(t, p, clk).(*engine.Engine)}
	}, degradedYAML)
	for name, req := range requestShapes() {
		_, err := h.Client.ShouldRateLimit(context.Background(), req)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), envoyrls.ErrDegraded.Error()) {
			t.Errorf("%s: err %v, want Unavailable with %q", name, err, envoyrls.ErrDegraded)
		}
		if msg := status.Convert(err).Message(); strings.Count(msg, "envoyrls:") != 1 {
			t.Errorf("%s: message %q says envoyrls: more than once", name, msg)
		}
	}
}

// failingEngine is an engine whose every call fails with errBroken after
// doing its work, as an admitter that lost its answer would.
type failingEngine struct{ *engine.Engine }

var errBroken = errors.New("broken admitter")

func (e failingEngine) Allow(ctx context.Context, key string, cost int64) (engine.Decision, error) {
	d, _ := e.Engine.Allow(ctx, key, cost)
	return d, errBroken
}

func (e failingEngine) AllowAll(ctx context.Context, reqs []engine.Request) (engine.Decision, int, error) {
	d, i, _ := e.Engine.AllowAll(ctx, reqs)
	return d, i, errBroken
}

func (e failingEngine) AllowBatch(ctx context.Context, reqs []engine.Request, out []engine.Result) error {
	err := e.Engine.AllowBatch(ctx, reqs, out)
	for i := range reqs {
		out[i].Err = errBroken
	}
	return err
}

func (e failingEngine) Peek(ctx context.Context, key string) (engine.Decision, error) {
	d, _ := e.Engine.Peek(ctx, key)
	return d, errBroken
}

// An admitter's error, on every shape of request, is gRPC Unavailable
// wrapping ErrAdmitter and the admitter's error, never an OK.
func TestAdmitterErrorIsUnavailable(t *testing.T) {
	h := rlstest.Start(t, func(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
		return failingEngine{newEngine(t, p, clk).(*engine.Engine)}
	}, degradedYAML)
	for name, req := range requestShapes() {
		_, err := h.Client.ShouldRateLimit(context.Background(), req)
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.Unavailable || !strings.Contains(msg, envoyrls.ErrAdmitter.Error()) || !strings.Contains(msg, errBroken.Error()) {
			t.Errorf("%s: err %v, want Unavailable with %q and %q", name, err, envoyrls.ErrAdmitter, errBroken)
		}
	}
}
