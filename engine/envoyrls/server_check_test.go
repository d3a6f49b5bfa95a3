package envoyrls_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
)

// TestCheckPolicy: a server agrees with its admitter's policy until
// another process (here a ReplacePolicy on the same engine, as a replica
// on the same Redis prefix does) installs another configuration's, and
// again once a Reload brings its configurations to that policy.
func TestCheckPolicy(t *testing.T) {
	cfgs := rlstest.Parse(t, rlstest.TreeYAML)
	e, srv := engineServer(t, cfgs)
	if err := srv.CheckPolicy(); err != nil {
		t.Fatalf("a fresh server: %v", err)
	}
	other := rlstest.Parse(t, strings.Replace(rlstest.TreeYAML, "requests_per_unit: 12\n", "requests_per_unit: 36\n", 1))
	next, err := envoyrls.Policy(2, other...)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.ReplacePolicy(context.Background(), next, 1); err != nil {
		t.Fatal(err)
	}
	if err := srv.CheckPolicy(); !errors.Is(err, envoyrls.ErrPolicyMismatch) {
		t.Fatalf("after another configuration's cutover: %v, want ErrPolicyMismatch", err)
	}
	if err := srv.Reload(context.Background(), other...); err != nil {
		t.Fatal(err)
	}
	if err := srv.CheckPolicy(); err != nil {
		t.Fatalf("after a reload to that configuration: %v", err)
	}
	if v := e.Policy().Version; v != 2 {
		t.Errorf("version %d: the reload found the policy in force and made no cutover", v)
	}
}

// TestConfigOrderDoesNotMatter: the same domains listed in another order are
// the same configuration: NewServer accepts an admitter built from them in
// any order, and a Reload that only reorders them makes no cutover.
func TestConfigOrderDoesNotMatter(t *testing.T) {
	ab := rlstest.Parse(t,
		"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n",
		"domain: b\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: minute, requests_per_unit: 4}\n")
	ba := []*envoyrls.Config{ab[1], ab[0]}
	p, err := envoyrls.Policy(1, ab...)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	srv, err := envoyrls.NewServer(e, ba...)
	if err != nil {
		t.Fatalf("NewServer with the configurations reordered: %v", err)
	}
	if err := srv.Reload(context.Background(), ab...); err != nil {
		t.Fatal(err)
	}
	if v := e.Policy().Version; v != 1 {
		t.Errorf("version %d after a reload that only reorders the configurations, want 1 (no cutover)", v)
	}
}

// TestZeroServerAndNilContext: a Server NewServer did not make, and a
// call given a nil context, are errors, never a panic (a panic in a gRPC
// handler takes the process down).
func TestZeroServerAndNilContext(t *testing.T) {
	req := rlstest.Req("d", 0, rlstest.D("k=v"))
	for name, s := range map[string]*envoyrls.Server{"zero": new(envoyrls.Server), "nil": nil} {
		if _, err := s.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.FailedPrecondition ||
			!strings.Contains(err.Error(), engine.ErrNotInitialized.Error()) {
			t.Errorf("%s Server: ShouldRateLimit: %v, want FailedPrecondition naming engine.ErrNotInitialized", name, err)
		}
		if err := s.Reload(context.Background()); !errors.Is(err, engine.ErrNotInitialized) {
			t.Errorf("%s Server: Reload: %v, want engine.ErrNotInitialized", name, err)
		}
		if err := s.CheckPolicy(); !errors.Is(err, engine.ErrNotInitialized) {
			t.Errorf("%s Server: CheckPolicy: %v, want engine.ErrNotInitialized", name, err)
		}
	}
	var c *envoyrls.Config
	if d := c.Domain(); d != "" {
		t.Errorf("nil Config: Domain %q", d)
	}

	cfgs := rlstest.Parse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	_, srv := engineServer(t, cfgs)
	var nilCtx context.Context // a variable, not the literal, so that staticcheck (SA1012) keeps flagging real code
	if _, err := srv.ShouldRateLimit(nilCtx, req); !strings.Contains(fmt.Sprint(err), engine.ErrNilContext.Error()) {
		t.Errorf("nil context: %v, want an error naming engine.ErrNilContext", err)
	}
}

// engineServer is an engine on cfgs' policy at version 1, and a Server on
// it, both closed with the test.
func engineServer(t *testing.T, cfgs []*envoyrls.Config) (*engine.Engine, *envoyrls.Server) {
	t.Helper()
	p, err := envoyrls.Policy(1, cfgs...)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	srv, err := envoyrls.NewServer(e, cfgs...)
	if err != nil {
		t.Fatal(err)
	}
	return e, srv
}
