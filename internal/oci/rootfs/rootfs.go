// Package rootfs makes the root filesystem sandboxes run: a base (the Debian package layer of
// `make image`, or a user's image unpacked) with the pipeline's executor layer on top, named
// by the digest of both and never written again; and reads back what a rootfs records of
// itself (Info, at InfoPath).
package rootfs

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

	"readie.dev/pipeline/internal/atomicfile"
)

// ErrPython reports an image without what the executor needs: python3 (3.11 or newer) and
// cloudpickle.
var ErrPython = errors.New("the image cannot run the executor")

// Info is what a rootfs records of itself at InfoPath: its digest (of the base and the
// executor layer) and where they came from.
type Info struct {
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

// InfoPath is where a rootfs records its Info, relative to its root.
const InfoPath = "usr/lib/readie/image.json"

// ReadInfo reads the Info that dir (a rootfs) records; an Info without a digest is an error.
func ReadInfo(dir string) (*Info, error) {
	data, err := os.ReadFile(filepath.Join(dir, InfoPath))
	if err != nil {
		return nil, err
	}
	var info Info
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, fmt.Errorf("%s: %w", InfoPath, err)
	}
	if info.Digest == "" {
		return nil, fmt.Errorf("%s: no digest", InfoPath)
	}
	return &info, nil
}

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
func Assemble(ctx context.Context, cacheDir, base, baseDigest string, image *ImageRef) (string, *Info, error) {
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
	info := &Info{Digest: "sha256:" + hex.EncodeToString(sum[:]), BaseDigest: baseDigest, ExecutorDigest: executorDigest, SitePackages: "/" + site, Image: image}
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
	if err := os.MkdirAll(filepath.Join(tmp, "rootfs", filepath.Dir(InfoPath)), 0o755); err != nil {
		return "", nil, err
	}
	if err := atomicfile.WriteJSON(filepath.Join(tmp, "rootfs", InfoPath), info); err != nil {
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
		if err := os.RemoveAll(target); err != nil {
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
