package engine

import (
	"context"
	"fmt"

	"github.com/tokenshard/tokenshard/msg"
)

// batchCall is the reusable working set of one AllowBatch call: one part per
// shard, the request indices each part carries, and the channel the parts
// report on. Pooled, so a batch allocates nothing in steady state.
type batchCall struct {
	parts []batchPart
	done  chan int // one slot per shard: no shard ever blocks on it
}

type batchPart struct {
	m   msg.Batch
	idx []int // idx[j] is the index in reqs of m.Items[j]
}

func newBatchCall(shards int) *batchCall {
	c := &batchCall{parts: make([]batchPart, shards), done: make(chan int, shards)}
	for i := range c.parts {
		c.parts[i].m.Part = i
		c.parts[i].m.Done = c.done
	}
	return c
}

// reset empties every part, dropping references to the caller's keys. The
// answers need no clearing (the shard writes every field of each), but
// clearing them is faster: without it, the shard's stores go to lines the
// caller has only read (the figures are in package bench's Performance
// notes).
func (c *batchCall) reset() {
	for i := range c.parts {
		p := &c.parts[i]
		clear(p.m.Items)
		clear(p.m.Out)
		p.m.Items, p.m.Out, p.idx = p.m.Items[:0], p.m.Out[:0], p.idx[:0]
		p.m.Closed = false
	}
}

// AllowBatch decides reqs[i] into out[i] for every i. Requests are grouped by
// shard and each shard gets one message with its part, which it decides in
// request order at one clock reading: every result is what the same Allow
// calls made one by one in that order would give at that instant.
//
// A shard decides its part without a break: its other callers wait until
// the whole part is decided, and so does a ReplacePolicy, whose prepared
// shards serve nothing meanwhile. So a batch of a million requests holds
// every shard up for as long as deciding its share of a million takes;
// where other callers' latency matters, send batches of thousands.
//
// Per-request errors are only in out[i].Err, and AllowBatch returns nil, when
// every part reached its shard. Otherwise it returns ErrClosed, or
// ErrNilContext for a nil ctx, or the context's error, which is also written
// into every result that was not decided; so also when no request needed a
// shard (none, or each with a bad key or cost, whose results keep their own
// errors). len(out) < len(reqs) is
// ErrInvalidConfig, and nothing is decided. A zero Engine returns
// ErrNotInitialized, written into every result out has room for.
// Parts on different shards may see different policy versions during a
// cutover. It does not allocate in steady state.
func (e *Engine) AllowBatch(ctx context.Context, reqs []Request, out []Result) error {
	if e.uninitialized() {
		for i := range min(len(reqs), len(out)) {
			out[i] = Result{Err: ErrNotInitialized}
		}
		return ErrNotInitialized
	}
	if len(out) < len(reqs) {
		return fmt.Errorf("%w: len(out) %d < len(reqs) %d", ErrInvalidConfig, len(out), len(reqs))
	}
	c := e.batches.Get().(*batchCall)
	if len(c.parts) == 1 {
		e.groupOne(c, reqs, out)
	} else {
		e.group(c, reqs, out)
	}

	var err error
	switch {
	case e.closed.Load():
		err = ErrClosed
	case ctx == nil:
		err = ErrNilContext
	default:
		err = e.ctxErr(ctx)
	}
	sent := 0
	for i := range c.parts {
		p := &c.parts[i]
		if len(p.m.Items) == 0 {
			continue
		}
		if err == nil {
			p.m.Out = grow(p.m.Out, len(p.m.Items))
			err = e.mailboxes[i].SendBatch(ctx, &p.m)
			if err == nil {
				sent++
				continue
			}
		}
		for _, j := range p.idx {
			out[j] = Result{Err: err}
		}
		e.callerErrs.add(err, len(p.idx))
	}
	// Parts taken by a shard are always answered; wait for all of them, since
	// they write into buffers that go back to the pool.
	for ; sent > 0; sent-- {
		p := &c.parts[msg.AwaitPart(c.done, e.waitYields)]
		if p.m.Closed && err == nil {
			err = ErrClosed // queued, but the shard stopped before taking it
		}
		for j := range p.m.Out {
			// Field by field: a Result literal is built on the stack in
			// words and copied out in wider loads that wait for those
			// stores to retire.
			r, o := &p.m.Out[j], &out[p.idx[j]]
			o.Decision.set(&r.Decision)
			o.Err = r.Err
		}
	}
	c.reset()
	e.batches.Put(c)
	return err
}

// group adds each valid request of reqs to its shard's part of c, and
// answers each invalid one in out.
func (e *Engine) group(c *batchCall, reqs []Request, out []Result) {
	for i, r := range reqs {
		err := e.checkKey(r.Key)
		if err == nil && r.Cost < 1 {
			err = ErrInvalidCost
		}
		if err != nil {
			out[i] = Result{Err: err}
			e.callerErrs.add(err, 1)
			continue
		}
		j, h := e.shardOf(r.Key)
		p := &c.parts[j]
		p.m.Items = append(p.m.Items, msg.Item{Key: r.Key, Hash: h, Cost: r.Cost})
		p.idx = append(p.idx, i)
	}
}

// groupOne is group for an engine of one shard. The part's slices are kept
// in locals: appending to a part in memory waits, at every request, for the
// length the last append stored to come back, a chain through memory that
// cost about 2 ns a request (6% of a batch of 64 on one hot key).
func (e *Engine) groupOne(c *batchCall, reqs []Request, out []Result) {
	p := &c.parts[0]
	items, idx := p.m.Items, p.idx
	for i, r := range reqs {
		err := e.checkKey(r.Key)
		if err == nil && r.Cost < 1 {
			err = ErrInvalidCost
		}
		if err != nil {
			out[i] = Result{Err: err}
			e.callerErrs.add(err, 1)
			continue
		}
		items = append(items, msg.Item{Key: r.Key, Hash: e.hasher.Sum(r.Key), Cost: r.Cost})
		idx = append(idx, i)
	}
	p.m.Items, p.idx = items, idx
}

// grow returns s resized to n, reusing its array when it is large enough.
func grow(s []msg.Reply, n int) []msg.Reply {
	if cap(s) < n {
		return make([]msg.Reply, n)
	}
	return s[:n]
}
