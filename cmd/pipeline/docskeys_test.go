package main

import (
	"flag"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	pipeline "readie.dev/pipeline"
	"readie.dev/pipeline/internal/config"
)

// The reference docs checked against what they describe, both ways, so that they cannot go
// stale: docs/commands.md against every command's flag set, docs/config.md against the
// config's keys, docs/bench.md against the default variants, and the README's first screen
// against the default image's packages.

// tableRows returns the rows of the markdown table in doc whose header row starts with header,
// each split into its cells (`\|` inside a cell stays in it, as `|`).
func tableRows(t *testing.T, doc, header string) [][]string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n"+header)
	if !ok {
		t.Fatalf("no table whose header starts with %q", header)
	}
	var rows [][]string
	for i, line := range strings.Split(rest, "\n")[1:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		if i == 0 {
			continue // the |---| line
		}
		line = strings.ReplaceAll(strings.Trim(line, "|"), `\|`, "\x00")
		var cells []string
		for _, cell := range strings.Split(line, "|") {
			cells = append(cells, strings.TrimSpace(strings.ReplaceAll(cell, "\x00", "|")))
		}
		rows = append(rows, cells)
	}
	if len(rows) < 5 {
		t.Fatalf("the table under %q has only %d rows", header, len(rows))
	}
	return rows
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// spans returns the contents of the code spans of text.
func spans(text string) []string {
	var out []string
	for _, m := range codeSpan.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

// namedFlags returns the flags (--name) that the code spans of text name, but for those of the
// pipeline itself (`pipeline --version`), which come before any command.
func namedFlags(text string) []string {
	var names []string
	for _, s := range spans(text) {
		if strings.HasPrefix(s, "pipeline --") {
			continue
		}
		for _, m := range regexp.MustCompile(`(?:^|\s)--([a-z][a-z0-9-]*)`).FindAllStringSubmatch(s, -1) {
			names = append(names, m[1])
		}
	}
	return names
}

// TestCommandsDocFlags: docs/commands.md has a row per command whose flags cell names every flag
// of the command's flag set, and no row names a flag its command lacks; the header names the
// flags every command takes. The help row is for `help`, which parse handles.
func TestCommandsDocFlags(t *testing.T) {
	t.Parallel()
	doc := readFile(t, "../../"+commandsDoc)
	const header = "| command | what it does | its flags"
	rows := tableRows(t, doc, header)
	headerLine := doc[strings.Index(doc, header):]
	headerLine, _, _ = strings.Cut(headerLine, "\n")
	logs := flag.NewFlagSet("", flag.ContinueOnError)
	(&logFlags{}).register(logs)
	logs.VisitAll(func(f *flag.Flag) {
		if !regexp.MustCompile("`--?" + regexp.QuoteMeta(f.Name) + "[ `]").MatchString(headerLine) {
			t.Errorf("%s: the header does not say that every command takes -%s", commandsDoc, f.Name)
		}
	})
	used := make([]bool, len(rows))
	for _, l := range leafCommands() {
		i := slices.IndexFunc(rows, func(cells []string) bool {
			first := spans(cells[0])
			return len(first) > 0 && (first[0] == l.path() || strings.HasPrefix(first[0], l.path()+" "))
		})
		if i < 0 {
			t.Errorf("%s has no row for `%s`", commandsDoc, l.path())
			continue
		}
		used[i] = true
		row := rows[i]
		if len(row) != 3 {
			t.Errorf("%s: the row of %s has %d cells, want 3", commandsDoc, l.path(), len(row))
			continue
		}
		own := ownFlags(l.cmd)
		for _, name := range own {
			if !regexp.MustCompile("`--" + regexp.QuoteMeta(name) + "[ `=]").MatchString(row[2]) {
				t.Errorf("%s: the row of %s does not name its flag --%s in its flags cell", commandsDoc, l.path(), name)
			}
		}
		for _, name := range namedFlags(strings.Join(row, " | ")) {
			if !slices.Contains(own, name) {
				t.Errorf("%s: the row of %s names --%s, which %s does not take", commandsDoc, l.path(), name, l.path())
			}
		}
	}
	for i, row := range rows {
		if first := spans(row[0]); !used[i] && (len(first) == 0 || !strings.HasPrefix(first[0], "help ")) {
			t.Errorf("%s: the row %q is of no command", commandsDoc, row[0])
		}
	}
}

// configKeys adds the keys of the config type t under prefix to keys: true for a key that holds
// a value, false for one that holds keys (a mapping, or a list of mappings: its items' keys are
// prefix[].key).
func configKeys(t reflect.Type, prefix string, keys map[string]bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct:
			keys[path] = false
			configKeys(ft, path, keys)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			keys[path] = false
			configKeys(ft.Elem(), path+"[]", keys)
		default:
			keys[path] = true
		}
	}
}

