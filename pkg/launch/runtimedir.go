package launch

import "path/filepath"

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
