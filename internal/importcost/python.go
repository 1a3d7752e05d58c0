package importcost

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/pycall"
)

// importCode runs inside the executor, as the first call of a cold start: it imports PRELOAD
// off the clock, then times the import of MODULE and reports what the import added to
// sys.modules and to the process's private dirty memory (the sum of Private_Dirty over
// /proc/self/smaps: what a checkpoint's pages.img grows by; TestDirtyTracksPagesImg shows it
// against real captures), and whether MODULE was loaded
// already (the executor's own imports, cloudpickle and much of the standard library).
const importCode = `import importlib, os, sys, time
def dirty():
    total = 0
    with open("/proc/self/smaps") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                total += int(line.split()[1]) * 1024
    return total
for name in PRELOAD:
    importlib.import_module(name)
before = set(sys.modules)
loaded = MODULE in before
error = ""
r0 = dirty()
t0 = time.perf_counter()
if MODULE:
    try:
        importlib.import_module(MODULE)
    except BaseException as e:
        error = (type(e).__name__ + ": " + str(e))[:500]
t1 = time.perf_counter()
r1 = dirty()
result = {"ms": (t1 - t0) * 1000.0, "dirty": r1 - r0, "added": sorted(k for k in set(sys.modules) - before if isinstance(k, str)), "error": error, "loaded": loaded}
`

// importRequest builds the call that imports preload, then module (none when empty), and
// reports on the second import. Names are validated dotted identifiers; they reach Python as
// JSON string literals, which Python reads as its own.
func importRequest(preload []string, module string) ([]byte, error) {
	list, err := pycall.PyList(preload)
	if err != nil {
		return nil, err
	}
	name, err := json.Marshal(module)
	if err != nil {
		return nil, err
	}
	code := strings.NewReplacer("PRELOAD", string(list), "MODULE", string(name)).Replace(importCode)
	literal, err := json.Marshal(code)
	if err != nil {
		return nil, err
	}
	return pycall.EvalRequest(fmt.Sprintf(`(lambda ns: (__import__("builtins").exec(%s, ns), ns["result"])[1])({})`, literal))
}

// importResponseSize is the most read of an answer to importRequest: a few numbers and the
// names of the modules the import added (pandas adds 519, 11.5 KB pickled), with room for
// forty thousand.
const importResponseSize = 1 << 20

// importResult is what one import call reported.
type importResult struct {
	// Ms is the import's time inside the executor; DirtyMiB what it added to the process's
	// private dirty memory.
	Ms       float64  `json:"ms"`
	DirtyMiB float64  `json:"dirty_mib"`
	Added    []string `json:"added"`
	// Error is the exception the import raised ("" when it imported).
	Error string `json:"error,omitempty"`
	// Loaded says the module was in sys.modules before the call imported it.
	Loaded bool `json:"loaded"`
}

// decodeImport reads the answer to importRequest.
func decodeImport(response []byte) (importResult, error) {
	v, err := pycall.DecodeEnvelope(response)
	if err != nil {
		return importResult{}, err
	}
	d, ok := v.(map[any]any)
	if !ok {
		return importResult{}, fmt.Errorf("import call returned %T, not a dict", v)
	}
	var r importResult
	ms, okMs := number(d["ms"])
	dirty, okDirty := number(d["dirty"])
	added, okAdded := d["added"].([]any)
	r.Error, _ = d["error"].(string)
	r.Loaded, _ = d["loaded"].(bool)
	if !okMs || !okDirty || !okAdded || ms < 0 || math.IsNaN(ms) {
		return importResult{}, fmt.Errorf("import call returned an unexpected dict: ms %s, dirty %s, added %T",
			pycall.Format(d["ms"], pycall.ErrorBytes), pycall.Format(d["dirty"], pycall.ErrorBytes), d["added"])
	}
	r.Ms, r.DirtyMiB = ms, dirty/(1<<20)
	for _, a := range added {
		if s, ok := a.(string); ok {
			r.Added = append(r.Added, s)
		}
	}
	return r, nil
}

