package output

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/oci/unpack"
	"readie.dev/pipeline/internal/oci/verify"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/limitread"
	"readie.dev/pipeline/pkg/manifest"
)

// The files of a runtime directory (pull --runtime DIR; its entries: launch.RuntimeIn) that
// are no entry.
const (
	// runtimeRecordName names the layer each part of the directory was laid out from, written
	// once every check passed: a later pull skips a layer it names.
	runtimeRecordName = ".readie-runtime.json"
	runtimeStaging    = ".staging-"
	// runtimeRecordLimit bounds the record file read: it holds two digests.
	runtimeRecordLimit = 64 << 10
)

// runtimeRecord is the record file: each part's layer digest.
type runtimeRecord struct {
	Runsc  string `json:"runsc_layer,omitempty"`
	Rootfs string `json:"rootfs_layer,omitempty"`
}

// runtimePart is one runtime layer and the entries of the directory it may lay out, in the
// order they are put in place: those it removes and replaces when it is fetched, and refuses
// when the record does not name it. laidOut are the ones this output's layer lays out (the
// helpers of a runsc captured without them are none): all of them there say it is laid out.
type runtimePart struct {
	name     string
	layer    v1.Hash
	entries  []string
	laidOut  []string
	recorded *string
	fetch    bool
}

// PullRuntime lays out the runtime layers of img (RuntimeLayers) in dir: dir/runsc,
// dir/gvisor-bin/, dir/rootfs. dir is made 0700 when missing and must be private
// (launch.OpenPrivateDir: a directory of this user's alone, not a symbolic link): root runs
// the runsc there, and trusts its record. Under an flock on dir (no lock file: dir changes
// only when a pull succeeds), a layer the directory's record already names is not fetched;
// the others are read through package verify into a staging directory inside dir (unpack's
// Applier: modes, owners and symbolic links kept, nothing executed). Every access after the
// unpack goes through an os.Root on dir, and no symbolic link is followed: the runtime as it
// will be, skipped parts included, must be real directories (readie-runtime/, gvisor-bin/,
// rootfs/) and regular files (runsc and each helper of one link, the rootfs's record read
// within a limit), and is checked against m byte for byte (manifest.CheckRunsc,
// CheckRootfsDigest: a manifest without runsc's sha256 or the rootfs digest is refused).
// Then runsc and its helpers are made this user's, mode 0755, the record names the new layers
// and their entries are renamed into place. A layer of other bytes, a runtime other than m's,
// an entry of another type, another runtime in dir or entries no pull laid out are refused,
// and dir is left as it was (a dir made here is removed).
func PullRuntime(ctx context.Context, img v1.Image, m *manifest.Manifest, dir string, limits unpack.Limits, log logrus.FieldLogger, done func(verify.Layer)) (err error) {
	digests, err := RuntimeLayers(img)
	if err != nil {
		return err
	}
	if digests.Runsc.Hex == "" || digests.Rootfs.Hex == "" {
		return fmt.Errorf("%w: it carries no runtime (no %s and %s annotations): it was pushed without push --runtime (or from an image's rootfs)", ErrImage, AnnotationRuntimeRunsc, AnnotationRuntimeRootfs)
	}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		defer func() {
			if err != nil {
				os.Remove(dir) // made here, and empty again: left as it was
			}
		}()
	}
	root, err := launch.OpenPrivateDir(dir)
	if err != nil {
		return fmt.Errorf("%w: %w (root runs the runsc laid out there)", launch.ErrRuntimeDir, err)
	}
	defer root.Close()
	unlock, err := lockDir(ctx, root, dir, log)
	if err != nil {
		return err
	}
	defer unlock()
	if err := removeStaging(root); err != nil {
		return err
	}
	rec, err := readRecord(root, dir)
	if err != nil {
		return err
	}
	runscLaidOut := []string{launch.RuntimeRunsc}
	if len(m.Runsc.Helpers) > 0 {
		runscLaidOut = append(runscLaidOut, launch.RuntimeHelpers)
	}
	parts := []*runtimePart{
		{name: "runsc", layer: digests.Runsc, entries: []string{launch.RuntimeHelpers, launch.RuntimeRunsc}, laidOut: runscLaidOut, recorded: &rec.Runsc},
		{name: "rootfs", layer: digests.Rootfs, entries: []string{launch.RuntimeRootfs}, laidOut: []string{launch.RuntimeRootfs}, recorded: &rec.Rootfs},
	}
	wanted := map[v1.Hash]bool{}
	for _, p := range parts {
		if p.fetch, err = p.needed(root, dir); err != nil {
			return err
		}
		if p.fetch {
			wanted[p.layer] = true
		} else {
			log.WithFields(logrus.Fields{"layer": p.layer.String(), "dir": dir}).Infof("pull: the runtime's %s layer is in the directory already", p.name)
		}
	}

	var staging string // the staging directory's name in dir, when a layer is fetched
	var staged *os.Root
	if len(wanted) > 0 {
		staging = runtimeStaging + rand.Text()
		if err := root.Mkdir(staging, 0o700); err != nil {
			return err
		}
		defer root.RemoveAll(staging)
		if staged, err = unpackRuntime(ctx, img, root, staging, wanted, limits, done); err != nil {
			return fmt.Errorf("runtime: %w", err)
		}
		defer staged.Close()
	}
	// The runtime as it will be: fetched parts from staging, the others from dir.
	from := func(p *runtimePart) *os.Root {
		if p.fetch {
			return staged
		}
		return root
	}
	sum, helpers, err := launch.ReadRunscIn(from(parts[0]))
	if err == nil {
		err = m.CheckRunsc(sum, helpers)
	}
	if err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	if err := checkRootfsIn(from(parts[1]), m); err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	if len(wanted) == 0 {
		return nil
	}
	if parts[0].fetch {
		if err := ownRunsc(staged, helpers); err != nil {
			return err
		}
	}

	// The record first: a pull that dies before every entry is in place leaves a recorded
	// layer with an entry missing, which the next pull fetches again (needed).
	for _, p := range parts {
		if p.fetch {
			*p.recorded = p.layer.String()
		}
	}
	if err := writeRecord(root, staging, rec); err != nil {
		return err
	}
	for _, p := range parts {
		if !p.fetch {
			continue
		}
		for _, e := range p.entries {
			src := filepath.Join(staging, RuntimeRoot, e)
			if _, err := root.Lstat(src); errors.Is(err, fs.ErrNotExist) {
				continue // not in this layer
			}
			if err := root.RemoveAll(e); err != nil { // what a dead pull put in place
				return err
			}
			if err := root.Rename(src, e); err != nil {
				return fmt.Errorf("put %s in place: %w", e, err)
			}
		}
		log.WithFields(logrus.Fields{"layer": p.layer.String(), "dir": dir}).Infof("pull: the runtime's %s layer laid out", p.name)
	}
	return syncDir(root)
}

