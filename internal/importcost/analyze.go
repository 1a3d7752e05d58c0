// Package importcost does the work of `pipeline analyze`: it measures, in sandboxes of the real
// image and spec shape, what each module a corpus imports costs a start: whether it imports at
// all, its cold import time, the memory it adds to a checkpoint, what it leaves loaded (its
// closure), and its own share of each with the rest of its closure already loaded; plus the
// host's cold start and restore line. Every measurement is cached by a digest of what it
// depends on, so a second analysis of the same corpus starts no sandbox. Package analysis holds
// the file it writes, analysis.json.
package importcost

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/bench"
	"readie.dev/pipeline/internal/corpus"
	"readie.dev/pipeline/internal/parallel"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/measure"
)

// Options shape an analysis.
type Options struct {
	// Runs is how many fresh sandboxes each timed import is the median of (analysis.runs).
	Runs int
	// Jobs is how many probes run at a time; timed imports and restores always run alone.
	Jobs int
	// Timeout bounds one sandbox (analysis.timeout); captures have timeouts.capture.
	Timeout time.Duration
	// CacheDir holds the measurements (analysis.cache).
	CacheDir string
	// RestoreRuns is how many measure-mode restores each point of the restore line is the
	// median of (restore_runs).
	RestoreRuns int
	// CacheOnly measures nothing: an analysis the cache cannot answer whole fails with
	// ErrNotCached.
	CacheOnly bool
	Log       logrus.FieldLogger
	// Sandboxes are the sandboxes on the rootfs the caller resolved already (a capture's), so
	// it is not resolved again; nil: Run resolves the config's.
	Sandboxes *run.Sandboxes
}

// ErrNotCached reports that a CacheOnly analysis needed a measurement.
var ErrNotCached = errNotCached

// Report says what an analysis did.
type Report struct {
	// Modules is how many distinct modules were analysed (the corpus's and their closures').
	Modules int
	// Measured is how many of them this run timed, Cached how many it took from the cache;
	// the rest the executor holds loaded already (they cost nothing) or do not import.
	Measured, Cached int
	// Sandboxes is how many sandboxes this run started.
	Sandboxes int64
	// Unavailable are the modules the image lacks or that fail to import, with why.
	Unavailable map[string]string
	Took        time.Duration
}

// codeDigest names the measuring code: a change to it measures everything again.
var codeDigest = func() string {
	return filedigest.OfBytes([]byte("analyze/1\n" + importCode + "\n" + resolveScript))
}()

// packagesDigest names the code that reads the image's distributions: the "packages" entries
// have their own, so that adding them left every measurement cached before valid.
var packagesDigest = filedigest.OfBytes([]byte("analyze-packages/1\n" + packagesScript))

type analyzer struct {
	o     Options
	env   *run.Env
	sb    *run.Sandboxes // offline
	log   logrus.FieldLogger
	cache *cache
	// base is the key of every measurement in this image; timedBase, of a time: it holds only
	// on this kind of host, with these runs.
	base      key
	timedBase key
	cpu       string
	box       *starter

	// The scratch directory is made when the first sandbox needs it: a cached analysis
	// starts none and sweeps nothing.
	scratchOnce sync.Once
	work        string
	cleanup     func()
	scratchErr  error
}

