// Command tokenshard-rls serves Envoy's global rate limit service (RLS v3)
// from a directory of envoyproxy/ratelimit configuration files, on the
// in-process engine or on a Redis store that replicas share:
//
//	tokenshard-rls -config DIR [-redis ADDR|URL | -redis-cluster ADDR,ADDR,...|URL]
//
// It serves envoy.service.ratelimit.v3.RateLimitService and gRPC health
// (grpc.health.v1, SERVING once the configuration is loaded, NOT_SERVING while
// shutting down, after which its Watch streams end) on -grpc, and Prometheus
// metrics on -metrics at /metrics: the engine's (engine/promstats) or the
// store's (engine/promstats/storestats),
// tokenshard_rls_requests_total{answer="ok"|"over_limit"|"error"},
// tokenshard_rls_reloads_total{result="ok"|"error"} and
// tokenshard_rls_foreign_policy (see below). Both listen on loopback unless
// told otherwise.
//
// A connection to -grpc has at most -max-streams requests in flight at once
// (250, as Go's HTTP/2 server: a gRPC client waits for a slot, Envoy opens
// another connection, a client that pushes on is refused the stream): the
// answer to a request its client does not read is held until it does, so a
// client that sends and never reads would otherwise make the server hold
// answers without end, twenty times the bytes it sent. At most -max-in-flight
// requests (10,000) are in flight on all connections together, a health Watch
// included; one beyond is refused (ResourceExhausted, so Envoy's
// failure_mode_deny decides): a request whose message never ends holds a
// goroutine until its connection closes, and costs the server some 10 KB, two
// hundred times the bytes of its start. A request may be at most
// -max-request-bytes long (1 MiB; Envoy's are a few descriptors, each value at
// most a request's header, 60 KiB by default): a longer one is refused
// (ResourceExhausted) unread, as reading a request of empty entries costs the
// server forty times its size or more. A connection to -grpc without a request
// in flight for five minutes is closed (with GOAWAY: a client reconnects for
// its next request), so that idle or half-open connections, and headers sent
// halfway, are not held for ever. A connection to -metrics has 10 seconds to
// send a request and, kept alive between requests, is closed after a minute
// without one, so that connections left open do not pile up.
//
// The configuration is every *.yaml and *.yml file directly in DIR, one
// domain each (package envoyrls says what is read and what is refused); a
// directory without one is an error, not a service that limits nothing.
// Files in its subdirectories are not read. In a Kubernetes ConfigMap or
// Secret volume, whose files are links through DIR/..data, they are read
// from the directory ..data names, so that a poll reads one version of the
// volume whole, never part of an update. Elsewhere, replace a file by
// renaming a new one over it, as editors do: one written in place may be
// read halfway, and taken as it stands if that parses. Nor does it read
// envoyproxy/ratelimit's environment settings: no global SHADOW_MODE
// (shadow_mode is set per descriptor), no MERGE_DOMAIN_CONFIG (a domain is
// one file; two are an error), no dynamic metadata in responses. Every -poll
// the files are read again; when their names or contents changed they are
// parsed and installed with envoyrls.Server.Reload, an exact cutover that
// tops nobody up. A file that does not parse keeps the last good
// configuration and is reported on stderr once (so is a directory that
// cannot be read or holds no file, until that changes); a reload that fails
// (Redis away, or another replica's cutover meanwhile) keeps it too, and is
// reported and tried again at every poll. SIGHUP makes it read the files at
// once, as a -poll does, and it goes on serving (envoyproxy/ratelimit stops
// at SIGHUP). SIGINT or SIGTERM stops it: health turns NOT_SERVING, requests
// in flight finish (up to -drain; then their clients are cut off, and a
// request waiting on Redis ends within -redis-timeout), and it exits 0.
//
// With -redis or -redis-cluster, the buckets and the policy live in Redis under
// -redis-prefix, shared by every replica on that prefix. Either takes
// addresses (host:port) or a URL, as go-redis's ParseURL and ParseClusterURL
// read it: rediss:// for TLS, a user and a password, for -redis a database
// (redis://user:password@host:6379/2), for -redis-cluster the other nodes as
// addr parameters (redis://:password@host1:6379?addr=host2:6379). The
// environment variable TOKENSHARD_RLS_REDIS_PASSWORD, if set, is the
// password in place of the URL's, out of sight of ps, and needs no escaping
// (in a URL, characters such as #, / and @ in a password must be
// percent-encoded). A password or user Redis refuses stops the command at
// start if Redis answers then; one that starts while Redis is down answers
// by the failure rule until it can log in. A replica that starts
// with a configuration other than the prefix's installs its own (the last to
// start or reload wins, as with files deployed one replica at a time), once
// it listens on -grpc and -metrics: one that cannot stops first, leaving the
// prefix as it was; one that
// starts while Redis is down makes that check once Redis answers, within about
// a second (so after an outage the last replica to reach Redis wins). A replica
// whose configuration is not the prefix's policy, since another installed its
// own, enforces the prefix's limits (a limit of 0 there as
// envoyrls.Server.CheckPolicy says) but reports its own configuration's in its
// answers: at each -poll, after reading its files, it checks
// (envoyrls.Server.CheckPolicy), says so on stderr once, and sets
// tokenshard_rls_foreign_policy to 1 until its files match again. Decisions
// that Redis cannot give are answered with a gRPC Unavailable error (the store
// marks them Degraded), so Envoy's failure_mode_deny decides. A -poll after
// which requests were answered so, or the store met errors, logs how many of
// each and the store's last error: a line a poll, not a line a request. After
// such requests, the first poll at which Redis has decided since and no
// request failed says that Redis decides again. With -leases each
// replica takes tokens of a hot key from Redis in advance and decides the
// requests they cover without Redis (redisstore.Leases, with its defaults): the
// limits stay exact across replicas, and unspent tokens go back when a key goes
// idle, at a reload and at shutdown. Only a request whose enforced descriptors
// take tokens from one bucket is decided from a lease: one that takes from two
// or more goes to Redis every time, which decides it without the leases'
// tokens, so it may be refused while they would cover it (see package
// envoyrls, Decisions).
//
// It logs to stderr, each line stamped with the time in UTC (the usage text
// that -h and a flag error print excepted).
package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/promstats"
	"github.com/tokenshard/tokenshard/engine/promstats/storestats"
	"github.com/tokenshard/tokenshard/engine/redisstore"
)