// unpackRuntime unpacks the wanted layers of img into the directory staging of root and
// returns its RuntimeRoot opened, a directory itself (not a symbolic link to one).
func unpackRuntime(ctx context.Context, img v1.Image, root *os.Root, staging string, wanted map[v1.Hash]bool, limits unpack.Limits, done func(verify.Layer)) (*os.Root, error) {
	into, err := root.OpenRoot(staging)
	if err != nil {
		return nil, err
	}
	defer into.Close()
	a := unpack.NewApplier(into, unpack.NewBudget(limits))
	want := func(l verify.Layer) bool { return wanted[l.Digest] }
	if _, err := verify.SomeLayers(ctx, img, want, func(_ verify.Layer, tr *tar.Reader) error { return a.Apply(tr) }, done); err != nil {
		return nil, err
	}
	staged, err := launch.OpenDirIn(into, RuntimeRoot)
	if err != nil {
		return nil, fmt.Errorf("the runtime layers: %w", err)
	}
	return staged, nil
}

// checkRootfsIn refuses the rootfs of the runtime directory root unless it is a directory
// whose record (a regular file, read within a limit: manifest.ReadRootfsInfoIn) names m's
// rootfs digest.
func checkRootfsIn(root *os.Root, m *manifest.Manifest) error {
	rootfs, err := launch.OpenDirIn(root, launch.RuntimeRootfs)
	if err != nil {
		return err
	}
	defer rootfs.Close()
	info, err := manifest.ReadRootfsInfoIn(rootfs)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", launch.ErrRuntimeDir, launch.RuntimeRootfs, err)
	}
	return m.CheckRootfsDigest(info.Digest)
}

