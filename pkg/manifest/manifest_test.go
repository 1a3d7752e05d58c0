package manifest

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/sandbox"
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
	if err := atomicfile.WriteJSON(path, want); err != nil {
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

// verifiedOutput writes an output that Verify accepts: a real restore spec and its fingerprint,
// and a checkpoint.img that starts with gVisor's header.
func verifiedOutput(t *testing.T) (string, *Manifest) {
	t.Helper()
	out := t.TempDir()
	m := sample()
	m.RunscFlags, m.CPUs = sandbox.DefaultFlags().Args(), 2
	spec, err := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeSandbox, Rootfs: "/r", HostDir: "/run/readie/sandboxes/SANDBOX_ID"})
	if err != nil {
		t.Fatal(err)
	}
	if m.SpecFingerprint, err = sandbox.Fingerprint(spec, sandbox.DefaultFlags()); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(out, "numpy")
	os.MkdirAll(dir, 0o755)
	meta := &Meta{ID: "numpy", Imports: []string{"numpy"}, RunscVersion: m.Runsc.Version, SpecFingerprint: m.SpecFingerprint, CPUs: m.CPUs, Files: map[string]File{}}
	for _, name := range ImageFiles() {
		content := []byte("content of " + name)
		if name == "checkpoint.img" {
			content = header(`{"runsc_version":"` + m.Runsc.Version + `","compression":"none"}`)
		}
		os.WriteFile(filepath.Join(dir, name), content, 0o644)
		size, sum, err := filedigest.Of(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		meta.Files[name] = File{Bytes: size, SHA256: sum}
	}
	atomicfile.WriteJSON(filepath.Join(dir, MetaFileName), meta)
	atomicfile.WriteJSON(filepath.Join(out, RestoreSpecFileName), spec)
	atomicfile.WriteJSON(filepath.Join(out, FileName), m)
	if _, err := Verify(out, 2); err != nil {
		t.Fatal(err)
	}
	return out, m
}

func TestVerify(t *testing.T) {
	out, _ := verifiedOutput(t)
	// One changed byte in pages.img is caught and the file named.
	pages := filepath.Join(out, "numpy", "pages.img")
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

// TestVerifyCatches changes one thing at a time in a good output; Verify must name it.
func TestVerifyCatches(t *testing.T) {
	edit := func(path string, f func(map[string]any)) {
		var v map[string]any
		data, _ := os.ReadFile(path)
		json.Unmarshal(data, &v)
		f(v)
		atomicfile.WriteJSON(path, v)
	}
	for _, tc := range []struct {
		name   string
		change func(out string)
		want   string
	}{
		{"restore spec edited", func(out string) {
			edit(filepath.Join(out, RestoreSpecFileName), func(v map[string]any) {
				v["process"].(map[string]any)["cwd"] = "/tmp"
			})
		}, "restore-spec.json: fingerprint sha256:"},
		{"meta.json from another runsc", func(out string) {
			edit(filepath.Join(out, "numpy", MetaFileName), func(v map[string]any) { v["runsc_version"] = "other" })
		}, `meta.json runsc version "other" differs from the manifest's "v"`},
		{"meta.json of another CPU count", func(out string) {
			edit(filepath.Join(out, "numpy", MetaFileName), func(v map[string]any) { v["cpus"] = 4 })
		}, "meta.json says its sandbox saw 4 CPUs, the manifest's cpus is 2"},
		{"image saved by another runsc", func(out string) {
			image := filepath.Join(out, "numpy", "checkpoint.img")
			os.WriteFile(image, header(`{"runsc_version":"other"}`), 0o644)
		}, `checkpoint.img: saved by runsc "other", the manifest records "v"`},
		{"image without gVisor's header", func(out string) {
			os.WriteFile(filepath.Join(out, "numpy", "checkpoint.img"), []byte("not an image"), 0o644)
		}, "bad checkpoint image header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := verifiedOutput(t)
			tc.change(out)
			if _, err := Verify(out, 2); !errors.Is(err, ErrVerify) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Verify = %v\nwant it to say %q", err, tc.want)
			}
		})
	}
}

// TestLoadRefusesPathsOutside: a manifest whose checkpoint dir or spec leaves the output is
// refused by Load itself, so no caller restores from elsewhere.
func TestLoadRefusesPathsOutside(t *testing.T) {
	for _, tc := range []struct{ dir, spec string }{
		{"../../etc", RestoreSpecFileName}, {"/etc", RestoreSpecFileName}, {"", RestoreSpecFileName},
		{".", RestoreSpecFileName}, {"a/../..", RestoreSpecFileName}, {"numpy", "../spec.json"},
	} {
		m := sample()
		m.Checkpoints[0].Dir, m.Spec = tc.dir, tc.spec
		path := filepath.Join(t.TempDir(), FileName)
		atomicfile.WriteJSON(path, m)
		if _, err := Load(path); !errors.Is(err, ErrInvalid) {
			t.Errorf("dir %q spec %q: Load = %v, want ErrInvalid", tc.dir, tc.spec, err)
		}
	}
	m := sample()
	m.Checkpoints[0].Dir = "sets/numpy" // nested but inside: fine
	path := filepath.Join(t.TempDir(), FileName)
	atomicfile.WriteJSON(path, m)
	if _, err := Load(path); err != nil {
		t.Errorf("a nested local dir: %v", err)
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
		if err := atomicfile.WriteJSON(path, m); err != nil {
			b.Fatal(err)
		}
	}
}

