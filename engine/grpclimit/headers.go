package grpclimit

import (
	"google.golang.org/grpc/metadata"

	"github.com/tokenshard/tokenshard/engine"
)

// The metadata keys of WithHeaders: the RateLimit-Policy and RateLimit
// fields of the IETF httpapi draft, lower-case as gRPC metadata keys are.
const (
	PolicyHeader    = "ratelimit-policy"
	RateLimitHeader = "ratelimit"
)

// rateLimitMD returns the RateLimit fields of a bucket's decision d on key,
// written by httplimit.Fields, so they are exactly what httplimit sends for
// the same decision (httplimit.Fields.Append says what they hold).
func (l *Limiter) rateLimitMD(key string, d engine.Decision) metadata.MD {
	var stack [2048]byte // as httplimit: room for every band's item
	buf, policyEnd := l.fields.Append(stack[:0], l.engine.Policy(), key, d)
	fields := string(buf)
	return metadata.MD{PolicyHeader: {fields[:policyEnd]}, RateLimitHeader: {fields[policyEnd:]}}
}