// ownRunsc makes runsc and the helpers in root this user's (root's), mode 0755, whatever the
// layer gave them: no one else may rewrite what root runs.
func ownRunsc(root *os.Root, helpers map[string]string) error {
	names := []string{launch.RuntimeRunsc}
	for name := range helpers {
		names = append(names, filepath.Join(launch.RuntimeHelpers, name))
	}
	for _, name := range names {
		if err := root.Lchown(name, os.Geteuid(), os.Getegid()); err != nil {
			return err
		}
		// chmod after chown: chown clears the setuid and setgid bits.
		if err := root.Chmod(name, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// readRecord reads the record file of the runtime directory root (dir); none is an empty
// record.
func readRecord(root *os.Root, dir string) (runtimeRecord, error) {
	var rec runtimeRecord
	data, err := limitread.ReadIn(root, runtimeRecordName, runtimeRecordLimit, "the limit on a runtime directory's record")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return rec, nil
	case err != nil:
		return rec, fmt.Errorf("%w %s: %w", launch.ErrRuntimeDir, dir, err)
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("%w %s: %s: %w", launch.ErrRuntimeDir, dir, runtimeRecordName, err)
	}
	return rec, nil
}

// writeRecord replaces the record file of the runtime directory root atomically: written and
// synced in the staging directory, then renamed over it.
func writeRecord(root *os.Root, staging string, rec runtimeRecord) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(staging, runtimeRecordName)
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(append(data, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := root.Rename(tmp, runtimeRecordName); err != nil {
		return err
	}
	return syncDir(root)
}

// syncDir syncs the directory root is opened on: what was renamed into it stays there.
func syncDir(root *os.Root) error {
	d, err := root.Open(".")
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// needed says whether p's layer must be fetched into the runtime directory root (dir): no
// (the record names it and every entry it lays out is there) or yes (no record of it and
// none of its entries, or a pull that died while it put them in place, or an entry removed
// since). Another layer recorded, or an entry without a record, is refused.
func (p *runtimePart) needed(root *os.Root, dir string) (bool, error) {
	var present []string
	for _, e := range p.entries {
		if _, err := root.Lstat(e); err == nil {
			present = append(present, e)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
	}
	switch {
	case *p.recorded == p.layer.String():
		for _, e := range p.laidOut {
			if !slices.Contains(present, e) {
				return true, nil
			}
		}
		return false, nil
	case *p.recorded != "":
		return false, fmt.Errorf("%w %s: it holds the %s of another runtime (layer %s; this output's is %s): a runtime directory holds one runtime, name another",
			launch.ErrRuntimeDir, dir, p.name, *p.recorded, p.layer)
	case len(present) > 0:
		return false, fmt.Errorf("%w %s: %s is there and no pull laid it out (%s names no %s layer): remove it, or name another directory",
			launch.ErrRuntimeDir, dir, strings.Join(present, " and "), runtimeRecordName, p.name)
	}
	return true, nil
}

// removeStaging removes the staging directories of pulls that died from the runtime directory
// root (the caller holds its lock: no other pull is under way).
func removeStaging(root *os.Root) error {
	d, err := root.Open(".")
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, name := range names {
		if strings.HasPrefix(name, runtimeStaging) {
			if err := root.RemoveAll(name); err != nil {
				return fmt.Errorf("remove what a pull that died left: %w", err)
			}
		}
	}
	return nil
}

// lockDir takes an flock on the directory root is opened on (dir) itself, polling while
// another pull holds it, until ctx is done; it says once that it waits. The kernel drops the
// lock of a pull that dies.
func lockDir(ctx context.Context, root *os.Root, dir string, log logrus.FieldLogger) (func(), error) {
	f, err := root.Open(".")
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
