package output

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"readie.dev/pipeline/internal/oci/verify"
)

// epoch is every entry's time in a layer: the same checkpoint gives the same layer digest.
var epoch = time.Unix(0, 0).UTC()

// fileLayer is a layer of files of an output directory, under Root/dir. Its gzip is written
// once, while it is hashed, into a file of a scratch directory, and every read streams that
// file: a push holds no layer in memory, whatever the output's size, and compresses each
// layer once. A read that reaches the end checks the bytes against the digest again.
type fileLayer struct {
	out, dir string
	files    []string
	name     string // for logs: the checkpoint's id, or manifest.json
	blob     string // the gzip, in the scratch directory

	digest, diffID         v1.Hash
	size, uncompressedSize int64
	report                 func(l *fileLayer, done int64, final bool)
	uploaded               atomic.Bool
	reportOnce             sync.Once
}

var _ v1.Layer = (*fileLayer)(nil)

// newFileLayer writes the gzip of the layer of files of out/dir to blob, hashing it and its
// tar on the way.
func newFileLayer(out, dir, name string, files []string, blob string) (*fileLayer, error) {
	l := &fileLayer{out: out, dir: dir, name: name, files: slices.Sorted(slices.Values(files)), blob: blob}
	f, err := os.OpenFile(blob, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	compressed, uncompressed := &hashCounter{h: sha256.New()}, &hashCounter{h: sha256.New()}
	buffered := bufio.NewWriterSize(io.MultiWriter(f, compressed), 1<<16)
	err = l.write(buffered, uncompressed)
	if err == nil {
		err = buffered.Flush()
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return nil, err
	}
	l.digest, l.size = compressed.sum(), compressed.n
	l.diffID, l.uncompressedSize = uncompressed.sum(), uncompressed.n
	return l, nil
}

// write writes the layer's tar into tarCopy (when set) and its gzip into w.
func (l *fileLayer) write(w io.Writer, tarCopy io.Writer) error {
	gz, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return err
	}
	var plain io.Writer = gz
	if tarCopy != nil {
		plain = io.MultiWriter(gz, tarCopy)
	}
	if err := l.writeTar(plain); err != nil {
		return err
	}
	return gz.Close()
}

// writeTar writes the layer's tar: Root/ and Root/dir/, then the files, sorted, with fixed
// times, owners and modes.
func (l *fileLayer) writeTar(w io.Writer) error {
	tw := tar.NewWriter(w)
	dirs := []string{Root}
	if l.dir != "." {
		dirs = append(dirs, filepath.ToSlash(filepath.Join(Root, l.dir)))
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	for _, name := range l.files {
		if err := l.writeFile(tw, name); err != nil {
			return err
		}
	}
	return tw.Close()
}

func (l *fileLayer) writeFile(tw *tar.Writer, name string) error {
	path := filepath.Join(l.out, l.dir, name)
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	// Image files hold process memory: owner-only, as in the store.
	mode := int64(0o644)
	if strings.HasSuffix(name, ".img") {
		mode = 0o600
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: filepath.ToSlash(filepath.Join(Root, l.dir, name)), Mode: mode, Size: fi.Size(), ModTime: epoch, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, fi.Size()); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return types.OCILayer, nil }

// Compressed streams the layer's gzip from its file; a read that reaches the end checks it
// against the digest, and counts as an upload.
func (l *fileLayer) Compressed() (io.ReadCloser, error) {
	f, err := os.Open(l.blob)
	if err != nil {
		return nil, err
	}
	return &layerReader{l: l, f: f, hash: &hashCounter{h: sha256.New()}, next: time.Now().Add(time.Second)}, nil
}

// Uncompressed streams the layer's tar, made again from the output's files.
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(l.writeTar(pw)) }()
	return pr, nil
}

// layerReader is one read of a layer's gzip.
type layerReader struct {
	l      *fileLayer
	f      *os.File
	hash   *hashCounter
	next   time.Time
	failed error
}

func (r *layerReader) Read(p []byte) (int, error) {
	if r.failed != nil {
		return 0, r.failed
	}
	n, err := r.f.Read(p)
	r.hash.Write(p[:n])
	if r.l.report != nil && time.Now().After(r.next) {
		r.next = time.Now().Add(time.Second)
		r.l.report(r.l, r.hash.n, false)
	}
	if err == io.EOF {
		if got := r.hash.sum(); got != r.l.digest || r.hash.n != r.l.size {
			r.failed = fmt.Errorf("%w: layer of %s: %s changed: expected %s (%d bytes), got %s (%d bytes)", verify.ErrDigest, r.l.name, r.l.blob, r.l.digest, r.l.size, got, r.hash.n)
			return n, r.failed
		}
		r.l.uploaded.Store(true)
		if r.l.report != nil {
			r.l.reportOnce.Do(func() { r.l.report(r.l, r.hash.n, true) })
		}
	}
	return n, err
}

func (r *layerReader) Close() error { return r.f.Close() }

// hashCounter is a writer that hashes and counts.
type hashCounter struct {
	h interface {
		io.Writer
		Sum([]byte) []byte
	}
	n int64
}

func (c *hashCounter) Write(p []byte) (int, error) {
	c.h.Write(p)
	c.n += int64(len(p))
	return len(p), nil
}

func (c *hashCounter) sum() v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(c.h.Sum(nil))}
}
