package output

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/oci/ocitest"
	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/internal/oci/verify"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/runsc"
)

// TestRuntimeCheck: push takes only the runsc, helpers and rootfs the manifest records; another
// binary, another helper set or another rootfs is refused with ErrRuntime.
func TestRuntimeCheck(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "runsc")
	helpers := filepath.Join(dir, "gvisor-bin")
	rootfs := filepath.Join(dir, "rootfs")
	for path, data := range map[string]string{bin: "runsc", filepath.Join(helpers, runsc.Sentry): "sentry", filepath.Join(rootfs, manifest.RootfsInfoFile): `{"digest":"sha256:aa"}`} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rt := Runtime{Runsc: bin, Rootfs: rootfs}
	recorded := manifest.Manifest{
		Runsc:  manifest.Runsc{SHA256: filedigest.OfBytes([]byte("runsc")), Helpers: map[string]string{runsc.Sentry: filedigest.OfBytes([]byte("sentry"))}},
		Rootfs: manifest.Rootfs{Digest: "sha256:aa"},
	}
	if err := rt.check(&recorded); err != nil {
		t.Fatalf("the recorded runtime: %v", err)
	}
	for name, change := range map[string]func(m *manifest.Manifest){
		"runsc":   func(m *manifest.Manifest) { m.Runsc.SHA256 = filedigest.OfBytes([]byte("another runsc")) },
		"helpers": func(m *manifest.Manifest) { m.Runsc.Helpers = nil },
		"rootfs":  func(m *manifest.Manifest) { m.Rootfs.Digest = "sha256:bb" },
	} {
		m := recorded
		change(&m)
		if err := rt.check(&m); !errors.Is(err, ErrRuntime) {
			t.Errorf("another %s: %v, want ErrRuntime", name, err)
		}
	}
}

// TestPullRuntimeRefusesDir: a runtime directory that holds another runtime (its record names
// other layers) or an entry no pull laid out is refused with ErrRuntimeDir before any layer is
// read, and left as it was.
func TestPullRuntimeRefusesDir(t *testing.T) {
	runscLayer, rootfsLayer := ocitest.Layer(t, []byte("runsc")), ocitest.Layer(t, []byte("rootfs"))
	img, err := mutate.AppendLayers(empty.Image, runscLayer, rootfsLayer)
	if err != nil {
		t.Fatal(err)
	}
	runscDigest, _ := runscLayer.Digest()
	rootfsDigest, _ := rootfsLayer.Digest()
	img = mutate.Annotations(img, map[string]string{AnnotationRuntimeRunsc: runscDigest.String(), AnnotationRuntimeRootfs: rootfsDigest.String()}).(v1.Image)
	other := filedigest.OfBytes([]byte("another layer"))
	for name, tc := range map[string]struct {
		files map[string]string
		want  string
	}{
		"another runtime":           {map[string]string{runtimeRecordName: `{"runsc_layer":"` + other + `"}`}, "it holds the runsc of another runtime (layer " + other},
		"an entry no pull laid out": {map[string]string{"rootfs/etc/passwd": "root"}, "rootfs is there and no pull laid it out"},
		"the record, rootfs alone":  {map[string]string{runtimeRecordName: `{"rootfs_layer":"` + rootfsDigest.String() + `"}`, "runsc": "x"}, "runsc is there and no pull laid it out"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for path, data := range tc.files {
				os.MkdirAll(filepath.Join(dir, filepath.Dir(path)), 0o755)
				if err := os.WriteFile(filepath.Join(dir, path), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			before := tree(t, dir)
			err := PullRuntime(context.Background(), img, &manifest.Manifest{}, dir, unpack.Limits{}, quietLog(), nil)
			if !errors.Is(err, ErrRuntimeDir) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want ErrRuntimeDir saying %q", err, tc.want)
			}
			if after := tree(t, dir); after != before {
				t.Errorf("a refused pull changed the directory:\n%s\nthen\n%s", before, after)
			}
		})
	}
}

// tree lists every path under dir with its mode and size.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %s %d\n", path, info.Mode(), info.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestPullRuntimeFetchesOnce: a pull lays out the runtime (the helpers of a runsc captured
// with them, none of one without); a second pull fetches no layer; a pull that died before it
// put runsc in place (the record written, runsc missing) is finished by the next, which
// fetches the runsc layer alone.
func TestPullRuntimeFetchesOnce(t *testing.T) {
	for _, withHelpers := range []bool{true, false} {
		t.Run(fmt.Sprintf("helpers %v", withHelpers), func(t *testing.T) {
			runscTar := map[string]string{RuntimeRoot + "/runsc": "runsc"}
			m := &manifest.Manifest{Runsc: manifest.Runsc{SHA256: filedigest.OfBytes([]byte("runsc"))}, Rootfs: manifest.Rootfs{Digest: "sha256:aa"}}
			if withHelpers {
				runscTar[RuntimeRoot+"/gvisor-bin/"+runsc.Sentry] = "sentry"
				m.Runsc.Helpers = map[string]string{runsc.Sentry: filedigest.OfBytes([]byte("sentry"))}
			}
			runscLayer := ocitest.Layer(t, tarOf(t, runscTar))
			rootfsLayer := ocitest.Layer(t, tarOf(t, map[string]string{RuntimeRoot + "/rootfs/" + manifest.RootfsInfoFile: `{"digest":"sha256:aa"}`}))
			img, err := mutate.AppendLayers(empty.Image, runscLayer, rootfsLayer)
			if err != nil {
				t.Fatal(err)
			}
			runscDigest, _ := runscLayer.Digest()
			rootfsDigest, _ := rootfsLayer.Digest()
			img = mutate.Annotations(img, map[string]string{AnnotationRuntimeRunsc: runscDigest.String(), AnnotationRuntimeRootfs: rootfsDigest.String()}).(v1.Image)

			dir := filepath.Join(t.TempDir(), "runtime")
			pull := func() []string {
				t.Helper()
				var fetched []string
				if err := PullRuntime(context.Background(), img, m, dir, unpack.DefaultLimits(), quietLog(), func(l verify.Layer) { fetched = append(fetched, l.Digest.String()) }); err != nil {
					t.Fatal(err)
				}
				return fetched
			}
			if got := pull(); len(got) != 2 {
				t.Errorf("the first pull fetched %v, want both layers", got)
			}
			if _, err := os.Stat(filepath.Join(dir, "gvisor-bin", runsc.Sentry)); (err == nil) != withHelpers {
				t.Errorf("the sentry laid out: %v, want %v", err, withHelpers)
			}
			if got := pull(); len(got) != 0 {
				t.Errorf("the second pull fetched %v, want nothing", got)
			}
			os.Remove(filepath.Join(dir, "runsc"))
			if got := pull(); len(got) != 1 || got[0] != runscDigest.String() {
				t.Errorf("a pull after one that died fetched %v, want the runsc layer %s", got, runscDigest)
			}
			if data, err := os.ReadFile(filepath.Join(dir, "runsc")); string(data) != "runsc" {
				t.Errorf("runsc: %q, %v", data, err)
			}
		})
	}
}

// tarOf returns a tar of the files (name: content), each 0755, sorted.
func tarOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(files[name]))}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(files[name]))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// quietLog is a logger that writes nowhere.
func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.Out = io.Discard
	return l
}
