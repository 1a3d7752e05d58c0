package output

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/internal/oci/verify"
	"readie.dev/pipeline/pkg/atomicfile"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
)

// The files of a runtime directory (pull --runtime DIR; its entries: launch.RuntimeIn) that
// are no entry.
const (
	// runtimeRecordName names the layer each part of the directory was laid out from, written
	// once every check passed: a later pull skips a layer it names.
	runtimeRecordName = ".readie-runtime.json"
	runtimeStaging    = ".staging-"
)

// ErrRuntimeDir reports a runtime directory that holds another runtime, or entries no pull
// laid out: it is left as it is.
var ErrRuntimeDir = errors.New("unusable runtime directory")

// RuntimeOf returns the runtime laid out in dir (pull --runtime DIR; launch.RuntimeIn).
func RuntimeOf(dir string) Runtime {
	d := launch.RuntimeIn(dir)
	return Runtime{Runsc: d.Runsc, HelpersDir: d.Helpers, Rootfs: d.Rootfs}
}

// runtimeRecord is the record file: each part's layer digest.
type runtimeRecord struct {
	Runsc  string `json:"runsc_layer,omitempty"`
	Rootfs string `json:"rootfs_layer,omitempty"`
}

// runtimePart is one runtime layer and the entries of the directory it lays out, in the order
// they are put in place: the last one there says they all are. An entry the layer lacks (the
// helpers of a runsc captured without them) is none of the directory's.
type runtimePart struct {
	name     string
	layer    v1.Hash
	entries  []string
	recorded *string
	fetch    bool
}

// PullRuntime lays out the runtime layers of img (RuntimeLayers) in dir, made when missing:
// dir/runsc, dir/gvisor-bin/, dir/rootfs, under an flock on dir (no lock file: dir changes
// only when a pull succeeds). A layer the directory's record already names is not fetched;
// the others are read through package verify into a staging directory inside dir (unpack's
// Applier: modes, owners and symbolic links kept, nothing executed), and the whole runtime,
// skipped parts included, is checked against m (runsc's sha256, its helpers, the rootfs
// digest) before the record names the new layers and their entries are renamed into place.
// A layer of other bytes, a runtime other than m's, another runtime in dir or entries no pull
// laid out are refused, and dir is left as it was.
func PullRuntime(ctx context.Context, img v1.Image, m *manifest.Manifest, dir string, limits unpack.Limits, log logrus.FieldLogger, done func(verify.Layer)) (err error) {
	digests, err := RuntimeLayers(img)
	if err != nil {
		return err
	}
	if digests.Runsc.Hex == "" || digests.Rootfs.Hex == "" {
		return fmt.Errorf("%w: it carries no runtime (no %s and %s annotations): it was pushed from an image's rootfs, or by a pipeline before the runtime layers", ErrImage, AnnotationRuntimeRunsc, AnnotationRuntimeRootfs)
	}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		defer func() {
			if err != nil {
				os.Remove(dir) // made here, and empty again: left as it was
			}
		}()
	}
	unlock, err := lockDir(ctx, dir, log)
	if err != nil {
		return err
	}
	defer unlock()
	if err := removeStaging(dir); err != nil {
		return err
	}
	var rec runtimeRecord
	switch data, err := os.ReadFile(filepath.Join(dir, runtimeRecordName)); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	default:
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("%w %s: %s: %w", ErrRuntimeDir, dir, runtimeRecordName, err)
		}
	}
	parts := []*runtimePart{
		{name: "runsc", layer: digests.Runsc, entries: []string{launch.RuntimeHelpers, launch.RuntimeRunsc}, recorded: &rec.Runsc},
		{name: "rootfs", layer: digests.Rootfs, entries: []string{launch.RuntimeRootfs}, recorded: &rec.Rootfs},
	}
	wanted := map[v1.Hash]bool{}
	for _, p := range parts {
		if p.fetch, err = p.needed(dir); err != nil {
			return err
		}
		if p.fetch {
			wanted[p.layer] = true
		} else {
			log.WithFields(logrus.Fields{"layer": p.layer.String(), "dir": dir}).Infof("pull: the runtime's %s layer is in the directory already", p.name)
		}
	}

	var staging string
	if len(wanted) > 0 {
		if staging, err = os.MkdirTemp(dir, runtimeStaging); err != nil {
			return err
		}
		defer os.RemoveAll(staging)
		root, err := os.OpenRoot(staging)
		if err != nil {
			return err
		}
		defer root.Close()
		a := unpack.NewApplier(root, unpack.NewBudget(limits))
		want := func(l verify.Layer) bool { return wanted[l.Digest] }
		if _, err := verify.SomeLayers(ctx, img, want, func(_ verify.Layer, tr *tar.Reader) error { return a.Apply(tr) }, done); err != nil {
			return fmt.Errorf("runtime: %w", err)
		}
	}
	// The runtime as it will be: fetched parts from staging, the others from dir.
	staged := filepath.Join(staging, RuntimeRoot)
	where := func(p *runtimePart) string {
		if p.fetch {
			return staged
		}
		return dir
	}
	rt := Runtime{Runsc: RuntimeOf(where(parts[0])).Runsc, HelpersDir: RuntimeOf(where(parts[0])).HelpersDir, Rootfs: RuntimeOf(where(parts[1])).Rootfs}
	if err := rt.check(m); err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	if len(wanted) == 0 {
		return nil
	}

	// The record first: a pull that dies before every entry is in place leaves a recorded
	// layer with an entry missing, which the next pull fetches again (needed).
	for _, p := range parts {
		if p.fetch {
			*p.recorded = p.layer.String()
		}
	}
	if err := atomicfile.WriteJSON(filepath.Join(dir, runtimeRecordName), rec); err != nil {
		return err
	}
	for _, p := range parts {
		if !p.fetch {
			continue
		}
		for _, e := range p.entries {
			if _, err := os.Lstat(filepath.Join(staged, e)); errors.Is(err, fs.ErrNotExist) {
				continue // not in this layer
			}
			if err := os.RemoveAll(filepath.Join(dir, e)); err != nil { // what a dead pull put in place
				return err
			}
			if err := os.Rename(filepath.Join(staged, e), filepath.Join(dir, e)); err != nil {
				return fmt.Errorf("put %s in place: %w", e, err)
			}
		}
		log.WithFields(logrus.Fields{"layer": p.layer.String(), "dir": dir}).Infof("pull: the runtime's %s layer laid out", p.name)
	}
	return unpack.SyncDir(dir)
}

