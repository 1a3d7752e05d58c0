package ref

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"readie.dev/pipeline/internal/oci/verify"
)

// Resolved is the image a reference names, and how it was found in an image index.
type Resolved struct {
	Image v1.Image
	// Index is the digest of the image index the reference named ("" when it named an image
	// manifest); Platform is the platform chosen in it (os/arch[/variant]).
	Index, Platform string
}

// maxNestedIndexes bounds the nested indexes one resolution reads, whatever their depth.
const maxNestedIndexes = 64

// maxIndexDepth bounds nested indexes: an index that names itself, directly or not, ends.
const maxIndexDepth = 4

// errTooDeep reports indexes nested deeper than maxIndexDepth (with ErrRef): it ends the
// resolution, where a nested index's other ErrRef (no such platform) lets siblings be tried.
var errTooDeep = errors.New("image indexes nested too deep")

// HostPlatform returns the platform this host runs: runtime.GOOS/runtime.GOARCH (the variant of
// arm64 is v8, and is left out, as OCI indexes often do).
func HostPlatform() v1.Platform {
	return v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}
}

// ParsePlatform reads os/arch[/variant] (the config's platform, --platform); "" is nil: the
// host's.
func ParsePlatform(s string) (*v1.Platform, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || slices.Contains(parts, "") || strings.ContainsAny(s, " :") {
		return nil, fmt.Errorf("%w: platform %q: want OS/ARCH[/VARIANT], e.g. linux/amd64 or linux/arm/v7", ErrRef, s)
	}
	p := &v1.Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p, nil
}

// Resolve finds the image ref names for platform want (nil: the host's): ref is
// oci-layout:DIR[:TAG|@DIGEST], docker-archive:FILE or a registry reference, and an image
// index there (nested ones included) resolves to its manifest for want. An image manifest that
// is named directly must be of want when want is given.
func Resolve(ctx context.Context, ref string, insecure []string, want *v1.Platform) (*Resolved, error) {
	platform := HostPlatform()
	if want != nil {
		platform = *want
	}
	var res *Resolved
	if file, ok := strings.CutPrefix(ref, "docker-archive:"); ok {
		// A docker archive holds images only (its manifest.json lists them): no index.
		img, err := tarball.ImageFromPath(file, nil)
		if err != nil {
			return nil, fmt.Errorf("docker archive %s: %w", file, err)
		}
		res = &Resolved{Image: img}
	} else {
		r, err := Parse(ref, insecure)
		if err != nil {
			return nil, err
		}
		if res, err = resolve(ctx, r, platform); err != nil {
			return nil, err
		}
	}
	if res.Index == "" && want != nil {
		cfg, err := res.Image.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("image %s: read the config: %w", ref, err)
		}
		if have := cfg.Platform(); have != nil && have.OS != "" && !matches(*have, platform) {
			return nil, fmt.Errorf("%w: %s is an image for %s, not %s", ErrRef, ref, have, platform)
		}
	}
	return res, nil
}

// resolve finds r's image for platform, through an index when r names one.
func resolve(ctx context.Context, r Ref, platform v1.Platform) (*Resolved, error) {
	if r.Layout == "" {
		desc, err := remote.Get(r.Registry, RemoteOptions(ctx)...)
		if err != nil {
			return nil, RegistryError("pull", r.Registry, err)
		}
		if !desc.MediaType.IsIndex() {
			img, err := desc.Image()
			if err != nil {
				return nil, RegistryError("pull", r.Registry, err)
			}
			return &Resolved{Image: img}, nil
		}
		index, err := desc.ImageIndex()
		if err != nil {
			return nil, RegistryError("pull", r.Registry, err)
		}
		return choose(index, desc.Digest, platform, r.String(), 1, map[v1.Hash]bool{})
	}
	p, desc, err := layoutEntry(r)
	if err != nil {
		return nil, err
	}
	if !desc.MediaType.IsIndex() {
		img, err := fetchLayoutImage(p, r, desc)
		if err != nil {
			return nil, err
		}
		return &Resolved{Image: img}, nil
	}
	index, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	return chooseIn(index, desc, platform, r.String(), 1, map[v1.Hash]bool{})
}

