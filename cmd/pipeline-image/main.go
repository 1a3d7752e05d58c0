// Command pipeline-image builds the pipeline's own container image as an OCI layout, without a
// container engine (`make pipeline-image` runs it): the static pipeline and runsc with its
// helpers (gvisor-bin/ beside it, where runsc looks for them), a static
// busybox for the Job's `/bin/sh -c`, CA certificates for registries over TLS, and the
// executor's rootfs, baked in outside the cache path a pod mounts a volume over. The same
// inputs give the same digest: the image's times are the commit's (-created), never the
// build's. Its last line of output is the image's digest; with -push it is pushed too.
//
//	pipeline-image -out DIR -pipeline BIN -runsc BIN -rootfs DIR -busybox BIN
//	    -ca-certificates FILE -source URL -version V -revision COMMIT -created TIME
//	    [-push HOST/REPO[:TAG]]
package main

import (
	"context"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/oci/output"
	"readie.dev/pipeline/internal/oci/ref"
	"readie.dev/pipeline/internal/oci/selfimage"
	"readie.dev/pipeline/internal/parallel"
	"readie.dev/pipeline/pkg/exitcode"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/runsc"
)

// Where the image holds what it brings: outside /root/.cache/readie, which the Job's cache
// volume hides.
const (
	PipelinePath = "/usr/local/bin/pipeline"
	RunscPath    = "/usr/local/bin/runsc"
	// HelpersPath is runsc's gvisor-bin/, beside it.
	HelpersPath  = "/usr/local/bin/gvisor-bin"
	RootfsPath   = "/usr/share/readie/rootfs"
	DefaultsPath = "/usr/share/readie/defaults.yaml"
)

// Annotations of the image besides output.AnnotationRunscVersion (the one an output carries).
const (
	annotationSource   = "org.opencontainers.image.source"
	annotationVersion  = "org.opencontainers.image.version"
	annotationRevision = "org.opencontainers.image.revision"
	annotationCreated  = "org.opencontainers.image.created"
)

type options struct {
	out, pipeline, runsc, rootfs, busybox, caCerts, source, push string
	version, revision, created                                   string
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pipeline-image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.out, "out", "build/pipeline-image", "the OCI layout to write (replaced whole)")
	fs.StringVar(&o.pipeline, "pipeline", "", "the pipeline binary, static (CGO_ENABLED=0)")
	fs.StringVar(&o.runsc, "runsc", "", "the pinned runsc, static, with its helpers in gvisor-bin/ beside it")
	fs.StringVar(&o.rootfs, "rootfs", "", "the executor's rootfs (make image)")
	fs.StringVar(&o.busybox, "busybox", "/usr/bin/busybox", "a static busybox: the image's /bin/sh")
	fs.StringVar(&o.caCerts, "ca-certificates", "/etc/ssl/certs/ca-certificates.crt", "the CA bundle for registries over TLS")
	fs.StringVar(&o.source, "source", "", "the source repository's URL (org.opencontainers.image.source)")
	fs.StringVar(&o.version, "version", "", "the pipeline's version (org.opencontainers.image.version)")
	fs.StringVar(&o.revision, "revision", "", "the commit the image is built from (org.opencontainers.image.revision)")
	fs.StringVar(&o.created, "created", "", "that commit's time, RFC 3339: the image's time, never the build's")
	fs.StringVar(&o.push, "push", "", "also push the image to this registry reference")
	if err := fs.Parse(args); err != nil {
		return exitcode.Usage
	}
	if o.pipeline == "" || o.runsc == "" || o.rootfs == "" || o.source == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "pipeline-image: -pipeline, -runsc, -rootfs and -source are required, and no arguments")
		return exitcode.Usage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	digest, err := build(ctx, o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "pipeline-image: %v\n", err)
		return exitcode.Failed
	}
	fmt.Fprintln(stdout, digest)
	return exitcode.OK
}

// errInput marks inputs the image cannot be made of.
var errInput = errors.New("bad input")

// static fails unless path is an ELF executable without an interpreter: in the image there is
// no dynamic loader, and runsc re-execs itself in an empty chroot.
func static(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", errInput, path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%w: %s is linked dynamically: build it with CGO_ENABLED=0", errInput, path)
		}
	}
	return nil
}

// helperFiles returns runsc's helpers where runsc finds them, as files of the image's
// gvisor-bin/: every one of runsc.HelperNames, static, or the image would boot its sandboxes
// without them.
func helperFiles(runscPath string) ([]selfimage.File, error) {
	dir, err := (&runsc.Runsc{Path: runscPath}).ResolvedHelpersDir()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInput, err)
	}
	var files []selfimage.File
	for _, name := range runsc.HelperNames() {
		path := filepath.Join(dir, name)
		if err := static(path); err != nil {
			return nil, fmt.Errorf("runsc's helper %s: %w (`make runsc` builds it)", name, err)
		}
		files = append(files, selfimage.File{Path: HelpersPath + "/" + name, Mode: 0o755, Source: path})
	}
	return files, nil
}

