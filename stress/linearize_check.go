package main

// The checks run on each recorded history: what partitions leave out,
// real-time version order across keys, and porcupine, with an explanation
// of any history it rejects.

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// linCheck checks one history: the ranges of what partitions leave out,
// real-time version order across keys, then porcupine. unknown reports that
// porcupine timed out, which is not a violation.
func linCheck(spec *linSpec, h []porcupine.Operation, vizDir string) (v *Violation, unknown bool) {
	if v := linBounds(spec, h); v != nil {
		return v, false
	}
	if v := linVersions(h); v != nil {
		return v, false
	}
	m := spec.model()
	res, info := porcupine.CheckOperationsVerbose(m, h, linTimeout)
	switch res {
	case porcupine.Ok:
		return nil, false
	case porcupine.Unknown:
		return nil, true
	}
	return linIllegal(spec, m, h, info, vizDir), false
}

// linBounds checks what partitions cannot: a KeyCount within the bound and
// the keys used, and an EvictFull without error and within the keys
// (unpartitioned histories check both exactly as well); and, in every
// history, an AllowAll's index within its requests.
func linBounds(spec *linSpec, h []porcupine.Operation) *Violation {
	for _, op := range h {
		in, out := op.Input.(*linInput), op.Output.(*linOutput)
		switch in.kind {
		case linKeyCount:
			if hi := min(spec.maxKeys, len(spec.keys)); out.n < 0 || out.n > hi {
				return linViolation("", op, fmt.Sprintf("a count in [0, %d]", hi), fmt.Sprint(out.n))
			}
		case linPass:
			if out.err != nil || out.n < 0 || out.n > len(spec.keys) {
				return linViolation("", op, fmt.Sprintf("a count in [0, %d] and no error", len(spec.keys)),
					fmt.Sprintf("%d, %s", out.n, linErrOrNil(out.err)))
			}
		case linAllow:
			if out.err != nil {
				return linViolation(in.key, op, "AllowBatch to return nil", linErrName(out.err))
			}
		case linAllowAll:
			// The index's range, in every history (the model checks it
			// exactly, but for ErrKeyCapacity's on several shards): none
			// for an error of the call as a whole, else a request.
			want, ok := fmt.Sprintf("an index in [0, %d)", len(in.reqs)), 0 <= out.n && out.n < len(in.reqs)
			switch linErrName(out.res[0].err) {
			case "ErrAllowAllSize", "ErrClosed", "Canceled", "DeadlineExceeded":
				want, ok = "index -1", out.n == -1
			}
			if !ok {
				return linViolation(linKeyOf(in), op, want, fmt.Sprint(out.n))
			}
		}
	}
	return nil
}

// linVersions checks, across all keys, that versions never go back in real
// time: if A returned before B was invoked, B saw a version at least A's. A
// successful cutover counts as having seen its new version; a decision, a
// Policy read, as the version it reports. Per-key partitions cannot see
// this: each may place a cutover at a different instant.
func linVersions(h []porcupine.Operation) *Violation {
	type seen struct {
		op      porcupine.Operation
		version int64
	}
	var before, after []seen // as the earlier call A, as the later call B
	for _, op := range h {
		in, out := op.Input.(*linInput), op.Output.(*linOutput)
		switch in.kind {
		case linAllow, linAllowAll, linRefund, linPeek, linCharge:
			lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
			for _, r := range out.res {
				if r.err == nil {
					lo, hi = min(lo, r.d.Version), max(hi, r.d.Version)
				}
			}
			if lo <= hi {
				before = append(before, seen{op, hi})
				after = append(after, seen{op, lo})
			}
		case linPolicy:
			before = append(before, seen{op, out.pol.Version})
			after = append(after, seen{op, out.pol.Version})
		case linCutover:
			if out.err == nil {
				before = append(before, seen{op, in.next.Version})
			}
		}
	}
	slices.SortFunc(before, func(a, b seen) int { return cmp.Compare(a.op.Return, b.op.Return) })
	slices.SortFunc(after, func(a, b seen) int { return cmp.Compare(a.op.Call, b.op.Call) })
	var best seen
	i := 0
	for _, b := range after {
		for ; i < len(before) && before[i].op.Return < b.op.Call; i++ {
			if before[i].version > best.version {
				best = before[i]
			}
		}
		if b.version < best.version {
			return linViolation(linKeyOf(b.op.Input.(*linInput)), b.op,
				fmt.Sprintf("version >= %d, since %s returned before it was invoked", best.version, linDescribeOp(best.op)),
				fmt.Sprintf("version %d", b.version))
		}
	}
	return nil
}

