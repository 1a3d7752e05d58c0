package manifest

import (
	"errors"
	"fmt"
	"strings"
)

// Python is the interpreter of an image, as its own python3 says inside a sandbox: a
// cloudpickle of a function by value loads only on the same implementation and minor
// version.
type Python struct {
	// Version is platform.python_version(), e.g. "3.13.5".
	Version string `json:"version"`
	// Implementation is sys.implementation.name, e.g. "cpython".
	Implementation string `json:"implementation"`
	// CacheTag is sys.implementation.cache_tag, e.g. "cpython-313".
	CacheTag string `json:"cache_tag"`
	// Cloudpickle is the version of cloudpickle in the image.
	Cloudpickle string `json:"cloudpickle"`
}

// ErrPython reports checkpoints whose Python differs from the one a client needs.
var ErrPython = errors.New("python mismatch")

// minor returns "X.Y" of a version "X.Y.Z...".
func minor(version string) string {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return version
	}
	return parts[0] + "." + parts[1]
}

// CheckPython refuses checkpoints whose interpreter a client with want cannot send functions
// to by value: another implementation, another minor version (want.Version may be "3.13" or
// "3.13.1": only X.Y is compared), or, when want names one, another cloudpickle version.
// Empty fields of want are not compared. A manifest that records no python is refused: what
// it holds is unknown.
func (m *Manifest) CheckPython(want Python) error {
	have := m.Python
	if have == nil {
		return fmt.Errorf("%w: the manifest records no python (made before it was recorded): capture again", ErrPython)
	}
	var problems []string
	if want.Implementation != "" && want.Implementation != have.Implementation {
		problems = append(problems, fmt.Sprintf("implementation %s, the client's %s", have.Implementation, want.Implementation))
	}
	if want.Version != "" && minor(want.Version) != minor(have.Version) {
		problems = append(problems, fmt.Sprintf("python %s, the client's %s (a function pickled by value loads only on the same minor version)", have.Version, want.Version))
	}
	if want.CacheTag != "" && want.CacheTag != have.CacheTag {
		problems = append(problems, fmt.Sprintf("cache tag %s, the client's %s", have.CacheTag, want.CacheTag))
	}
	if want.Cloudpickle != "" && want.Cloudpickle != have.Cloudpickle {
		problems = append(problems, fmt.Sprintf("cloudpickle %s, the client's %s", have.Cloudpickle, want.Cloudpickle))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: the checkpoints hold %s", ErrPython, strings.Join(problems, "; "))
	}
	return nil
}
