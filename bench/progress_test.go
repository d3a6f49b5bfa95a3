package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProgressQuiet: a writer that is not a file, as a test's buffer, gets
// no progress, and a nil progress accepts every call.
func TestProgressQuiet(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf)
	if p != nil {
		t.Fatalf("newProgress(buffer) = %+v, want nil", p)
	}
	p.show("x")
	p.mark("x")
	p.clear()
	if w := p.clearing(&buf); w != &buf {
		t.Errorf("a nil progress wrapped the writer")
	}
	if buf.Len() != 0 {
		t.Errorf("a nil progress wrote %q", buf.String())
	}
}

// TestProgressPlain: a regular file is no terminal, so it gets one line per
// mark and nothing for a show.
func TestProgressPlain(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := newProgress(f)
	if p == nil || p.tty {
		t.Fatalf("newProgress(regular file) = %+v, want plain mode", p)
	}
	p.show("a step")
	p.mark("column %d/%d", 1, 8)
	p.show("another step")
	p.mark("column %d/%d", 2, 8)
	p.clear()
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	want := "bench: 0s column 1/8\nbench: 0s column 2/8\n"
	if string(got) != want {
		t.Errorf("plain progress wrote %q, want %q", got, want)
	}
}

// TestProgressTerminal: on a terminal each show redraws one line in place,
// blanks the tail of a longer one, stays within progressWidth, and a write
// through clearing first blanks the line.
func TestProgressTerminal(t *testing.T) {
	var buf bytes.Buffer
	p := &progress{w: &buf, tty: true, start: time.Now()}
	p.show("measuring %d/%d", 10, 72)
	p.show("x")
	if want := "\r0s measuring 10/72\r0s x" + strings.Repeat(" ", len("0s measuring 10/72")-len("0s x")); buf.String() != want {
		t.Errorf("terminal progress wrote %q, want %q", buf.String(), want)
	}
	buf.Reset()
	p.show("%s", strings.Repeat("y", 200))
	if n := len(strings.TrimPrefix(buf.String(), "\r")); n != progressWidth {
		t.Errorf("a long line took %d columns, want %d", n, progressWidth)
	}
	buf.Reset()
	var out bytes.Buffer
	w := p.clearing(&out)
	if _, err := w.Write([]byte("table\n")); err != nil {
		t.Fatal(err)
	}
	if want := "\r" + strings.Repeat(" ", progressWidth) + "\r"; buf.String() != want {
		t.Errorf("clearing wrote %q to the terminal, want %q", buf.String(), want)
	}
	if out.String() != "table\n" {
		t.Errorf("clearing passed on %q, want %q", out.String(), "table\n")
	}
	buf.Reset()
	p.clear()
	if buf.Len() != 0 {
		t.Errorf("clearing a blank line wrote %q", buf.String())
	}
}