// linIllegal explains a history porcupine rejected: the first partition with
// no linearization, the longest prefix it found, and the operations none of
// which fits next.
func linIllegal(spec *linSpec, m porcupine.Model, h []porcupine.Operation, info porcupine.LinearizationInfo, vizDir string) *Violation {
	parts := [][]porcupine.Operation{h}
	if spec.partitioned {
		parts = spec.partition(h)
	}
	partials := info.PartialLinearizations()
	p, longest := 0, []int(nil)
	for i, part := range parts {
		var best []int
		for _, l := range partials[i] {
			if len(l) > len(best) {
				best = l
			}
		}
		if len(best) < len(part) {
			p, longest = i, best
			break
		}
	}
	part := parts[p]
	done := make([]bool, len(part))
	for _, id := range longest {
		done[id] = true
	}
	// The operations that could come next are the pending ones invoked
	// before any pending one returned.
	firstReturn := int64(math.MaxInt64)
	for i, op := range part {
		if !done[i] {
			firstReturn = min(firstReturn, op.Return)
		}
	}
	var next []string
	var stuck porcupine.Operation
	order := make([]int, len(part))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(part[a].Call, part[b].Call) })
	var lines []string
	firstStuck := -1
	for _, i := range order {
		op := part[i]
		mark := "  "
		switch {
		case done[i]:
			mark = "ok"
		case op.Call <= firstReturn:
			mark = "!!"
			if firstStuck < 0 {
				firstStuck, stuck = len(lines), op
			}
			next = append(next, linDescribeOp(op))
		}
		lines = append(lines, fmt.Sprintf("%s [%d,%d] c%d %s", mark, op.Call, op.Return, op.ClientId, linDescribeOp(op)))
	}
	// Keep the excerpt short: the operations around the first that fits nowhere.
	lo, hi := max(0, firstStuck-25), min(len(lines), firstStuck+15)
	excerpt := strings.Join(lines[lo:hi], "\n")
	if lo > 0 || hi < len(lines) {
		excerpt = fmt.Sprintf("(operations %d to %d of %d, by invocation)\n%s", lo+1, hi, len(lines), excerpt)
	}
	key := linPartitionKey(part)
	if in, ok := stuck.Input.(*linInput); ok && !spec.partitioned {
		key = linKeyOf(in)
	}
	if len(next) > 4 {
		next = append(next[:4], fmt.Sprintf("and %d more", len(next)-4))
	}
	got := fmt.Sprintf("no linearization of %d operations (the longest prefix has %d); none of these fits next: %s",
		len(part), len(longest), strings.Join(next, " | "))
	detail := "ok = in the longest linearizable prefix, !! = could come next but fits nowhere, [call,return] in logical time\n" + excerpt
	if vizDir != "" {
		if path, err := linVisualize(m, info, vizDir); err == nil {
			detail += "\nvisualization: " + path
		} else {
			detail += "\nvisualization failed: " + err.Error()
		}
	}
	v := linViolation(key, stuck, "a linearizable history", got)
	v.Detail = detail
	return v
}

// linVisualize writes porcupine's HTML view of the check to a new file in dir.
func linVisualize(m porcupine.Model, info porcupine.LinearizationInfo, dir string) (string, error) {
	f, err := os.CreateTemp(dir, "tokenshard-linearizability-*.html")
	if err != nil {
		return "", err
	}
	err = porcupine.Visualize(m, info, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return f.Name(), err
}

func linViolation(key string, op porcupine.Operation, want, got string) *Violation {
	return &Violation{Check: "linearizability", Key: key, Op: linDescribeOp(op), Want: want, Got: got}
}

func linDescribeOp(op porcupine.Operation) string {
	if op.Input == nil {
		return "history"
	}
	return linDescribe(op.Input.(*linInput), op.Output.(*linOutput))
}
