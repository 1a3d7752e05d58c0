package jsonfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	type doc struct {
		A int `json:"a"`
	}
	for _, tc := range []struct {
		data, want string // want: a part of the error, "" for none
	}{
		{`{"a": 1}`, ""},
		{`{"a": 1}` + "\n", ""},
		{`{"a": 1, "b": 2}`, `unknown field "b"`},
		{`{"a": 1} {"a": 2}`, "data after the doc object"},
		{`{"a": "x"}`, "cannot unmarshal"},
		{``, "EOF"},
	} {
		var d doc
		err := Decode([]byte(tc.data), &d, "doc")
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Decode(%q): %v", tc.data, err)
		case tc.want == "" && d.A != 1:
			t.Errorf("Decode(%q) = %+v, want a: 1", tc.data, d)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Decode(%q) = %v, want an error with %q", tc.data, err, tc.want)
		}
	}
}

func TestRead(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(filepath.Join(dir, "absent.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read of an absent file: %v, want fs.ErrNotExist", err)
	}
	path := filepath.Join(dir, "x.json")
	if err := os.WriteFile(path, []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if data, err := Read(path); err != nil || string(data) != `{}` {
		t.Errorf("Read = %q, %v", data, err)
	}
	if _, err := Read(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("Read of a directory: %v, want an error naming it", err)
	}
}
