// Package verify reads an image's bytes only through their digests: the manifest's config
// descriptor against the config, each layer's blob against its descriptor (digest and size)
// and its uncompressed tar against the config's diff ID, every stream read to its end. A
// consumer sees a layer's tar as it streams, but an image counts as read only when every check
// passed, so nothing may be committed before Layers returns.
//
// go-containerregistry checks a blob only when its reader reaches EOF, and a tar reader stops
// at the end-of-archive marker, before EOF: relying on it checks nothing.
package verify

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/zstd"
)

// ErrDigest reports bytes that differ from the digest or the size that names them.
var ErrDigest = errors.New("digest mismatch")

// maxTrailing is how much a layer's tar may be followed by (padding to its record size: GNU
// tar pads to 10 KiB); more is refused, so a stream that never ends cannot keep a read going.
const maxTrailing = 1 << 20

// maxDrainOnError is how much more of a blob is read, after its consumer failed or past the
// size its descriptor gives, to name its actual digest: a forged blob then says so.
const maxDrainOnError = 64 << 20

// Bytes checks data against the digest and, when size is not negative, the size that name it.
func Bytes(what string, data []byte, want v1.Hash, size int64) error {
	got := Sum(data)
	if got != want {
		return fmt.Errorf("%w: %s: expected %s, got %s", ErrDigest, what, want, got)
	}
	if size >= 0 && int64(len(data)) != size {
		return fmt.Errorf("%w: %s: expected %d bytes, got %d", ErrDigest, what, size, len(data))
	}
	return nil
}

// Sum returns the sha256 digest of data.
func Sum(data []byte) v1.Hash {
	sum := sha256.Sum256(data)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
}

// Layer is one layer as the manifest and the config describe it, and what was read of it.
type Layer struct {
	Index, Count int     // its place, from 1
	Digest       v1.Hash // the blob's, from the manifest
	Size         int64   // the blob's, from the manifest
	DiffID       v1.Hash // the uncompressed tar's, from the config
	// Compressed and Uncompressed are the bytes read of the blob and of its tar (set once the
	// layer is verified).
	Compressed, Uncompressed int64
}

func (l Layer) String() string { return fmt.Sprintf("layer %d of %d (%s)", l.Index, l.Count, l.Digest) }

// Image is what Layers verified of an image.
type Image struct {
	// Manifest is the sha256 of the manifest's own bytes.
	Manifest v1.Hash
	// Content is a digest of the verified diff IDs, in order: the same image gives the same
	// content digest through an OCI layout, a docker archive or a registry.
	Content string
	Config  *v1.ConfigFile
}

// Layers reads every layer of img in order and hands each one's tar to apply while it
// streams; done, when set, hears of each layer once it is verified. It returns the image only
// when the config matched the manifest and every layer matched its digest, its size and its
// diff ID; otherwise an error matching ErrDigest names the layer and both digests. Reads stop
// with ctx.
func Layers(ctx context.Context, img v1.Image, apply func(Layer, *tar.Reader) error, done func(Layer)) (*Image, error) {
	return SomeLayers(ctx, img, nil, apply, done)
}

// SomeLayers is Layers for the layers want accepts (every one when want is nil); the others
// are neither read nor verified.
func SomeLayers(ctx context.Context, img v1.Image, want func(Layer) bool, apply func(Layer, *tar.Reader) error, done func(Layer)) (*Image, error) {
	raw, m, cfg, err := manifestAndConfig(img)
	if err != nil {
		return nil, err
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return nil, fmt.Errorf("%w: the config lists %d diff IDs for the manifest's %d layers", ErrDigest, len(cfg.RootFS.DiffIDs), len(m.Layers))
	}
	for i, desc := range m.Layers {
		l := Layer{Index: i + 1, Count: len(m.Layers), Digest: desc.Digest, Size: desc.Size, DiffID: cfg.RootFS.DiffIDs[i]}
		if want != nil && !want(l) {
			continue
		}
		if err := readLayer(ctx, img, &l, apply); err != nil {
			return nil, fmt.Errorf("%s: %w", l, err)
		}
		if done != nil {
			done(l)
		}
	}
	ids := make([]string, 0, len(cfg.RootFS.DiffIDs))
	for _, id := range cfg.RootFS.DiffIDs {
		ids = append(ids, id.String())
	}
	content, _ := json.Marshal(ids)
	return &Image{Manifest: Sum(raw), Content: Sum(content).String(), Config: cfg}, nil
}

// Config returns img's config, checked against the digest and size its manifest gives (what
// Layers checks of it, for a run that finds the image already unpacked), and the digest of
// that manifest.
func Config(img v1.Image) (*v1.ConfigFile, v1.Hash, error) {
	raw, _, cfg, err := manifestAndConfig(img)
	if err != nil {
		return nil, v1.Hash{}, err
	}
	return cfg, Sum(raw), nil
}

