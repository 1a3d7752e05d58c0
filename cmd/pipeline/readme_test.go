package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/manifest"
)

// The README and the topics of docs/ are how a new user meets the pipeline: every make target
// and command they name must exist, and every target, command and manifest field must be in
// them (the tables of targets and commands in docs/commands.md).

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// userDocs are README.md and docs/*.md by path from the repository's root, with their text.
func userDocs(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 10 {
		t.Fatalf("found only %v in docs/", paths)
	}
	docs := map[string]string{"README.md": readFile(t, "../../README.md")}
	for _, p := range paths {
		docs[strings.TrimPrefix(p, "../../")] = readFile(t, p)
	}
	return docs
}

// commandsDoc holds the tables of make targets and of commands.
const commandsDoc = "docs/commands.md"

// codeSpans are a document's inline code spans and indented code lines: where commands are.
func codeSpans(doc string) []string {
	spans := regexp.MustCompile("`[^`\n]+`").FindAllString(doc, -1)
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "    ") {
			spans = append(spans, line)
		}
	}
	return spans
}

func makeTargets(t *testing.T) []string {
	var targets []string
	for _, m := range regexp.MustCompile(`(?m)^\.PHONY:(.*)$`).FindAllStringSubmatch(readFile(t, "../../Makefile"), -1) {
		targets = append(targets, strings.Fields(m[1])...)
	}
	if len(targets) < 10 {
		t.Fatalf("found only %v in the Makefile's .PHONY", targets)
	}
	return targets
}

func TestReadmeMakeTargets(t *testing.T) {
	t.Parallel()
	docs := userDocs(t)
	targets := makeTargets(t)
	for path, doc := range docs {
		named := map[string]bool{}
		for _, span := range codeSpans(doc) {
			for _, m := range regexp.MustCompile(`\bmake ([a-z][a-z-]*)`).FindAllStringSubmatch(span, -1) {
				named[m[1]] = true
			}
		}
		for name := range named {
			if !slices.Contains(targets, name) {
				t.Errorf("%s runs `make %s`, which the Makefile does not have", path, name)
			}
		}
	}
	for _, target := range targets {
		if !strings.Contains(docs[commandsDoc], "| `"+target+"` |") {
			t.Errorf("make target %s is not in %s's table of make targets", target, commandsDoc)
		}
	}
}

func TestReadmeCommands(t *testing.T) {
	t.Parallel()
	docs := userDocs(t)
	set := commands()
	for path, doc := range docs {
		for _, span := range codeSpans(doc) {
			for _, m := range regexp.MustCompile(`\bpipeline ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?`).FindAllStringSubmatch(span, -1) {
				if m[1] == "help" { // parse's word, not a command: `pipeline help COMMAND`
					if m[2] == "" {
						continue
					}
					m = []string{m[0], m[2], ""}
				}
				cmd, err := set.find(m[1])
				if err != nil {
					t.Errorf("%s names `pipeline %s`: %v", path, m[1], err)
					continue
				}
				if g, ok := cmd.(*group); ok && m[2] != "" {
					if _, err := g.set.find(m[2]); err != nil {
						t.Errorf("%s names `pipeline %s %s`: %v", path, m[1], m[2], err)
					}
				}
			}
		}
	}
	for _, c := range set.commands {
		names := []string{c.Name()}
		if g, ok := c.(*group); ok {
			names = nil
			for _, sub := range g.set.commands {
				names = append(names, c.Name()+" "+sub.Name())
			}
		}
		for _, name := range names {
			if !regexp.MustCompile("\\| `" + regexp.QuoteMeta(name) + "[ `]").MatchString(docs[commandsDoc]) {
				t.Errorf("command %q is not in %s's table of commands", name, commandsDoc)
			}
		}
	}
}

// jsonFields lists the JSON names of t's fields, and of the structs they hold, recursively.
func jsonFields(t reflect.Type, seen map[reflect.Type]bool, into map[string]string) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] || t.PkgPath() != reflect.TypeOf(manifest.Manifest{}).PkgPath() {
		return
	}
	seen[t] = true
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			into[name] = t.Name() + "." + f.Name
		}
		jsonFields(f.Type, seen, into)
	}
}