// documentedKeys returns the keys a row's key cell names: its first code span is a whole key
// (`timeouts.capture`), and each further one a sibling of it (`restore`: timeouts.restore).
func documentedKeys(cell string) []string {
	names := spans(cell)
	if len(names) == 0 {
		return nil
	}
	keys := []string{names[0]}
	parent := ""
	if i := strings.LastIndex(names[0], "."); i >= 0 {
		parent = names[0][:i+1]
	}
	for _, n := range names[1:] {
		keys = append(keys, parent+n)
	}
	return keys
}

// TestConfigDocKeys: docs/config.md has a row for every key of the config that holds a value,
// and names no key the config lacks.
func TestConfigDocKeys(t *testing.T) {
	t.Parallel()
	const path = "docs/config.md"
	keys := map[string]bool{}
	configKeys(reflect.TypeOf(config.Config{}), "", keys)
	if len(keys) < 40 {
		t.Fatalf("found only %d config keys: %v", len(keys), keys)
	}
	documented := map[string]bool{}
	for _, row := range tableRows(t, readFile(t, "../../"+path), "| key | default | meaning |") {
		for _, key := range documentedKeys(row[0]) {
			if _, ok := keys[key]; !ok {
				t.Errorf("%s documents %s, which the config does not have", path, key)
			}
			documented[key] = true
		}
	}
	for key, holdsValue := range keys {
		if holdsValue && !documented[key] {
			t.Errorf("%s has no row for the config key %s", path, key)
		}
	}
}

// numberWords names the counts docs write in words.
var numberWords = []string{"no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"}

// TestBenchDocVariants: docs/bench.md's row of the variant series names every variant of the
// default config, and counts them right.
func TestBenchDocVariants(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg, err := config.Parse(pipeline.DefaultConfig(), "pipeline.yaml", dir, dir)
	if err != nil {
		t.Fatal(err)
	}
	variants := cfg.Bench.Variants
	if len(variants) < 2 || len(variants) >= len(numberWords) {
		t.Fatalf("the default config has %d bench variants: extend numberWords", len(variants))
	}
	var row []string
	for _, r := range tableRows(t, readFile(t, "../../docs/bench.md"), "| series |") {
		if r[0] == "`variant:NAME`" {
			row = r
		}
	}
	if row == nil {
		t.Fatal("docs/bench.md has no row for the variant:NAME series")
	}
	named := spans(row[1])
	for _, v := range variants {
		if !slices.Contains(named, v.Name) {
			t.Errorf("docs/bench.md does not name the default variant %q (`%s`)", v.Name, v.Name)
		}
	}
	if want := "the default " + numberWords[len(variants)] + ":"; !strings.Contains(row[1], want) {
		t.Errorf("docs/bench.md does not say %q: %s", want, row[1])
	}
}

// TestReadmeFirstScreen: the README's first screen says what the default image holds (its
// Debian suite and the Python packages of images/executor/packages.txt) and how to bring your
// own (--image, docs/images.md).
func TestReadmeFirstScreen(t *testing.T) {
	t.Parallel()
	lines := strings.Split(readFile(t, "../../README.md"), "\n")
	screen := strings.Join(lines[:min(25, len(lines))], "\n")
	suite := regexp.MustCompile(`(?m)^suite=(\S+)$`).FindStringSubmatch(readFile(t, "../../images/executor/build-image.sh"))
	if suite == nil {
		t.Fatal("images/executor/build-image.sh sets no suite=")
	}
	want := []string{suite[1], "--image REF", "(docs/images.md)"}
	for _, line := range strings.Split(readFile(t, "../../images/executor/packages.txt"), "\n") {
		if module, ok := strings.CutPrefix(strings.TrimSpace(line), "python3-"); ok {
			want = append(want, module)
		}
	}
	if len(want) < 5 {
		t.Fatalf("found only %v", want)
	}
	for _, w := range want {
		if !strings.Contains(screen, w) {
			t.Errorf("the README's first 25 lines do not say %q", w)
		}
	}
}