// manifestAndConfig reads img's manifest (its raw bytes and parsed) and its config, checked
// against the manifest's config descriptor.
func manifestAndConfig(img v1.Image) ([]byte, *v1.Manifest, *v1.ConfigFile, error) {
	raw, err := img.RawManifest()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read the manifest: %w", err)
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("parse the manifest: %w", err)
	}
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read the config: %w", err)
	}
	if err := Bytes("config", rawConfig, m.Config.Digest, m.Config.Size); err != nil {
		return nil, nil, nil, err
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(rawConfig))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("parse the config: %w", err)
	}
	return raw, m, cfg, nil
}

// readLayer streams l's blob through a digester, its decompression, a second digester and a
// tar reader for apply; then reads both streams to their ends and checks both digests.
func readLayer(ctx context.Context, img v1.Image, l *Layer, apply func(Layer, *tar.Reader) error) error {
	blob, err := img.LayerByDigest(l.Digest)
	if err != nil {
		return err
	}
	rc, err := blob.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	compressed := newDigester("blob", ctxReader{ctx, rc}, l.Digest, l.Size)
	buffered := bufio.NewReaderSize(compressed, 1<<16)
	plain, closeDecompressor, err := decompress(buffered)
	if err != nil {
		return err
	}
	defer closeDecompressor()
	uncompressed := newDigester("uncompressed tar", plain, l.DiffID, -1)
	if err := apply(*l, tar.NewReader(uncompressed)); err != nil {
		// Forged bytes may trip the consumer before their digest is known: when the rest of
		// the blob is short, read it and say which it was.
		if _, derr := io.Copy(io.Discard, io.LimitReader(buffered, maxDrainOnError)); errors.Is(derr, ErrDigest) {
			return fmt.Errorf("%w (and reading it: %v)", derr, err)
		}
		return err
	}
	// The end-of-archive marker is not the end of the stream: what follows is hashed too.
	if n, err := io.Copy(io.Discard, io.LimitReader(uncompressed, maxTrailing+1)); err != nil {
		return err
	} else if n > maxTrailing {
		return fmt.Errorf("%w: more than %d bytes follow the end of its tar archive", ErrDigest, maxTrailing)
	}
	if err := uncompressed.verify(); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, buffered); err != nil {
		return err
	}
	if err := compressed.verify(); err != nil {
		return err
	}
	l.Compressed, l.Uncompressed = compressed.n, uncompressed.n
	return nil
}

// decompress reads r as gzip, zstd or a plain tar, by its first bytes (as container runtimes
// do: a media type says less than the bytes).
func decompress(r *bufio.Reader) (io.Reader, func(), error) {
	magic, err := r.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, err
	}
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, fmt.Errorf("gzip: %w", err)
		}
		return zr, func() { zr.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, fmt.Errorf("zstd: %w", err)
		}
		return zr, zr.Close, nil
	}
	return r, func() {}, nil
}

// digester hashes and counts what is read through it, and checks the digest (and the size,
// when known) at the end: at EOF, or at an error once the whole expected length arrived (a
// registry client that checks the digest itself reports a mismatch as its own error).
type digester struct {
	what     string
	r        io.Reader
	h        hash.Hash
	n        int64
	want     v1.Hash
	size     int64
	verified bool
}

func newDigester(what string, r io.Reader, want v1.Hash, size int64) *digester {
	return &digester{what: what, r: r, h: sha256.New(), want: want, size: size}
}

func (d *digester) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	d.h.Write(p[:n])
	d.n += int64(n)
	if d.size >= 0 && d.n > d.size {
		return n, d.overflow()
	}
	if err != nil && (errors.Is(err, io.EOF) || d.size >= 0 && d.n >= d.size) {
		if verr := d.verify(); verr != nil {
			return n, verr
		}
	}
	return n, err
}

// verify checks what was read against the expected digest and size.
func (d *digester) verify() error {
	if d.verified {
		return nil
	}
	if got := d.sum(); got != d.want || d.size >= 0 && d.n != d.size {
		return d.mismatch()
	}
	d.verified = true
	return nil
}

func (d *digester) sum() v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(d.h.Sum(nil))}
}

// overflow reports a stream longer than its descriptor says, with its own digest when it ends
// within maxDrainOnError more bytes; one that goes on is not read further.
func (d *digester) overflow() error {
	n, err := io.Copy(d, io.LimitReader(d.r, maxDrainOnError+1))
	if err != nil || n > maxDrainOnError {
		return fmt.Errorf("%w: %s: expected %s (%d bytes), got more than %d bytes", ErrDigest, d.what, d.want, d.size, d.n)
	}
	return d.mismatch()
}

// Write hashes and counts p (what overflow reads past the end).
func (d *digester) Write(p []byte) (int, error) {
	d.h.Write(p)
	d.n += int64(len(p))
	return len(p), nil
}

func (d *digester) mismatch() error {
	if d.size >= 0 && d.n != d.size {
		return fmt.Errorf("%w: %s: expected %s (%d bytes), got %s (%d bytes)", ErrDigest, d.what, d.want, d.size, d.sum(), d.n)
	}
	return fmt.Errorf("%w: %s: expected %s, got %s", ErrDigest, d.what, d.want, d.sum())
}

// ctxReader stops reading once ctx is done, with its cause.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		if cause := context.Cause(c.ctx); cause != err {
			return 0, fmt.Errorf("%w: %w", cause, err)
		}
		return 0, err
	}
	return c.r.Read(p)
}
