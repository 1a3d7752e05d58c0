package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/measure"
	"readie.dev/pipeline/pkg/pool"
	"readie.dev/pipeline/pkg/pycall"
)

// LastPageSuffix ends the name of the series that times a variant's restore to its last page
// loaded (NAME:last-page), beside the variant's own series, to its first answer.
const LastPageSuffix = ":last-page"

// pagesLoadedLine is what the sandbox logs (at info level) once every page of the image is in
// memory, whether loaded before the restore returned or in the background (-background):
// pkg/sentry/kernel/kernel_restore.go of the pinned gVisor.
const pagesLoadedLine = "All MemoryFile pages have been loaded."

// OwnImage reports whether the variant restores an image captured for it alone: with
// checkpoint options, global flags or pre-checkpoint steps.
func (v Variant) OwnImage() bool {
	return len(v.CheckpointOptions) > 0 || len(v.GlobalFlags) > 0 || len(v.PreCheckpoint) > 0
}

// imageKey names what the variant's image is captured with, the same for equal captures; ""
// for the output's own image. Checkpoint options alone read as they always did
// (bench.json's variant_bytes).
func (v Variant) imageKey() string {
	parts := []string{}
	if key := optionsKey(v.CheckpointOptions); key != "" {
		parts = append(parts, key)
	}
	if len(v.GlobalFlags) > 0 {
		parts = append(parts, "flags="+strings.Join(v.GlobalFlags, " "))
	}
	if len(v.PreCheckpoint) > 0 {
		parts = append(parts, "pre_checkpoint="+strings.Join(v.PreCheckpoint, "+"))
	}
	return strings.Join(parts, ",")
}

// withHelpersDir gives the variants WithoutHelpers an empty directory under work as runsc's
// helpers directory, where runsc finds none.
func withHelpersDir(variants []Variant, work string) error {
	for i := range variants {
		if !variants[i].WithoutHelpers {
			continue
		}
		dir := filepath.Join(work, "no-helpers")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		variants[i].noHelpers = dir
	}
	return nil
}

// runtime is rt with the variant's global flags added, without runsc's helpers when the
// variant says so, and, when logDir is set, runsc's log at its default (info) level in logDir:
// without --debug, so that the few lines cost little, and the same for every variant.
func (v Variant) runtime(rt *launch.Runtime, logDir string) *launch.Runtime {
	c := *rt
	if v.WithoutHelpers {
		c.HelpersDir = v.noHelpers
	}
	c.Flags.Extra = append(slices.Clone(rt.Flags.Extra), v.GlobalFlags...)
	if logDir != "" {
		c.Flags.Extra = append(c.Flags.Extra, "--debug-log="+strings.TrimSuffix(logDir, "/")+"/")
	}
	return &c
}

// restorer is r restoring with the variant's flags in sandboxes of its runtime.
func (v Variant) restorer(r *measure.Restorer, logDir string) *measure.Restorer {
	c := *r
	c.Runtime = v.runtime(r.Runtime, logDir)
	c.Flags = slices.Clone(v.Flags)
	return &c
}

// variantRequest is pycall.ImportRequest's call that also returns the executor's count of frozen
// objects, so that a variant's answer shows its pre-checkpoint steps took effect.
func variantRequest(imports []string) ([]byte, error) {
	list, err := pycall.PyList(imports)
	if err != nil {
		return nil, err
	}
	return pycall.EvalRequest(fmt.Sprintf(`[len([__import__(m) for m in %s]), __import__("gc").get_freeze_count()]`, list))
}

// checkVariant checks the answer to variantRequest: every module imported, and objects frozen
// exactly when the variant's steps froze them.
func checkVariant(response []byte, imports []string, v Variant) error {
	value, err := pycall.DecodeEnvelope(response)
	if err != nil {
		return err
	}
	got, ok := value.([]any)
	if !ok || len(got) != 2 {
		return fmt.Errorf("variant call returned %s, want [imported, frozen]", pycall.Format(value, pycall.ErrorBytes))
	}
	n, okN := got[0].(int64)
	frozen, okF := got[1].(int64)
	if !okN || !okF || n != int64(len(imports)) {
		return fmt.Errorf("variant call returned %s, want %d modules imported", pycall.Format(value, pycall.ErrorBytes), len(imports))
	}
	if froze := slices.Contains(v.PreCheckpoint, "gc.freeze"); froze != (frozen > 0) {
		return fmt.Errorf("the restored executor has %d objects frozen, but the variant's pre-checkpoint steps are %q", frozen, v.PreCheckpoint)
	}
	return nil
}

