package rootfs

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/exitcode"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// ErrPython reports an image without what the executor needs: python3 (3.11 or newer) and
// cloudpickle.
var ErrPython = errors.New("the image cannot run the executor")

// probeScript finds the directory on the image's python3 path where the executor goes
// (sysconfig's purelib, with its links resolved inside the image), after checking the version
// and cloudpickle, and says which python3 it is: the one found through PATH (shutil.which,
// as runsc found it: a venv's bin/python3, not its realpath), its version, implementation,
// cache tag and cloudpickle's version. One JSON line; exit 3 and 4 say what is missing.
const probeScript = `import json, os, platform, shutil, sys, sysconfig
if sys.version_info < (3, 11):
    print("python3 %d.%d is older than 3.11" % sys.version_info[:2]); sys.exit(3)
try:
    import cloudpickle
except ImportError:
    print("cloudpickle is missing"); sys.exit(4)
print(json.dumps({"purelib": os.path.realpath(sysconfig.get_paths()["purelib"]),
    "python_path": shutil.which("python3") or sys.executable, "version": platform.python_version(),
    "implementation": sys.implementation.name, "cache_tag": sys.implementation.cache_tag,
    "cloudpickle": getattr(cloudpickle, "__version__", "")}))`

// The codes probeScript exits with when the image's python3 cannot run the executor.
const (
	probeTooOld        = 3
	probeNoCloudpickle = 4
)

// probed is what probeScript says.
type probed struct {
	Purelib    string `json:"purelib"`
	PythonPath string `json:"python_path"`
	manifest.Python
}

// pycachePrefix is where the precompile writes bytecode: the sandbox's own /tmp, never the
// host (and never the root, read-only in every sandbox).
const pycachePrefix = "/tmp/readie-pycache"

// precompileScript compiles the executor as `python3 -m compileall -q DIR` does, DIR the
// executor's package under the site directory argv[1], into pycachePrefix, then prints the
// bytecode files as one JSON object of name: base64, in writes of 64 KiB that it repeats until
// all is written (the sandbox's stdout pipe takes partial writes). The image's code thus
// writes nothing on the host, and what it prints is bounded by limits.sandbox_output.
const precompileScript = `import base64, compileall, json, os, select, sys
d = os.path.join("/", sys.argv[1], "readie_executor")
ok = compileall.compile_dir(d, quiet=1)
c = sys.pycache_prefix + d
out = json.dumps({n: base64.b64encode(open(os.path.join(c, n), "rb").read()).decode() for n in sorted(os.listdir(c))}).encode()
while out:
    select.select([], [1], [])
    out = out[os.write(1, out[:65536]):]
sys.exit(0 if ok else 1)`

// compileArgs precompiles the executor: the root is read-only in every sandbox, so bytecode
// not made here would be compiled again at every cold start.
func compileArgs(site string) []string {
	return []string{"python3", "-c", precompileScript, site}
}

// imageCode runs an image's own code while a rootfs is made: each run in a gVisor sandbox of
// the pipeline's making (no network, the root read-only, nothing of the host but an empty
// scratch directory where asked), bounded by timeout; never on the host, where a chroot
// would not hold it.
type imageCode struct {
	rt      *launch.Runtime
	timeout time.Duration
	what    string // the image, for errors
	// process is the image config's: python3 is found through its PATH, as in every sandbox.
	process sandbox.Process
}

func newImageCode(rt *launch.Runtime, timeout time.Duration, what string, process sandbox.Process) *imageCode {
	isolated := *rt
	isolated.Flags = sandbox.Flags{Network: "none", Overlay: "none", HostUDS: "none", Extra: slices.Clone(rt.Flags.Extra)}
	return &imageCode{rt: &isolated, timeout: timeout, what: what, process: process}
}

