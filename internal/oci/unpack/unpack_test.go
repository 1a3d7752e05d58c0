package unpack

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"readie.dev/pipeline/internal/oci/ocitest"
	"readie.dev/pipeline/internal/oci/verify"
	"readie.dev/pipeline/internal/testenv"
)

// entry is one tar entry of a test layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid              int
}

func layerOf(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		hdr := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Linkname: e.link, Uid: e.uid, Gid: e.uid}
		if typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	tw.Close()
	return ocitest.Layer(t, buf.Bytes())
}

func imageOf(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestUnpackWhiteoutsModesLinks(t *testing.T) {
	root := t.TempDir()
	lower := layerOf(t,
		entry{name: "a/", typ: tar.TypeDir},
		entry{name: "a/keep", body: "keep"},
		entry{name: "a/gone", body: "gone"},
		entry{name: "d/", typ: tar.TypeDir},
		entry{name: "d/old", body: "old"},
		entry{name: "d/sub/", typ: tar.TypeDir},
		entry{name: "d/sub/deeper", body: "deeper"},
		entry{name: "bin/tool", body: "#!/bin/sh\n", mode: 0o4755, uid: 1000},
		entry{name: "bin/tool-link", typ: tar.TypeLink, link: "bin/tool"},
		entry{name: "bin/sh-link", typ: tar.TypeSymlink, link: "/bin/tool"},
		entry{name: "dev/null", typ: tar.TypeChar},
	)
	upper := layerOf(t,
		entry{name: "d/before", body: "made before the marker"},
		entry{name: "a/.wh.gone"},
		entry{name: "d/.wh..wh..opq"},
		entry{name: "d/after", body: "made after the marker"},
	)
	if _, err := Into(context.Background(), imageOf(t, lower, upper), root, DefaultLimits(), nil); err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool { _, err := os.Lstat(filepath.Join(root, p)); return err == nil }
	for p, want := range map[string]bool{
		"a/keep": true, "a/gone": false, "d/old": false, "d/sub": false, "d/before": true, "d/after": true, "dev/null": false,
	} {
		if exists(p) != want {
			t.Errorf("%s exists = %v, want %v", p, !want, want)
		}
	}
	tool, _ := os.Stat(filepath.Join(root, "bin/tool"))
	link, _ := os.Stat(filepath.Join(root, "bin/tool-link"))
	if tool == nil || tool.Mode()&os.ModeSetuid == 0 || tool.Mode().Perm() != 0o755 || !os.SameFile(tool, link) {
		t.Errorf("bin/tool: %v; a hard link to it: %v", tool, link)
	}
	if uid := tool.Sys().(*syscallStat).Uid; uid != 1000 {
		t.Errorf("bin/tool owner %d, want 1000", uid)
	}
	if target, err := os.Readlink(filepath.Join(root, "bin/sh-link")); err != nil || target != "/bin/tool" {
		t.Errorf("symlink: %q %v", target, err)
	}
}

// TestUnpackRefusesHostileLayers: each entry that would land outside the root is refused with
// an error naming it, and nothing is written outside the root.
func TestUnpackRefusesHostileLayers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []entry
		want    string
	}{
		{"path traversal", []entry{{name: "../escaped", body: "x"}}, `"../escaped"`},
		{"deeper traversal", []entry{{name: "a/../../escaped", body: "x"}}, `"a/../../escaped"`},
		{"absolute name", []entry{{name: "/escaped", body: "x"}}, `"/escaped"`},
		{"write through a symlink", []entry{{name: "out", typ: tar.TypeSymlink, link: "OUTSIDE"}, {name: "out/escaped", body: "x"}}, `"out/escaped": it would be written through the symlink`},
		// The directories the applier knows of must be forgotten when one is replaced.
		{"write through a directory replaced by a symlink", []entry{{name: "d/", typ: tar.TypeDir}, {name: "d/a", body: "x"},
			{name: "d", typ: tar.TypeSymlink, link: "OUTSIDE"}, {name: "d/escaped", body: "x"}}, `"d/escaped": it would be written through the symlink /d`},
		{"write through a parent made implicitly, then replaced by a symlink", []entry{{name: "a/b/f", body: "x"},
			{name: "a", typ: tar.TypeSymlink, link: "OUTSIDE"}, {name: "a/b/escaped", body: "x"}}, `"a/b/escaped": it would be written through the symlink /a`},
		{"write through a directory whited out, then a symlink", []entry{{name: "w/x", body: "x"}, {name: ".wh.w"},
			{name: "w", typ: tar.TypeSymlink, link: "OUTSIDE"}, {name: "w/escaped", body: "x"}}, `"w/escaped": it would be written through the symlink /w`},
		{"write into a directory replaced by a file", []entry{{name: "f/", typ: tar.TypeDir}, {name: "f/a", body: "x"},
			{name: "f", body: "x"}, {name: "f/b", body: "x"}}, `"f/b": /f is not a directory`},
		{"whiteout of ..", []entry{{name: "etc/.wh..."}}, `a whiteout of ".."`},
		{"hard link to outside", []entry{{name: "h", typ: tar.TypeLink, link: "../OUTSIDE/secret"}}, `"h"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			root, outside := filepath.Join(dir, "root"), filepath.Join(dir, "outside")
			os.MkdirAll(root, 0o755)
			os.MkdirAll(outside, 0o755)
			os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600)
			for i := range tc.entries {
				tc.entries[i].link = strings.ReplaceAll(tc.entries[i].link, "OUTSIDE", outside)
				if tc.entries[i].typ == tar.TypeLink {
					tc.entries[i].link = strings.ReplaceAll(tc.entries[i].link, outside, "../outside")
				}
			}
			_, err := Into(context.Background(), imageOf(t, layerOf(t, tc.entries...)), root, DefaultLimits(), nil)
			if !errors.Is(err, ErrLayer) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrLayer naming %s", err, tc.want)
			}
			entries, _ := os.ReadDir(outside)
			if len(entries) != 1 {
				t.Errorf("something was written outside the root: %v", entries)
			}
			if _, err := os.Stat(filepath.Join(dir, "escaped")); err == nil {
				t.Error("an entry escaped the root")
			}
		})
	}
}

// TestUnpackOnceConcurrently: runs that unpack the same image at once all end with the one
// complete directory; a later call unpacks nothing.
func TestUnpackOnceConcurrently(t *testing.T) {
	cache := t.TempDir()
	img := imageOf(t, layerOf(t, entry{name: "etc/", typ: tar.TypeDir}, entry{name: "etc/os-release", body: "ID=test\n"}))
	var wg sync.WaitGroup
	dirs := make([]string, 6)
	errs := make([]error, 6)
	for i := range dirs {
		wg.Go(func() {
			u, err := IntoCache(context.Background(), img, cache, DefaultLimits(), logrus.New(), nil)
			if err == nil {
				dirs[i] = u.Dir
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != dirs[0] {
			t.Fatalf("unpack %d: %s %v (first: %s)", i, dirs[i], errs[i], dirs[0])
		}
	}
	if data, err := os.ReadFile(filepath.Join(dirs[0], "etc/os-release")); err != nil || string(data) != "ID=test\n" {
		t.Fatalf("%q %v", data, err)
	}
	if names := dirNames(t, filepath.Join(cache, "rootfs", "oci")); len(names) != 1 {
		t.Errorf("left in the cache: %v", names)
	}
	if u, err := IntoCache(context.Background(), img, cache, DefaultLimits(), logrus.New(), nil); err != nil || u.Made {
		t.Errorf("a second unpack: %+v, %v", u, err)
	}
}

// dirNames lists the entries of dir that are not hidden (lock files are).
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") || strings.HasPrefix(e.Name(), ".tmp-") {
			names = append(names, e.Name())
		}
	}
	return names
}

// TestOpaqueWhiteoutHidesNestedLowerEntries: an opaque whiteout hides every lower entry of its
// directory, nested ones included, even under a directory the same layer also lists; the
// layer's own entries stay, before or after the marker, listed or implied.
func TestOpaqueWhiteoutHidesNestedLowerEntries(t *testing.T) {
	lower := []entry{
		{name: "d/", typ: tar.TypeDir}, {name: "d/sub/", typ: tar.TypeDir}, {name: "d/sub/old", body: "old"},
		{name: "d/sub/deeper/", typ: tar.TypeDir}, {name: "d/sub/deeper/older", body: "older"}, {name: "d/other", body: "other"},
	}
	for _, tc := range []struct {
		name  string
		upper []entry
	}{
		{"issue 16: the directory listed, the marker last", []entry{{name: "d/sub/", typ: tar.TypeDir}, {name: "d/sub/new", body: "new"}, {name: "d/.wh..wh..opq"}}},
		{"the marker first", []entry{{name: "d/.wh..wh..opq"}, {name: "d/sub/", typ: tar.TypeDir}, {name: "d/sub/new", body: "new"}}},
		{"the directory only implied", []entry{{name: "d/sub/new", body: "new"}, {name: "d/.wh..wh..opq"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if _, err := Into(context.Background(), imageOf(t, layerOf(t, lower...), layerOf(t, tc.upper...)), root, DefaultLimits(), nil); err != nil {
				t.Fatal(err)
			}
			for p, want := range map[string]bool{"d/sub/new": true, "d/sub/old": false, "d/sub/deeper": false, "d/other": false} {
				if _, err := os.Lstat(filepath.Join(root, p)); (err == nil) != want {
					t.Errorf("%s exists = %v, want %v", p, err == nil, want)
				}
			}
		})
	}
}

// TestWhiteoutOfADirectoryTheLayerAlsoLists: .wh.sub hides the lower layers' sub, also when
// the same layer lists sub's new entries (before or after the whiteout): only they remain.
func TestWhiteoutOfADirectoryTheLayerAlsoLists(t *testing.T) {
	lower := []entry{{name: "d/", typ: tar.TypeDir}, {name: "d/sub/", typ: tar.TypeDir}, {name: "d/sub/old", body: "old"}, {name: "d/other", body: "other"}}
	for _, upper := range [][]entry{
		{{name: "d/sub/new", body: "new"}, {name: "d/.wh.sub"}},
		{{name: "d/.wh.sub"}, {name: "d/sub/", typ: tar.TypeDir}, {name: "d/sub/new", body: "new"}},
	} {
		root := t.TempDir()
		if _, err := Into(context.Background(), imageOf(t, layerOf(t, lower...), layerOf(t, upper...)), root, DefaultLimits(), nil); err != nil {
			t.Fatal(err)
		}
		for p, want := range map[string]bool{"d/sub/new": true, "d/sub/old": false, "d/other": true} {
			if _, err := os.Lstat(filepath.Join(root, p)); (err == nil) != want {
				t.Errorf("upper %v: %s exists = %v, want %v", upper, p, err == nil, want)
			}
		}
	}
}

// rawHeader is a ustar header block, written by hand: archive/tar writes no GNU sparse records.
func rawHeader(name string, typ byte, size int64) []byte {
	b := make([]byte, 512)
	copy(b[0:], name)
	copy(b[100:], "0000644\x00")
	copy(b[108:], "0000000\x00")
	copy(b[116:], "0000000\x00")
	copy(b[124:], fmt.Sprintf("%011o\x00", size))
	copy(b[136:], "00000000000\x00")
	b[156] = typ
	copy(b[257:], "ustar\x0000")
	copy(b[148:], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

func paxRecord(k, v string) string {
	rest := " " + k + "=" + v + "\n"
	for n := len(rest); ; {
		s := fmt.Sprintf("%d%s", n, rest)
		if len(s) == n {
			return s
		}
		n = len(s)
	}
}

func padBlock(b []byte) []byte {
	if r := len(b) % 512; r != 0 {
		b = append(b, make([]byte, 512-r)...)
	}
	return b
}

// sparseLayer is a layer of a few KiB whose one entry (PAX sparse 1.0, all hole) expands to
// size bytes of zeros.
func sparseLayer(t *testing.T, size int64) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	records := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", "big") + paxRecord("GNU.sparse.realsize", strconv.FormatInt(size, 10))
	buf.Write(rawHeader("PaxHeaders/big", tar.TypeXHeader, int64(len(records))))
	buf.Write(padBlock([]byte(records)))
	buf.Write(rawHeader("GNUSparseFile.0/big", tar.TypeReg, 512))
	buf.Write(padBlock([]byte("0\n")))
	buf.Write(make([]byte, 1024))
	data := buf.Bytes()
	if hdr, err := tar.NewReader(bytes.NewReader(data)).Next(); err != nil || hdr.Size != size {
		t.Fatalf("the sparse layer reads as %+v, %v", hdr, err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// declaredLayer is a gzipped layer of an entry per name, of type typ, whose size bytes of data
// are all zeros: a few KiB compressed. archive/tar reads through the data of a type it does
// not know.
func declaredLayer(t *testing.T, typ byte, size int64, names ...string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	for _, name := range names {
		buf.Write(rawHeader(name, typ, size))
		buf.Write(padBlock(make([]byte, size)))
	}
	buf.Write(make([]byte, 1024))
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	if n, err := l.Size(); err != nil || n > 64<<10 {
		t.Fatalf("the layer is %d bytes compressed (%v), want a small one", n, err)
	}
	return l
}

// TestLimitsRefuseBeforeWriting: a sparse entry of 2 GiB in a 3 KiB layer, entries of types
// archive/tar does not know declaring more data than the limits (a GNU volume header, a
// multi-volume continuation), too many entries, too many bytes: each refused naming the entry
// and the limit's key, before its bytes are written or read, and nothing in the cache is
// complete.
func TestLimitsRefuseBeforeWriting(t *testing.T) {
	small := Limits{Bytes: 1 << 20, Entries: 5, FileBytes: 1 << 20}
	many, big := make([]entry, 6), make([]entry, 3)
	for i := range many {
		many[i] = entry{name: fmt.Sprintf("f%d", i), body: "x"}
	}
	for i := range big {
		big[i] = entry{name: fmt.Sprintf("big%d", i), body: strings.Repeat("x", 600<<10)}
	}
	for _, tc := range []struct {
		name  string
		layer v1.Layer
		want  string
	}{
		{"sparse", sparseLayer(t, 2<<30), `entry "big": 2 GiB exceeds the limit on one file, 1 MiB (limits.image_file_bytes)`},
		{"volume header", declaredLayer(t, 'V', 4<<20, "vol"), `entry "vol": 4 MiB exceeds the limit on one file, 1 MiB (limits.image_file_bytes)`},
		{"continuation", declaredLayer(t, 'M', 3<<20, "cont"), `entry "cont": 3 MiB exceeds the limit on one file, 1 MiB (limits.image_file_bytes)`},
		{"non-regular total", declaredLayer(t, 'V', 600<<10, "v1", "v2"), `entry "v2": the files come to more than 1 MiB (limits.image_bytes)`},
		{"entries", layerOf(t, many...), `entry "f5": more than 5 entries (limits.image_entries)`},
		{"bytes", layerOf(t, big...), `entry "big1": the files come to more than 1 MiB (limits.image_bytes)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := t.TempDir()
			_, err := IntoCache(context.Background(), imageOf(t, tc.layer), cache, small, logrus.New(), nil)
			if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrLimit saying %s", err, tc.want)
			}
			if names := dirNames(t, filepath.Join(cache, "rootfs", "oci")); len(names) != 0 {
				t.Errorf("left in the cache: %v", names)
			}
		})
	}
}

