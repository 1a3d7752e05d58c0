package importcost

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func testKey() key {
	return key{Kind: "cold", Code: codeDigest, RootfsDigest: "sha256:aa", RunscSHA256: "bb", Spec: "sha256:cc",
		RunscFlags: []string{"--network=none"}, Host: "sha256:dd", Runs: 3, Module: "pandas"}
}

func TestCacheRoundTrip(t *testing.T) {
	c := &cache{dir: t.TempDir()}
	k := testKey()
	calls := 0
	measure := func() (runs, error) {
		calls++
		return runs{Runs: []importRun{{importResult: importResult{Ms: 640, DirtyMiB: 31.6, Added: []string{"numpy", "pandas"}}, ColdMs: 1100}}}, nil
	}
	v, fresh, err := lookup(c, k, measure)
	if err != nil || !fresh || calls != 1 {
		t.Fatalf("first lookup: %v fresh=%v calls=%d", err, fresh, calls)
	}
	again, fresh, err := lookup(c, k, measure)
	if err != nil || fresh || calls != 1 || again.Runs[0].Ms != v.Runs[0].Ms || !slices.Equal(again.Runs[0].Added, v.Runs[0].Added) {
		t.Fatalf("second lookup: %+v fresh=%v calls=%d err=%v", again, fresh, calls, err)
	}
	// Empty and absent slices are the same key.
	k2 := k
	k2.Preload = []string{}
	if _, fresh, _ := lookup(c, k2, measure); fresh {
		t.Error("an empty preload made another key")
	}
}

// Every part of the key separates entries: a figure of one image, runsc, spec, host, number of
// runs, module or preload is never served for another.
func TestCacheKeyParts(t *testing.T) {
	base := testKey()
	edits := map[string]func(*key){
		"kind": func(k *key) { k.Kind = "own" }, "code": func(k *key) { k.Code = "sha256:0" },
		"rootfs": func(k *key) { k.RootfsDigest = "sha256:ab" }, "runsc": func(k *key) { k.RunscSHA256 = "bc" },
		"spec": func(k *key) { k.Spec = "sha256:cd" }, "flags": func(k *key) { k.RunscFlags = nil },
		"host": func(k *key) { k.Host = "sha256:de" }, "runs": func(k *key) { k.Runs = 5 },
		"module": func(k *key) { k.Module = "numpy" }, "preload": func(k *key) { k.Preload = []string{"numpy"} },
		"restore flags": func(k *key) { k.RestoreFlags = []string{"-direct"} },
		"options":       func(k *key) { k.CheckpointOptions = map[string]string{"direct": "true"} },
		"sets":          func(k *key) { k.Sets = [][]string{{}} },
	}
	seen := map[string]string{base.digest(): "base"}
	for name, edit := range edits {
		k := base
		edit(&k)
		d := k.digest()
		if other, ok := seen[d]; ok {
			t.Errorf("%s gives the digest of %s", name, other)
		}
		seen[d] = name
	}
}

// An entry that does not parse, or that holds another key (a file copied or planted under the
// wrong name), is not taken: it is measured again and overwritten.
func TestCacheRefusesBadEntries(t *testing.T) {
	c := &cache{dir: t.TempDir()}
	k := testKey()
	other := k
	other.Module = "numpy"
	if err := c.put(other, runs{Runs: []importRun{{importResult: importResult{Ms: 1}}}}); err != nil {
		t.Fatal(err)
	}
	path := c.path(k)
	for name, data := range map[string][]byte{
		"torn":      []byte(`{"key": {"kind": "cold"`),
		"other key": mustRead(t, c.path(other)),
		"bad value": []byte(`{"key": ` + string(mustJSON(t, k)) + `, "value": {"runs": "no"}}`),
	} {
		os.MkdirAll(filepath.Dir(path), 0o755)
		os.WriteFile(path, data, 0o644)
		var v runs
		if ok, err := c.get(k, &v); ok || err != nil {
			t.Errorf("%s: taken (%v, %v)", name, ok, err)
		}
		got, fresh, err := lookup(c, k, func() (runs, error) { return runs{Runs: []importRun{{importResult: importResult{Ms: 2}}}}, nil })
		if err != nil || !fresh || got.Runs[0].Ms != 2 {
			t.Errorf("%s: lookup %+v fresh=%v %v", name, got, fresh, err)
		}
		if ok, _ := c.get(k, &v); !ok || v.Runs[0].Ms != 2 {
			t.Errorf("%s: not overwritten", name)
		}
	}
}

func TestCacheReadOnly(t *testing.T) {
	c := &cache{dir: t.TempDir(), readOnly: true}
	_, _, err := lookup(c, testKey(), func() (runs, error) {
		t.Fatal("a read-only cache measured")
		return runs{}, nil
	})
	if !errors.Is(err, ErrNotCached) {
		t.Fatalf("error %v, want ErrNotCached", err)
	}
	if entries, _ := os.ReadDir(c.dir); len(entries) != 0 {
		t.Errorf("a read-only cache wrote %v", entries)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
