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
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/oci/ocitest"
	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/internal/oci/verify"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/limitread"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/runsc"
)

// TestRuntimeCheck: push takes only the runsc, helpers and rootfs the manifest records; another
// binary, another helper set or another rootfs is refused with manifest.ErrRuntime, and so is
// a manifest that records no runsc sha256 or no rootfs digest (an empty digest skips no check).
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
		"runsc":              func(m *manifest.Manifest) { m.Runsc.SHA256 = filedigest.OfBytes([]byte("another runsc")) },
		"helpers":            func(m *manifest.Manifest) { m.Runsc.Helpers = nil },
		"rootfs":             func(m *manifest.Manifest) { m.Rootfs.Digest = "sha256:bb" },
		"runsc, unrecorded":  func(m *manifest.Manifest) { m.Runsc.SHA256 = "" },
		"rootfs, unrecorded": func(m *manifest.Manifest) { m.Rootfs.Digest = "" },
	} {
		m := recorded
		change(&m)
		if err := rt.check(&m); !errors.Is(err, manifest.ErrRuntime) {
			t.Errorf("another %s: %v, want manifest.ErrRuntime", name, err)
		}
	}
}

// TestPullRuntimeRefusesDir: a runtime directory that holds another runtime (its record names
// other layers) or an entry no pull laid out is refused with launch.ErrRuntimeDir before any
// layer is read, and left as it was.
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
			dir := privateDir(t)
			for path, data := range tc.files {
				os.MkdirAll(filepath.Join(dir, filepath.Dir(path)), 0o755)
				if err := os.WriteFile(filepath.Join(dir, path), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			before := testenv.ListTree(t, dir)
			err := PullRuntime(context.Background(), img, &manifest.Manifest{}, dir, unpack.Limits{}, quietLog(), nil)
			if !errors.Is(err, launch.ErrRuntimeDir) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want launch.ErrRuntimeDir saying %q", err, tc.want)
			}
			if after := testenv.ListTree(t, dir); after != before {
				t.Errorf("a refused pull changed the directory:\n%s\nthen\n%s", before, after)
			}
		})
	}
}

// privateDir returns a new empty directory of this user's alone (t.TempDir's others can enter),
// as a runtime directory must be.
func privateDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runtimeImage returns an image of two runtime layers, their tars given, annotated as push
// annotates them, and the runsc layer's digest.
func runtimeImage(t *testing.T, runscTar, rootfsTar []byte) (v1.Image, v1.Hash) {
	t.Helper()
	runscLayer, rootfsLayer := ocitest.Layer(t, runscTar), ocitest.Layer(t, rootfsTar)
	img, err := mutate.AppendLayers(empty.Image, runscLayer, rootfsLayer)
	if err != nil {
		t.Fatal(err)
	}
	runscDigest, _ := runscLayer.Digest()
	rootfsDigest, _ := rootfsLayer.Digest()
	return mutate.Annotations(img, map[string]string{AnnotationRuntimeRunsc: runscDigest.String(), AnnotationRuntimeRootfs: rootfsDigest.String()}).(v1.Image), runscDigest
}

// The runtime of the crafted layers below: runsc and the sentry of a few bytes, a rootfs of
// its record alone.
const (
	testRunsc      = "runsc"
	testSentry     = "sentry"
	testRootfsInfo = `{"digest":"sha256:aa"}`
)

// testManifest records the runtime above, with the sentry or without helpers.
func testManifest(withHelpers bool) *manifest.Manifest {
	m := &manifest.Manifest{Runsc: manifest.Runsc{SHA256: filedigest.OfBytes([]byte(testRunsc))}, Rootfs: manifest.Rootfs{Digest: "sha256:aa"}}
	if withHelpers {
		m.Runsc.Helpers = map[string]string{runsc.Sentry: filedigest.OfBytes([]byte(testSentry))}
	}
	return m
}

// TestPullRuntimePrivateDir: a runtime directory others can enter, another user's, or a
// symbolic link to one is refused with launch.ErrNotPrivate before its record is read or a
// layer fetched, and left as it was; one made by the pull is 0700.
func TestPullRuntimePrivateDir(t *testing.T) {
	img, _ := runtimeImage(t, tarOf(t, map[string]string{RuntimeRoot + "/runsc": testRunsc}), tarOf(t, map[string]string{RuntimeRoot + "/rootfs/" + manifest.RootfsInfoFile: testRootfsInfo}))
	for name, prepare := range map[string]func(t *testing.T, dir string) string{
		"mode 0755": func(t *testing.T, dir string) string { os.Chmod(dir, 0o755); return dir },
		"uid 1000":  func(t *testing.T, dir string) string { os.Chown(dir, 1000, 1000); return dir },
		"a symbolic link": func(t *testing.T, dir string) string {
			link := filepath.Join(t.TempDir(), "link")
			if err := os.Symlink(dir, link); err != nil {
				t.Fatal(err)
			}
			return link
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := privateDir(t)
			arg := prepare(t, dir)
			before := testenv.ListTree(t, dir)
			var fetched []string
			err := PullRuntime(context.Background(), img, testManifest(false), arg, unpack.DefaultLimits(), quietLog(), func(l verify.Layer) { fetched = append(fetched, l.Digest.String()) })
			if !errors.Is(err, launch.ErrNotPrivate) || !strings.Contains(err.Error(), "0700") {
				t.Errorf("%v, want launch.ErrNotPrivate", err)
			}
			if len(fetched) > 0 {
				t.Errorf("a refused directory had layers fetched: %v", fetched)
			}
			if after := testenv.ListTree(t, dir); after != before {
				t.Errorf("a refused pull changed the directory:\n%s\nthen\n%s", before, after)
			}
		})
	}
	dir := filepath.Join(t.TempDir(), "runtime")
	if err := PullRuntime(context.Background(), img, testManifest(false), dir, unpack.DefaultLimits(), quietLog(), nil); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(dir); err != nil {
		t.Error(err)
	} else if fi.Mode() != fs.ModeDir|0o700 {
		t.Errorf("the runtime directory made is %s, want drwx------", fi.Mode())
	}
}

