// Package redistest gives integration tests a real Redis server: Addr for a
// server shared by the whole test binary, Start for a private one a test owns
// and may kill and restart (outage tests), Alone for one a test may load as
// a benchmark does without slowing the others. ClusterAddrs and StartCluster do
// the same for a Redis Cluster of three masters (redis-cli --cluster
// create), the shared one taken from $TOKENSHARD_REDIS_CLUSTER_ADDRS when
// set (.ci/run starts one and sets it). GetReplicaCluster gives a failover
// test a cluster of three masters with one replica each, which it may kill
// a master of: $TOKENSHARD_REDIS_REPLICA_CLUSTER_ADDRS when set (.ci/run
// starts one), which the test must leave whole, else a private one.
//
// Readiness is checked with a real PING over TCP (a raw RESP exchange, so the
// package needs no client library). When no server can be had, tests skip
// with a loud message saying the Redis integration tests did not run, or fail
// instead when TOKENSHARD_REQUIRE_REDIS=1 (CI sets it).
//
// A test binary that calls Addr must call Stop after m.Run and before its
// leak check, for example:
//
//	type stopRedis struct{ m *testing.M }
//
//	func (s stopRedis) Run() int { defer redistest.Stop(); return s.m.Run() }
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(stopRedis{m}) }
//
// # Ownership
//
// Every redis-server this package starts has exactly one goroutine, started
// with it, that calls cmd.Wait and then closes the process's done channel;
// Kill and Stop send SIGKILL and wait on that channel, so no process is left
// unreaped and no goroutine outlives them. The nodes of
// $TOKENSHARD_REDIS_REPLICA_CLUSTER_ADDRS are daemons this package did not
// start: ReplicaCluster.Kill signals one by the process ID it reports, and
// Restart starts it again as a daemon, from its configuration file, so
// neither leaves a child to reap. The shared server is guarded by a
// package mutex; a Server's process by the Server's own mutex.
//
// A test binary killed from outside (a -timeout panic, SIGKILL) leaves its
// redis-server processes running: they are started with --daemonize no but
// nothing ties their life to the parent's.
package redistest
