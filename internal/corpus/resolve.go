package corpus

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// IsModule says which of candidates (dotted names) are modules in the image. The analysis
// answers it inside a sandbox of the image (importlib.util.find_spec imports parent packages,
// so it runs the image's code).
type IsModule func(ctx context.Context, candidates []string) (map[string]bool, error)

// Resolution is what a name resolves to.
type Resolution struct {
	// Module is the longest prefix of the name that is a module; when none is (Found false),
	// the name's top-level package, which the image lacks.
	Module string
	Found  bool
}

// Prefixes returns every dotted prefix of names, the names included, sorted, each once:
// sklearn.svm.SVC gives sklearn, sklearn.svm and sklearn.svm.SVC.
func Prefixes(names []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range names {
		for i := 0; i <= len(n); i++ {
			if i == len(n) || n[i] == '.' {
				if p := n[:i]; !seen[p] {
					seen[p] = true
					out = append(out, p)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// Resolve maps each name to the longest of its prefixes that is a module, asking isModule once
// about every prefix of every name.
func Resolve(ctx context.Context, names []string, isModule IsModule) (map[string]Resolution, error) {
	candidates := Prefixes(names)
	modules, err := isModule(ctx, candidates)
	if err != nil {
		return nil, fmt.Errorf("resolving %d names: %w", len(names), err)
	}
	out := make(map[string]Resolution, len(names))
	for _, n := range names {
		res := Resolution{Module: n}
		if top, _, ok := strings.Cut(n, "."); ok {
			res.Module = top
		}
		for p := n; ; {
			if modules[p] {
				res = Resolution{Module: p, Found: true}
				break
			}
			dot := strings.LastIndexByte(p, '.')
			if dot < 0 {
				break
			}
			p = p[:dot]
		}
		out[n] = res
	}
	return out, nil
}
