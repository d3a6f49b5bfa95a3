package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseOptionsCheckNamedTwice: a check named twice, by its name or an
// alias, runs once; runChecks waited for as many results as names, and a
// check run once gave one, so `-check flood,flood` never ended.
func TestParseOptionsCheckNamedTwice(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseOptions([]string{"-check", "differential,diff,flood,flood"}, &stderr)
	require.NoError(t, err, stderr.String())
	assert.Equal(t, []string{"differential", "flood"}, o.checks)
}

// TestRunCheckNamedTwiceEnds: the command ends when its one check does,
// though the options name it twice, as tests may build them.
func TestRunCheckNamedTwiceEnds(t *testing.T) {
	o := options{duration: 200 * time.Millisecond, workers: 2, keys: 10, maxKeys: 1000, seed: 1, checks: []string{"flood", "flood"}}
	var out bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- runChecks(context.Background(), o, &out) }()
	select {
	case code := <-done:
		assert.Equal(t, 0, code, out.String())
	case <-time.After(30 * time.Second): // the check itself ends after 200ms
		t.Fatalf("runChecks did not return 30s after a check of 200ms: it waits for a second result of the check named twice\n%s", out.String())
	}
}

// TestParseOptionsAllWithOthers: "all" beside checks it leaves out adds
// them, wherever it stands in the list; it dropped every name after it,
// and those before it.
func TestParseOptionsAllWithOthers(t *testing.T) {
	all := []string{"linearizability", "differential", "conservation", "flood"}
	for _, names := range []string{"all,leases", "leases,all", "all,flood", "flood,all"} {
		var stderr bytes.Buffer
		o, err := parseOptions([]string{"-check", names}, &stderr)
		require.NoError(t, err, stderr.String())
		want := all
		if names != "all,flood" && names != "flood,all" {
			want = append(append([]string(nil), all...), "leases")
		}
		assert.ElementsMatch(t, want, o.checks, names)
	}
}

// TestParseOptionsRejectsArguments: a word that is not a flag ends flag
// parsing, so `stress differential -duration 5s` ran every check for the
// default 10s, ignoring both; it is refused.
func TestParseOptionsRejectsArguments(t *testing.T) {
	var stderr bytes.Buffer
	_, err := parseOptions([]string{"differential", "-duration", "5s"}, &stderr)
	require.Error(t, err)
	assert.Contains(t, stderr.String(), `unexpected argument "differential"`)
	assert.Equal(t, 2, run(context.Background(), []string{"-check", "flood", "extra"}, &stderr, &stderr))
}

// TestParseOptionsAddresses: -redis and every -redis-cluster entry must be
// host:port, the port in [1, 65535]; an empty entry made go-redis dial its
// default, a server the command was not given, and -redis host:abc passed,
// to fail only at the first dial.
func TestParseOptionsAddresses(t *testing.T) {
	for _, args := range [][]string{
		{"-check", "differential", "-redis", "localhost"},
		{"-check", "differential", "-redis", "127.0.0.1:"},
		{"-check", "leases", "-redis", ":6379x:"},
		{"-check", "differential", "-redis-cluster", ","},
		{"-check", "differential", "-redis-cluster", "127.0.0.1:30001,"},
		{"-check", "differential", "-redis-cluster", "127.0.0.1:30001,127.0.0.1"},
		{"-check", "differential", "-redis", "127.0.0.1:abc"},
		{"-check", "leases", "-redis", "localhost:0"},
		{"-check", "leases", "-redis", "localhost:65536"},
		{"-check", "leases", "-redis", "localhost:-1"},
		{"-check", "differential", "-redis-cluster", "127.0.0.1:30001,127.0.0.1:3x"},
		{"-check", "differential", "-redis-cluster", "127.0.0.1:99999"},
	} {
		var stderr bytes.Buffer
		_, err := parseOptions(args, &stderr)
		assert.Error(t, err, "%q", args)
		assert.Contains(t, stderr.String(), "host:port", "%q", args)
	}
	var stderr bytes.Buffer
	_, err := parseOptions([]string{"-check", "differential", "-redis-cluster", "127.0.0.1:30001,[::1]:30002"}, &stderr)
	assert.NoError(t, err, stderr.String())
	_, err = parseOptions([]string{"-check", "leases", "-redis", "localhost:65535"}, &stderr)
	assert.NoError(t, err, stderr.String())
}

// TestParseOptionsDurabilityPorts: the durability check's ports, and the
// ones it derives from them, must be valid ports; -durability-port 99999
// reached redis-server, and the error blamed a port taken.
func TestParseOptionsDurabilityPorts(t *testing.T) {
	for _, args := range [][]string{
		{"-check", "durability", "-durability-port", "99999"},
		{"-check", "durability", "-durability-port", "0"},
		{"-check", "durability", "-durability-port", "65530"},         // its cluster's buses are 10 to 15 above
		{"-check", "durability", "-durability-cluster-port", "65533"}, // a seventh port after its six, for -durability-lag's proxy
	} {
		var stderr bytes.Buffer
		_, err := parseOptions(args, &stderr)
		assert.Error(t, err, "%q", args)
		assert.Contains(t, stderr.String(), "-durability-", "%q", args)
	}
}