func main() {
	redis.SetLogger(redisLog{newLogger(os.Stderr)})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	err := run(ctx, os.Args[1:], os.Stderr, hooks{reread: hup})
	signal.Stop(hup)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		newLogger(os.Stderr).Print(err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

// newLogger is the command's log: each line stamped with the time in UTC.
func newLogger(w io.Writer) *log.Logger {
	return log.New(w, "tokenshard-rls: ", log.LstdFlags|log.LUTC|log.Lmsgprefix)
}

// redisLog writes go-redis's own lines (a dial that failed) to the
// command's log, stamped in UTC as its other lines are, where go-redis
// would stamp them in local time.
type redisLog struct{ l *log.Logger }

func (r redisLog) Printf(_ context.Context, format string, v ...any) { r.l.Printf(format, v...) }

// hooks let main and tests drive the command: reread (SIGHUP) makes it
// poll at once; poll replaces the -poll ticker and retry the ticker of a
// replica started while Redis was down (see settleStart), ready is told the
// listeners' addresses, reloaded each reload's outcome (after polled, told
// at the end of each poll) and settled each retry's; grpcIdle, metricsIdle
// and metricsRead, if not 0, replace the constants of those names.
type hooks struct {
	reread                <-chan os.Signal
	poll, retry           <-chan time.Time
	grpcIdle, metricsIdle time.Duration
	metricsRead           time.Duration
	ready                 func(grpcAddr, metricsAddr string)
	reloaded              func(error)
	polled                func()
	settled               func(reached bool, err error)
}

// redisErrors gathers what an outage reports on the goroutines of the
// requests (the errors the store tells its OnError, the last kept, and the
// requests answered Unavailable), so that the poll loop logs it a line a
// poll rather than a line a request.
type redisErrors struct {
	n, unavailable atomic.Uint64
	last           atomic.Pointer[error]
	// The poll loop's own: the counts of the last report, and whether
	// requests have failed since the last decision by Redis it saw.
	seen, seenUnavailable, decisions uint64
	down                             bool
}

func (e *redisErrors) note(err error) {
	e.last.Store(&err) // before the count, so that a report that sees the count sees an error
	e.n.Add(1)
}

// report logs, at a poll after which requests were answered Unavailable or
// the store met errors, how many of each and the store's last error; and,
// at the first poll after requests failed at which Redis has decided
// since and none failed, that Redis decides again.
func (e *redisErrors) report(logger *log.Logger, decisions uint64) {
	// Unavailable answers first: a request tells OnError before it is
	// answered, so the errors loaded after hold those of every answer loaded.
	u := e.unavailable.Load()
	n := e.n.Load()
	switch {
	case u > e.seenUnavailable || n > e.seen:
		last := "none" // a Peek Redis did not answer tells OnError nothing
		if n > 0 {
			last = (*e.last.Load()).Error()
		}
		logger.Printf("Redis: %d requests answered Unavailable and %d errors since the last report; the last error: %s",
			u-e.seenUnavailable, n-e.seen, last)
		e.down = e.down || u > e.seenUnavailable
	case e.down && decisions > e.decisions:
		logger.Print("Redis decides again")
		e.down = false
	}
	e.seen, e.seenUnavailable, e.decisions = n, u, decisions
}

type options struct {
	dir, grpcAddr, metricsAddr   string
	redisAddr, redisCluster, pfx string
	poll, drain, timeout         time.Duration
	maxKeys, maxStreams, maxReq  int
	maxInFlight                  int
	leases                       bool
	redis                        *redis.Options        // from -redis, if given
	cluster                      *redis.ClusterOptions // from -redis-cluster, if given
}

// passwordEnv names the environment variable whose value, if set, is the
// Redis password, in place of any in -redis's or -redis-cluster's URL: a
// process's environment is not on its command line for ps to show.
const passwordEnv = "TOKENSHARD_RLS_REDIS_PASSWORD"

// minPoll is the shortest -poll: each poll reads every file of -config and,
// with Redis, asks it for the prefix's policy, so a shorter period spends a
// core and Redis's time on files that seldom change (SIGHUP reads them at
// once).
const minPoll = time.Second

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("tokenshard-rls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.dir, "config", "", "directory of envoyproxy/ratelimit YAML files, one domain each (required)")
	fs.StringVar(&o.grpcAddr, "grpc", "127.0.0.1:8081", "address of the RLS and health gRPC service")
	fs.StringVar(&o.metricsAddr, "metrics", "127.0.0.1:9102", "address of the Prometheus /metrics endpoint")
	fs.StringVar(&o.redisAddr, "redis", "", "Redis server: host:port, or a URL redis[s]://[[user]:password@]host:port[/db]; buckets shared by every replica on -redis-prefix")
	fs.StringVar(&o.redisCluster, "redis-cluster", "", "Redis Cluster nodes: host:port,host:port,..., or a URL redis[s]://[[user]:password@]host:port?addr=host:port&addr=...")
	fs.StringVar(&o.pfx, "redis-prefix", "tokenshard-rls:", "prefix of every Redis key")
	fs.DurationVar(&o.timeout, "redis-timeout", 0, "bound on each Redis exchange (0: the store's default)")
	fs.DurationVar(&o.poll, "poll", 5*time.Second, "how often the configuration directory is read for changes (at least 1s)")
	fs.DurationVar(&o.drain, "drain", 10*time.Second, "how long requests in flight may take to finish at shutdown, before their clients are cut off (one waiting on Redis then ends within -redis-timeout)")
	fs.IntVar(&o.maxKeys, "max-keys", 0, "bound on buckets of the in-process engine (0: engine.DefaultMaxKeys); not with -redis or -redis-cluster")
	fs.IntVar(&o.maxStreams, "max-streams", 250, "bound on the requests in flight on one connection to -grpc; a client's further requests wait for a slot")
	fs.IntVar(&o.maxInFlight, "max-in-flight", 10000, "bound on the requests in flight on -grpc, all connections together; a request beyond is refused")
	fs.IntVar(&o.maxReq, "max-request-bytes", 1<<20, "bound on a request's length; a longer one is refused")
	fs.BoolVar(&o.leases, "leases", false, "with -redis or -redis-cluster: take tokens of hot keys in advance and decide them in the process (redisstore.Leases, defaults); a request taking tokens from several buckets still goes to Redis, without them")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err // -h: the usage, printed, is the answer
		}
		return o, fmt.Errorf("%w: %v", errUsage, err)
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	case o.dir == "":
		return o, fmt.Errorf("%w: -config DIR is required", errUsage)
	case o.redisAddr != "" && o.redisCluster != "":
		return o, fmt.Errorf("%w: -redis and -redis-cluster exclude each other", errUsage)
	case o.leases && o.redisAddr == "" && o.redisCluster == "":
		return o, fmt.Errorf("%w: -leases needs -redis or -redis-cluster", errUsage)
	case o.maxKeys != 0 && (o.redisAddr != "" || o.redisCluster != ""):
		return o, fmt.Errorf("%w: -max-keys bounds the in-process engine; with -redis or -redis-cluster the buckets are Redis's", errUsage)
	case o.poll < minPoll:
		return o, fmt.Errorf("%w: -poll must be at least %v", errUsage, minPoll)
	case o.drain < 0 || o.timeout < 0 || o.maxKeys < 0:
		return o, fmt.Errorf("%w: -drain, -redis-timeout and -max-keys must not be negative", errUsage)
	case o.maxStreams <= 0 || uint64(o.maxStreams) > math.MaxUint32:
		return o, fmt.Errorf("%w: -max-streams must be from 1 to %d", errUsage, uint32(math.MaxUint32))
	case o.maxReq <= 0 || o.maxInFlight <= 0:
		return o, fmt.Errorf("%w: -max-request-bytes and -max-in-flight must be positive", errUsage)
	}
	if err := o.redisOptions(os.Getenv(passwordEnv)); err != nil {
		return o, fmt.Errorf("%w: %v", errUsage, err)
	}
	return o, nil
}

