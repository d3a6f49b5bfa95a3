package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// configMap lays out dir as a Kubernetes ConfigMap volume holds files: each
// a link name -> ..data/name, ..data a link to a timestamped directory.
type configMap struct{ dir string }

// stage writes files to the timestamped directory ts and points ..data at
// it, as the kubelet's update does before it makes the links of new files
// and drops those of removed ones (see link).
func (m configMap) stage(ts string, files map[string]string) error {
	if err := os.Mkdir(filepath.Join(m.dir, ts), 0o700); err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(m.dir, ts, name), []byte(data), 0o600); err != nil {
			return err
		}
	}
	tmp := filepath.Join(m.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(m.dir, "..data"))
}

// link ends the update: a link for each file ..data holds, none for a
// file it does not, and old, the previous timestamped directory, removed.
func (m configMap) link(old string) error {
	data, err := os.ReadDir(filepath.Join(m.dir, "..data"))
	if err != nil {
		return err
	}
	for _, e := range data {
		if err := os.Symlink(filepath.Join("..data", e.Name()), filepath.Join(m.dir, e.Name())); err != nil && !os.IsExist(err) {
			return err
		}
	}
	top, err := os.ReadDir(m.dir)
	if err != nil {
		return err
	}
	for _, e := range top {
		if strings.HasPrefix(e.Name(), "..") {
			continue
		}
		if _, err := os.Stat(filepath.Join(m.dir, "..data", e.Name())); os.IsNotExist(err) {
			if err := os.Remove(filepath.Join(m.dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if old == "" {
		return nil
	}
	return os.RemoveAll(filepath.Join(m.dir, old))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

const otherYAML = `domain: other
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// TestCommandConfigMapUpdate: in a ConfigMap volume an update renames
// ..data to a new directory and only then makes the links of its new
// files. A poll in between reads the update whole, through ..data, not the
// links' mix of the two versions (here: a domain moved to a new file,
// missing, its limits gone), and the end of the update reloads nothing
// again: one reload, to the new version.
func TestCommandConfigMapUpdate(t *testing.T) {
	c := startCommand(t)
	if err := os.Remove(filepath.Join(c.dir, "limits.yaml")); err != nil {
		t.Fatal(err)
	}
	m := configMap{c.dir}
	must(t, m.stage("..2026_12_07_01_00_00.000000001", map[string]string{"limits.yaml": limitsYAML, "other.yaml": otherYAML}))
	must(t, m.link(""))
	if err := c.reload(); err != nil { // other.yaml is new
		t.Fatalf("reload: %v\n%s", err, c.stderr)
	}

	// The gw domain moves to gateway.yaml, its limit raised.
	raised := strings.Replace(limitsYAML, "requests_per_unit: 2", "requests_per_unit: 10", 1)
	must(t, m.stage("..2026_12_07_02_00_00.000000002", map[string]string{"gateway.yaml": raised, "other.yaml": otherYAML}))
	if err := c.reload(); err != nil {
		t.Fatalf("reload after ..data moved: %v\n%s", err, c.stderr)
	}
	if got := c.ask("gw", "route=/x").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 10 {
		t.Errorf("after ..data moved: gw's limit %d, want the update's 10\n%s", got, c.stderr)
	}
	must(t, m.link("..2026_12_07_01_00_00.000000001"))
	c.pollOnce()
	if got := c.ask("gw", "route=/x").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 10 {
		t.Errorf("after the update: gw's limit %d, want 10", got)
	}
	if m := c.scrape(); !strings.Contains(m, `tokenshard_rls_reloads_total{result="ok"} 2`) || !strings.Contains(m, `tokenshard_rls_reloads_total{result="error"} 0`) {
		t.Errorf("want 2 reloads (the new file, the update), none failed:\n%s", m)
	}
}

// TestReadDirDuringUpdates: ConfigMap updates one after another, each
// removing the previous version's directory as soon as ..data has moved
// off it, while the directory is read over and over. Every read that
// succeeds is one version whole, never a part of one whose files were
// being removed.
func TestReadDirDuringUpdates(t *testing.T) {
	m := configMap{t.TempDir()}
	versions := []map[string]string{
		{"limits.yaml": limitsYAML, "other.yaml": otherYAML},
		{"gateway.yaml": strings.Replace(limitsYAML, "requests_per_unit: 2", "requests_per_unit: 10", 1), "other.yaml": otherYAML},
	}
	must(t, m.stage("..v0", versions[0]))
	must(t, m.link(""))
	const updates = 300
	stop := make(chan struct{})
	updated := make(chan error, 1)
	go func() {
		for i := 1; i <= updates; i++ {
			select {
			case <-stop:
				updated <- nil
				return
			default:
			}
			if err := m.stage(fmt.Sprintf("..v%d", i), versions[i%2]); err != nil {
				updated <- err
				return
			}
			if err := m.link(fmt.Sprintf("..v%d", i-1)); err != nil {
				updated <- err
				return
			}
		}
		updated <- nil
	}()
	whole, reads := 0, 0
	for {
		select {
		case err := <-updated:
			must(t, err)
			t.Logf("%d reads, %d whole versions", reads, whole)
			if whole == 0 {
				t.Fatalf("none of %d reads during the updates gave a version", reads)
			}
			return
		default:
		}
		s, err := readDir(m.dir)
		reads++
		if err != nil {
			continue // the version read was replaced meanwhile, again and again
		}
		got := map[string]string{}
		for i, name := range s.names {
			got[name] = string(s.data[i])
		}
		if !maps.Equal(got, versions[0]) && !maps.Equal(got, versions[1]) {
			close(stop)
			must(t, <-updated)
			t.Fatalf("read %d: files %q, not a version", reads, s.names)
		}
		whole++
	}
}
