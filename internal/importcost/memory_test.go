package importcost

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/capture"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/measure"
)

// TestDirtyTracksPagesImg shows that the memory figure analyze measures inside the sandbox (the
// growth of the process's Private_Dirty over one import) tracks what matters for a restore: the
// growth of the checkpoint's pages.img over the empty checkpoint's, captured for real. Resident
// memory does not (it counts the shared libraries' file pages, which the image does not hold:
// numpy adds 31 MiB of RSS and 9.5 MiB of pages.img). On the default image's modules each
// figure is within half a MiB or 10%; READIE_MEMORY_MODULES names other modules (e.g. on the
// catalogue image, READIE_ROOTFS=build/rootfs-catalogue), of which only the line is checked:
// pages.img leaves out zero pages the sentry did not know to be committed, which some modules
// map by the MiB (cv2: 47 MiB dirty, 33 MiB saved; README, "Which sets to checkpoint").
func TestDirtyTracksPagesImg(t *testing.T) {
	modules := []string{"json", "asyncio", "numpy", "pandas"}
	each := true
	if env := os.Getenv("READIE_MEMORY_MODULES"); env != "" {
		modules, each = strings.Split(env, ","), false
	}
	rootfs := testenv.Rootfs(t)
	rt := testenv.Runtime(t)
	work := testenv.WorkDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	box := &starter{launcher: launch.Launcher{Runtime: rt, Rootfs: rootfs, WorkDir: work, Timeout: 5 * time.Minute}}
	pagesMiB := func(imports []string) float64 {
		t.Helper()
		dir := filepath.Join(work, "image")
		defer os.RemoveAll(dir)
		if _, err := capture.Run(ctx, rt, capture.Request{ID: "memory", Imports: imports, Rootfs: rootfs, Dir: dir, WorkDir: work, Timeout: 5 * time.Minute, RunscVersion: "test"}); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(filepath.Join(dir, "pages.img"))
		if err != nil {
			t.Fatal(err)
		}
		return float64(fi.Size()) / (1 << 20)
	}
	empty := pagesMiB(nil)
	var xs, ys []float64
	var table strings.Builder
	fmt.Fprintf(&table, "%-28s %12s %12s\n", "module", "dirty MiB", "pages.img +MiB")
	for _, m := range modules {
		r, err := box.importOnce(ctx, "memory", nil, m)
		if err != nil {
			t.Fatal(err)
		}
		if r.Error != "" {
			t.Fatalf("%s: %s", m, r.Error)
		}
		grown := pagesMiB([]string{m}) - empty
		xs, ys = append(xs, r.DirtyMiB), append(ys, grown)
		fmt.Fprintf(&table, "%-28s %12.2f %12.2f\n", m, r.DirtyMiB, grown)
		// Within half a MiB, or 10% of the growth for large modules.
		if each && math.Abs(r.DirtyMiB-grown) > max(0.5, 0.1*grown) {
			t.Errorf("%s: private dirty memory grew %.2f MiB, pages.img %.2f MiB", m, r.DirtyMiB, grown)
		}
	}
	line := measure.LeastSquares(xs, ys)
	r := math.Sqrt(line.RSquared)
	t.Logf("empty pages.img %.2f MiB\n%spages.img growth = %.3f x dirty %+.2f MiB, r = %.4f over %d modules", empty, table.String(), line.Slope, line.Intercept, r, len(xs))
	if len(xs) >= 3 && (r < 0.98 || math.Abs(line.Slope-1) > 0.15) {
		t.Errorf("pages.img growth against private dirty memory: slope %.3f, r %.4f; want a slope of 1 ± 0.15 and r >= 0.98", line.Slope, r)
	}
}
