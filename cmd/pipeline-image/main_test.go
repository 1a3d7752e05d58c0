package main

import (
	"archive/tar"
	"crypto/sha256"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"readie.dev/pipeline/internal/oci/ocitest"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/runsc"
)

// TestImageCarriesHelpers: the pipeline's image (`make pipeline-image`) holds runsc's helpers
// in gvisor-bin/ beside its runsc, executable, the same bytes as those beside READIE_RUNSC, in
// its runsc layer.
func TestImageCarriesHelpers(t *testing.T) {
	img, _ := ocitest.FirstImage(t, testenv.PipelineImage(t))
	want, err := (&runsc.Runsc{Path: testenv.RunscPath(t)}).Helpers()
	if err != nil || len(want) != len(runsc.HelperNames()) {
		t.Fatalf("the helpers beside READIE_RUNSC: %v, %v (run `make runsc`)", want, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	layer := -1
	for i, h := range cfg.History {
		if h.CreatedBy == "readie pipeline-image: runsc" {
			layer = i
		}
	}
	if layer < 0 || layer >= len(layers) {
		t.Fatalf("no runsc layer in the image's history %+v", cfg.History)
	}
	r, err := layers[layer].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := map[string]string{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name, ok := strings.CutPrefix("/"+strings.TrimPrefix(hdr.Name, "/"), HelpersPath+"/")
		if !ok || name == "" {
			continue
		}
		if hdr.Typeflag != tar.TypeReg || hdr.Mode&0o777 != 0o755 {
			t.Errorf("%s: type %c, mode %o; want a regular file, 0755", hdr.Name, hdr.Typeflag, hdr.Mode)
		}
		h := sha256.New()
		if _, err := io.Copy(h, tr); err != nil {
			t.Fatal(err)
		}
		got[name] = filedigest.Format(h.Sum(nil))
	}
	if !maps.Equal(got, want) {
		t.Errorf("the image's %s holds %v; beside READIE_RUNSC: %v", HelpersPath, got, want)
	}
	if filepath.Dir(HelpersPath) != filepath.Dir(RunscPath) || filepath.Base(HelpersPath) != "gvisor-bin" {
		t.Errorf("the image's helpers are at %s, not in gvisor-bin/ beside its runsc %s", HelpersPath, RunscPath)
	}
}

// TestHelperFilesRefused: a runsc without its helpers, or with one linked dynamically, makes
// no image, and the error names the helper and the fix.
func TestHelperFilesRefused(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "gvisor-bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile := func(src, dst string) {
		t.Helper()
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// busybox-static (make deps) stands in for a static binary, /bin/ls for a dynamic one.
	staticBin := "/usr/bin/busybox"
	copyFile(staticBin, filepath.Join(dir, "runsc"))
	copyFile(staticBin, filepath.Join(bin, runsc.Sentry))
	_, err := helperFiles(filepath.Join(dir, "runsc"))
	if !errors.Is(err, errInput) || !strings.Contains(err.Error(), runsc.Prewarmer) || !strings.Contains(err.Error(), "make runsc") {
		t.Errorf("without a prewarmer: %v", err)
	}
	copyFile("/bin/ls", filepath.Join(bin, runsc.Prewarmer))
	if _, err := helperFiles(filepath.Join(dir, "runsc")); !errors.Is(err, errInput) || !strings.Contains(err.Error(), "linked dynamically") {
		t.Errorf("with a dynamic prewarmer: %v", err)
	}
	copyFile(staticBin, filepath.Join(bin, runsc.Prewarmer))
	files, err := helperFiles(filepath.Join(dir, "runsc"))
	if err != nil || len(files) != 2 || files[0].Path != HelpersPath+"/"+runsc.Prewarmer || files[1].Source != filepath.Join(bin, runsc.Sentry) {
		t.Errorf("with both: %+v, %v", files, err)
	}
}