// run runs args in a sandbox whose root is rootfs, with nothing of the host on
// sandbox.ExecutorDir (no host directory: runsc then makes no mount point in the root);
// bundles go in workDir. It returns the start of what the process wrote on stdout, at most
// limit bytes, and an error naming the image and the step; a process that wrote more on stdout
// than the runtime's output limit keeps is an error too.
func (c *imageCode) run(ctx context.Context, step, rootfs, workDir string, env, args []string, limit int64) (string, error) {
	fail := func(err error) error { return fmt.Errorf("image %s: %s: %w", c.what, step, err) }
	sb, err := launch.NewSandbox(launch.SandboxOptions{
		Runtime: c.rt, WorkDir: workDir, NoHostDir: true, KeepLogs: true, // its stdout is read after Delete
		Spec: func(string) (*specs.Spec, error) {
			return sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeSandbox, Rootfs: rootfs, Process: c.process, Env: env, Args: args})
		},
	}, "image", strings.ReplaceAll(step, " ", "-"))
	if err != nil {
		return "", fail(err)
	}
	runCtx, cancel := context.WithTimeoutCause(ctx, c.timeout, fmt.Errorf("%s exceeded its timeout of %s (timeouts.image_probe)", step, c.timeout))
	_, runErr := sb.Run(runCtx)
	cancel()
	deleteErr := sb.Delete(ctx)
	stdout := head(sb.Stdout, limit)
	if dropped, _ := sb.Dropped(); dropped > 0 && runErr == nil {
		runErr = fmt.Errorf("it wrote %d bytes more on its stdout than limits.sandbox_output keeps", dropped)
	}
	if runErr != nil {
		if tail := sb.Tail(10); tail != "" {
			runErr = fmt.Errorf("%w\nits stderr (last lines):\n%s", runErr, tail)
		}
		return stdout, fail(errors.Join(runErr, deleteErr))
	}
	if deleteErr != nil {
		return stdout, fail(deleteErr)
	}
	return stdout, nil
}

// probe runs the image's python3 on base (read-only, with no host directory) and returns what it said: the directory where the executor goes,
// relative to the root, and which python3 it is.
func (c *imageCode) probe(ctx context.Context, base, workDir string) (*probed, error) {
	out, err := c.run(ctx, "python3 probe", base, workDir, nil, []string{"python3", "-B", "-c", probeScript}, 64<<10)
	said := strings.TrimSpace(out)
	status, exited := exitcode.Of(err)
	switch {
	case err == nil:
		var p probed
		if err := json.Unmarshal([]byte(said), &p); err != nil {
			return nil, fmt.Errorf("%w: %s: the probe's answer is not readable: %q", ErrPython, c.what, said)
		}
		site := path.Clean(p.Purelib)
		if !path.IsAbs(site) || site == "/" || strings.ContainsAny(site, "\n\x00") || len(site) > 1024 {
			return nil, fmt.Errorf("%w: %s: python3's purelib directory %q is not an absolute path below /", ErrPython, c.what, p.Purelib)
		}
		if !path.IsAbs(p.PythonPath) || strings.ContainsAny(p.PythonPath, "\n\x00") || p.Version == "" {
			return nil, fmt.Errorf("%w: %s: the probe's answer is not usable: %q", ErrPython, c.what, said)
		}
		p.Purelib = strings.TrimPrefix(site, "/")
		return &p, nil
	case exited && (status == probeTooOld || status == probeNoCloudpickle):
		return nil, fmt.Errorf("%w: %s: %s", ErrPython, c.what, said)
	case strings.Contains(err.Error(), "error finding executable"):
		return nil, fmt.Errorf("%w: %s: python3 is missing (%w)", ErrPython, c.what, err)
	}
	return nil, fmt.Errorf("%w: %s: python3 does not run: %w", ErrPython, c.what, err)
}

// pycName is a bytecode file's name as compileall writes it: MODULE.TAG.pyc.
var pycName = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)\.[a-z]+-[0-9]+\.pyc$`)

// precompile runs the image's python3 on rootfs (read-only, with no host directory) to compile
// the executor, and returns the bytecode it printed as layer entries for its __pycache__: files
// of the executor's modules only, at most 1 MiB each.
func (c *imageCode) precompile(ctx context.Context, rootfs, site, workDir string) ([]layerFile, error) {
	out, err := c.run(ctx, "precompile", rootfs, workDir, []string{"PYTHONPYCACHEPREFIX=" + pycachePrefix}, compileArgs(site), c.rt.OutputLimitOrDefault())
	if err != nil {
		return nil, err
	}
	var printed map[string]string
	if err := json.Unmarshal([]byte(out), &printed); err != nil {
		return nil, fmt.Errorf("image %s: precompile: its output is not the bytecode's JSON: %w", c.what, err)
	}
	modules := executorModules()
	var files []layerFile
	for _, name := range slices.Sorted(maps.Keys(printed)) {
		m := pycName.FindStringSubmatch(name)
		if m == nil || !slices.Contains(modules, m[1]) {
			continue
		}
		data, err := base64.StdEncoding.DecodeString(printed[name])
		if err != nil || len(data) > 1<<20 {
			return nil, fmt.Errorf("image %s: precompile: %s is not base64 of at most 1 MiB", c.what, name)
		}
		files = append(files, layerFile{name: path.Join(site, "readie_executor", "__pycache__", name), data: data})
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("image %s: precompile wrote no bytecode of the executor", c.what)
	}
	return files, nil
}

// head returns up to limit bytes from the start of the file at p.
func head(p string, limit int64) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	data, _ := io.ReadAll(io.LimitReader(f, limit))
	return string(data)
}