// redisOptions sets o.redis or o.cluster from -redis or -redis-cluster: an
// address list, or a URL as go-redis's ParseURL and ParseClusterURL read it
// (rediss:// for TLS; a user, a password, a database, and the client options
// those functions take as query parameters). password, if not empty, is the
// password, whatever the URL says. Every client has ContextTimeoutEnabled,
// which the store needs, and one dial per attempt: go-redis's default, 5
// dials 100 ms apart, would hold every answer for the whole -redis-timeout
// while Redis is down, where Envoy has long given up waiting (its default
// timeout is 20 ms).
func (o *options) redisOptions(password string) error {
	var err error
	switch {
	case strings.Contains(o.redisAddr, "://"):
		if o.redis, err = redis.ParseURL(o.redisAddr); err != nil {
			return fmt.Errorf("-redis: %w", withoutURL(err))
		}
	case o.redisAddr != "":
		o.redis = &redis.Options{Addr: o.redisAddr}
	case strings.Contains(o.redisCluster, "://"):
		if o.cluster, err = redis.ParseClusterURL(o.redisCluster); err != nil {
			return fmt.Errorf("-redis-cluster: %w", withoutURL(err))
		}
		if o.cluster.ReadOnly || o.cluster.RouteByLatency || o.cluster.RouteRandomly {
			return errors.New("-redis-cluster: read_only, route_by_latency and route_randomly send reads to replicas, which the store refuses")
		}
	case o.redisCluster != "":
		o.cluster = &redis.ClusterOptions{Addrs: strings.Split(o.redisCluster, ",")}
	}
	if o.redis != nil {
		o.redis.ContextTimeoutEnabled, o.redis.DialerRetries = true, 1
		o.redis.Password = cmp.Or(password, o.redis.Password)
	}
	if o.cluster != nil {
		o.cluster.ContextTimeoutEnabled, o.cluster.DialerRetries = true, 1
		o.cluster.Password = cmp.Or(password, o.cluster.Password)
	}
	return nil
}

