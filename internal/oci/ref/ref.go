// Package ref finds images: references (an OCI layout, a docker archive, a registry), the
// transport policy for registries (credentials, plain HTTP for which hosts), and opening the
// image a reference names, in the style of go-containerregistry's name and remote.
package ref

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"readie.dev/pipeline/internal/oci/verify"
)

// ErrRef reports an image reference the pipeline cannot use.
var ErrRef = errors.New("bad image reference")

// Ref is where an image is: an OCI layout directory (with a tag, a digest or neither), or a
// registry reference.
type Ref struct {
	// Layout is the OCI layout directory of "oci-layout:DIR[:TAG|@DIGEST]", or "".
	Layout string
	Tag    string // with Layout: the org.opencontainers.image.ref.name to find or write
	Digest string // with Layout: the manifest digest to find
	// Registry is a registry reference (HOST/REPO[:TAG|@DIGEST]), or nil.
	Registry name.Reference
}

// String returns the reference as the user wrote it, without credentials (it holds none).
func (r Ref) String() string {
	switch {
	case r.Layout != "" && r.Digest != "":
		return "oci-layout:" + r.Layout + "@" + r.Digest
	case r.Layout != "" && r.Tag != "":
		return "oci-layout:" + r.Layout + ":" + r.Tag
	case r.Layout != "":
		return "oci-layout:" + r.Layout
	}
	return r.Registry.String()
}

// Movable reports a registry reference by tag: whoever can push to the repository can point
// it at another image. A digest names one image, and so does an OCI layout (the operator's own
// files).
func (r Ref) Movable() bool {
	_, byDigest := r.Registry.(name.Digest)
	return r.Layout == "" && !byDigest
}

// Parse reads REF: oci-layout:DIR[:TAG|@DIGEST] or HOST/REPO[:TAG|@DIGEST]. Plain HTTP is
// used for localhost, 127.0.0.1 and the hosts in insecure.
func Parse(ref string, insecure []string) (Ref, error) {
	if rest, ok := strings.CutPrefix(ref, "oci-layout:"); ok {
		r := Ref{Layout: rest}
		if dir, digest, ok := strings.Cut(rest, "@"); ok {
			r.Layout, r.Digest = dir, digest
			if !strings.HasPrefix(digest, "sha256:") || len(digest) != 71 {
				return Ref{}, fmt.Errorf("%w: %q: the digest is not sha256:<64 hex>", ErrRef, ref)
			}
		} else if i := strings.LastIndex(rest, ":"); i > 0 && !strings.Contains(rest[i:], "/") {
			r.Layout, r.Tag = rest[:i], rest[i+1:]
		}
		if r.Layout == "" {
			return Ref{}, fmt.Errorf("%w: %q names no directory", ErrRef, ref)
		}
		return r, nil
	}
	if strings.Contains(ref, "://") || strings.HasPrefix(ref, "docker-archive:") {
		return Ref{}, fmt.Errorf("%w: %q: want oci-layout:DIR[:TAG] or HOST/REPO[:TAG|@DIGEST]", ErrRef, ref)
	}
	var opts []name.Option
	host, _, _ := strings.Cut(ref, "/")
	if slices.Contains(insecure, host) {
		opts = append(opts, name.Insecure)
	}
	parsed, err := name.ParseReference(ref, append(opts, name.StrictValidation)...)
	if err != nil {
		// StrictValidation wants an explicit tag or digest; without one, latest.
		parsed, err = name.ParseReference(ref, opts...)
	}
	if err != nil {
		return Ref{}, fmt.Errorf("%w: %q: %w", ErrRef, ref, err)
	}
	if !strings.Contains(host, ".") && !strings.Contains(host, ":") && host != "localhost" {
		return Ref{}, fmt.Errorf("%w: %q: name the registry host (HOST/REPO)", ErrRef, ref)
	}
	return Ref{Registry: parsed}, nil
}

// RemoteOptions returns the registry options of every push, pull and --image fetch: credentials
// from the Docker config (authn.DefaultKeychain, as every registry client reads them), ctx
// (which bounds every request and every blob read), and a transport of our own whose every
// step has a timeout of its own.
func RemoteOptions(ctx context.Context) []remote.Option {
	return []remote.Option{
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithContext(ctx),
		remote.WithTransport(Transport()),
	}
}

