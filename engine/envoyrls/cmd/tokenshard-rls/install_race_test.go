package main

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
)

// TestInstallBesideAReplica: two replicas of a new deployment start at
// once on a prefix holding an earlier deployment's policy. Both find it
// and install theirs over the same version; the one that comes second must
// not fail (the command would exit): the prefix already holds its policy,
// or it installs over the version it finds, as Reload does.
func TestInstallBesideAReplica(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := "envoyrls-cmd-race:" + time.Now().Format("150405.000000000") + ":"
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	deleteKeys(t, client, prefix)
	ctx := context.Background()
	old, err := envoyrls.Policy(1, rlstest.Parse(t, rlstest.TreeYAML)...)
	if err != nil {
		t.Fatal(err)
	}
	cfgs := rlstest.Parse(t, limitsYAML)
	p, err := envoyrls.Policy(1, cfgs...)
	if err != nil {
		t.Fatal(err)
	}
	earlier, err := redisstore.New(ctx, redisstore.Config{Client: client, Prefix: prefix, Policy: old, Timeout: answersTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer earlier.Close()
	// Both replicas' stores start and adopt the earlier policy.
	var stores [2]*redisstore.Store
	for i := range stores {
		s, err := redisstore.New(ctx, redisstore.Config{Client: client, Prefix: prefix, Policy: p, Timeout: answersTimeout})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := envoyrls.NewServer(s, cfgs...); err == nil {
			t.Fatalf("replica %d: NewServer found no mismatch", i)
		}
		stores[i] = s
	}
	for i, s := range stores {
		if err := install(ctx, s, cfgs); err != nil {
			t.Fatalf("replica %d: install: %v", i, err)
		}
		if _, err := envoyrls.NewServer(s, cfgs...); err != nil {
			t.Errorf("replica %d: NewServer after install: %v", i, err)
		}
	}
	if v := stores[1].Policy().Version; v != 2 {
		t.Errorf("version %d, want 2: the second replica installed again", v)
	}
}