// TestPullRuntimeRefusesEntries: runtime layers whose entries are not what push writes (a
// symbolic link out of the directory where a directory or a file should be, a FIFO, a runsc
// with another name, a rootfs record too large to be one) are refused before anything is
// renamed, whatever those links point at (here: the runtime the manifest records), and so is
// a manifest that records no runsc sha256; the runtime directory and what the links point at
// are left as they were. No check blocks on a FIFO.
func TestPullRuntimeRefusesEntries(t *testing.T) {
	outside := t.TempDir()
	for path, data := range map[string]string{"runsc": testRunsc, "gvisor-bin/" + runsc.Sentry: testSentry, "rootfs/" + manifest.RootfsInfoFile: testRootfsInfo} {
		os.MkdirAll(filepath.Dir(filepath.Join(outside, path)), 0o755)
		if err := os.WriteFile(filepath.Join(outside, path), []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	file := func(name, data string) tarEntry {
		return tarEntry{tar.Header{Typeflag: tar.TypeReg, Name: RuntimeRoot + "/" + name, Mode: 0o755, Size: int64(len(data))}, data}
	}
	link := func(name, target string) tarEntry {
		return tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: RuntimeRoot + "/" + name, Linkname: target}}
	}
	fifo := func(name string) tarEntry {
		return tarEntry{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: RuntimeRoot + "/" + name, Mode: 0o644}}
	}
	runscOK := []tarEntry{file("runsc", testRunsc)}
	rootfsOK := []tarEntry{file("rootfs/"+manifest.RootfsInfoFile, testRootfsInfo)}
	for name, tc := range map[string]struct {
		runsc, rootfs []tarEntry
		helpers       bool
		m             func(m *manifest.Manifest)
		want          error
	}{
		"readie-runtime a symbolic link out": {
			runsc:  []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: RuntimeRoot, Linkname: outside}}},
			rootfs: []tarEntry{{tar.Header{Typeflag: tar.TypeReg, Name: "other", Mode: 0o644, Size: 1}, "x"}},
			want:   launch.ErrRuntimeDir,
		},
		"runsc a symbolic link out": {runsc: []tarEntry{link("runsc", filepath.Join(outside, "runsc"))}, rootfs: rootfsOK, want: limitread.ErrNotRegular},
		"runsc a FIFO":              {runsc: []tarEntry{fifo("runsc")}, rootfs: rootfsOK, want: limitread.ErrNotRegular},
		"runsc a hard link": {
			runsc:  []tarEntry{file("rootfs/usr/bin/env", testRunsc), {hdr: tar.Header{Typeflag: tar.TypeLink, Name: RuntimeRoot + "/runsc", Linkname: RuntimeRoot + "/rootfs/usr/bin/env"}}},
			rootfs: rootfsOK, want: launch.ErrRuntimeDir,
		},
		"gvisor-bin a symbolic link out": {runsc: append([]tarEntry{link("gvisor-bin", filepath.Join(outside, "gvisor-bin"))}, runscOK...), rootfs: rootfsOK, helpers: true, want: launch.ErrRuntimeDir},
		"the sentry a symbolic link out": {runsc: append([]tarEntry{link("gvisor-bin/"+runsc.Sentry, filepath.Join(outside, "gvisor-bin", runsc.Sentry))}, runscOK...), rootfs: rootfsOK, helpers: true, want: limitread.ErrNotRegular},
		"rootfs a symbolic link out":     {runsc: runscOK, rootfs: []tarEntry{link("rootfs", filepath.Join(outside, "rootfs"))}, want: launch.ErrRuntimeDir},
		"the rootfs record a symbolic link out": {
			runsc: runscOK, rootfs: []tarEntry{link("rootfs/"+manifest.RootfsInfoFile, filepath.Join(outside, "rootfs", manifest.RootfsInfoFile))}, want: limitread.ErrNotRegular,
		},
		"the rootfs record a FIFO":          {runsc: runscOK, rootfs: []tarEntry{fifo("rootfs/" + manifest.RootfsInfoFile)}, want: limitread.ErrNotRegular},
		"the rootfs record of 64 KiB":       {runsc: runscOK, rootfs: []tarEntry{file("rootfs/"+manifest.RootfsInfoFile, testRootfsInfo+strings.Repeat(" ", 64<<10))}, want: limitread.ErrTooLarge},
		"a manifest without runsc's sha256": {runsc: runscOK, rootfs: rootfsOK, m: func(m *manifest.Manifest) { m.Runsc.SHA256 = "" }, want: manifest.ErrRuntime},
	} {
		t.Run(name, func(t *testing.T) {
			img, _ := runtimeImage(t, tarOfEntries(t, tc.runsc), tarOfEntries(t, tc.rootfs))
			m := testManifest(tc.helpers)
			if tc.m != nil {
				tc.m(m)
			}
			dir := privateDir(t)
			before, beforeOutside := testenv.ListTree(t, dir), testenv.ListTree(t, outside)
			err := PullRuntime(context.Background(), img, m, dir, unpack.DefaultLimits(), quietLog(), nil)
			if !errors.Is(err, tc.want) {
				t.Errorf("%v, want %v", err, tc.want)
			}
			if after := testenv.ListTree(t, dir); after != before {
				t.Errorf("a refused pull changed the runtime directory:\n%s\nthen\n%s", before, after)
			}
			if after := testenv.ListTree(t, outside); after != beforeOutside {
				t.Errorf("a refused pull changed what its links point at:\n%s\nthen\n%s", beforeOutside, after)
			}
		})
	}
}

