package config

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// checkKeys walks a YAML document against the Go type it decodes into and reports, in the
// config's own words, the keys it does not know (with the closest known one) and the values
// that are not of their key's kind (with an example of what is expected), each with its line.
// yaml.v3's own messages name Go types ("field restore_run not found in type config.Config").
func checkKeys(data []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return nil // syntax errors are reported by the decoder, with their line
	}
	var p problems
	walkKeys(doc.Content[0], reflect.TypeOf(Config{}), "", &p)
	return errors.Join(p...)
}

var (
	durationType = reflect.TypeOf(time.Duration(0))
	baselineType = reflect.TypeOf(CPUBaseline{})
)

// walkKeys checks the node n against the type t it decodes into; path names it in messages.
func walkKeys(n *yaml.Node, t reflect.Type, path string, p *problems) {
	if n.Kind == yaml.AliasNode || (n.Kind == yaml.ScalarNode && n.Tag == "!!null") {
		return
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == baselineType && n.Kind != yaml.MappingNode {
		t = reflect.TypeOf([]string{}) // cpu_baseline's list form
	}
	switch t.Kind() {
	case reflect.Struct:
		walkStruct(n, t, path, p)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			p.addAt(n, "%s: want a list", path)
			return
		}
		for i, item := range n.Content {
			walkKeys(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), p)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			p.addAt(n, "%s: want a mapping", path)
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			walkKeys(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value), p)
		}
	default:
		checkScalar(n, t, path, p)
	}
}

// walkStruct checks a mapping's keys against the yaml tags of the struct type t, naming the
// closest known key for an unknown one.
func walkStruct(n *yaml.Node, t reflect.Type, path string, p *problems) {
	where := path
	if where == "" {
		where = "the top level"
	}
	if n.Kind != yaml.MappingNode {
		p.addAt(n, "%s: want a mapping of keys (%s)", where, strings.Join(keysOf(t), ", "))
		return
	}
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			fields[name] = f.Type
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, value := n.Content[i], n.Content[i+1]
		ft, ok := fields[key.Value]
		if !ok {
			hint := ""
			if near := closest(key.Value, keysOf(t)); near != "" {
				hint = fmt.Sprintf(" (did you mean %s?)", join(path, near))
			}
			p.addAt(key, "unknown key %s%s; %s takes %s", join(path, key.Value), hint, where, strings.Join(keysOf(t), ", "))
			continue
		}
		walkKeys(value, ft, join(path, key.Value), p)
	}
}

// checkScalar checks that a single value is of the kind of t: a duration, a whole number, a
// boolean or a string.
func checkScalar(n *yaml.Node, t reflect.Type, path string, p *problems) {
	switch {
	case t == durationType:
		if n.Kind != yaml.ScalarNode {
			p.addAt(n, "%s: want a duration such as 5m or 90s", path)
		} else if _, err := time.ParseDuration(n.Value); err != nil {
			p.addAt(n, "%s: %q is not a duration: want one such as 5m or 90s", path, n.Value)
		}
	case t.Kind() == reflect.Int:
		if _, err := strconv.Atoi(n.Value); n.Kind != yaml.ScalarNode || err != nil {
			p.addAt(n, "%s: %q is not a whole number", path, n.Value)
		}
	case t.Kind() == reflect.Bool:
		if _, err := strconv.ParseBool(n.Value); n.Kind != yaml.ScalarNode || err != nil {
			p.addAt(n, "%s: %q is not true or false", path, n.Value)
		}
	case t.Kind() == reflect.String:
		if n.Kind != yaml.ScalarNode {
			p.addAt(n, "%s: want a single value, not a list or mapping", path)
		}
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func keysOf(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}

// closest returns the key of keys nearest to s, within an edit distance of a third of its
// length; "" when none is that near.
func closest(s string, keys []string) string {
	best, bestDist := "", len(s)/3+1
	for _, k := range keys {
		if d := editDistance(s, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
