package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"readie.dev/pipeline/internal/atomicfile"
)

// ErrPython reports an image without what the executor needs: python3 (3.11 or newer) and
// cloudpickle.
var ErrPython = errors.New("the image cannot run the executor")

// ImageInfo is /usr/lib/readie/image.json in a rootfs: its digest (of the base and the
// executor layer) and where they came from.
type ImageInfo struct {
	Digest         string `json:"digest"`
	BaseDigest     string `json:"base_digest"`
	ExecutorDigest string `json:"executor_digest"`
	SitePackages   string `json:"site_packages"`
	// Image is the OCI image the base was unpacked from, if it was.
	Image *ImageRef `json:"image,omitempty"`
	// Reused says Assemble found the rootfs made already.
	Reused bool `json:"-"`
}

// ImageRef names an image: the reference given and the manifest digest found.
type ImageRef struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

// ImageInfoPath is where a rootfs records its ImageInfo.
const ImageInfoPath = "usr/lib/readie/image.json"

// checkPython runs the base's python3 in a chroot (with its own PATH and no bytecode writes)
// and returns the directory on its path for the executor (sysconfig's purelib).
func checkPython(ctx context.Context, base, what string) (string, error) {
	const probe = `import sys, sysconfig
if sys.version_info < (3, 11):
    print("python3 %d.%d is older than 3.11" % sys.version_info[:2]); sys.exit(3)
try:
    import cloudpickle
except ImportError:
    print("cloudpickle is missing"); sys.exit(4)
print(sysconfig.get_paths()["purelib"])`
	cmd := exec.CommandContext(ctx, "chroot", base, "python3", "-B", "-c", probe)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	said := strings.TrimSpace(out.String())
	var exit *exec.ExitError
	switch {
	case err == nil && said != "":
		return strings.TrimPrefix(said, "/"), nil
	case errors.As(err, &exit) && (exit.ExitCode() == 3 || exit.ExitCode() == 4):
		return "", fmt.Errorf("%w: %s: %s", ErrPython, what, said)
	case errors.As(err, &exit) && exit.ExitCode() == 127:
		return "", fmt.Errorf("%w: %s: python3 is missing (%s)", ErrPython, what, strings.TrimSpace(errOut.String()))
	default:
		return "", fmt.Errorf("%w: %s: python3 does not run: %v %s", ErrPython, what, err, strings.TrimSpace(errOut.String()))
	}
}

// Assemble makes the rootfs of base plus the executor layer under cacheDir/rootfs, named by
// their digest, and returns its path and info (Reused says it was there already). base (a directory that never changes) is linked,
// not copied; the executor layer's files are new. It is made once, atomically, and never
// written again; a rootfs of the same digest is reused as it is.
func Assemble(ctx context.Context, cacheDir, base, baseDigest string, image *ImageRef) (string, *ImageInfo, error) {
	what := base
	if image != nil {
		what = "image " + image.Ref
	}
	site, err := checkPython(ctx, base, what)
	if err != nil {
		return "", nil, err
	}
	parent := filepath.Join(cacheDir, "rootfs")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", nil, err
	}
	stage, err := os.MkdirTemp(parent, ".stage-")
	if err != nil {
		return "", nil, err
	}
	defer os.RemoveAll(stage)
	executorDigest, err := ExecutorLayer(stage, site)
	if err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256([]byte(baseDigest + " " + executorDigest))
	info := &ImageInfo{Digest: "sha256:" + hex.EncodeToString(sum[:]), BaseDigest: baseDigest, ExecutorDigest: executorDigest, SitePackages: "/" + site, Image: image}
	final := filepath.Join(parent, strings.Replace(info.Digest, ":", "-", 1))
	rootfs := filepath.Join(final, "rootfs")
	if _, err := os.Stat(filepath.Join(final, "complete")); err == nil {
		info.Reused = true
		return rootfs, info, nil
	}
	tmp, err := os.MkdirTemp(parent, ".tmp-")
	if err != nil {
		return "", nil, err
	}
	defer os.RemoveAll(tmp)
	// Hard links share the base's files: neither copy is ever written again.
	if out, err := exec.CommandContext(ctx, "cp", "-al", base, filepath.Join(tmp, "rootfs")).CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("link %s: %w: %s", base, err, out)
	}
	if err := overlay(stage, filepath.Join(tmp, "rootfs")); err != nil {
		return "", nil, err
	}
	compile := exec.CommandContext(ctx, "chroot", filepath.Join(tmp, "rootfs"), "python3", "-m", "compileall", "-q", "/"+site+"/readie_executor")
	compile.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"}
	if out, err := compile.CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("precompile the executor: %w: %s", err, out)
	}
	if err := os.MkdirAll(filepath.Join(tmp, "rootfs", filepath.Dir(ImageInfoPath)), 0o755); err != nil {
		return "", nil, err
	}
	if err := atomicfile.WriteJSON(filepath.Join(tmp, "rootfs", ImageInfoPath), info); err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "complete"), nil, 0o644); err != nil {
		return "", nil, err
	}
	if err := os.Rename(tmp, final); err != nil {
		// Another run assembled the same digest first: its rootfs is the same.
		if _, statErr := os.Stat(filepath.Join(final, "complete")); statErr != nil {
			return "", nil, fmt.Errorf("put %s in place: %w", final, err)
		}
	}
	return rootfs, info, nil
}