// chooseIn opens the index desc names in parent, checks its bytes against desc, and chooses
// in it.
func chooseIn(parent v1.ImageIndex, desc v1.Descriptor, platform v1.Platform, what string, depth int, seen map[v1.Hash]bool) (*Resolved, error) {
	if depth > maxIndexDepth {
		return nil, fmt.Errorf("%w: %w: %s: more than %d deep", ErrRef, errTooDeep, what, maxIndexDepth)
	}
	index, err := parent.ImageIndex(desc.Digest)
	if err != nil {
		return nil, fmt.Errorf("%s: index %s: %w", what, desc.Digest, err)
	}
	raw, err := index.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: index %s: %w", what, desc.Digest, err)
	}
	if err := verify.Bytes(what+": image index", raw, desc.Digest, desc.Size); err != nil {
		return nil, err
	}
	return choose(index, desc.Digest, platform, what, depth, seen)
}

// choose picks platform's image in index (whose digest is digest): an image manifest whose
// platform matches (an exact variant first), skipping attestation manifests (unknown/unknown),
// or the image a nested index gives for it. None: an error naming the platforms it has.
func choose(index v1.ImageIndex, digest v1.Hash, platform v1.Platform, what string, depth int, seen map[v1.Hash]bool) (*Resolved, error) {
	im, err := index.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: index %s: %w", what, digest, err)
	}
	var have []string
	var best *v1.Descriptor
	for i, d := range im.Manifests {
		switch {
		case d.MediaType.IsIndex():
			if d.Platform != nil && !matches(*d.Platform, platform) {
				have = append(have, d.Platform.String())
				continue
			}
			// Each nested index is looked into once per resolution: an index that lists the
			// same one (or many) over and over would otherwise be read again at every level.
			if seen[d.Digest] {
				continue
			}
			if seen[d.Digest] = true; len(seen) > maxNestedIndexes {
				return nil, fmt.Errorf("%w: %w: %s: more than %d nested image indexes", ErrRef, errTooDeep, what, maxNestedIndexes)
			}
			nested, err := chooseIn(index, d, platform, what, depth+1, seen)
			if err == nil {
				nested.Index = digest.String()
				return nested, nil
			} else if !errors.Is(err, ErrRef) || errors.Is(err, errTooDeep) {
				return nil, err
			}
			have = append(have, "an index without "+platform.String())
		case d.MediaType.IsImage():
			if d.Platform == nil || attestation(d) {
				if d.Platform != nil {
					have = append(have, d.Platform.String()+" (attestation)")
				}
				continue
			}
			have = append(have, d.Platform.String())
			if matches(*d.Platform, platform) && (best == nil || d.Platform.Variant == platform.Variant && best.Platform.Variant != platform.Variant) {
				best = &im.Manifests[i]
			}
		}
	}
	if best == nil {
		slices.Sort(have)
		return nil, fmt.Errorf("%w: %s: the image index %s has no image for %s (it has: %s)", ErrRef, what, digest, platform, listOrNone(slices.Compact(have)))
	}
	img, err := index.Image(best.Digest)
	if err != nil {
		return nil, fmt.Errorf("%s: image %s: %w", what, best.Digest, err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: image %s: %w", what, best.Digest, err)
	}
	if err := verify.Bytes(what+": manifest", raw, best.Digest, best.Size); err != nil {
		return nil, err
	}
	return &Resolved{Image: img, Index: digest.String(), Platform: best.Platform.String()}, nil
}

// matches says whether an image of platform have runs on want: the same OS and architecture,
// and the same variant when want names one (arm64's v8 is its default).
func matches(have, want v1.Platform) bool {
	if have.OS != want.OS || have.Architecture != want.Architecture {
		return false
	}
	return want.Variant == "" || variant(have) == variant(want)
}

func variant(p v1.Platform) string {
	if p.Variant == "" && p.Architecture == "arm64" {
		return "v8"
	}
	return p.Variant
}

// attestation says whether d is a build attestation (buildx's provenance and SBOM manifests:
// platform unknown/unknown, reference type attestation-manifest), not an image to run.
func attestation(d v1.Descriptor) bool {
	return d.Platform.OS == "unknown" || d.Platform.Architecture == "unknown" ||
		d.Annotations["vnd.docker.reference.type"] == "attestation-manifest"
}
