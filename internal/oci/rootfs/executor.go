package rootfs

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	pipeline "readie.dev/pipeline"
)

// TestingDir is where the executor layer puts the test-only module (on no path unless
// PYTHONPATH names it).
const TestingDir = "usr/lib/readie/testing"

// epoch is every entry's time in the pipeline's layers: the same files give the same bytes,
// and the precompiled bytecode records it as its source's time.
var epoch = time.Unix(0, 0).UTC()

// layerFile is one entry of a layer the pipeline writes: a file (0644, root's) or a symlink.
type layerFile struct {
	name, link string
	data       []byte
}

// ExecutorLayer returns the pipeline's own layer as a tar, for an image whose python3 looks in
// sitePackages: readie_executor there, the test-only module, the resolver files
// (/etc/resolv.conf a link into the sandbox's /tmp, since the root is read-only;
// /etc/readie-resolv.conf the resolvers the executor writes there; /etc/hosts). Entries are
// sorted, root's, 0644, at time 0, with no directory entries (the image's directories keep
// their modes): the same files give the same bytes.
func ExecutorLayer(sitePackages string) ([]byte, error) {
	site := strings.Trim(path.Clean("/"+sitePackages), "/")
	files := pipeline.ExecutorFiles()
	var entries []layerFile
	add := func(pattern, dest string) error {
		names, err := fs.Glob(files, pattern)
		if err != nil || len(names) == 0 {
			return fmt.Errorf("executor files %s: %v", pattern, err)
		}
		for _, name := range names {
			data, err := fs.ReadFile(files, name)
			if err != nil {
				return err
			}
			entries = append(entries, layerFile{name: path.Join(dest, path.Base(name)), data: data})
		}
		return nil
	}
	if err := add("readie_executor/*.py", path.Join(site, "readie_executor")); err != nil {
		return nil, err
	}
	if err := add("testing/*.py", TestingDir); err != nil {
		return nil, err
	}
	entries = append(entries,
		layerFile{name: "etc/resolv.conf", link: "../tmp/resolv.conf"},
		layerFile{name: "etc/readie-resolv.conf", data: []byte("nameserver 1.1.1.1\nnameserver 8.8.8.8\noptions edns0\n")},
		layerFile{name: "etc/hosts", data: []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\treadie\n")},
	)
	return tarOf(entries)
}

// executorModules returns the names of readie_executor's modules (what its bytecode may be of).
func executorModules() []string {
	names, _ := fs.Glob(pipeline.ExecutorFiles(), "readie_executor/*.py")
	var modules []string
	for _, name := range names {
		modules = append(modules, strings.TrimSuffix(path.Base(name), ".py"))
	}
	return modules
}

// tarOf writes entries as a deterministic tar: sorted, root's, 0644 (links 0777), time 0.
func tarOf(entries []layerFile) ([]byte, error) {
	slices.SortFunc(entries, func(a, b layerFile) int { return strings.Compare(a.name, b.name) })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch, Format: tar.FormatPAX}
		if e.link != "" {
			hdr = &tar.Header{Typeflag: tar.TypeSymlink, Name: e.name, Linkname: e.link, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
