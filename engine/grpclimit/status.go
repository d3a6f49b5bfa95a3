package grpclimit

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenshard/tokenshard/engine"
)

// PushbackTrailer is the trailer of gRFC A6 (client-side retries) that
// tells a client with a retry policy how many milliseconds to wait before
// its next attempt. grpc-go honours it in place of its own backoff when
// the status is one its policy retries.
const PushbackTrailer = "grpc-retry-pushback-ms"

// Status messages. They say what failed and nothing about the server's
// internals; the package logs nothing.
const (
	msgKey      = "grpclimit: the server could not derive a rate-limit key for this call"
	msgCost     = "grpclimit: the server could not derive a rate-limit cost for this call"
	msgTooLarge = "grpclimit: the call costs more than its rate limit can ever admit"
	msgOverload = "grpclimit: the rate limiter is at capacity; retry later"
	msgClosed   = "grpclimit: the rate limiter is shut down"
	msgFailed   = "grpclimit: the rate limiter failed"
	msgDenied   = "grpclimit: too many requests"
	msgDegraded = "grpclimit: the rate limiter cannot reach its store; retry later"
)

// The refusals that carry no figure are made once: a status error is
// immutable.
var (
	errNoKey    = status.Error(codes.Internal, msgKey)
	errNoCost   = status.Error(codes.Internal, msgCost)
	errTooLarge = status.Error(codes.InvalidArgument, msgTooLarge)
	errOverload = status.Error(codes.Unavailable, msgOverload)
	errClosed   = status.Error(codes.Unavailable, msgClosed)
	errFailed   = status.Error(codes.Internal, msgFailed)
)

// refusal is why a call is not admitted as it stands: the status error
// that answers it, the pushback in milliseconds for the trailer (0: none),
// and the cause given to WithOnError (nil for a bucket's denial, which is a
// limit, not an error). The zero refusal is none.
type refusal struct {
	status   error
	pushback int64
	cause    error
}

// failure returns the refusal for an engine error.
//
// A full key table gets a delay only when the engine estimates one
// (ReclaimAfter): one that never frees a slot by itself gets none, since
// any figure would be a guess the client would act on.
func (l *Limiter) failure(err error) refusal {
	switch {
	case errors.Is(err, engine.ErrInvalidKey):
		return refusal{status: errNoKey, cause: err}
	case errors.Is(err, engine.ErrInvalidCost):
		// Only a cost above the key's capacity gets here: waiting never helps.
		return refusal{status: errTooLarge, cause: err}
	case errors.Is(err, engine.ErrKeyCapacity):
		if l.reclaim == nil {
			return refusal{status: errOverload, cause: err}
		}
		d, ok := l.reclaim.ReclaimAfter()
		if !ok {
			return refusal{status: errOverload, cause: err}
		}
		ms := ceilMillis(d)
		return refusal{status: retryable(codes.Unavailable, msgOverload, ms), pushback: ms, cause: err}
	case errors.Is(err, engine.ErrClosed):
		return refusal{status: errClosed, cause: err}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return refusal{status: status.FromContextError(err).Err(), cause: err}
	}
	return refusal{status: errFailed, cause: err}
}

// contextEnded reports whether r answers the call's context, ctx, ending
// before the engine decided, which is not the limiter's refusal: shadow
// mode returns it too. A status of the same code while ctx lives (a key
// function's lookup that met its own deadline) is not that.
func (r refusal) contextEnded(ctx context.Context) bool {
	c := status.Code(r.status)
	return (c == codes.Canceled || c == codes.DeadlineExceeded) && ctx.Err() != nil
}

// retryable returns a status error with a google.rpc.RetryInfo detail
// whose retry_delay is ms milliseconds, the same figure as the pushback
// trailer.
func retryable(c codes.Code, msg string, ms int64) error {
	st := status.New(c, msg)
	delay := &durationpb.Duration{Seconds: ms / 1000, Nanos: int32(ms%1000) * int32(time.Millisecond)}
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: delay}); err == nil {
		st = withInfo // WithDetails fails only for codes.OK or a detail that cannot be marshalled
	}
	return st.Err()
}

// ceilMillis returns d in whole milliseconds, rounded up, at least 1 (so a
// refusal never says "retry now") and at most the longest Duration's
// (grpc-go multiplies the pushback by a millisecond: one more overflows
// to a wait below 0, and the client retries at once).
func ceilMillis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond > 0 && ms < math.MaxInt64/int64(time.Millisecond) {
		ms++
	}
	return max(ms, 1)
}

// pushbackMD is the trailer that carries a pushback of ms milliseconds.
func pushbackMD(ms int64) metadata.MD {
	return metadata.MD{PushbackTrailer: []string{strconv.FormatInt(ms, 10)}}
}
