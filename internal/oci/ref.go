// Package oci speaks OCI at the pipeline's ends, on go-containerregistry: an output directory
// as a regular OCI image (one layer per checkpoint) pushed to a registry or an OCI layout, and
// pulled back into an output directory.
package oci

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
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

// String is the reference as the user wrote it, without credentials (references hold none).
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

// ParseRef reads REF: oci-layout:DIR[:TAG|@DIGEST] or HOST/REPO[:TAG|@DIGEST]. Plain HTTP is
// used for localhost, 127.0.0.1 and the hosts in insecure.
func ParseRef(ref string, insecure []string) (Ref, error) {
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

// remoteOptions are the registry options of every push and pull: credentials from the Docker
// config (authn.DefaultKeychain, as every registry client reads them), ctx, and progress.
func remoteOptions(ctx context.Context, progress *Progress) []remote.Option {
	opts := []remote.Option{
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithContext(ctx),
		remote.WithTransport(http.DefaultTransport),
	}
	if progress != nil {
		opts = append(opts, remote.WithProgress(progress.updates()))
	}
	return opts
}