// lockAsAnotherRun holds the unpack lock of img in cache the way another run's process would
// (flock is per open file) until release is called.
func lockAsAnotherRun(t *testing.T, img v1.Image, cache string) (hex string, release func()) {
	t.Helper()
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	hex = fmt.Sprintf("%x", sum)
	parent := filepath.Join(cache, "rootfs", "oci")
	os.MkdirAll(parent, 0o755)
	f, err := os.OpenFile(filepath.Join(parent, "."+hex+".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	return hex, func() { f.Close() }
}

// TestUnpackOnceLivenessByLock: a run that holds the lock is alive whatever its pid (another
// pid namespace, another machine): its work directory stays, and a second run waits for it,
// bounded by its context. Once the lock is free, what that run left is a dead run's leftover:
// removed, logged, and the image unpacked.
func TestUnpackOnceLivenessByLock(t *testing.T) {
	cache := t.TempDir()
	img := imageOf(t, layerOf(t, entry{name: "etc/os-release", body: "ID=test\n"}))
	hex, release := lockAsAnotherRun(t, img, cache)
	work := filepath.Join(cache, "rootfs", "oci", ".tmp-"+hex+"-alive")
	os.MkdirAll(filepath.Join(work, "rootfs", "etc"), 0o755)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	log, hook := logtest.NewNullLogger()
	_, err := IntoCache(ctx, img, cache, DefaultLimits(), log, nil)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for another run") {
		t.Fatalf("with the lock held elsewhere: %v, want a bounded wait", err)
	}
	if _, err := os.Stat(work); err != nil {
		t.Fatalf("the live run's work directory was touched: %v", err)
	}

	release() // the holder dies: the kernel drops its flock
	u, err := IntoCache(context.Background(), img, cache, DefaultLimits(), log, nil)
	if err != nil || !u.Made {
		t.Fatalf("after the holder died: %+v %v", u, err)
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("the dead run's work directory is still there: %v", err)
	}
	var said bool
	for _, e := range hook.AllEntries() {
		said = said || e.Message == "removed what a run that died left" && e.Data["dir"] == work
	}
	if !said {
		t.Errorf("the removal was not logged: %v", hook.AllEntries())
	}
}

// blockingImage is an image whose layer of digest block never gives a byte.
type blockingImage struct {
	v1.Image
	block v1.Hash
}

type blockingLayer struct{ v1.Layer }

func (l blockingLayer) Compressed() (io.ReadCloser, error) {
	r, _ := io.Pipe() // no one writes
	return r, nil
}

func (i blockingImage) LayerByDigest(h v1.Hash) (v1.Layer, error) {
	l, err := i.Image.LayerByDigest(h)
	if h == i.block {
		return blockingLayer{l}, err
	}
	return l, err
}

// TestHelperUnpackOnce is the process TestUnpackOnceAfterSIGKILL kills: it unpacks the image
// of READIE_TEST_UNPACK_LAYOUT into READIE_TEST_UNPACK_CACHE, blocking in its last layer.
// Without them it does nothing.
func TestHelperUnpackOnce(t *testing.T) {
	dir, cache := os.Getenv("READIE_TEST_UNPACK_LAYOUT"), os.Getenv("READIE_TEST_UNPACK_CACHE")
	if dir == "" {
		return
	}
	img, _ := ocitest.FirstImage(t, dir)
	m, _ := img.Manifest()
	_, err := IntoCache(context.Background(), blockingImage{img, m.Layers[len(m.Layers)-1].Digest}, cache, DefaultLimits(), logrus.New(), nil)
	t.Fatalf("the unpack returned: %v", err)
}

// TestUnpackOnceAfterSIGKILL: a run in another pid namespace (its pid means nothing here),
// killed with SIGKILL in the middle of an unpack, leaves its work directory; the next run
// knows it for a dead run's by the lock alone, removes it, says so, and unpacks.
func TestUnpackOnceAfterSIGKILL(t *testing.T) {
	cache := t.TempDir()
	dir := filepath.Join(t.TempDir(), "layout")
	img := imageOf(t, layerOf(t, entry{name: "etc/first", body: "first layer\n"}), layerOf(t, entry{name: "etc/second", body: "second\n"}))
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	cmd := testenv.Command(t, 5*time.Minute, "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", os.Args[0], "-test.run=^TestHelperUnpackOnce$")
	cmd.Env = append(os.Environ(), "READIE_TEST_UNPACK_LAYOUT="+dir, "READIE_TEST_UNPACK_CACHE="+cache)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	raw, _ := img.RawManifest()
	hex := fmt.Sprintf("%x", sha256.Sum256(raw))
	pattern := filepath.Join(cache, "rootfs", "oci", ".tmp-"+hex+"-*", "rootfs", "etc", "first")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if found, _ := filepath.Glob(pattern); len(found) == 1 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the run did not unpack its first layer within 2 minutes:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Kill() // unshare, which kills its child with it
	cmd.Wait()

	log, hook := logtest.NewNullLogger()
	from, _ := p.Image(mustDigest(t, img))
	u, err := IntoCache(context.Background(), from, cache, DefaultLimits(), log, nil)
	if err != nil || !u.Made {
		t.Fatalf("after the kill: %+v %v\n%s", u, err, out.String())
	}
	if left, _ := filepath.Glob(filepath.Join(cache, "rootfs", "oci", ".tmp-*")); len(left) != 0 {
		t.Errorf("left: %v", left)
	}
	if len(hook.AllEntries()) != 1 || hook.LastEntry().Message != "removed what a run that died left" {
		t.Errorf("logged %v", hook.AllEntries())
	}
	if data, err := os.ReadFile(filepath.Join(u.Dir, "etc", "second")); err != nil || string(data) != "second\n" {
		t.Errorf("etc/second: %q %v", data, err)
	}
}

// TestOnceKeepsWhatItCannotJudge: when complete cannot tell (an I/O error, here a record that
// is a directory), Once stops with the error and removes nothing: another run may be using it.
func TestOnceKeepsWhatItCannotJudge(t *testing.T) {
	parent := t.TempDir()
	final := filepath.Join(parent, "x")
	if err := os.MkdirAll(filepath.Join(final, "record"), 0o755); err != nil {
		t.Fatal(err)
	}
	complete := func(dir string) (bool, error) {
		_, err := os.ReadFile(filepath.Join(dir, "record"))
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return err == nil, err
	}
	built := false
	_, _, err := Once(context.Background(), parent, "x", complete, func(string) error { built = true; return nil }, logrus.New())
	if !errors.Is(err, syscall.EISDIR) || built {
		t.Fatalf("Once = %v (built: %v), want the read error and no build", err, built)
	}
	if _, err := os.Stat(filepath.Join(final, "record")); err != nil {
		t.Fatalf("Once removed what it could not judge: %v", err)
	}
}

// TestOnceReplacesAStrayFile: a file where an unpacked image's directory belongs (its record
// then reads ENOTDIR) is a leftover that IntoCache removes and unpacks over, not an error
// that stops every run.
func TestOnceReplacesAStrayFile(t *testing.T) {
	cache := t.TempDir()
	img := imageOf(t, layerOf(t, entry{name: "etc/", typ: tar.TypeDir}, entry{name: "etc/os-release", body: "ID=test\n"}))
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(cache, "rootfs", "oci", verify.Sum(raw).Hex)
	os.MkdirAll(filepath.Dir(stray), 0o755)
	if err := os.WriteFile(stray, []byte("stray"), 0o644); err != nil {
		t.Fatal(err)
	}
	u, err := IntoCache(context.Background(), img, cache, DefaultLimits(), logrus.New(), nil)
	if err != nil || !u.Made || u.Dir != filepath.Join(stray, "rootfs") {
		t.Fatalf("IntoCache over a stray file: %+v, %v", u, err)
	}
	if data, err := os.ReadFile(filepath.Join(u.Dir, "etc/os-release")); err != nil || string(data) != "ID=test\n" {
		t.Fatalf("%q %v", data, err)
	}
}

// TestRemoveDead: the work directories of a name that no one is making (a run died making it,
// and no run makes that name again) are removed; those of a name a run is making now stay, and
// so do those with no lock to judge them by. Remove takes a made directory out under its
// name's lock, and leaves one a run is making.
func TestRemoveDead(t *testing.T) {
	parent := t.TempDir()
	dead := filepath.Join(parent, ".tmp-aaaa-1")
	os.MkdirAll(filepath.Join(dead, "rootfs"), 0o755)
	os.WriteFile(filepath.Join(parent, ".aaaa.lock"), nil, 0o644)
	unjudged := filepath.Join(parent, ".tmp-zzzz-1")
	os.MkdirAll(unjudged, 0o755)

	// A run making bbbb now: its build waits until the test lets it go on.
	building, proceed := make(chan string), make(chan struct{})
	done := make(chan error, 1)
	complete := func(dir string) (bool, error) {
		_, err := os.Stat(filepath.Join(dir, "done"))
		return err == nil, nil
	}
	go func() {
		_, _, err := Once(context.Background(), parent, "bbbb", complete, func(tmp string) error {
			building <- tmp
			<-proceed
			return os.WriteFile(filepath.Join(tmp, "done"), nil, 0o644)
		}, logrus.New())
		done <- err
	}()
	live := <-building

	removed, err := RemoveDead(parent)
	if err != nil || len(removed) != 1 || removed[0] != dead {
		t.Fatalf("RemoveDead = %v, %v; want only %s", removed, err, dead)
	}
	for _, kept := range []string{live, unjudged} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("%s was removed: %v", kept, err)
		}
	}
	if gone, err := Remove(filepath.Join(parent, "bbbb")); gone || err != nil {
		t.Errorf("Remove of a directory being made = %v, %v; want it left", gone, err)
	}
	close(proceed)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if gone, err := Remove(filepath.Join(parent, "bbbb")); !gone || err != nil {
		t.Fatalf("Remove = %v, %v", gone, err)
	}
	if names := dirNames(t, parent); strings.Join(names, ",") != ".tmp-zzzz-1" {
		t.Errorf("left %v", names)
	}
}