// needed says whether p's layer must be fetched into dir: no (the record names it and its
// last entry is there) or yes (no record of it and none of its entries, or a pull that died
// while it put them in place). Another layer recorded, or an entry without a record, is
// refused.
func (p *runtimePart) needed(dir string) (bool, error) {
	var present []string
	last := false
	for i, e := range p.entries {
		if _, err := os.Lstat(filepath.Join(dir, e)); err == nil {
			present = append(present, e)
			last = i == len(p.entries)-1
		} else if !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
	}
	switch {
	case *p.recorded == p.layer.String():
		return !last, nil
	case *p.recorded != "":
		return false, fmt.Errorf("%w %s: it holds the %s of another runtime (layer %s; this output's is %s): a runtime directory holds one runtime, name another",
			ErrRuntimeDir, dir, p.name, *p.recorded, p.layer)
	case len(present) > 0:
		return false, fmt.Errorf("%w %s: %s is there and no pull laid it out (%s names no %s layer): remove it, or name another directory",
			ErrRuntimeDir, dir, strings.Join(present, " and "), runtimeRecordName, p.name)
	}
	return true, nil
}

// removeStaging removes the staging directories of pulls that died (the caller holds dir's
// lock: no other pull is under way).
func removeStaging(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), runtimeStaging) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("remove what a pull that died left: %w", err)
			}
		}
	}
	return nil
}

// lockDir takes an flock on the directory dir itself, polling while another pull holds it,
// until ctx is done; it says once that it waits. The kernel drops the lock of a pull that dies.
func lockDir(ctx context.Context, dir string, log logrus.FieldLogger) (func(), error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", dir, err)
		}
		if !said {
			log.WithField("dir", dir).Info("pull: waiting for another pull into the runtime directory")
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another pull into %s: %w", dir, context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
}