// withoutURL is err, a URL's parse error, without the URL, which may hold a
// password: url.Error quotes it whole.
func withoutURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// snapshot is the configuration directory as read: its YAML files' names
// and contents, and their digest.
type snapshot struct {
	names  []string
	data   [][]byte
	digest [32]byte
}

// dataLink is the link through which a Kubernetes ConfigMap or Secret
// volume's files reach its current version: each file is a link
// name -> ..data/name, and ..data a link to a directory of that version's
// files, which an update replaces whole by renaming a new ..data over it
// (only then are the links of new files made and those of removed ones
// dropped).
const dataLink = "..data"

// readDir reads the configuration files of dir; in a ConfigMap volume, from
// the directory ..data names, so that it reads one version whole: the links
// would give the files of an update without those it adds, or, meeting the
// rename, part of each version. When ..data has moved on by the end of the
// read, the update may have removed files of the version being read: that
// read is dropped and the new version read, up to three times.
func readDir(dir string) (snapshot, error) {
	link := filepath.Join(dir, dataLink)
	for attempt := 1; ; attempt++ {
		target, err := os.Readlink(link)
		if err != nil {
			return readFiles(dir, dir) // not a ConfigMap volume
		}
		from := target
		if !filepath.IsAbs(from) {
			from = filepath.Join(dir, from)
		}
		s, err := readFiles(dir, from)
		if now, _ := os.Readlink(link); now == target {
			return s, err
		}
		if attempt == 3 {
			return snapshot{}, fmt.Errorf("%s: updated again while each of %d reads was under way", link, attempt)
		}
	}
}

