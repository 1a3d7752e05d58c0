package analysis

import "slices"

// OwnStep says how the analyze stage measures one module's own figures (Entry.OwnMs and
// OwnMiB): in a fresh sandbox, import Preload first, off the clock, then time the import of
// Module and take the memory it adds.
type OwnStep struct {
	Module  string
	Preload []string
	// Measure is false for a module that is in an import cycle with others (a package and a
	// submodule it imports, say matplotlib and matplotlib.colors) without being the cycle's
	// first by name: the cycle always loads whole, so its first member carries the figures
	// of all of it and the others have own figures of 0.
	Measure bool
}

// OwnSteps returns, for every module of closures (module -> its measured closure), how to
// measure its own figures so that they add up: the preload is the closure without the module's
// import cycle. Without that rule a package whose closure holds one of its own submodules
// would be measured with itself already imported (importing a submodule imports its parent),
// and its cost would vanish. Sorted by module.
func OwnSteps(closures map[string][]string) []OwnStep {
	modules := make([]string, 0, len(closures))
	for m := range closures {
		modules = append(modules, m)
	}
	slices.Sort(modules)
	// reach[m] is everything m loads, transitively.
	reach := map[string]map[string]bool{}
	for _, m := range modules {
		reach[m] = map[string]bool{m: true}
		for _, c := range closures[m] {
			reach[m][c] = true
		}
	}
	for changed := true; changed; {
		changed = false
		for _, m := range modules {
			for c := range reach[m] {
				for d := range reach[c] {
					if !reach[m][d] {
						reach[m][d] = true
						changed = true
					}
				}
			}
		}
	}
	steps := make([]OwnStep, 0, len(modules))
	for _, m := range modules {
		step := OwnStep{Module: m, Measure: true}
		for c := range reach[m] {
			if c == m {
				continue
			}
			if reach[c][m] {
				// c and m load each other: the cycle's first member measures it.
				if c < m {
					step.Measure = false
				}
				continue
			}
			step.Preload = append(step.Preload, c)
		}
		slices.Sort(step.Preload)
		steps = append(steps, step)
	}
	return steps
}