// TestUnpackOnceRecordsItsUse: an image found unpacked has its last use recorded (LastUse),
// which `cache prune-rootfs --older-than` goes by.
func TestUnpackOnceRecordsItsUse(t *testing.T) {
	cache := t.TempDir()
	img := imageOf(t, layerOf(t, entry{name: "etc/os-release", body: "ID=test\n"}))
	u, err := IntoCache(context.Background(), img, cache, DefaultLimits(), logrus.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(u.Dir)
	long := time.Now().Add(-72 * time.Hour)
	if err := os.Chtimes(filepath.Join(dir, recordName), long, long); err != nil {
		t.Fatal(err)
	}
	if used, ok := LastUse(dir); !ok || !used.Equal(long) {
		t.Fatalf("LastUse = %v, %v; want %v", used, ok, long)
	}
	if _, err := IntoCache(context.Background(), img, cache, DefaultLimits(), logrus.New(), nil); err != nil {
		t.Fatal(err)
	}
	if used, ok := LastUse(dir); !ok || !used.After(long) {
		t.Errorf("after a reuse LastUse = %v, %v; want later than %v", used, ok, long)
	}
	if _, ok := LastUse(t.TempDir()); ok {
		t.Error("LastUse of a directory with no record says it is an unpacked image")
	}
}

// TestRemoveDeadFollowsNoLockSymlink: the rootfs cache is shared with strangers; one who plants
// .NAME.lock as a symlink (and a .tmp-NAME-* directory, so that the sweep judges NAME) must not
// have a run's sweep create or open the file it points to, as root, outside the cache.
func TestRemoveDeadFollowsNoLockSymlink(t *testing.T) {
	parent, outside := t.TempDir(), t.TempDir()
	target := filepath.Join(outside, "planted")
	if err := os.Symlink(target, filepath.Join(parent, ".x.lock")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(parent, ".tmp-x-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	removed, err := RemoveDead(parent)
	if _, statErr := os.Lstat(target); !errors.Is(statErr, fs.ErrNotExist) {
		t.Fatalf("RemoveDead followed the planted lock symlink: %s exists (%v)", target, statErr)
	}
	if len(removed) != 0 || err == nil || !strings.Contains(err.Error(), ".x.lock") {
		t.Errorf("RemoveDead = %v, %v; want nothing removed and an error naming the lock", removed, err)
	}
	if _, _, err := Once(context.Background(), parent, "x", func(string) (bool, error) { return false, nil },
		func(string) error { return nil }, logrus.New()); err == nil {
		t.Error("Once took a symlinked lock")
	}
	if _, statErr := os.Lstat(target); !errors.Is(statErr, fs.ErrNotExist) {
		t.Fatalf("Once followed the planted lock symlink: %s exists (%v)", target, statErr)
	}
}

// TestRemoveDeadJudgesEachNameByItsOwnLock: the work directories of a name that another name
// starts with (a-b, beside a) are a-b's, judged by a-b's lock: a sweep that finds a's lock free
// must leave the work directory of a run making a-b now.
func TestRemoveDeadJudgesEachNameByItsOwnLock(t *testing.T) {
	parent := t.TempDir()
	dead := filepath.Join(parent, ".tmp-a-1")
	if err := os.Mkdir(dead, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(parent, ".a.lock"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	building, proceed, done := make(chan string), make(chan struct{}), make(chan error, 1)
	go func() {
		_, _, err := Once(context.Background(), parent, "a-b", func(string) (bool, error) { return false, nil }, func(tmp string) error {
			building <- tmp
			<-proceed
			return nil
		}, logrus.New())
		done <- err
	}()
	live := <-building
	removed, err := RemoveDead(parent)
	close(proceed)
	if err := <-done; err != nil {
		t.Fatalf("the run making a-b: %v", err)
	}
	if err != nil || len(removed) != 1 || removed[0] != dead {
		t.Fatalf("RemoveDead = %v, %v; want only %s (a-b's %s is being made)", removed, err, dead, live)
	}
}
