package manifest

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/checkpointid"
	"readie.dev/pipeline/pkg/limitread"
)

// escapes reports whether p, joined under a directory, could name anything but a plain entry
// strictly inside it.
func escapes(p string) bool {
	return !filepath.IsLocal(p) || filepath.Clean(p) == "." || strings.Contains(p, "\x00")
}

// TestLoadRefusesHostileIDs: an id that is not one (a path, empty, too long) or a repeated
// id is refused by Load and LoadMeta, naming it; the refusal is ErrInvalid.
func TestLoadRefusesHostileIDs(t *testing.T) {
	for _, id := range []string{"../../x", "a/b", "/abs", "", ".", "..", strings.Repeat("x", 65), "a.b"} {
		m := sample()
		m.Checkpoints[0].ID = id
		path := filepath.Join(t.TempDir(), FileName)
		atomicfile.WriteJSON(path, m)
		_, err := Load(path)
		if !errors.Is(err, ErrInvalid) || !errors.Is(err, checkpointid.ErrInvalid) || !strings.Contains(err.Error(), mustQuote(id)) {
			t.Errorf("id %q: Load = %v, want ErrInvalid naming it", id, err)
		}
		metaPath := filepath.Join(t.TempDir(), MetaFileName)
		atomicfile.WriteJSON(metaPath, &Meta{ID: id})
		if _, err := LoadMeta(metaPath); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), mustQuote(id)) {
			t.Errorf("id %q: LoadMeta = %v, want ErrInvalid naming it", id, err)
		}
	}
	m := sample()
	second := m.Checkpoints[0]
	second.Dir = "other"
	m.Checkpoints = append(m.Checkpoints, second)
	path := filepath.Join(t.TempDir(), FileName)
	atomicfile.WriteJSON(path, m)
	if _, err := Load(path); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `duplicate id "numpy"`) {
		t.Errorf("a repeated id: Load = %v", err)
	}
}

func mustQuote(s string) string {
	data, _ := json.Marshal(s) // the same quoting as %q for these ASCII ids
	return string(data)
}

// FuzzLoad: whatever manifest.json holds, Load does not panic, and a manifest it accepts names
// no path outside the output: every checkpoint id is an id (one plain name) and unique, every
// dir and the spec local.
func FuzzLoad(f *testing.F) {
	good, _ := json.Marshal(sample())
	f.Add(good)
	f.Add([]byte(`{"spec":"restore-spec.json","checkpoints":[{"id":"../../x","dir":"x"}]}`))
	f.Add([]byte(`{"checkpoints":[{"id":"a","dir":"a"},{"id":"a","dir":"b"}]}`))
	f.Add([]byte(`{"checkpoints":[{"id":"a/b","dir":"../a"}]}`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, FileName)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := Load(path)
		if err != nil {
			return
		}
		if m.Spec != "" && escapes(m.Spec) {
			t.Errorf("accepted spec %q", m.Spec)
		}
		seen := map[string]bool{}
		for _, c := range m.Checkpoints {
			if !checkpointid.Valid(c.ID) || escapes(c.ID) || filepath.Base(c.ID) != c.ID || seen[c.ID] {
				t.Errorf("accepted id %q", c.ID)
			}
			seen[c.ID] = true
			if escapes(c.Dir) {
				t.Errorf("accepted dir %q", c.Dir)
			}
		}
	})
}

// FuzzLoadMeta: a meta.json LoadMeta accepts has an id that is one plain name.
func FuzzLoadMeta(f *testing.F) {
	f.Add([]byte(`{"id":"numpy"}`))
	f.Add([]byte(`{"id":"../x"}`))
	f.Add([]byte(`{"id":""}`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, MetaFileName)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := LoadMeta(path)
		if err == nil && (!checkpointid.Valid(m.ID) || escapes(m.ID) || filepath.Base(m.ID) != m.ID) {
			t.Errorf("accepted id %q", m.ID)
		}
	})
}

// TestLoadRefusesTooLarge: a manifest.json or meta.json larger than limitread.OutputJSON (a
// pulled one could be gigabytes) is refused before it is read, the error naming the limit;
// the restore spec too, through Verify.
func TestLoadRefusesTooLarge(t *testing.T) {
	dir := t.TempDir()
	sparse := func(name string) string {
		path := filepath.Join(dir, name)
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(limitread.OutputJSON + 1); err != nil {
			t.Fatal(err)
		}
		return path
	}
	const want = "is larger than 64 MiB (the limit on an output's JSON files)"
	if _, err := Load(sparse(FileName)); !errors.Is(err, limitread.ErrTooLarge) || !strings.Contains(err.Error(), want) {
		t.Errorf("Load of a manifest of 64 MiB + 1: %v", err)
	}
	if _, err := LoadMeta(sparse(MetaFileName)); !errors.Is(err, limitread.ErrTooLarge) || !strings.Contains(err.Error(), want) {
		t.Errorf("LoadMeta of 64 MiB + 1: %v", err)
	}
	out := t.TempDir()
	m := sample()
	m.RunscFlags = []string{"--network=none", "--overlay2=none", "--host-uds=create"}
	atomicfile.WriteJSON(filepath.Join(out, FileName), m)
	dir = out
	sparse(RestoreSpecFileName)
	if _, err := Verify(out, 2); !errors.Is(err, limitread.ErrTooLarge) || !strings.Contains(err.Error(), RestoreSpecFileName+" "+want) {
		t.Errorf("Verify with a restore spec of 64 MiB + 1: %v", err)
	}
}