// timeVariant restores the variant's image of set (dir) into a sandbox it makes, with runsc's
// info log in logDir, and times it to the first answer; after the answer, off the clock, it
// waits for the sandbox to log its last page loaded (with -background the pages may still be
// loading) and returns that too, both from the start of `runsc restore`, and the restore's CPU
// time as the sandbox logs it.
func timeVariant(ctx context.Context, r *measure.Restorer, v Variant, set MeasuredSet, dir, logDir string) (first, lastPage, cpu float64, err error) {
	request, err := variantRequest(set.Imports)
	if err != nil {
		return 0, 0, 0, err
	}
	vr := v.restorer(r, logDir)
	var began time.Time
	marks, err := vr.TimedCall(ctx, launch.Call{SetID: set.ID, Step: "variant", Prepare: func(context.Context, *launch.Sandbox) error {
		began = time.Now() // the clock starts as Prepare returns: `runsc restore` follows at once
		return nil
	}, Image: launch.Image{Dir: dir, Flags: vr.Flags}, Request: request, Check: func(resp []byte) error {
		if err := checkVariant(resp, set.Imports, v); err != nil {
			return err
		}
		// Before TimedCall deletes the sandbox, which would end a background load unlogged.
		zone, err := bootLogZone()
		if err != nil {
			return err
		}
		loaded, err := waitPagesLoaded(ctx, logDir, began.In(zone).Year(), zone, vr.Timeout)
		if err != nil {
			return err
		}
		if loaded.Before(began) {
			return fmt.Errorf("the sandbox's log in %s says its last page was loaded at %s, before its restore began (%s): its times are not in the zone read (%s)", logDir, loaded.Format(time.RFC3339Nano), began.Format(time.RFC3339Nano), zone)
		}
		lastPage = launch.MS(loaded.Sub(began))
		cpu, err = waitRestoreCPU(ctx, logDir, vr.Timeout)
		return err
	}, MaxResponseSize: pycall.SmallResponse})
	if err != nil {
		return 0, 0, 0, err
	}
	return marks.TotalMS(), lastPage, cpu, nil
}

// timePooledVariant is TimePooledCall with the variant's request and check, from p (a pool of
// the variant's runtime).
func timePooledVariant(ctx context.Context, p *pool.Pool, v Variant, set MeasuredSet, dir string, timeout time.Duration) (float64, error) {
	request, err := variantRequest(set.Imports)
	if err != nil {
		return 0, err
	}
	if err := p.Wait(ctx); err != nil {
		return 0, err
	}
	marks, err := pooledCall(ctx, p, dir, v.Flags, timeout, request, func(resp []byte) error { return checkVariant(resp, set.Imports, v) })
	if err != nil {
		return 0, err
	}
	return marks.TotalMS(), p.Wait(ctx)
}

// bootLogZone returns the zone of the times in a sandbox's log (*.boot.txt): `runsc boot`
// runs with an empty environment (runsc/sandbox/sandbox.go), so the TZ=UTC the pipeline gives
// runsc does not reach it and it logs in the host's zone, /etc/localtime's (UTC without one,
// as Go reads it).
func bootLogZone() (*time.Location, error) {
	data, err := os.ReadFile("/etc/localtime")
	if errors.Is(err, fs.ErrNotExist) {
		return time.UTC, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the host's time zone, for the sandbox's log: %w", err)
	}
	zone, err := time.LoadLocationFromTZData("/etc/localtime", data)
	if err != nil {
		return nil, fmt.Errorf("the host's time zone, for the sandbox's log: %w", err)
	}
	return zone, nil
}

// waitPagesLoaded polls the sandbox's log in logDir (*.boot.txt) until it says every page is
// loaded, at most limit, and returns the time of that line, read in zone (bootLogZone).
func waitPagesLoaded(ctx context.Context, logDir string, year int, zone *time.Location, limit time.Duration) (time.Time, error) {
	var at time.Time
	err := waitLogged(ctx, pagesLoadedLine, logDir, limit, func() (err error) {
		at, err = pagesLoadedAt(logDir, year, zone)
		return err
	})
	return at, err
}

// waitRestoreCPU polls the sandbox's log in logDir until it gives the restore's CPU time (it
// is logged once the restore's work is done, pages loaded in the background included), at
// most limit, and returns it in milliseconds.
func waitRestoreCPU(ctx context.Context, logDir string, limit time.Duration) (float64, error) {
	var ms float64
	err := waitLogged(ctx, restoreCPULine, logDir, limit, func() (err error) {
		ms, err = restoreCPUMs(logDir)
		return err
	})
	return ms, err
}

// waitLogged calls read every few milliseconds until it returns anything but errNotYet, at
// most limit: what names the line awaited in the sandbox's log in logDir.
func waitLogged(ctx context.Context, what, logDir string, limit time.Duration, read func() error) error {
	ctx, cancel := context.WithTimeoutCause(ctx, limit, fmt.Errorf("the sandbox did not log %q within %s (logs in %s)", what, limit, logDir))
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := read(); err == nil || !errors.Is(err, errNotYet) {
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
		}
	}
}

var errNotYet = errors.New("not logged yet")