// Run analyses the modules that names resolve to in the image of env's config (o.Sandboxes'
// rootfs when given), in sandboxes without network (Sandboxes.Offline) whatever the config's
// runsc.network.
func Run(ctx context.Context, env *run.Env, names []string, o Options) (*analysis.File, *Report, error) {
	start := time.Now()
	if o.Runs < 1 || o.RestoreRuns < 1 || o.Jobs < 1 || o.Timeout <= 0 || o.CacheDir == "" {
		return nil, nil, fmt.Errorf("%w: analysis options %+v", run.ErrSetup, o)
	}
	if len(names) == 0 {
		return nil, nil, fmt.Errorf("%w: no names to analyse", run.ErrSetup)
	}
	// Every import of an image a stranger may have made runs here: no network for any of it.
	sb := o.Sandboxes
	if sb == nil {
		r, err := env.ResolveRootfs(ctx)
		if err != nil {
			return nil, nil, err
		}
		sb = env.Sandboxes(r)
	}
	sb = sb.Offline()
	fp, err := sb.SpecFingerprint()
	if err != nil {
		return nil, nil, err
	}
	machine := bench.ThisMachine()
	cpu := fmt.Sprintf("%s x%d", machine.CPUModel, machine.CPUs)
	hostSum := sha256.Sum256([]byte(cpu))
	a := &analyzer{
		o: o, env: env, sb: sb, log: o.Log, cpu: cpu,
		cache: &cache{dir: o.CacheDir, readOnly: o.CacheOnly},
		base: key{Code: codeDigest, RootfsDigest: sb.Rootfs.Digest, RunscSHA256: env.Runsc.SHA256, Spec: fp,
			RunscFlags: sb.Runtime.Flags.Args()},
	}
	a.timedBase = a.base
	a.timedBase.Host, a.timedBase.Runs = filedigest.Format(hostSum[:]), o.Runs
	if a.log == nil {
		a.log = logrus.New()
	}
	defer func() {
		if a.cleanup != nil {
			a.cleanup()
		}
	}()
	f, rep, err := a.run(ctx, names)
	if rep != nil {
		rep.Took = time.Since(start)
		if a.box != nil {
			rep.Sandboxes = a.box.started.Load()
		}
	}
	return f, rep, err
}

// starter returns the sandbox starter, making the scratch directory (and sweeping what runs
// that died left) the first time.
func (a *analyzer) starter(ctx context.Context) (*starter, error) {
	a.scratchOnce.Do(func() {
		a.work, a.cleanup, a.scratchErr = a.env.Scratch(ctx)
		if a.scratchErr == nil {
			a.box.launcher = a.sb.Launcher(a.work, a.o.Timeout)
		}
	})
	return a.box, a.scratchErr
}

// probe is what one cold import told about a module: whether it imports, whether the executor
// had it loaded already, and what it added to sys.modules.
type probe struct {
	Error  string   `json:"error,omitempty"`
	Loaded bool     `json:"loaded"`
	Added  []string `json:"added"`
}

// found is what the name probe says about one dotted name.
type found struct {
	Module bool   `json:"module"`
	Error  string `json:"error,omitempty"`
}

// run measures in four steps: names to modules, availability and closures, timed imports, and
// the host's cold start and restore line; then it puts the file together.
func (a *analyzer) run(ctx context.Context, names []string) (*analysis.File, *Report, error) {
	a.box = &starter{}
	rep := &Report{Unavailable: map[string]string{}}
	res, err := a.resolveNames(ctx, names)
	if err != nil {
		return nil, nil, err
	}
	probes, err := a.probeClosures(ctx, res)
	if err != nil {
		return nil, nil, err
	}
	available, closures := closuresOf(probes, res.stdlibSet)
	// Timed imports, one sandbox at a time: cold, then own (after the rest of the closure).
	figures, err := a.measureAll(ctx, probes, closures, rep)
	if err != nil {
		return nil, nil, err
	}
	host, err := a.measureHost(ctx, figures)
	if err != nil {
		return nil, nil, err
	}
	pkgs, err := a.imagePackages(ctx)
	if err != nil {
		return nil, nil, err
	}
	f := &analysis.File{
		Version:  analysis.Version,
		Image:    analysis.Provenance{RootfsDigest: a.base.RootfsDigest, Runsc: a.base.RunscSHA256, SpecDigest: a.base.Spec, Runs: a.o.Runs},
		Stdlib:   slices.Clone(res.stdlib),
		Names:    map[string]analysis.Entry{},
		Host:     host,
		Packages: pkgs.Distributions,
	}
	slices.Sort(f.Stdlib)
	for _, name := range names {
		r := res.resolved[name]
		switch {
		case !r.Found:
			f.Names[name] = analysis.Entry{Module: r.Module, Error: notFound(name, r.Module, res.probeErrors)}
			rep.Unavailable[r.Module] = f.Names[name].Error
		case !available[r.Module]:
			f.Names[name] = analysis.Entry{Module: r.Module, Error: probes[r.Module].Error}
			rep.Unavailable[r.Module] = f.Names[name].Error
		default:
			f.Names[name] = figures[r.Module]
		}
	}
	for m := range available {
		if _, ok := f.Names[m]; !ok {
			f.Names[m] = figures[m]
		}
	}
	for name, e := range f.Names {
		e.Packages = pkgs.of(e.Module)
		f.Names[name] = e
	}
	rep.Modules = len(f.Modules())
	if err := f.Validate(); err != nil {
		return nil, nil, fmt.Errorf("the analysis does not hold together (a bug): %w", err)
	}
	return f, rep, nil
}

