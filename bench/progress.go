package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress tells the person waiting on the command what it is measuring, on
// stderr, so the tables on stdout stay clean. On a terminal it keeps one line
// that redraws itself; elsewhere (a log file, a pipe) it writes a plain line
// per column or section, never one per measurement. A nil *progress reports
// nothing: that is what run gives a writer that is not a file, such as a
// test's buffer. It is not safe for concurrent use; only the goroutine that
// drives the tables calls it.
type progress struct {
	w     io.Writer
	tty   bool
	start time.Time
	drawn int // length of the line on the terminal now; 0 if none
}

// progressWidth is the longest line a terminal gets: a longer one would wrap,
// and a carriage return then redraws only its last row.
const progressWidth = 79

// newProgress returns a progress reporting on w if w is a file, in place on a
// terminal (a character device) and in plain lines otherwise; nil otherwise.
func newProgress(w io.Writer) *progress {
	f, ok := w.(*os.File)
	if !ok {
		return nil
	}
	fi, err := f.Stat()
	tty := err == nil && fi.Mode()&os.ModeCharDevice != 0
	return &progress{w: f, tty: tty, start: time.Now()}
}

// show draws what on the terminal's progress line, after the time since the
// run began. It writes nothing in plain mode: a step too small for its own
// line.
func (p *progress) show(format string, args ...any) {
	if p == nil || !p.tty {
		return
	}
	line := p.elapsed() + " " + fmt.Sprintf(format, args...)
	if len(line) > progressWidth {
		line = line[:progressWidth]
	}
	// Blank what is left of a longer line drawn before.
	pad := strings.Repeat(" ", max(0, p.drawn-len(line)))
	fmt.Fprint(p.w, "\r"+line+pad)
	p.drawn = len(line)
}

// mark reports a milestone (a column, a section): a plain line of its own,
// or on a terminal the progress line.
func (p *progress) mark(format string, args ...any) {
	if p == nil {
		return
	}
	if p.tty {
		p.show(format, args...)
		return
	}
	fmt.Fprintf(p.w, "bench: %s %s\n", p.elapsed(), fmt.Sprintf(format, args...))
}

// clear blanks the terminal's progress line, so that what comes next (a
// table) starts at the left margin on a clean line.
func (p *progress) clear() {
	if p == nil || p.drawn == 0 {
		return
	}
	fmt.Fprint(p.w, "\r"+strings.Repeat(" ", p.drawn)+"\r")
	p.drawn = 0
}

func (p *progress) elapsed() string {
	return time.Since(p.start).Round(time.Second).String()
}

// clearing returns a writer that clears p's line before each write to w:
// stdout and stderr are often the same terminal.
func (p *progress) clearing(w io.Writer) io.Writer {
	if p == nil || !p.tty {
		return w
	}
	return clearingWriter{p: p, w: w}
}

type clearingWriter struct {
	p *progress
	w io.Writer
}

func (c clearingWriter) Write(b []byte) (int, error) {
	c.p.clear()
	return c.w.Write(b)
}

// cores is n GOMAXPROCS in words: "1 core", "2 cores".
func cores(n int) string {
	if n == 1 {
		return "1 core"
	}
	return fmt.Sprintf("%d cores", n)
}