// readFiles reads the configuration files in from, dir's files or, in a
// ConfigMap volume, the directory of its current version.
func readFiles(dir, from string) (snapshot, error) {
	var s snapshot
	entries, err := os.ReadDir(from)
	if err != nil {
		return s, err
	}
	h := sha256.New()
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if ext != ".yaml" && ext != ".yml" || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(from, e.Name())
		if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() {
			continue // a directory, or a dangling link: not a configuration file
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return s, err
		}
		s.names = append(s.names, e.Name())
		s.data = append(s.data, b)
		fmt.Fprintf(h, "%d:%s%d:", len(e.Name()), e.Name(), len(b))
		h.Write(b)
	}
	if len(s.names) == 0 {
		// Not an empty configuration: a service with no limits answers OK
		// to everything, and a misplaced -config would do that unseen.
		hint := ""
		if fi, err := os.Stat(filepath.Join(dir, "config")); err == nil && fi.IsDir() {
			hint = fmt.Sprintf(" (envoyproxy/ratelimit's runtime layout keeps them in %s: give that to -config)", filepath.Join(dir, "config"))
		}
		return s, fmt.Errorf("%w in %s%s", errNoConfig, dir, hint)
	}
	copy(s.digest[:], h.Sum(nil))
	return s, nil
}

// errNoConfig is a -config directory without a configuration file.
var errNoConfig = errors.New("no configuration file (*.yaml, *.yml)")

// parse parses every file of s; the error names the file.
func (s snapshot) parse() ([]*envoyrls.Config, error) {
	cfgs := make([]*envoyrls.Config, len(s.names))
	domains := map[string]string{}
	for i, name := range s.names {
		c, err := envoyrls.ParseConfig(s.data[i])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if other, ok := domains[c.Domain()]; ok {
			return nil, fmt.Errorf("%s: %w: '%s', also in %s", name, envoyrls.ErrDuplicateDomain, c.Domain(), other)
		}
		domains[c.Domain()] = name
		cfgs[i] = c
	}
	if _, err := envoyrls.Policy(1, cfgs...); err != nil {
		return nil, err
	}
	return cfgs, nil
}

