package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteJSONLeavesNoTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "manifest.json")
	if err := WriteJSON(path, map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil || string(data) != "{\n  \"a\": 1\n}\n" {
		t.Fatalf("%q %v", data, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
}

func TestWriteAtomicKeepsOldFileOnFailure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "manifest.json")
	if err := WriteJSON(path, map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	if err := WriteJSON(path, map[string]any{"bad": func() {}}); err == nil {
		t.Fatal("unencodable value written")
	}
	after, _ := os.ReadFile(path)
	if string(before) != string(after) {
		t.Fatal("a failed write changed the file")
	}
}

// TestTempOf: TempOf knows the names Write gives its temporary files, and no other.
func TestTempOf(t *testing.T) {
	dir := t.TempDir()
	tmp, err := os.CreateTemp(dir, ".manifest.json"+tmpInfix+"*") // as Write names them
	if err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	if base, ok := TempOf(filepath.Base(tmp.Name())); !ok || base != "manifest.json" {
		t.Errorf("TempOf(%q) = %q, %v", filepath.Base(tmp.Name()), base, ok)
	}
	for _, name := range []string{"manifest.json", ".manifest.json.tmp-", ".manifest.json.tmp-12a", "manifest.json.tmp-12", "..tmp-1", ".tmp-1", ".x.tmp-1/"} {
		if base, ok := TempOf(name); ok {
			t.Errorf("TempOf(%q) = %q, true", name, base)
		}
	}
}
