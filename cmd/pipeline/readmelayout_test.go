package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
)

// layoutBlock returns the paths of the README's Layout block: the first indented block of the
// "## Layout" section, where a line that starts at the block's indent names one path (a
// directory ends in "/", "./" is the module's root) and a line indented further continues the
// one before.
func layoutBlock(readme string) ([]string, error) {
	_, section, ok := strings.Cut(readme, "\n## Layout\n")
	if !ok {
		return nil, errors.New("the README has no \"## Layout\" section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var paths []string
	inBlock := false
	for _, line := range strings.Split(section, "\n") {
		code, indented := strings.CutPrefix(line, "    ")
		switch {
		case indented && code != "" && !strings.HasPrefix(code, " "):
			inBlock = true
			paths = append(paths, strings.Fields(code)[0])
		case indented && inBlock:
			// A continuation line.
		case inBlock:
			return paths, nil
		}
	}
	if len(paths) == 0 {
		return nil, errors.New("the README's Layout section has no indented block of paths")
	}
	return paths, nil
}

// layoutProblems compares the paths of a Layout block with the tree at root and its packages
// (directories relative to root, "." for the root's own): every package must have its line,
// and every path named must exist, a directory named being a package or holding no Go file. It
// returns one problem a line, each naming the path, sorted; none when the block and tree agree.
func layoutProblems(root string, paths, packages []string) []string {
	named := map[string]bool{}
	var problems []string
	for _, p := range paths {
		if named[p] {
			problems = append(problems, "named twice: "+p)
		}
		named[p] = true
		if filepath.IsAbs(p) || slices.Contains(strings.Split(strings.TrimSuffix(p, "/"), "/"), "..") {
			problems = append(problems, "not a path inside the repository: "+p)
			continue
		}
		dir, isDir := strings.CutSuffix(p, "/")
		if dir == "." {
			dir = ""
		}
		info, err := os.Stat(filepath.Join(root, dir))
		switch {
		case err != nil:
			problems = append(problems, "named, but does not exist: "+p)
		case isDir && !info.IsDir():
			problems = append(problems, "named as a directory, but is a file: "+p)
		case !isDir && info.IsDir():
			problems = append(problems, "named as a file, but is a directory (end it with /): "+p)
		case isDir && !slices.Contains(packages, filepath.Clean("./"+dir)) && holdsGo(filepath.Join(root, dir)):
			problems = append(problems, "named, holds Go files, but is no package of go list ./...: "+p)
		}
	}
	for _, pkg := range packages {
		if !named[pkg+"/"] {
			problems = append(problems, "a package of go list ./... that the block lacks: "+pkg+"/")
		}
	}
	slices.Sort(problems)
	return problems
}

// holdsGo says whether dir holds a .go file.
func holdsGo(dir string) bool {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".go") {
			return true
		}
	}
	return false
}

// goPackages lists the packages of go list ./... under root as directories relative to it.
func goPackages(t *testing.T, root string) []string {
	t.Helper()
	cmd := testenv.Command(t, 2*time.Minute, "go", "list", "-f", "{{.Dir}}", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v\n%s", err, stderr.Bytes())
	}
	var packages []string
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		packages = append(packages, rel)
	}
	if len(packages) < 20 {
		t.Fatalf("go list ./... gave only %v", packages)
	}
	return packages
}

// TestReadmeLayout checks the README's Layout block against the tree: every package of
// go list ./... (test helpers included) has its line, and every path it names exists.
func TestReadmeLayout(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if root, err = filepath.EvalSymlinks(root); err != nil {
		t.Fatal(err)
	}
	paths, err := layoutBlock(readFile(t, filepath.Join(root, "README.md")))
	if err != nil {
		t.Fatal(err)
	}
	if problems := layoutProblems(root, paths, goPackages(t, root)); len(problems) > 0 {
		t.Errorf("the README's Layout block and the tree disagree (%d):\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
}

// TestReadmeLayoutProblems checks the comparison itself on a tree of its own: a package the
// block lacks, a package renamed, a file gone and a directory of Go files that is no package are
// each named, and a block that agrees gives none.
func TestReadmeLayoutProblems(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, f := range []string{"go.mod", "defaults.go", "pkg/a/a.go", "pkg/b/b.go", "internal/c/c.go", "docs/x.md", "stray/s.go"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	packages := []string{".", "pkg/a", "pkg/b", "internal/c"}
	readme := "# x\n\n## Layout\n\nWhat is where:\n\n" +
		"    ./             the root\n" +
		"    go.mod\n" +
		"    pkg/a/         a, described\n" +
		"                   on two lines\n" +
		"    pkg/a/a.go     a file\n" +
		"    internal/c/    c\n" +
		"    docs/          no Go here\n" +
		"\nAfter the block:\n\n    pkg/zzz/ an indented line of another block\n\n## Next\n"
	paths, err := layoutBlock(readme)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"./", "go.mod", "pkg/a/", "pkg/a/a.go", "internal/c/", "docs/"}; !slices.Equal(paths, want) {
		t.Fatalf("layoutBlock = %q, want %q", paths, want)
	}
	if problems := layoutProblems(root, paths, packages); !slices.Equal(problems, []string{"a package of go list ./... that the block lacks: pkg/b/"}) {
		t.Errorf("with pkg/b/ missing from the block: %q", problems)
	}
	if problems := layoutProblems(root, append(paths, "pkg/b/"), packages); len(problems) != 0 {
		t.Errorf("a block that agrees with the tree: %q", problems)
	}
	bad := []string{"./", "go.mod", "pkg/a/", "pkg/a/", "pkg/a/gone.go", "pkg/b/", "internal/renamed/", "internal/c/", "stray/", "go.mod/", "docs", "../up/"}
	want := []string{
		"a package of go list ./... that the block lacks: internal/c/",
		"named as a directory, but is a file: go.mod/",
		"named as a file, but is a directory (end it with /): docs",
		"named twice: pkg/a/",
		"named, but does not exist: internal/renamed/",
		"named, but does not exist: pkg/a/gone.go",
		"named, holds Go files, but is no package of go list ./...: stray/",
		"not a path inside the repository: ../up/",
	}
	bad = slices.DeleteFunc(bad, func(p string) bool { return p == "internal/c/" })
	if problems := layoutProblems(root, bad, packages); !slices.Equal(problems, want) {
		t.Errorf("layoutProblems =\n  %s\nwant\n  %s", strings.Join(problems, "\n  "), strings.Join(want, "\n  "))
	}
	if _, err := layoutBlock("# x\n\n## Usage\n"); err == nil {
		t.Error("a README without a Layout section gave no error")
	}
}