func run(ctx context.Context, args []string, stderr io.Writer, hk hooks) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	logger := newLogger(stderr)
	snap, err := readDir(o.dir)
	if err != nil {
		return fmt.Errorf("reading -config: %w", err)
	}
	cfgs, err := snap.parse()
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	p, err := envoyrls.Policy(1, cfgs...)
	if err != nil {
		return err
	}

	// Listen before the store starts: a replica that cannot serve must not
	// install its configuration on the prefix the others share.
	gl, err := net.Listen("tcp", o.grpcAddr)
	if err != nil {
		return fmt.Errorf("-grpc: %w", err)
	}
	defer func() { _ = gl.Close() }() // already closed once served
	ml, err := net.Listen("tcp", o.metricsAddr)
	if err != nil {
		return fmt.Errorf("-metrics: %w", err)
	}
	defer func() { _ = ml.Close() }()

	reg := prometheus.NewRegistry()
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: promstats.Namespace, Name: "rls_reloads_total",
		Help: "Configuration reloads of tokenshard-rls, by result.",
	}, []string{"result"})
	reloads.WithLabelValues("ok")
	reloads.WithLabelValues("error")
	answers := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: promstats.Namespace, Name: "rls_requests_total",
		Help: "ShouldRateLimit requests answered, by overall code (ok, over_limit) or error.",
	}, []string{"answer"})
	for _, a := range []string{"ok", "over_limit", "error"} {
		answers.WithLabelValues(a)
	}
	foreign := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: promstats.Namespace, Name: "rls_foreign_policy",
		Help: "1 while the Redis prefix's policy is another replica's configuration, not this one's: the limits enforced are the prefix's, those reported this replica's.",
	})
	reg.MustRegister(reloads, answers, foreign)

	var a engine.Admitter
	var store *redisstore.Store
	var trouble redisErrors // what the store's OnError said, reported at each poll
	switch {
	case o.redis != nil || o.cluster != nil:
		var client redis.UniversalClient
		if o.redis != nil {
			client = redis.NewClient(o.redis)
		} else {
			client = redis.NewClusterClient(o.cluster)
		}
		defer func() { _ = client.Close() }()
		cfg := redisstore.Config{Client: client, Prefix: o.pfx, Policy: p, Timeout: o.timeout, OnError: trouble.note}
		if o.leases {
			cfg.Leases = &redisstore.Leases{}
		}
		store, err = redisstore.New(ctx, cfg)
		replied := func(prefixes ...string) bool {
			return slices.ContainsFunc(prefixes, func(p string) bool { return redis.HasErrorPrefix(err, p) })
		}
		switch {
		case err == nil:
		case o.redis != nil && replied("MOVED", "ASK", "CROSSSLOT"):
			return fmt.Errorf("redis store: %w: name its nodes with -redis-cluster, not -redis", err)
		case replied("NOAUTH", "WRONGPASS"):
			return fmt.Errorf("redis store: %w: give Redis's password in %s or in the URL (redis://:password@host:port)", err, passwordEnv)
		default:
			return fmt.Errorf("redis store: %w", err)
		}
		defer func() { _ = store.Close() }()
		col, err := storestats.New(store)
		if err != nil {
			return err
		}
		reg.MustRegister(col)
		a = store
	default:
		eng, err := engine.New(engine.Config{Policy: p, MaxKeys: o.maxKeys})
		if err != nil {
			return fmt.Errorf("engine: %w", err)
		}
		defer func() { _ = eng.Close() }()
		col, err := promstats.New(eng)
		if err != nil {
			return err
		}
		reg.MustRegister(col)
		a = eng
	}

	srv, err := envoyrls.NewServer(a, cfgs...)
	if errors.Is(err, envoyrls.ErrPolicyMismatch) {
		// The store's prefix holds another configuration's policy.
		err = install(ctx, a, cfgs)
		if err == nil {
			srv, err = envoyrls.NewServer(a, cfgs...)
		}
	}
	if err != nil {
		return err
	}
	// A store started without Redis reports the policy it was given, so
	// NewServer could not compare it with the prefix's: that check is owed
	// until the store reaches Redis (see settleStart).
	owed := store != nil && !reached(ctx, store)

	gs := grpc.NewServer(grpc.UnaryInterceptor(countAnswers(answers, &trouble.unavailable)),
		grpc.MaxConcurrentStreams(uint32(o.maxStreams)), grpc.MaxRecvMsgSize(o.maxReq), grpc.InTapHandle(inFlight(o.maxInFlight)),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cmp.Or(hk.grpcIdle, grpcIdle)}))
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	hs := health.NewServer()
	stopping := make(chan struct{})
	healthpb.RegisterHealthServer(gs, endingHealth{hs, stopping})
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	hsrv := &http.Server{Handler: mux, ReadTimeout: cmp.Or(hk.metricsRead, metricsRead), IdleTimeout: cmp.Or(hk.metricsIdle, metricsIdle)}

	done := make(chan error, 2)
	go func() { done <- gs.Serve(gl) }()
	go func() { done <- hsrv.Serve(ml) }()
	logger.Printf("serving RLS on %s, metrics on %s, %d domains from %s",
		gl.Addr(), ml.Addr(), len(cfgs), o.dir)
	if hk.ready != nil {
		hk.ready(gl.Addr().String(), ml.Addr().String())
	}

	poll := hk.poll
	if poll == nil {
		t := time.NewTicker(o.poll)
		defer t.Stop()
		poll = t.C
	}
	var retry <-chan time.Time // while the check is owed: every second
	if owed {
		retry = hk.retry
		if retry == nil {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			retry = t.C
		}
	}
	live := cfgs     // the configuration served
	unreadable := "" // the error of the last poll that could not read -config
	mismatch := ""   // what the last poll's CheckPolicy said, reported once
	var serveErr error
	received := 0
	// pollNow reads -config and installs what changed, at each -poll and
	// at SIGHUP, and reports whether it tried to install a change (a
	// failure already reported is not tried again).
	pollNow := func() bool {
		// The files before the check: when a deploy reaches another
		// replica first, this one may already have met that replica's
		// cutover to the very files it is about to read. Checked first,
		// that would be reported as another replica's policy for a poll.
		tried, err := func() (bool, error) {
			next, err := readDir(o.dir)
			switch {
			case err != nil && err.Error() == unreadable:
				return false, nil // reported once, as an invalid file is
			case err != nil:
				unreadable = err.Error()
			default:
				unreadable = ""
				if next.digest == snap.digest {
					return false, nil
				}
			}
			if err == nil {
				var cfgs []*envoyrls.Config
				if cfgs, err = next.parse(); err != nil {
					snap = next // an invalid file is reported once, not every poll
				} else if err = srv.Reload(ctx, cfgs...); err == nil {
					snap, live = next, cfgs
				} // else a failed Reload (Redis away, another replica's cutover) is tried again at the next poll
			}
			if err != nil {
				reloads.WithLabelValues("error").Inc()
				logger.Printf("reload: %v (keeping the last good configuration)", err)
			} else {
				reloads.WithLabelValues("ok").Inc()
				logger.Printf("reloaded %d files from %s, policy version %d", len(next.names), o.dir, a.Policy().Version)
			}
			return true, err
		}()
		if store != nil && retry == nil {
			// Another replica may have installed its configuration
			// (the last to start or reload wins): say so, once.
			m := ""
			if err := srv.CheckPolicy(); err != nil {
				m = err.Error()
			}
			switch {
			case m == mismatch:
			case m != "":
				foreign.Set(1)
				logger.Printf("%v: another replica installed its configuration; this one enforces it and reports its own limits until its files match (or it reloads)", m)
			default:
				foreign.Set(0)
				logger.Printf("the prefix's policy is this configuration's again, version %d", a.Policy().Version)
			}
			mismatch = m
		}
		if store != nil {
			trouble.report(logger, store.Stats().Decisions)
		}
		if hk.polled != nil {
			hk.polled()
		}
		if tried && hk.reloaded != nil {
			hk.reloaded(err)
		}
		return tried
	}
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case serveErr = <-done:
			received++
			break loop
		case <-retry:
			ok, err := settleStart(ctx, store, srv, live)
			switch {
			case !ok:
			case err != nil:
				logger.Printf("reached Redis; installing the configuration's policy: %v (tried again in a second)", err)
			default:
				retry = nil
				logger.Printf("reached Redis, policy version %d", a.Policy().Version)
			}
			if hk.settled != nil {
				hk.settled(ok, err)
			}
		case <-poll:
			pollNow()
		case <-hk.reread:
			logger.Print("SIGHUP: reading -config now")
			if !pollNow() {
				logger.Print("SIGHUP: -config unchanged since the last reload or report")
			}
		}
	}

	hs.Shutdown()
	close(stopping) // ends the health Watch streams, which GracefulStop would wait for
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(o.drain):
		gs.Stop()
		<-stopped
	}
	sctx, cancel := context.WithTimeout(context.Background(), o.drain)
	defer cancel()
	if err := hsrv.Shutdown(sctx); err != nil {
		_ = hsrv.Close()
	}
	// Both Serve calls return once their servers stop.
	for ; received < 2; received++ {
		if err := <-done; serveErr == nil {
			serveErr = err
		}
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return fmt.Errorf("serving: %w", serveErr)
	}
	logger.Print("stopped")
	return nil
}

