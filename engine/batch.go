package engine

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/tokenshard/tokenshard/msg"
)

// batchCall is the reusable working set of one AllowBatch call: one part per
// shard and the channel the parts report on. Pooled, so a batch allocates
// nothing in steady state.
type batchCall struct {
	parts []msg.Batch
	done  chan int // one slot per shard: no shard ever blocks on it
}

func newBatchCall(shards int) *batchCall {
	c := &batchCall{parts: make([]msg.Batch, shards), done: make(chan int, shards)}
	for i := range c.parts {
		c.parts[i].Part = i
		c.parts[i].Done = c.done
	}
	return c
}

// reset empties every part, dropping references to the caller's slices.
func (c *batchCall) reset() {
	for i := range c.parts {
		p := &c.parts[i]
		p.Reqs, p.Out, p.Items, p.Closed = nil, nil, p.Items[:0], false
	}
}

// The parts of a batch read the caller's requests and write the caller's
// results where they are, each part its own entries: no copy of either
// crosses between the caller and a shard. That takes msg.Request and
// msg.Reply to be laid out as Request and Result, which TestBatchLayout
// checks field by field (Decision and msg.Decision convert, so they are).
func requests(r []Request) []msg.Request {
	return unsafe.Slice((*msg.Request)(unsafe.Pointer(unsafe.SliceData(r))), len(r))
}

func replies(r []Result) []msg.Reply {
	return unsafe.Slice((*msg.Reply)(unsafe.Pointer(unsafe.SliceData(r))), len(r))
}

// A compile-time check that the two request types are the same struct.
var _ = msg.Request(Request{})

// AllowBatch decides reqs[i] into out[i] for every i. Requests are grouped by
// shard and each shard gets one message with its part, which it decides in
// request order at one clock reading: every result is what the same Allow
// calls made one by one in that order would give at that instant.
//
// Per-request errors are only in out[i].Err, and AllowBatch returns nil, when
// every part reached its shard. Otherwise it returns ErrClosed or the
// context's error, which is also written into every result that was not
// decided. len(out) < len(reqs) is ErrInvalidConfig, and nothing is decided.
// Parts on different shards may see different policy versions during a
// cutover. It does not allocate in steady state.
func (e *Engine) AllowBatch(ctx context.Context, reqs []Request, out []Result) error {
	if len(out) < len(reqs) {
		return fmt.Errorf("%w: len(out) %d < len(reqs) %d", ErrInvalidConfig, len(out), len(reqs))
	}
	// The shards write the results into out where it is (see requests).
	// Zeroing it here first is not for them: a hot key's batches on 2 cores
	// took 40% longer without it. Most likely because a shard's stores into
	// lines another core only read (the caller's last results) each wait
	// for the reader's copy to be dropped, while lines the caller wrote
	// come over as a stream.
	clear(out[:len(reqs)])
	c := e.batches.Get().(*batchCall)
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
		p.Items = append(p.Items, msg.Item{Hash: h, At: i})
	}

	var err error
	if e.closed.Load() {
		err = ErrClosed
	} else {
		err = ctx.Err()
	}
	sent := 0
	mreqs, mout := requests(reqs), replies(out)
	for i := range c.parts {
		p := &c.parts[i]
		if len(p.Items) == 0 {
			continue
		}
		if err == nil {
			p.Reqs, p.Out = mreqs, mout
			err = e.mailboxes[i].SendBatch(ctx, p)
			if err == nil {
				sent++
				continue
			}
		}
		for _, it := range p.Items {
			out[it.At] = Result{Err: err}
		}
		e.callerErrs.add(err, len(p.Items))
	}
	// Parts taken by a shard are always answered; wait for all of them: they
	// write into out, and their messages go back to the pool.
	for ; sent > 0; sent-- {
		if p := &c.parts[<-c.done]; p.Closed && err == nil {
			err = ErrClosed // queued, but the shard stopped before taking it
		}
	}
	c.reset()
	e.batches.Put(c)
	return err
}