// imagePackages reads the image's distributions and the top-level packages each provides, in
// one sandbox of the image (never on the host: the image's metadata is its code's to read),
// or from the cache. A CacheOnly analysis whose cache lacks them goes on without packages.
func (a *analyzer) imagePackages(ctx context.Context) (imagePackages, error) {
	k := a.base.of("packages")
	k.Code = packagesDigest
	p, fresh, err := lookup(a.cache, k, func() (imagePackages, error) {
		box, err := a.starter(ctx)
		if err != nil {
			return imagePackages{}, err
		}
		out, runErr, err := box.runPython(ctx, "packages", packagesScript, nil)
		if err != nil {
			return imagePackages{}, err
		}
		p, err := decodePackages(out)
		if err != nil {
			return imagePackages{}, fmt.Errorf("reading the image's packages: %w", errors.Join(err, runErr))
		}
		return p, nil
	})
	if errors.Is(err, errNotCached) {
		// A cache written before packages were read still answers for the figures; the
		// analysis then says nothing of packages (the router checks no requirement on them).
		a.log.Debug("analyze: the image's packages are not in the analysis cache: left out")
		return imagePackages{}, nil
	}
	if err != nil {
		return imagePackages{}, err
	}
	if fresh {
		a.log.WithFields(logrus.Fields{"distributions": len(p.Distributions)}).Info("analyze: the image's packages")
		for where, why := range p.Errors {
			a.log.WithField("distribution", where).Warnf("analyze: its metadata is not readable, left out: %s", why)
		}
	}
	return p, nil
}

// resolvedNames is what the name probe told: each name's module, the image's standard library,
// and the import errors of the prefixes that are no module.
type resolvedNames struct {
	resolved    map[string]corpus.Resolution
	stdlib      []string
	stdlibSet   map[string]bool
	probeErrors map[string]string
}

// resolveNames resolves names to modules, and learns the image's standard library.
func (a *analyzer) resolveNames(ctx context.Context, names []string) (*resolvedNames, error) {
	res := &resolvedNames{stdlibSet: map[string]bool{}, probeErrors: map[string]string{}}
	isModule := func(ctx context.Context, candidates []string) (map[string]bool, error) {
		answers, std, err := a.findModules(ctx, candidates)
		if err != nil {
			return nil, err
		}
		res.stdlib = std
		out := map[string]bool{}
		for name, f := range answers {
			out[name] = f.Module
			if f.Error != "" {
				res.probeErrors[name] = f.Error
			}
		}
		return out, nil
	}
	resolved, err := corpus.Resolve(ctx, names, isModule)
	if err != nil {
		return nil, err
	}
	res.resolved = resolved
	for _, s := range res.stdlib {
		res.stdlibSet[s] = true
	}
	return res, nil
}

// probeClosures probes the resolved modules for availability and closure, several at a time,
// then the packages their closures name, until the closures name no new package.
func (a *analyzer) probeClosures(ctx context.Context, res *resolvedNames) (map[string]probe, error) {
	probes := map[string]probe{}
	var queue []string
	for _, r := range res.resolved {
		if r.Found && !slices.Contains(queue, r.Module) {
			queue = append(queue, r.Module)
		}
	}
	for len(queue) > 0 {
		slices.Sort(queue)
		got, err := a.probeAll(ctx, queue)
		if err != nil {
			return nil, err
		}
		queue = nil
		maps.Copy(probes, got)
		for _, m := range slices.Sorted(maps.Keys(got)) {
			if got[m].Error != "" {
				continue
			}
			for _, name := range got[m].Added {
				top, _, _ := strings.Cut(name, ".")
				if catalogue.IsModuleName(top) && !strings.HasPrefix(top, "__") && !res.stdlibSet[top] {
					if _, known := probes[top]; !known && !slices.Contains(queue, top) {
						queue = append(queue, top)
					}
				}
			}
		}
	}
	return probes, nil
}

