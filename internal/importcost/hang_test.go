package importcost

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
)

// TestImportThatNeverReturns gives the name probe and the closure probe a module whose import
// never returns (testenv.BlockingModule, on the path only here): each sandbox is stopped by its
// timeout and deleted; the name probe marks that name not a module and answers for the names
// after it in a second sandbox; the closure probe reports the module unavailable, and caches it.
func TestImportThatNeverReturns(t *testing.T) {
	rt := testenv.Runtime(t)
	// Only the hang may reach the limit: it is also the budget of the sandboxes that resolve
	// json and numpy.linalg, which take about a second idle and must not on a loaded CI host.
	const limit = 45 * time.Second
	box := &starter{launcher: launch.Launcher{Runtime: rt, Rootfs: testenv.Rootfs(t), WorkDir: testenv.WorkDir(t),
		Env: []string{"PYTHONPATH=" + testenv.TestingPythonPath}, Timeout: limit}}
	log := logrus.New()
	log.SetOutput(io.Discard)
	a := &analyzer{o: Options{Jobs: 1, Timeout: limit}, cache: &cache{dir: t.TempDir()}, box: box, log: log, base: testKey()}
	a.scratchOnce.Do(func() {}) // the test's launcher has its own work directory
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var wg sync.WaitGroup
	wg.Go(func() {
		res, err := box.resolve(ctx, []string{"json", testenv.BlockingModule + ".sub", "numpy.linalg"})
		if err != nil {
			t.Errorf("resolve: %v", err)
			return
		}
		if !res.Modules["json"] || !res.Modules["numpy.linalg"] || res.Modules[testenv.BlockingModule+".sub"] {
			t.Errorf("modules %v", res.Modules)
		}
		if why := res.Errors[testenv.BlockingModule+".sub"]; !strings.Contains(why, "stopped the interpreter") || !strings.Contains(why, "timeout") {
			t.Errorf("why the blocking name is no module: %q", why)
		}
		if len(res.Stdlib) < 100 {
			t.Errorf("stdlib: %d names", len(res.Stdlib))
		}
	})
	wg.Go(func() {
		got, err := a.probeAll(ctx, []string{testenv.BlockingModule})
		if err != nil {
			t.Errorf("probe: %v", err)
			return
		}
		if p := got[testenv.BlockingModule]; !strings.Contains(p.Error, "did not finish within 45s") {
			t.Errorf("probe of the blocking module: %+v", p)
		}
	})
	wg.Wait()
	started := box.started.Load()
	// Cached: a second probe starts no sandbox.
	if got, err := a.probeAll(ctx, []string{testenv.BlockingModule}); err != nil || got[testenv.BlockingModule].Error == "" || box.started.Load() != started {
		t.Errorf("second probe: %+v, %v; sandboxes %d -> %d", got, err, started, box.started.Load())
	}
}
