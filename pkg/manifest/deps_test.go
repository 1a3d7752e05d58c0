package manifest_test

import (
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
)

// kitPattern is what the kit test lists: every package under pkg/, and the example worker.
var kitPattern = []string{"./pkg/...", "./examples/worker"}

// framingPackage is the one package that may import og-rek: the pickled requests and envelopes
// live with it.
const framingPackage = "readie.dev/pipeline/pkg/pycall"

// thirdParty are the packages outside the standard library and this module that the kit may
// depend on, each with the kit packages allowed to import it directly (nil: any). og-rek's own
// dependencies are reached through it alone.
var thirdParty = map[string][]string{
	"github.com/opencontainers/runtime-spec/specs-go": nil,
	"github.com/kisielk/og-rek":                       {framingPackage},
	"github.com/aristanetworks/gomap":                 {"github.com/kisielk/og-rek"},
	"golang.org/x/exp/slices":                         {"github.com/kisielk/og-rek", "github.com/aristanetworks/gomap"},
}

// goPackage is what `go list -json` says of one package.
type goPackage struct {
	ImportPath string
	Standard   bool
	Imports    []string
	DepOnly    bool
}

// TestWorkerKitDependencies: every package under pkg/ (the kit a worker, a build job or a
// benchmark imports on its own) and the example worker, with everything they pull in as
// `go list -deps` reports it, import nothing under internal/, no go-runc, and nothing outside
// the standard library and this module but the OCI runtime-spec types and, for the framing
// package's pickled calls alone, og-rek and what it needs.
func TestWorkerKitDependencies(t *testing.T) {
	args := append([]string{"list", "-deps", "-json=ImportPath,Standard,Imports,DepOnly"}, kitPattern...)
	cmd := testenv.Command(t, 2*time.Minute, "go", args...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	pkgs, err := decodePackages(out)
	if err != nil {
		t.Fatalf("go list -json: %v", err)
	}
	problems := kitProblems(pkgs)
	for _, p := range problems {
		t.Error(p)
	}
	// The listing must hold what it checks: the kit's packages and the worker.
	var roots []string
	for _, p := range pkgs {
		if !p.DepOnly {
			roots = append(roots, p.ImportPath)
		}
	}
	for _, want := range []string{"readie.dev/pipeline/pkg/capture", "readie.dev/pipeline/pkg/measure", "readie.dev/pipeline/pkg/catalogue", framingPackage, "readie.dev/pipeline/examples/worker"} {
		if !slices.Contains(roots, want) {
			t.Errorf("go list %v lists %v: %s is missing", kitPattern, roots, want)
		}
	}
}

// TestKitProblems: the rule refuses a package under internal/, a module outside the allowed
// ones, og-rek imported beside the framing package, and go-runc; it lets the allowed through.
func TestKitProblems(t *testing.T) {
	std := func(path string) goPackage { return goPackage{ImportPath: path, Standard: true} }
	own := func(path string, imports ...string) goPackage {
		return goPackage{ImportPath: "readie.dev/pipeline/" + path, Imports: imports}
	}
	fine := []goPackage{
		std("fmt"),
		{ImportPath: "github.com/kisielk/og-rek", Imports: []string{"fmt", "github.com/aristanetworks/gomap"}},
		{ImportPath: "github.com/aristanetworks/gomap", Imports: []string{"golang.org/x/exp/slices"}},
		{ImportPath: "golang.org/x/exp/slices"},
		{ImportPath: "github.com/opencontainers/runtime-spec/specs-go"},
		own("pkg/pycall", "fmt", "github.com/kisielk/og-rek"),
		own("pkg/sandbox", "github.com/opencontainers/runtime-spec/specs-go"),
		own("pkg/measure", "readie.dev/pipeline/pkg/pycall"),
	}
	if got := kitProblems(fine); len(got) != 0 {
		t.Errorf("the allowed dependencies were refused: %v", got)
	}
	for name, bad := range map[string]goPackage{
		"internal":         own("pkg/capture", "readie.dev/pipeline/internal/lease"),
		"og-rek elsewhere": own("pkg/measure", "github.com/kisielk/og-rek"),
		"go-runc":          own("pkg/runsc", "github.com/containerd/go-runc"),
		"another module":   own("examples/worker", "gopkg.in/yaml.v3"),
	} {
		pkgs := append(slices.Clone(fine), bad)
		for _, imp := range bad.Imports {
			if !strings.HasPrefix(imp, "readie.dev/pipeline/") {
				pkgs = append(pkgs, goPackage{ImportPath: imp})
			}
		}
		if got := kitProblems(pkgs); len(got) == 0 {
			t.Errorf("%s: %s importing %v was let through", name, bad.ImportPath, bad.Imports)
		}
	}
}

// kitProblems returns what breaks the kit's rule among pkgs (a `go list -deps` listing): each
// import of a package under internal/, and each import outside the standard library and this
// module that thirdParty does not allow to its importer.
func kitProblems(pkgs []goPackage) []string {
	standard := map[string]bool{}
	for _, p := range pkgs {
		standard[p.ImportPath] = p.Standard
	}
	var problems []string
	for _, p := range pkgs {
		if p.Standard {
			continue
		}
		for _, imp := range p.Imports {
			switch {
			case standard[imp]:
			case strings.HasPrefix(imp, "readie.dev/pipeline/internal/"):
				problems = append(problems, p.ImportPath+" imports "+imp+": nothing under pkg/ may depend on internal/")
			case strings.HasPrefix(imp, "readie.dev/pipeline/"):
			default:
				importers, known := thirdParty[imp]
				if !known || importers != nil && !slices.Contains(importers, p.ImportPath) {
					problems = append(problems, p.ImportPath+" imports "+imp+": the kit may import, outside the standard library and this module, only the OCI runtime-spec types, and og-rek in "+framingPackage)
				}
			}
		}
	}
	return problems
}

// decodePackages decodes the stream of JSON objects `go list -json` writes.
func decodePackages(data []byte) ([]goPackage, error) {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	var pkgs []goPackage
	for {
		var p goPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
}