// closuresOf returns the modules that import and the closure of each. A closure member that
// does not import by itself (Cython's cython_runtime, say) is left out of closures: no start
// can load it alone.
func closuresOf(probes map[string]probe, stdlib map[string]bool) (available map[string]bool, closures map[string][]string) {
	available = map[string]bool{}
	for m, p := range probes {
		if p.Error == "" {
			available[m] = true
		}
	}
	closures = map[string][]string{}
	for m := range available {
		var c []string
		for _, member := range analysis.Closure(m, probes[m].Added, stdlib, available) {
			if available[member] {
				c = append(c, member)
			}
		}
		closures[m] = c
	}
	return available, closures
}

// notFound says why name resolves to no module: the probe's error for its longest prefix that
// raised one, or that the image lacks its top-level package.
func notFound(name, top string, errs map[string]string) string {
	for p := name; ; {
		if e, ok := errs[p]; ok {
			return fmt.Sprintf("%s: %s", p, e)
		}
		dot := strings.LastIndexByte(p, '.')
		if dot < 0 {
			break
		}
		p = p[:dot]
	}
	return fmt.Sprintf("no module named %s in the image", top)
}

// findModules answers which candidates are modules, and the image's stdlib, from the cache or
// from one probe sandbox for what the cache lacks.
func (a *analyzer) findModules(ctx context.Context, candidates []string) (map[string]found, []string, error) {
	answers := map[string]found{}
	var missing []string
	for _, c := range candidates {
		k := a.base.of("find")
		k.Module = c
		var f found
		ok, err := a.cache.get(k, &f)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			answers[c] = f
		} else {
			missing = append(missing, c)
		}
	}
	var stdlib []string
	stdKey := a.base.of("stdlib")
	ok, err := a.cache.get(stdKey, &stdlib)
	if err != nil {
		return nil, nil, err
	}
	if ok && len(missing) == 0 {
		return answers, stdlib, nil
	}
	if a.cache.readOnly {
		return nil, nil, fmt.Errorf("%w: whether %d names are modules", errNotCached, len(missing))
	}
	box, err := a.starter(ctx)
	if err != nil {
		return nil, nil, err
	}
	start := time.Now()
	res, err := box.resolve(ctx, missing)
	if err != nil {
		return nil, nil, fmt.Errorf("resolving names in the image: %w", err)
	}
	a.log.WithFields(logrus.Fields{"names": len(missing), "took": time.Since(start).Round(time.Millisecond)}).Info("analyze: names resolved in the image")
	if err := a.cache.put(stdKey, res.Stdlib); err != nil {
		return nil, nil, err
	}
	for _, c := range missing {
		f := found{Module: res.Modules[c], Error: res.Errors[c]}
		k := a.base.of("find")
		k.Module = c
		if err := a.cache.put(k, f); err != nil {
			return nil, nil, err
		}
		answers[c] = f
	}
	return answers, res.Stdlib, nil
}

// probeAll probes modules, Options.Jobs at a time: a cold import each, for availability and
// closure (not timed: sandboxes run side by side).
func (a *analyzer) probeAll(ctx context.Context, modules []string) (map[string]probe, error) {
	out := make(map[string]probe, len(modules))
	var mu sync.Mutex
	var errs []error
	done, measured := 0, 0
	parallel.Each(ctx, a.o.Jobs, modules, func(m string) {
		k := a.base.of("probe")
		k.Module = m
		p, fresh, err := lookup(a.cache, k, func() (probe, error) {
			box, err := a.starter(ctx)
			if err != nil {
				return probe{}, err
			}
			r, err := box.importOnce(ctx, "probe", nil, m)
			if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				// An import that never finishes is a fact of the image, like one that
				// raises: the module is unavailable, and stays so in the cache.
				return probe{Error: fmt.Sprintf("its import did not finish within %s (analysis.timeout)", a.o.Timeout)}, nil
			}
			if err != nil {
				return probe{}, err
			}
			return probe{Error: r.Error, Loaded: r.Loaded, Added: r.Added}, nil
		})
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		out[m] = p
		done++
		if fresh {
			measured++
			a.log.WithFields(logrus.Fields{"module": m, "done": fmt.Sprintf("%d/%d", done, len(modules)), "available": p.Error == ""}).Info("analyze: probed")
		}
	})
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if measured > 0 {
		a.log.WithFields(logrus.Fields{"modules": len(modules), "probed": measured}).Info("analyze: availability and closures")
	}
	return out, nil
}