// CheckFiles reports every image file that is unlisted, missing, of another size or another
// content, each as ErrFileMismatch naming the file, in the order of ImageFiles.
func TestCheckFiles(t *testing.T) {
	dir := t.TempDir()
	meta := &Meta{Files: map[string]File{}}
	for _, name := range ImageFiles() {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		size, sum, err := filedigest.Of(path)
		if err != nil {
			t.Fatal(err)
		}
		meta.Files[name] = File{Bytes: size, SHA256: sum}
	}
	if problems := CheckFiles(dir, meta); len(problems) != 0 {
		t.Fatalf("files as recorded: %v", problems)
	}
	names := ImageFiles()
	os.WriteFile(filepath.Join(dir, names[0]), []byte(strings.ToUpper(names[0])), 0o600) // same size
	os.Remove(filepath.Join(dir, names[1]))
	delete(meta.Files, names[2])
	problems := CheckFiles(dir, meta)
	if len(problems) != 3 {
		t.Fatalf("problems: %v", problems)
	}
	for i, p := range problems {
		if !errors.Is(p, ErrFileMismatch) || !strings.Contains(p.Error(), names[i]) {
			t.Errorf("problem %d: %v", i, p)
		}
	}
}

// A manifest of the format before runsc_flags was the one record of runsc's global flags, with
// "overlay" and "network" beside it, still loads, and its flags are read from runsc_flags.
func TestLoadOldFormatWithNetworkAndOverlay(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	old := `{"executor_protocol": 2, "runsc": {"version": "v", "module": "gvisor.dev/gvisor@x", "sha256": "sha256:ab"},
	"runsc_flags": ["--network=none", "--overlay2=none", "--host-uds=create", "--ignore-cgroups"], "restore_flags": ["-direct"],
	"checkpoint_options": {}, "alpha_ms_per_mib": 0, "intercept_ms": 0, "spec_fingerprint": "sha256:cd",
	"executor_argv": ["python3", "-u", "-m", "readie_executor"], "python_path": "/usr/bin/python3",
	"overlay": "none", "network": "none", "root_readonly": true, "rootfs": {"path": "/r", "digest": "sha256:ef"},
	"created_at": "2026-12-02T11:00:00Z", "spec": "restore-spec.json",
	"checkpoints": [{"id": "numpy", "imports": ["numpy"], "dir": "numpy", "bytes": 10, "key": "", "captured_at": "2026-12-02T11:00:00Z",
		"restore_ms": {"runs": [1, 2, 3], "min": 1, "median": 2, "p90": 2.8, "max": 3}, "smoke": {"ok": true, "ready_ms": 4}}]}`
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	flags, err := m.Flags()
	want := sandbox.Flags{Network: "none", Overlay: "none", HostUDS: "create", Extra: []string{"--ignore-cgroups"}}
	if err != nil || !reflect.DeepEqual(flags, want) {
		t.Fatalf("flags of an old manifest: %+v %v", flags, err)
	}
	if !m.RootReadonly || m.Checkpoints[0].RestoreMS.Median != 2 || m.Rootfs.Digest != "sha256:ef" {
		t.Errorf("old manifest: %+v", m)
	}
	// Written again, it records the flags once, in runsc_flags.
	if err := atomicfile.WriteJSON(path, m); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), `"network"`) || strings.Contains(string(data), `"overlay"`) || !strings.Contains(string(data), `"--network=none"`) {
		t.Errorf("manifest written again:\n%s", data)
	}
}

// TestCheckPython: only what the client names is compared, a version on X.Y; a manifest
// without python is refused.
func TestCheckPython(t *testing.T) {
	m := &Manifest{Python: &Python{Version: "3.13.5", Implementation: "cpython", CacheTag: "cpython-313", Cloudpickle: "3.1.1"}}
	for _, ok := range []Python{{}, {Version: "3.13"}, {Version: "3.13.1", Implementation: "cpython"}, {CacheTag: "cpython-313", Cloudpickle: "3.1.1"}} {
		if err := m.CheckPython(ok); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	for want, says := range map[Python]string{
		{Version: "3.11.2"}:       "python 3.13.5, the client's 3.11.2",
		{Version: "3.1"}:          "python 3.13.5, the client's 3.1",
		{Implementation: "pypy"}:  "implementation cpython, the client's pypy",
		{Cloudpickle: "2.2.0"}:    "cloudpickle 3.1.1, the client's 2.2.0",
		{CacheTag: "cpython-311"}: "cache tag cpython-313",
	} {
		if err := m.CheckPython(want); !errors.Is(err, ErrPython) || !strings.Contains(err.Error(), says) {
			t.Errorf("%+v: %v, want one saying %q", want, err, says)
		}
	}
	if err := (&Manifest{}).CheckPython(Python{Version: "3.11"}); !errors.Is(err, ErrPython) {
		t.Errorf("a manifest without python: %v", err)
	}
}