// overlay copies the tree src onto dst, replacing (never writing into) what is there: dst's
// files may be hard links to a base that must not change.
func overlay(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			if fi, err := os.Lstat(target); err == nil && !fi.IsDir() {
				os.Remove(target)
			}
			return os.MkdirAll(target, 0o755)
		}
		if err := replaceable(target); err != nil {
			return err
		}
		if d.Type()&os.ModeSymlink != 0 {
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
}

// OpenImage finds the image REF names: oci-layout:DIR[:TAG|@DIGEST], docker-archive:FILE, or
// a registry reference.
func OpenImage(ctx context.Context, ref string, insecure []string) (v1.Image, error) {
	if file, ok := strings.CutPrefix(ref, "docker-archive:"); ok {
		img, err := tarball.ImageFromPath(file, nil)
		if err != nil {
			return nil, fmt.Errorf("docker archive %s: %w", file, err)
		}
		return img, nil
	}
	r, err := ParseRef(ref, insecure)
	if err != nil {
		return nil, err
	}
	return Fetch(ctx, r, nil)
}

// ContentDigest is the digest of what an image's layers hold, whatever carries them (an OCI
// layout, a docker archive, a registry): their uncompressed digests, in order.
func ContentDigest(img v1.Image) (string, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	var ids []string
	for _, id := range cfg.RootFS.DiffIDs {
		ids = append(ids, id.String())
	}
	data, _ := json.Marshal(ids)
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// UnpackOnce unpacks img under cacheDir/rootfs/oci/<manifest digest>/rootfs, once: a second
// call for the same image unpacks nothing (and says so with unpacked false). Two runs unpacking
// the same image at once both end with the one complete directory.
func UnpackOnce(img v1.Image, cacheDir string, progress func(layer, layers int, bytes int64)) (dir string, unpacked bool, err error) {
	digest, err := img.Digest()
	if err != nil {
		return "", false, err
	}
	parent := filepath.Join(cacheDir, "rootfs", "oci")
	final := filepath.Join(parent, digest.Hex)
	if _, err := os.Stat(filepath.Join(final, "complete")); err == nil {
		return filepath.Join(final, "rootfs"), false, nil
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", false, err
	}
	tmp, err := os.MkdirTemp(parent, ".tmp-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		return "", false, err
	}
	if err := Unpack(img, root, progress); err != nil {
		return "", false, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "complete"), nil, 0o644); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp, final); err != nil {
		if _, statErr := os.Stat(filepath.Join(final, "complete")); statErr != nil {
			return "", false, fmt.Errorf("put %s in place: %w", final, err)
		}
		return filepath.Join(final, "rootfs"), false, nil
	}
	return filepath.Join(final, "rootfs"), true, nil
}
