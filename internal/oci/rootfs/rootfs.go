// Package rootfs makes the root filesystem sandboxes run: a base (the Debian package layer of
// `make image`, or a user's image unpacked) with the pipeline's executor layer on top, named
// by the digest of both and never written again, recording itself (manifest.RootfsInfo, at
// manifest.RootfsInfoFile). The base's own code (its python3) runs only in gVisor sandboxes.
package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// Info is what Assemble made: the rootfs's own record (manifest.RootfsInfo, written at
// manifest.RootfsInfoFile), and whether it was made already.
type Info struct {
	manifest.RootfsInfo
	// Reused says Assemble found the rootfs made already.
	Reused bool `json:"-"`
}

// Options say what Assemble puts together and how it runs the base's code.
type Options struct {
	// Cache is the cache directory; the rootfs goes under Cache/rootfs.
	Cache string
	// Base is a directory that never changes, and BaseDigest the digest of its verified
	// content.
	Base, BaseDigest string
	// Image names the image Base was unpacked from, if it was.
	Image *manifest.Image
	// Process is the image config's environment, cwd and user (imageconfig.Process): the
	// probe and the precompile run with it, as every sandbox on the rootfs will. Nil for a
	// base without a config (the default rootfs).
	Process *sandbox.Process
	// Runtime runs the base's python3 (the probe, the precompile), with no network whatever
	// its flags say; Timeout bounds each run (timeouts.image_probe).
	Runtime *launch.Runtime
	Timeout time.Duration
	Log     logrus.FieldLogger
}

func (o Options) what() string {
	if o.Image != nil {
		return o.Image.Ref
	}
	return "base " + o.Base
}

// Assemble makes the rootfs of the base plus the executor layer under Cache/rootfs, named by
// the digest of the base and of the executor layer's recipe, once (unpack.Once: a run that
// finds it made reuses it, a run that finds another making it waits): the base is linked, not
// copied; the base's python3 says, in a sandbox, where the executor goes and precompiles it
// (printing the bytecode: nothing of the host is writable by it); the executor layer, its bytecode and the Info go on through the
// one layer applier. The whole is bounded by three times Timeout.
func Assemble(ctx context.Context, o Options) (string, *Info, error) {
	executorDigest, err := recipeDigest()
	if err != nil {
		return "", nil, err
	}
	named := o.BaseDigest + " " + executorDigest
	if o.Process != nil && !o.Process.IsZero() {
		// The process decides which python3 the probe finds (PATH), so where the executor goes.
		process, err := json.Marshal(o.Process)
		if err != nil {
			return "", nil, err
		}
		named += " " + string(process)
	}
	info := &Info{RootfsInfo: manifest.RootfsInfo{Digest: filedigest.OfBytes([]byte(named)), BaseDigest: o.BaseDigest, ExecutorDigest: executorDigest, Image: o.Image, Process: o.Process}}
	ctx, cancel := context.WithTimeoutCause(ctx, 3*o.Timeout, fmt.Errorf("making the rootfs of %s exceeded three times timeouts.image_probe (%s)", o.what(), 3*o.Timeout))
	defer cancel()
	if err := os.MkdirAll(o.Runtime.Root, 0o700); err != nil {
		return "", nil, err
	}
	complete := func(dir string) (bool, error) {
		_, err := os.Stat(filepath.Join(dir, "complete"))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) { // ENOTDIR: a stray file at its place, removed
			return false, nil
		}
		return err == nil, err
	}
	dir, made, err := unpack.Once(ctx, filepath.Join(o.Cache, "rootfs"), strings.Replace(info.Digest, ":", "-", 1), complete, func(tmp string) error {
		return build(ctx, o, info, tmp)
	}, o.Log)
	if err != nil {
		return "", nil, err
	}
	rootfs := filepath.Join(dir, "rootfs")
	if !made {
		recorded, err := manifest.ReadRootfsInfo(rootfs)
		if err != nil {
			return "", nil, fmt.Errorf("rootfs %s: %w", rootfs, err)
		}
		recorded.Image = o.Image // the same content may have come through another reference
		info.RootfsInfo, info.Reused = *recorded, true
	}
	return rootfs, info, nil
}

// build makes the rootfs in tmp (tmp/rootfs, then tmp/complete).
func build(ctx context.Context, o Options, info *Info, tmp string) error {
	scratch := filepath.Join(tmp, "scratch")
	if err := os.Mkdir(scratch, 0o700); err != nil {
		return err
	}
	code := newImageCode(o.Runtime, o.Timeout, o.what(), info.SandboxProcess())
	said, err := code.probe(ctx, o.Base, scratch)
	if err != nil {
		return err
	}
	site := said.Purelib
	info.SitePackages, info.PythonPath, info.Python = "/"+site, said.PythonPath, &said.Python
	rootfs := filepath.Join(tmp, "rootfs")
	// Hard links share the base's files: the applier replaces files, never writes into them.
	cp := exec.CommandContext(ctx, "cp", "-al", o.Base, rootfs)
	cp.WaitDelay = time.Second // its output goes into memory: nothing holding the pipe keeps us past ctx
	if out, err := cp.CombinedOutput(); err != nil {
		return fmt.Errorf("link %s: %w: %s", o.Base, err, out)
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	applier := unpack.NewApplier(root, unpack.NewBudget(unpack.DefaultLimits()))
	layer, err := ExecutorLayer(site)
	if err != nil {
		return err
	}
	if err := applier.Apply(tar.NewReader(bytes.NewReader(layer))); err != nil {
		return fmt.Errorf("image %s: the executor layer: %w", o.what(), err)
	}
	// The executor's mount point, made here or runsc makes it in the first sandbox: the rootfs
	// is named by its digest and shared, and must not change once made.
	if err := root.MkdirAll(strings.TrimPrefix(sandbox.ExecutorDir, "/"), 0o755); err != nil {
		return fmt.Errorf("image %s: the executor's mount point %s cannot be made (its parent must be a directory of the image, or absent; not a file, nor a symlink that leaves the image): %w", o.what(), sandbox.ExecutorDir, err)
	}
	bytecode, err := code.precompile(ctx, rootfs, site, scratch)
	if err != nil {
		return err
	}
	record, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	last, err := tarOf(append(bytecode, layerFile{name: manifest.RootfsInfoFile, data: append(record, '\n')}))
	if err != nil {
		return err
	}
	if err := applier.Apply(tar.NewReader(bytes.NewReader(last))); err != nil {
		return fmt.Errorf("image %s: the executor's bytecode: %w", o.what(), err)
	}
	if err := os.RemoveAll(scratch); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(tmp, "complete"), nil, 0o644)
}

// recipeDigest returns "sha256:" over the executor layer (for a placeholder site: the site is
// the base's, which its digest covers), the probe, the precompile and the mount point: what
// decides, with the base, every byte Assemble adds.
func recipeDigest() (string, error) {
	layer, err := ExecutorLayer("{purelib}")
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write(layer)
	fmt.Fprintf(h, "\x00%s\x00%q\x00%s\x00%s", probeScript, compileArgs("{purelib}"), pycachePrefix, sandbox.ExecutorDir)
	return filedigest.Format(h.Sum(nil)), nil
}