// runs are the timed cold starts of one kind (cold, own, cold-start) of one module.
type runs struct {
	Runs []importRun `json:"runs"`
}

// timed runs Options.Runs cold starts whose call imports preload then module, one at a time.
func (a *analyzer) timed(ctx context.Context, kind string, preload []string, module string) (runs, bool, error) {
	k := a.timedBase.of(kind)
	k.Module, k.Preload = module, slices.Clone(preload)
	return lookup(a.cache, k, func() (runs, error) {
		box, err := a.starter(ctx)
		if err != nil {
			return runs{}, err
		}
		var out runs
		for i := range a.o.Runs {
			r, err := box.importOnce(ctx, kind, preload, module)
			if err == nil && r.Error != "" {
				err = fmt.Errorf("%s import of %s failed in run %d of %d (after importing %v): %s", kind, module, i+1, a.o.Runs, preload, r.Error)
			}
			if err != nil {
				return runs{}, err
			}
			out.Runs = append(out.Runs, r)
		}
		return out, nil
	})
}

func (r runs) medians() (ms, mib float64) {
	var t, m []float64
	for _, x := range r.Runs {
		t = append(t, x.Ms)
		m = append(m, x.DirtyMiB)
	}
	slices.Sort(t)
	slices.Sort(m)
	return round3(max(measure.Percentile(t, 50), 0)), round3(max(measure.Percentile(m, 50), 0))
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// measureAll times every available module that the executor does not already hold: its cold
// import, and its own import after the rest of its closure (analysis.OwnSteps). It logs each
// module done, of the total, with the time left.
func (a *analyzer) measureAll(ctx context.Context, probes map[string]probe, closures map[string][]string, rep *Report) (map[string]analysis.Entry, error) {
	steps := analysis.OwnSteps(closures)
	// What is left to measure, to say how long it will take.
	toMeasure := 0
	for _, s := range steps {
		if probes[s.Module].Loaded {
			continue
		}
		if !a.cached(a.timedBase.of("cold"), s.Module, nil) || (s.Measure && len(s.Preload) > 0 && !a.cached(a.timedBase.of("own"), s.Module, s.Preload)) {
			toMeasure++
		}
	}
	out := map[string]analysis.Entry{}
	start := time.Now()
	measured := 0
	for i, s := range steps {
		m := s.Module
		e := analysis.Entry{Module: m, Available: true, Closure: closures[m]}
		fresh := false
		if !probes[m].Loaded {
			cold, coldFresh, err := a.timed(ctx, "cold", nil, m)
			if err != nil {
				return nil, err
			}
			e.ImportMs, e.MiB = cold.medians()
			e.OwnMs, e.OwnMiB = e.ImportMs, e.MiB
			fresh = coldFresh
			switch {
			case !s.Measure:
				// Its import cycle's first member carries the cycle.
				e.OwnMs, e.OwnMiB = 0, 0
			case len(s.Preload) > 0:
				own, ownFresh, err := a.timed(ctx, "own", s.Preload, m)
				if err != nil {
					return nil, err
				}
				e.OwnMs, e.OwnMiB = own.medians()
				fresh = fresh || ownFresh
			}
		}
		out[m] = e
		if !a.o.CacheOnly { // a capture's look in the cache is no analysis to report on
			a.env.Progress.Step("analyze", i+1, len(steps), "modules", m)
		}
		if !probes[m].Loaded && !fresh {
			rep.Cached++
		}
		if fresh {
			measured++
			fields := logrus.Fields{"module": m, "done": fmt.Sprintf("%d/%d", i+1, len(steps)), "import_ms": e.ImportMs, "mib": e.MiB, "own_ms": e.OwnMs}
			if left := toMeasure - measured; left > 0 {
				fields["left"] = (time.Since(start) / time.Duration(measured) * time.Duration(left)).Round(time.Second).String()
			} else {
				fields["left"] = "0s"
			}
			a.log.WithFields(fields).Info("analyze: measured")
		}
	}
	rep.Measured = measured
	a.env.Progress.Done()
	return out, nil
}

// cached reports whether the cache holds the timed runs of module after preload.
func (a *analyzer) cached(k key, module string, preload []string) bool {
	k.Module, k.Preload = module, slices.Clone(preload)
	var r runs
	ok, err := a.cache.get(k, &r)
	return ok && err == nil
}