// number reads a pickled int or float.
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// resolveScript runs as `python3 -c` in a sandbox of the image: it prints the image's
// sys.stdlib_module_names, then, for each dotted name of argv, whether it is a module
// (importlib.util.find_spec, which imports parent packages). Each name's line "? NAME" comes
// before its answer "= NAME 1|0 [error]", flushed: a name whose probe kills the interpreter
// is the one asked last without an answer, and the pipeline asks again without it.
const resolveScript = `import importlib.util, sys
print("stdlib " + " ".join(sorted(sys.stdlib_module_names)), flush=True)
for name in sys.argv[1:]:
    print("? " + name, flush=True)
    try:
        found = importlib.util.find_spec(name) is not None
        why = ""
    except BaseException as e:
        found = False
        why = (type(e).__name__ + ": " + str(e)).replace("\n", " ")[:300]
    print("= " + name + (" 1 " if found else " 0 ") + why, flush=True)
`

// packagesScript runs as `python3 -c` in a sandbox of the image: it prints, on one line after
// "packages ", the image's distributions (PEP 503 normalized name to version; the first on
// sys.path wins, as an import would find it) and the distributions that provide each top-level
// package (importlib.metadata.packages_distributions), from the image's own metadata. A
// distribution whose metadata cannot be read is named in "errors".
const packagesScript = `import importlib.metadata as md, json, re
def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()
dists, errors = {}, {}
for d in md.distributions():
    try:
        name = d.metadata["Name"]
        if not name:
            continue
        if norm(name) not in dists:
            dists[norm(name)] = d.version
    except Exception as e:
        errors[str(getattr(d, "_path", "?"))] = (type(e).__name__ + ": " + str(e))[:300]
tops = {}
for top, names in md.packages_distributions().items():
    tops[top] = sorted({norm(n) for n in names if n and norm(n) in dists})
print("packages " + json.dumps({"distributions": dists, "top_level": tops, "errors": errors}, sort_keys=True), flush=True)
`

// imagePackages is what packagesScript reports.
type imagePackages struct {
	Distributions map[string]string   `json:"distributions"`
	TopLevel      map[string][]string `json:"top_level"`
	Errors        map[string]string   `json:"errors,omitempty"`
}

// decodePackages reads packagesScript's output: its last "packages " line (the image's
// sitecustomize runs, and may print, first). A distribution whose name or version the catalogue
// would refuse (white space in a version, say) is left out and named in Errors; what the image
// says of one it cannot read is quoted and cut short, since it reaches the log.
func decodePackages(out string) (imagePackages, error) {
	var report string
	found := false
	for line := range strings.Lines(out) {
		if r, ok := strings.CutPrefix(strings.TrimSpace(line), "packages "); ok {
			report, found = r, true
		}
	}
	if !found {
		return imagePackages{}, errors.New(`the packages probe printed no "packages" line`)
	}
	var p imagePackages
	if err := json.Unmarshal([]byte(report), &p); err != nil || p.Distributions == nil {
		return imagePackages{}, fmt.Errorf("the image's packages are not readable: %.200q (%v)", report, err)
	}
	for where, why := range p.Errors {
		p.Errors[where] = fmt.Sprintf("%.300q", why)
	}
	for name, v := range p.Distributions {
		if err := catalogue.CheckPackages(map[string]string{name: v}); err != nil {
			delete(p.Distributions, name)
			if p.Errors == nil {
				p.Errors = map[string]string{}
			}
			p.Errors[name] = err.Error()
		}
	}
	return p, nil
}

// of returns the distributions that provide module's top-level package, name to version (nil
// for none).
func (p imagePackages) of(module string) map[string]string {
	top, _, _ := strings.Cut(module, ".")
	var out map[string]string
	for _, name := range p.TopLevel[top] {
		if v, ok := p.Distributions[name]; ok {
			if out == nil {
				out = map[string]string{}
			}
			out[name] = v
		}
	}
	return out
}