// TestPullRuntimeFetchesOnce: a pull lays out the runtime (the helpers of a runsc captured
// with them, none of one without), runsc and its helpers this user's and 0755 whatever the
// layer said (here setuid, another user's); a second pull fetches no layer; a pull that died
// before it put runsc in place (the record written, runsc missing), or a runtime directory
// whose gvisor-bin was removed, is finished by the next, which fetches the runsc layer alone.
func TestPullRuntimeFetchesOnce(t *testing.T) {
	for _, withHelpers := range []bool{true, false} {
		t.Run(fmt.Sprintf("helpers %v", withHelpers), func(t *testing.T) {
			// Another user's, setuid, writable by anyone: pull makes them root's and 0755.
			exe := func(name, data string) tarEntry {
				return tarEntry{tar.Header{Typeflag: tar.TypeReg, Name: RuntimeRoot + "/" + name, Mode: 0o6777, Uid: 1000, Gid: 1000, Size: int64(len(data))}, data}
			}
			runscTar := []tarEntry{exe("runsc", testRunsc)}
			if withHelpers {
				runscTar = append(runscTar, exe("gvisor-bin/"+runsc.Sentry, testSentry))
			}
			m := testManifest(withHelpers)
			img, runscDigest := runtimeImage(t, tarOfEntries(t, runscTar), tarOf(t, map[string]string{RuntimeRoot + "/rootfs/" + manifest.RootfsInfoFile: testRootfsInfo}))

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
			executables := []string{"runsc"}
			if withHelpers {
				executables = append(executables, "gvisor-bin/"+runsc.Sentry)
			}
			for _, name := range executables {
				fi, err := os.Lstat(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				if st := fi.Sys().(*syscall.Stat_t); fi.Mode() != 0o755 || int(st.Uid) != os.Geteuid() {
					t.Errorf("%s laid out %s, uid %d; want -rwxr-xr-x, uid %d", name, fi.Mode(), st.Uid, os.Geteuid())
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "gvisor-bin", runsc.Sentry)); (err == nil) != withHelpers {
				t.Errorf("the sentry laid out: %v, want %v", err, withHelpers)
			}
			if got := pull(); len(got) != 0 {
				t.Errorf("the second pull fetched %v, want nothing", got)
			}
			removed := []string{"runsc"}
			if withHelpers {
				removed = append(removed, "gvisor-bin")
			}
			for _, name := range removed {
				os.RemoveAll(filepath.Join(dir, name))
				if got := pull(); len(got) != 1 || got[0] != runscDigest.String() {
					t.Errorf("a pull after %s was removed fetched %v, want the runsc layer %s", name, got, runscDigest)
				}
			}
			if data, err := os.ReadFile(filepath.Join(dir, "runsc")); string(data) != testRunsc {
				t.Errorf("runsc: %q, %v", data, err)
			}
		})
	}
}

// tarOf returns a tar of the regular files (name: content), each 0755, sorted.
func tarOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var entries []tarEntry
	for _, name := range slices.Sorted(maps.Keys(files)) {
		entries = append(entries, tarEntry{tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(files[name]))}, files[name]})
	}
	return tarOfEntries(t, entries)
}

// tarEntry is one entry of a crafted tar: its header and, for a regular file, its content.
type tarEntry struct {
	hdr  tar.Header
	data string
}

// tarOfEntries returns a tar of the entries, in their order.
func tarOfEntries(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		if err := tw.WriteHeader(&e.hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.data))
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
