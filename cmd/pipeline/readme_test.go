package main

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"readie.dev/pipeline/pkg/manifest"
)

// The README is how a new user meets the pipeline: every make target and command it names
// must exist, and every target, command and manifest field must be in it.

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// codeSpans are the README's inline code spans and indented code lines: where commands are.
func codeSpans(readme string) []string {
	spans := regexp.MustCompile("`[^`\n]+`").FindAllString(readme, -1)
	for _, line := range strings.Split(readme, "\n") {
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
	readme := readFile(t, "../../README.md")
	targets := makeTargets(t)
	named := map[string]bool{}
	for _, span := range codeSpans(readme) {
		for _, m := range regexp.MustCompile(`\bmake ([a-z][a-z-]*)`).FindAllStringSubmatch(span, -1) {
			named[m[1]] = true
		}
	}
	for name := range named {
		if !slices.Contains(targets, name) {
			t.Errorf("the README runs `make %s`, which the Makefile does not have", name)
		}
	}
	for _, target := range targets {
		if !strings.Contains(readme, "| `"+target+"` |") {
			t.Errorf("make target %s is not in the README's table of make targets", target)
		}
	}
}

func TestReadmeCommands(t *testing.T) {
	readme := readFile(t, "../../README.md")
	set := commands()
	for _, span := range codeSpans(readme) {
		for _, m := range regexp.MustCompile(`\bpipeline ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?`).FindAllStringSubmatch(span, -1) {
			cmd, err := set.find(m[1])
			if err != nil {
				t.Errorf("the README names `pipeline %s`: %v", m[1], err)
				continue
			}
			if g, ok := cmd.(*group); ok && m[2] != "" {
				if _, err := g.set.find(m[2]); err != nil {
					t.Errorf("the README names `pipeline %s %s`: %v", m[1], m[2], err)
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
			if !regexp.MustCompile("\\| `" + regexp.QuoteMeta(name) + "[ `]").MatchString(readme) {
				t.Errorf("command %q is not in the README's table of commands", name)
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
	readme := readFile(t, "../../README.md")
	fields := map[string]string{}
	seen := map[reflect.Type]bool{}
	jsonFields(reflect.TypeOf(manifest.Manifest{}), seen, fields)
	jsonFields(reflect.TypeOf(manifest.Meta{}), seen, fields)
	if len(fields) < 20 {
		t.Fatalf("found only %d manifest fields", len(fields))
	}
	for name, field := range fields {
		if !strings.Contains(readme, "`"+name+"`") && !regexp.MustCompile(`[ (/]`+regexp.QuoteMeta(name)+`[,)/ ]`).MatchString(readme) {
			t.Errorf("manifest field %s (%s) is not documented in the README", name, field)
		}
	}
}