// pagesLoadedAt returns the time of pagesLoadedLine in the one boot log of logDir, read in
// zone, or errNotYet.
func pagesLoadedAt(logDir string, year int, zone *time.Location) (time.Time, error) {
	var at time.Time
	var parseErr error
	err := scanBootLog(logDir, func(line string) bool {
		if !strings.HasSuffix(line, pagesLoadedLine) {
			return true
		}
		at, parseErr = glogLineTime(line, year, zone)
		return false
	})
	switch {
	case err != nil:
		return time.Time{}, err
	case parseErr != nil:
		return time.Time{}, parseErr
	case at.IsZero():
		return time.Time{}, errNotYet
	}
	return at, nil
}

// restoreCPULine is what the sandbox logs (at info level) once its restore is done: "CPU time
// saved with restore: N ms, restore CPU time: M ms", M the sandbox process's CPU time then
// (clock_gettime(CLOCK_PROCESS_CPUTIME_ID): its boot and the restore, every thread):
// runsc/boot/restore.go calculateCPUSavings of the pinned gVisor.
const restoreCPULine = "restore CPU time: "

var restoreCPUTime = regexp.MustCompile(`restore CPU time: (\d+) ms`)

// restoreCPUMs returns the restore CPU time logged in the one boot log of logDir, in ms, or
// errNotYet.
func restoreCPUMs(logDir string) (float64, error) {
	ms := -1.0
	var parseErr error
	err := scanBootLog(logDir, func(line string) bool {
		if !strings.Contains(line, restoreCPULine) {
			return true
		}
		m := restoreCPUTime.FindStringSubmatch(line)
		if m == nil {
			parseErr = fmt.Errorf("a restore CPU time runsc's log gives in a form not known here: %q", line)
			return false
		}
		ms, parseErr = strconv.ParseFloat(m[1], 64)
		return false
	})
	switch {
	case err != nil:
		return 0, err
	case parseErr != nil:
		return 0, parseErr
	case ms < 0:
		return 0, errNotYet
	}
	return ms, nil
}

// scanBootLog calls keep with each line of the one sandbox log (*.boot.txt) in logDir until it
// returns false; errNotYet while there is none.
func scanBootLog(logDir string, keep func(line string) bool) error {
	boots, _ := filepath.Glob(filepath.Join(logDir, "*.boot.txt"))
	if len(boots) > 1 {
		return fmt.Errorf("want one sandbox log in %s, found %d", logDir, len(boots))
	}
	if len(boots) == 0 {
		return errNotYet
	}
	return scanLines(boots[0], keep)
}

// glogLineTime reads the time of a runsc log line (I1203 15:04:05.000000 ...), in zone, in
// year.
func glogLineTime(line string, year int, zone *time.Location) (time.Time, error) {
	m := glogTime.FindStringSubmatch(line)
	if m == nil {
		return time.Time{}, fmt.Errorf("runsc log line without a time: %q", line)
	}
	return time.ParseInLocation("2006 0102 15:04:05.000000", fmt.Sprintf("%d %s %s", year, m[1], m[2]), zone)
}

// variantPools holds a pool per pooled variant's runtime (its global flags, with or without
// runsc's helpers), made on first use; Close deletes every sandbox of them.
type variantPools struct {
	size  int
	pools map[string]*pool.Pool
}

// poolKey names the runtime of a pooled variant: its global flags, and whether without
// runsc's helpers.
func poolKey(v Variant) string {
	key := strings.Join(v.GlobalFlags, " ")
	if v.WithoutHelpers {
		key += " (without helpers)"
	}
	return key
}

func (vp *variantPools) get(ctx context.Context, l *launch.Launcher, v Variant) (*pool.Pool, error) {
	key := poolKey(v)
	if p, ok := vp.pools[key]; ok {
		return p, nil
	}
	vl := *l
	vl.Runtime = v.runtime(l.Runtime, "")
	p, err := NewPool(ctx, &vl, vp.size)
	if err != nil {
		return nil, err
	}
	if vp.pools == nil {
		vp.pools = map[string]*pool.Pool{}
	}
	vp.pools[key] = p
	return p, nil
}

// Close closes every pool.
func (vp *variantPools) Close() error {
	var errs []error
	for _, p := range vp.pools {
		errs = append(errs, p.Close())
	}
	vp.pools = nil
	return errors.Join(errs...)
}

// removeLogs empties a variant trial's log directory for the next one.
func removeLogs(logDir string) error {
	entries, err := os.ReadDir(logDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(logDir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// variantDir is the image the variant restores: its own, or the output's.
func (set MeasuredSet) variantDir(v Variant) (string, error) {
	key := v.imageKey()
	if key == "" {
		return set.Dir, nil
	}
	if dir := set.VariantDirs[key]; dir != "" {
		return dir, nil
	}
	return "", fmt.Errorf("no image of %s captured with %s", set.ID, key)
}

// seriesBytes is the size of the image the series restores: a variant's own, or the set's.
func (set MeasuredSet) seriesBytes(series string, variants []Variant) int64 {
	name := strings.TrimSuffix(series, LastPageSuffix)
	for _, v := range variants {
		if v.Name == name && v.OwnImage() {
			if n, ok := set.VariantBytes[v.imageKey()]; ok {
				return n
			}
		}
	}
	return set.Bytes
}
