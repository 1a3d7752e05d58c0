package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sample() *Manifest {
	return &Manifest{
		ExecutorProtocol: 2,
		Runsc:            Runsc{Version: "v", Module: "gvisor.dev/gvisor@x", SHA256: "sha256:ab"},
		RunscFlags:       []string{"--network=none"},
		RestoreFlags:     []string{"-direct"},
		SpecFingerprint:  "sha256:cd",
		ExecutorArgv:     []string{"python3", "-u", "-m", "readie_executor"},
		PythonPath:       "/usr/bin/python3",
		Overlay:          "none",
		Network:          "none",
		RootReadonly:     true,
		Rootfs:           Rootfs{Path: "/r", Digest: "sha256:ef"},
		CreatedAt:        time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC),
		Spec:             RestoreSpecFileName,
		Checkpoints: []Checkpoint{{
			ID: "numpy", Imports: []string{"numpy"}, Dir: "numpy", Bytes: 10,
			RestoreMS: Stats{Runs: []float64{1, 2, 3}, Min: 1, Median: 2, P90: 2.8, Max: 3},
			Smoke:     Smoke{OK: true, ReadyMS: 4},
		}},
	}
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	want := sample()
	if err := WriteJSON(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
	data, _ := os.ReadFile(path)
	for _, key := range []string{`"executor_protocol": 2`, `"restore_ms"`, `"ready_ms"`, `"spec_fingerprint"`, `"root_readonly": true`} {
		if !strings.Contains(string(data), key) {
			t.Errorf("manifest.json lacks %s", key)
		}
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
}

func TestWriteAtomicKeepsOldFileOnFailure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	if err := WriteJSON(path, sample()); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	if err := WriteJSON(path, map[string]any{"bad": func() {}}); err == nil {
		t.Fatal("unencodable value written")
	}
	after, _ := os.ReadFile(path)
	if string(before) != string(after) {
		t.Fatal("a failed write changed the file")
	}
}

func TestCheckProtocol(t *testing.T) {
	if err := (&Manifest{ExecutorProtocol: 2}).CheckProtocol(2); err != nil {
		t.Fatal(err)
	}
	err := (&Manifest{}).CheckProtocol(2) // no field: version 1
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"protocol 1", "implements 2", "rebuild the worker image"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if err := (&Manifest{ExecutorProtocol: 3}).CheckProtocol(2); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "protocol 3") {
		t.Fatalf("err = %v", err)
	}
	// A manifest file without the field loads as version 0 and checks as version 1.
	path := filepath.Join(t.TempDir(), FileName)
	os.WriteFile(path, []byte(`{"checkpoints": []}`), 0o644)
	m, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.CheckProtocol(2); !errors.Is(err, ErrProtocol) {
		t.Fatalf("err = %v", err)
	}
}

func TestVerify(t *testing.T) {
	out := t.TempDir()
	m := sample()
	dir := filepath.Join(out, "numpy")
	os.MkdirAll(dir, 0o755)
	meta := &Meta{ID: "numpy", Imports: []string{"numpy"}, SpecFingerprint: m.SpecFingerprint, Files: map[string]File{}}
	for _, name := range ImageFiles() {
		os.WriteFile(filepath.Join(dir, name), []byte("content of "+name), 0o644)
		f, err := HashFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		meta.Files[name] = f
	}
	WriteJSON(filepath.Join(dir, MetaFileName), meta)
	WriteJSON(filepath.Join(out, RestoreSpecFileName), map[string]any{"ociVersion": "1.2.1"})
	WriteJSON(filepath.Join(out, FileName), m)
	if _, err := Verify(out, 2); err != nil {
		t.Fatal(err)
	}
	// One changed byte in pages.img is caught and the file named.
	pages := filepath.Join(dir, "pages.img")
	data, _ := os.ReadFile(pages)
	data[0] ^= 1
	os.WriteFile(pages, data, 0o644)
	if _, err := Verify(out, 2); !errors.Is(err, ErrVerify) || !strings.Contains(err.Error(), pages) {
		t.Fatalf("Verify after a flipped byte = %v", err)
	}
	if _, err := Verify(out, 3); !errors.Is(err, ErrProtocol) {
		t.Fatalf("Verify with another protocol = %v", err)
	}
}

// BenchmarkWriteManifest is writing manifest.json atomically (fsync included).
func BenchmarkWriteManifest(b *testing.B) {
	path := filepath.Join(b.TempDir(), FileName)
	m := sample()
	for range 20 {
		m.Checkpoints = append(m.Checkpoints, m.Checkpoints[0])
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := WriteJSON(path, m); err != nil {
			b.Fatal(err)
		}
	}
}
