package manifest_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/runsc"
)

// TestReadHostThisHost: this host, read with the real runsc, restores a manifest that needs
// exactly what it has.
func TestReadHostThisHost(t *testing.T) {
	h, err := manifest.ReadHost(context.Background(), &runsc.Runsc{Path: testenv.RunscPath(t), CommandTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(h.RunscSHA256, "sha256:") || h.RunscVersion == "" || h.CPU.CacheLine == 0 || !slices.Contains(h.CPU.Features, "sse2") {
		t.Fatalf("%+v", h)
	}
	m := manifest.Sample()
	m.Runsc.Version, m.Runsc.SHA256 = h.RunscVersion, h.RunscSHA256
	m.CPU = &manifest.CPU{Features: h.CPU.Features, CacheLine: h.CPU.CacheLine}
	if r := manifest.CheckHost(m, h); !r.Restores || len(r.Checkpoints[0].Warnings) > 0 {
		t.Errorf("%+v", r)
	}
}