// Transport returns a fresh HTTP transport for registries. http.DefaultTransport bounds nothing
// but the dial and the TLS handshake; here a registry that accepts a connection and then
// says nothing is given up on too. The caller's context bounds the whole.
func Transport() *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute, // after the request, its body included, is sent
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConns:          16,
	}
}

// RegistryError names the registry host and what failed; the cause (which names no
// credential: go-containerregistry never prints them) stays matchable.
func RegistryError(what string, ref name.Reference, err error) error {
	return fmt.Errorf("%s %s (registry %s): %w", what, ref, ref.Context().RegistryStr(), err)
}

// AnnotationRefName is the tag of an image in an OCI layout's index.
const AnnotationRefName = "org.opencontainers.image.ref.name"

// Fetch finds the image at r (manifest only; layers are read when extracted).
func Fetch(ctx context.Context, r Ref) (v1.Image, error) {
	if r.Layout == "" {
		img, err := remote.Image(r.Registry, RemoteOptions(ctx)...)
		if err != nil {
			return nil, RegistryError("pull", r.Registry, err)
		}
		return img, nil
	}
	return fetchLayout(r)
}

// fetchLayout finds the image at r in an OCI layout, by digest, by tag, or the only one.
func fetchLayout(r Ref) (v1.Image, error) {
	p, desc, err := layoutEntry(r)
	if err != nil {
		return nil, err
	}
	return fetchLayoutImage(p, r, desc)
}

// layoutEntry finds the entry of the layout's index.json that r names, by digest, by tag, or
// the only one.
func layoutEntry(r Ref) (layout.Path, v1.Descriptor, error) {
	// go-containerregistry reads index.json with os.ReadFile: a FIFO there would block the
	// open until a writer came, which none will (it checks its blobs itself).
	if fi, err := os.Stat(filepath.Join(r.Layout, "index.json")); err == nil && !fi.Mode().IsRegular() {
		return "", v1.Descriptor{}, fmt.Errorf("%w: OCI layout %s: index.json is not a regular file (%s)", ErrRef, r.Layout, fi.Mode().Type())
	}
	p, err := layout.FromPath(r.Layout)
	if err != nil {
		return "", v1.Descriptor{}, fmt.Errorf("OCI layout %s: %w", r.Layout, err)
	}
	index, err := p.ImageIndex()
	if err != nil {
		return "", v1.Descriptor{}, err
	}
	im, err := index.IndexManifest()
	if err != nil {
		return "", v1.Descriptor{}, err
	}
	var found []v1.Descriptor
	var tags []string
	for _, d := range im.Manifests {
		if tag := d.Annotations[AnnotationRefName]; tag != "" {
			tags = append(tags, tag)
		}
		switch {
		case r.Digest != "" && d.Digest.String() == r.Digest,
			r.Digest == "" && r.Tag != "" && d.Annotations[AnnotationRefName] == r.Tag,
			r.Digest == "" && r.Tag == "":
			found = append(found, d)
		}
	}
	switch {
	case len(found) == 0 && r.Tag != "":
		return "", v1.Descriptor{}, fmt.Errorf("%w: %s: no image tagged %q (tags: %s)", ErrRef, r, r.Tag, listOrNone(tags))
	case len(found) != 1:
		return "", v1.Descriptor{}, fmt.Errorf("%w: %s: %d images match (name one with :TAG or @DIGEST; tags: %s)", ErrRef, r, len(found), listOrNone(tags))
	}
	return p, found[0], nil
}

// fetchLayoutImage opens the image manifest desc names in the layout p.
func fetchLayoutImage(p layout.Path, r Ref, desc v1.Descriptor) (v1.Image, error) {
	img, err := p.Image(desc.Digest)
	if err != nil {
		return nil, err
	}
	// The index names the manifest by its digest: a blob file holding other bytes is refused
	// here, as a registry client refuses a manifest of another digest.
	raw, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", r.Layout, err)
	}
	if err := verify.Bytes("OCI layout "+r.Layout+": manifest", raw, desc.Digest, desc.Size); err != nil {
		return nil, err
	}
	return img, nil
}

func listOrNone(tags []string) string {
	if len(tags) == 0 {
		return "none"
	}
	slices.Sort(tags)
	return strings.Join(tags, ", ")
}