// grpcIdle is how long a -grpc connection without a request in flight is
// kept (gRPC's default: for ever).
const grpcIdle = 5 * time.Minute

// The -metrics server's bounds on a connection: the time to send a
// request, its body included (which the server reads to the end, up to
// 256 KiB, though /metrics has no use for it), and the time it is kept
// open between requests (an http.Server with neither IdleTimeout nor
// ReadTimeout keeps it for ever).
const (
	metricsRead = 10 * time.Second
	metricsIdle = time.Minute
)

// endingHealth is the health service whose Watch streams end when stopping
// closes, after NOT_SERVING: health.Server's Shutdown only sends
// NOT_SERVING and leaves them open, so one client watching health (gRPC's
// client-side health checking keeps a Watch open) would hold GracefulStop,
// and every request in flight with it, until -drain cuts them off.
type endingHealth struct {
	*health.Server
	stopping <-chan struct{}
}

func (h endingHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go func() {
		select {
		case <-h.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	ws := &watchStream{Health_WatchServer: stream, ctx: ctx, last: -1}
	err := h.Server.Watch(req, ws)
	select {
	case <-h.stopping:
		if stream.Context().Err() != nil {
			return err // the client left
		}
		if ws.last != healthpb.HealthCheckResponse_NOT_SERVING {
			if err := stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}); err != nil {
				return err
			}
		}
		return nil
	default:
		return err
	}
}