func build(ctx context.Context, o options, log io.Writer) (string, error) {
	for _, bin := range []string{o.pipeline, o.runsc, o.busybox} {
		if err := static(bin); err != nil {
			return "", err
		}
	}
	created, err := time.Parse(time.RFC3339, o.created)
	if err != nil || o.revision == "" || o.version == "" {
		return "", fmt.Errorf("%w: -revision %q, -version %q, -created %q: want a commit, a version and the commit's time (RFC 3339)", errInput, o.revision, o.version, o.created)
	}
	runscVersion, err := (&runsc.Runsc{Path: o.runsc, CommandTimeout: 30 * time.Second}).Version(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: %s --version: %w", errInput, o.runsc, err)
	}
	helpers, err := helperFiles(o.runsc)
	if err != nil {
		return "", err
	}
	rootfs, err := filepath.EvalSymlinks(o.rootfs)
	if err == nil {
		_, err = manifest.ReadRootfsInfo(rootfs)
	}
	if err != nil {
		return "", fmt.Errorf("%w: rootfs %s: %w (run `make image`)", errInput, o.rootfs, err)
	}
	defaults := fmt.Sprintf("# The image's defaults (%s names this file): its runsc and rootfs, outside the\n# cache path a pod mounts a volume over. A config's own keys win.\n"+
		"runsc:\n  path: %s\nrootfs: %s\n", config.DefaultsEnv, RunscPath, RootfsPath)
	layers := []selfimage.Layer{
		{Name: "base", Files: []selfimage.File{
			{Path: "/bin/busybox", Mode: 0o755, Source: o.busybox},
			{Path: "/bin/sh", Link: "busybox"},
			{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\n")},
			{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\n")},
			{Path: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644, Source: o.caCerts},
			{Path: "/root", Mode: 0o700, Dir: true},
			{Path: "/tmp", Mode: 0o777 | os.ModeSticky, Dir: true},
		}},
		{Name: "runsc", Files: append([]selfimage.File{{Path: RunscPath, Mode: 0o755, Source: o.runsc}}, helpers...)},
		{Name: "rootfs", Trees: []selfimage.Tree{{Path: RootfsPath, Source: rootfs}}},
		{Name: "pipeline", Files: []selfimage.File{
			{Path: PipelinePath, Mode: 0o755, Source: o.pipeline},
			{Path: DefaultsPath, Mode: 0o644, Data: []byte(defaults)},
		}},
	}
	scratch, err := os.MkdirTemp("", "readie-pipeline-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(scratch)
	// gzip is most of the build: the layers are made side by side, one per CPU.
	built := make([]v1.Layer, len(layers))
	errs := make([]error, len(layers))
	notes := make([]string, len(layers))
	indexes := make([]int, len(layers))
	for i := range indexes {
		indexes[i] = i
	}
	parallel.Each(ctx, runtime.NumCPU(), indexes, func(i int) {
		start := time.Now()
		l := layers[i]
		if built[i], errs[i] = selfimage.WriteLayer(l, scratch); errs[i] != nil {
			return
		}
		size, err := built[i].Size()
		errs[i] = err
		notes[i] = fmt.Sprintf("pipeline-image: layer %s: %.1f MiB compressed (%s)\n", l.Name, float64(size)/(1<<20), time.Since(start).Round(time.Millisecond))
	})
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return "", err
	}
	var names []string
	for i, l := range layers {
		fmt.Fprint(log, notes[i])
		names = append(names, l.Name)
	}
	annotations := map[string]string{
		annotationSource:              o.source,
		annotationVersion:             o.version,
		annotationRevision:            o.revision,
		annotationCreated:             created.UTC().Format(time.RFC3339),
		output.AnnotationRunscVersion: runscVersion,
	}
	img, err := selfimage.Image(built, names, selfimage.Config{
		Entrypoint:  []string{PipelinePath},
		Env:         []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", config.DefaultsEnv + "=" + DefaultsPath},
		Created:     created,
		Annotations: annotations,
	})
	if err != nil {
		return "", err
	}
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	if err := selfimage.WriteLayout(o.out, img); err != nil {
		return "", err
	}
	fmt.Fprintf(log, "pipeline-image: %s (revision %s, runsc %s) in %s\n", digest, o.revision, runscVersion, o.out)
	if o.push != "" {
		pushed, err := push(ctx, o.push, img, digest)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(log, "pipeline-image: pushed %s\n", pushed)
	}
	return digest.String(), nil
}

// push writes img to the registry reference to and returns it by digest.
func push(ctx context.Context, to string, img v1.Image, digest v1.Hash) (string, error) {
	r, err := ref.Parse(to, nil)
	if err != nil {
		return "", err
	}
	if r.Registry == nil || strings.Contains(to, "@") {
		return "", fmt.Errorf("%w: push %q: want a registry reference HOST/REPO[:TAG] (the layout is -out)", ref.ErrRef, to)
	}
	if err := remote.Write(r.Registry, img, ref.RemoteOptions(ctx)...); err != nil {
		return "", ref.RegistryError("push to", r.Registry, err)
	}
	return r.Registry.Context().Digest(digest.String()).String(), nil
}
