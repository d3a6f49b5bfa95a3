package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// Concurrent clients on one key, at one instant of a clock that does not
// move: exactly the capacity is admitted, whatever the interleaving.
func TestConcurrentClients(t *testing.T) {
	const clients, each, capacity = 8, 10, 20
	e, _ := newEngine(t, engine.Config{Policy: pol(capacity, 1), Shards: 4})
	srv := serve(t, e, ok)

	type answer struct {
		status int
		retry  string
		err    error
	}
	answers := make(chan answer, clients*each)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range each {
				res, err := srv.Client().Get(srv.URL)
				if err != nil {
					answers <- answer{err: err}
					continue
				}
				_, err = io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
				answers <- answer{res.StatusCode, res.Header.Get("Retry-After"), err}
			}
		})
	}
	wg.Wait()
	close(answers)

	count := map[int]int{}
	for a := range answers {
		require.NoError(t, a.err)
		count[a.status]++
		if a.status == http.StatusTooManyRequests {
			assert.Equal(t, "1", a.retry)
		}
	}
	assert.Equal(t, map[int]int{http.StatusOK: capacity, http.StatusTooManyRequests: clients*each - capacity}, count)
	assert.Equal(t, int64(0), remaining(t, e, loopback))
}

// A client that goes away while the handler runs: the handler sees its
// context end, the request was paid for, and nothing panics or leaks
// (TestMain checks the goroutines once the server is closed).
func TestClientDisconnectsInHandler(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	started, finished := make(chan struct{}), make(chan error, 1)
	srv := serve(t, e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		_, err := io.WriteString(w, "too late")
		finished <- errors.Join(r.Context().Err(), err)
	}))

	requestGoneAway(t, srv, started)
	assert.ErrorIs(t, <-finished, context.Canceled)
	assert.Equal(t, int64(4), remaining(t, e, loopback))
}

// statusWriter records what a handler wrote through it.
type statusWriter struct {
	http.ResponseWriter
	status int
	body   int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.body += len(p)
	return w.ResponseWriter.Write(p)
}

// A client that goes away before the middleware decides: the decision is a
// bare 503 on a dead connection, nothing is spent and the handler never
// runs.
func TestClientDisconnectsBeforeDecision(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	mw, err := httplimit.New(e)
	require.NoError(t, err)
	limited := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("handler reached")
	}))
	started, finished := make(chan struct{}), make(chan string, 1)
	srv := serve(t, e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done() // a slow step in front of the limiter
		sw := &statusWriter{ResponseWriter: w}
		limited.ServeHTTP(sw, r)
		finished <- fmt.Sprint(sw.status, " ", sw.body)
	}), httplimit.WithKey(func(*http.Request) (string, error) { return "outer", nil }))

	requestGoneAway(t, srv, started)
	assert.Equal(t, "503 0", <-finished)
	assert.Equal(t, int64(5), remaining(t, e, loopback))
	assert.Equal(t, 1, e.KeyCount()) // only the outer middleware's key
}

// requestGoneAway sends a request to srv and cancels it once started is
// closed (the handler is running), as a client that disconnects; the client
// sees its own cancellation.
func requestGoneAway(t *testing.T, srv *httptest.Server, started <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	go func() {
		<-started
		cancel()
	}()
	res, err := srv.Client().Do(req)
	if err == nil {
		_ = res.Body.Close()
	}
	require.ErrorIs(t, err, context.Canceled)
}