func TestReadmeDocumentsManifestFields(t *testing.T) {
	t.Parallel()
	var all strings.Builder
	for _, doc := range userDocs(t) {
		all.WriteString(doc + "\n")
	}
	readme := all.String()
	fields := map[string]string{}
	seen := map[reflect.Type]bool{}
	jsonFields(reflect.TypeOf(manifest.Manifest{}), seen, fields)
	jsonFields(reflect.TypeOf(manifest.Meta{}), seen, fields)
	if len(fields) < 20 {
		t.Fatalf("found only %d manifest fields", len(fields))
	}
	for name, field := range fields {
		if !strings.Contains(readme, "`"+name+"`") && !regexp.MustCompile(`[ (/]`+regexp.QuoteMeta(name)+`[,)/ ]`).MatchString(readme) {
			t.Errorf("manifest field %s (%s) is documented neither in the README nor in docs/", name, field)
		}
	}
}

// TestReadmeWalkthrough runs the README's walkthrough as written, with a free port and its own
// directories instead of 5000 and /tmp/readie-*: a new user's first commands must work.
func TestReadmeWalkthrough(t *testing.T) {
	t.Parallel()
	testenv.Rootfs(t) // fails, saying how, when `make image` has not run
	script := walkthrough(t, readFile(t, "../../README.md"))
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	for _, r := range []struct{ old, new string }{{"\nport=5000\n", "\nport=" + port + "\n"}, {"/tmp/readie-", dir + "/readie-"}} {
		if !strings.Contains(script, r.old) {
			t.Fatalf("the walkthrough no longer holds %q, which this test replaces:\n%s", r.old, script)
		}
		script = strings.ReplaceAll(script, r.old, r.new)
	}
	build := testenv.Command(t, 5*time.Minute, "go", "build", "-o", filepath.Join(dir, "bin", "pipeline"), ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// The output goes to a file, not a pipe: a background process the script leaves (its
	// registry) then holds nothing that Run or go test waits on. The registry runs in the
	// script's process group, killed with it on every path.
	logFile, err := os.Create(filepath.Join(dir, "walkthrough.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	err = cmd.Wait()
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	output := readFile(t, logFile.Name())
	if err != nil {
		t.Fatalf("the walkthrough failed: %v\n%s", err, output)
	}
	for _, want := range []string{"2 checkpoints verified", "mine: restores", "Restore/set=mine/series=restore/conc=1", "sec/op"} {
		if !strings.Contains(output, want) {
			t.Errorf("the walkthrough's output does not say %q:\n%s", want, output)
		}
	}
}

// walkthrough is the indented block of the README's "Walkthrough" section, as a script.
func walkthrough(t *testing.T, readme string) string {
	_, section, ok := strings.Cut(readme, "\n### Walkthrough")
	if !ok {
		t.Fatal("the README has no Walkthrough section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var lines []string
	for _, line := range strings.Split(section, "\n") {
		if code, ok := strings.CutPrefix(line, "    "); ok {
			lines = append(lines, code)
		}
	}
	if len(lines) < 10 {
		t.Fatalf("the walkthrough has %d lines of commands", len(lines))
	}
	return strings.Join(lines, "\n") + "\n"
}

// TestReadmeLinks checks the links of README.md and docs/*.md: each relative one names a file
// that exists (and, with #anchor, one of its headings), and the README's map links every file
// of docs/*.md.
func TestReadmeLinks(t *testing.T) {
	t.Parallel()
	docs := userDocs(t)
	for path, doc := range docs {
		for _, m := range regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(doc, -1) {
			target := m[1]
			if strings.Contains(target, "://") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			resolved := path
			if file != "" {
				resolved = filepath.ToSlash(filepath.Join(filepath.Dir(path), file))
			}
			if _, err := os.Stat(filepath.Join("../..", resolved)); err != nil {
				t.Errorf("%s links %s, which does not exist", path, target)
				continue
			}
			if anchor != "" && !slices.Contains(headingAnchors(docs[resolved]), anchor) {
				t.Errorf("%s links %s: %s has no heading of that anchor", path, target, resolved)
			}
		}
	}
	for path := range docs {
		if strings.HasPrefix(path, "docs/") && !strings.Contains(docs["README.md"], "]("+path+")") {
			t.Errorf("the README's map of docs/ does not link %s", path)
		}
	}
}

// headingAnchors are the anchors GitHub gives doc's headings: lower case, spaces as hyphens,
// other punctuation dropped.
func headingAnchors(doc string) []string {
	var anchors []string
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#"))) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		anchors = append(anchors, b.String())
	}
	return anchors
}
