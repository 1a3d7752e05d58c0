package launch

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/limitread"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/runsc"
)

// The entries of a runtime directory, as `pipeline pull REF OUT --runtime DIR` lays it out for
// a worker host: the runsc binary, its helpers in gvisor-bin/ beside it (where runsc looks for
// them), and the rootfs the output was captured on.
const (
	RuntimeRunsc   = "runsc"
	RuntimeHelpers = "gvisor-bin"
	RuntimeRootfs  = "rootfs"
)

// RuntimeDir is the paths of a runtime directory's entries.
type RuntimeDir struct{ Runsc, Helpers, Rootfs string }

// RuntimeIn returns the paths of the runtime laid out in dir.
func RuntimeIn(dir string) RuntimeDir {
	return RuntimeDir{Runsc: filepath.Join(dir, RuntimeRunsc), Helpers: filepath.Join(dir, RuntimeHelpers), Rootfs: filepath.Join(dir, RuntimeRootfs)}
}

// ErrRuntimeDir reports a runtime directory that cannot be used: others can enter it, an
// entry is not what a pull lays out (a symbolic link, a FIFO, a runsc linked elsewhere), it
// holds another runtime or entries no pull laid out.
var ErrRuntimeDir = errors.New("unusable runtime directory")

// CheckRuntimeDir checks, before any of it runs, that dir holds m's runsc: dir is private
// (OpenPrivateDir: no one else can change what runs as root), its runsc and helpers are
// regular files (ReadRunscIn) whose digests are m's (manifest.CheckRunsc: byte for byte, in a
// manifest that records them). It returns dir's entries, their paths absolute. The rootfs is
// left to whoever opens it (manifest.CheckRootfs).
func CheckRuntimeDir(dir string, m *manifest.Manifest) (RuntimeDir, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return RuntimeDir{}, err
	}
	root, err := OpenPrivateDir(abs)
	if err != nil {
		return RuntimeDir{}, fmt.Errorf("%w %s: %w", ErrRuntimeDir, dir, err)
	}
	defer root.Close()
	sum, helpers, err := ReadRunscIn(root)
	if err != nil {
		return RuntimeDir{}, fmt.Errorf("runtime directory %s: %w", dir, err)
	}
	if err := m.CheckRunsc(sum, helpers); err != nil {
		return RuntimeDir{}, fmt.Errorf("runtime directory %s: %w (its runsc was not run)", dir, err)
	}
	return RuntimeIn(abs), nil
}

// OpenPrivateDir opens dir as an os.Root once CheckPrivateDir passed, and checks that the
// directory opened is the one checked.
func OpenPrivateDir(dir string) (*os.Root, error) {
	checked, err := CheckPrivateDir(dir)
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	if opened, err := root.Stat("."); err != nil || !os.SameFile(checked, opened) {
		root.Close()
		return nil, fmt.Errorf("%w: %s changed while it was checked", ErrNotPrivate, dir)
	}
	return root, nil
}

// OpenDirIn opens the directory name in root as an os.Root of its own, refusing anything but
// a directory (a symbolic link to one included: the directory it names is another).
func OpenDirIn(root *os.Root, name string) (*os.Root, error) {
	fi, err := root.Lstat(name)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s is not a directory (%s)", ErrRuntimeDir, name, fi.Mode())
	}
	return root.OpenRoot(name)
}

// ReadRunscIn returns the sha256 of the runsc in the runtime directory root is opened on and
// the digests of the helpers in its gvisor-bin/, by name (absent: none), reading them through
// root and running nothing. runsc and each helper must be a regular file of one link (a
// symbolic link, a FIFO, a device or a file of another name too is refused:
// limitread.OpenRegularIn), gvisor-bin/ a directory.
func ReadRunscIn(root *os.Root) (sha256 string, helpers map[string]string, err error) {
	if sha256, err = digestIn(root, RuntimeRunsc); err != nil {
		return "", nil, err
	}
	helpers = map[string]string{}
	dir, err := OpenDirIn(root, RuntimeHelpers)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return sha256, helpers, nil
	case err != nil:
		return "", nil, err
	}
	defer dir.Close()
	for _, name := range runsc.HelperNames() {
		if _, err := dir.Lstat(name); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if helpers[name], err = digestIn(dir, name); err != nil {
			return "", nil, fmt.Errorf("%s: %w", RuntimeHelpers, err)
		}
	}
	return sha256, helpers, nil
}

// digestIn returns the sha256 of the regular file name in root, of one link.
func digestIn(root *os.Root, name string) (string, error) {
	f, err := limitread.OpenRegularIn(root, name)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrRuntimeDir, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	// A hard link shares the file with another name (a rootfs file, which a sandbox may see):
	// what changes there would change what root runs.
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Nlink != 1 {
		return "", fmt.Errorf("%w: %s has other names (hard links), want a file of its own", ErrRuntimeDir, name)
	}
	_, sum, err := filedigest.OfReader(f, name)
	return sum, err
}
