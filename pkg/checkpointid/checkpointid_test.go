package checkpointid

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for id, want := range map[string]bool{
		"numpy": true, "a-b_C9": true, "empty": true, strings.Repeat("x", 64): true,
		"": false, strings.Repeat("x", 65): false, ".": false, "..": false, "../x": false,
		"a/b": false, "/abs": false, "a.b": false, "a b": false, "é": false, "a\x00": false,
	} {
		if got := Valid(id); got != want {
			t.Errorf("Valid(%q) = %v, want %v", id, got, want)
		}
		if err := Check(id); (err == nil) != want || (err != nil && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("%q", id)))) {
			t.Errorf("Check(%q) = %v", id, err)
		}
	}
}

// TestPlain: Plain is Valid's alphabet without its bound.
func TestPlain(t *testing.T) {
	for s, want := range map[string]bool{
		"numpy": true, strings.Repeat("x", 200): true,
		"": false, ".": false, "..": false, "a/b": false, "a\x00": false, "a b": false, "é": false,
	} {
		if got := Plain(s); got != want {
			t.Errorf("Plain(%q) = %v, want %v", s, got, want)
		}
	}
}

// FuzzValid: an accepted id is a single local path element.
func FuzzValid(f *testing.F) {
	for _, s := range []string{"numpy", "..", "../../x", "a/b", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if Valid(id) && (!filepath.IsLocal(id) || filepath.Base(id) != id || id == "." || id == "..") {
			t.Errorf("Valid(%q) accepts a path", id)
		}
	})
}