// watchStream is a Watch stream whose context ends when the command stops;
// it remembers the last status sent.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx  context.Context
	last healthpb.HealthCheckResponse_ServingStatus
}

func (s *watchStream) Context() context.Context { return s.ctx }

func (s *watchStream) Send(r *healthpb.HealthCheckResponse) error {
	err := s.Health_WatchServer.Send(r)
	if err == nil {
		s.last = r.GetStatus()
	}
	return err
}

// inFlight admits a stream while fewer than max are in flight, and
// refuses it ResourceExhausted otherwise. A stream is in flight until its
// context ends, which the transport sees to when the stream ends, however
// it ends (at the latest when its connection closes).
func inFlight(max int) tap.ServerInHandle {
	var n atomic.Int64
	return func(ctx context.Context, _ *tap.Info) (context.Context, error) {
		if n.Add(1) > int64(max) {
			n.Add(-1)
			return nil, errInFlight
		}
		context.AfterFunc(ctx, func() { n.Add(-1) })
		return ctx, nil
	}
}

var errInFlight = status.Error(codes.ResourceExhausted, "tokenshard-rls: -max-in-flight requests in flight")

// countAnswers counts each ShouldRateLimit answer in answers, and those
// answered Unavailable (Redis did not decide) in unavailable too.
func countAnswers(answers *prometheus.CounterVec, unavailable *atomic.Uint64) grpc.UnaryServerInterceptor {
	ok, over, failed := answers.WithLabelValues("ok"), answers.WithLabelValues("over_limit"), answers.WithLabelValues("error")
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if info.FullMethod != rlsv3.RateLimitService_ShouldRateLimit_FullMethodName {
			return resp, err
		}
		switch r, _ := resp.(*rlsv3.RateLimitResponse); {
		case err != nil:
			failed.Inc()
			if status.Code(err) == codes.Unavailable {
				unavailable.Add(1)
			}
		case r.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
			over.Inc()
		default:
			ok.Inc()
		}
		return resp, err
	}
}

// settleStart makes, for a store started without Redis, the comparison
// with the prefix's policy that NewServer could not: once the store has
// reached Redis and adopted the prefix's policy, it installs the policy of
// cfgs if that is another (srv.Reload), as a replica started with Redis up
// would have. ok is false while the store has not reached Redis.
func settleStart(ctx context.Context, store *redisstore.Store, srv *envoyrls.Server, cfgs []*envoyrls.Config) (ok bool, err error) {
	if !reached(ctx, store) {
		return false, nil
	}
	return true, srv.Reload(ctx, cfgs...)
}

// reached reports whether store has read the prefix's state: a Peek does
// not say redisstore.ErrNotReady.
func reached(ctx context.Context, store *redisstore.Store) bool {
	_, err := store.Peek(ctx, "tokenshard-rls:probe")
	return !errors.Is(err, redisstore.ErrNotReady)
}

// install installs the policy of cfgs on a at the next version. When
// another replica moved the version on meanwhile (replicas of one
// deployment starting at once all find the earlier deployment's policy), it
// reads the prefix's policy again: if that is already cfgs', there is
// nothing to do, else it tries once more over the version it found, as
// envoyrls.Server.Reload does.
func install(ctx context.Context, a engine.Admitter, cfgs []*envoyrls.Config) error {
	for attempt := 0; ; attempt++ {
		cur := a.Policy()
		next, err := envoyrls.Policy(cur.Version+1, cfgs...)
		if err != nil {
			return err
		}
		err = a.ReplacePolicy(ctx, next, cur.Version)
		if err == nil {
			return nil
		}
		if !errors.Is(err, engine.ErrStalePolicy) || attempt > 0 {
			return fmt.Errorf("installing the configuration's policy over version %d: %w", cur.Version, err)
		}
		// A Peek makes a store load the version it has not met yet.
		if pk, ok := a.(envoyrls.Peeker); ok {
			if _, err := pk.Peek(ctx, "tokenshard-rls:probe"); err != nil {
				return fmt.Errorf("installing the configuration's policy: %w", err)
			}
		}
		if _, err := envoyrls.NewServer(a, cfgs...); err == nil {
			return nil // the other replica installed these very limits
		}
	}
}
