package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	pipeline "readie.dev/pipeline"
)

func TestAnalysisDefaults(t *testing.T) {
	c, err := Parse(pipeline.DefaultConfig(), "default", "/repo", "/cache/readie")
	if err != nil {
		t.Fatal(err)
	}
	want := Analysis{Runs: 3, Timeout: 2 * time.Minute, Cache: "/cache/readie/analysis"}
	if c.Analysis != want {
		t.Errorf("analysis %+v, want %+v", c.Analysis, want)
	}
	// A key given alone keeps the others' defaults; a relative cache is the config's.
	c, err = Parse([]byte("analysis:\n  runs: 5\n  cache: acache\n"), "mine.yaml", "/repo", "/cache/readie")
	if err != nil {
		t.Fatal(err)
	}
	if c.Analysis != (Analysis{Runs: 5, Timeout: 2 * time.Minute, Cache: "/repo/acache"}) {
		t.Errorf("analysis %+v", c.Analysis)
	}
}

func TestAnalysisErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"analysis:\n  runs: 0\n", "analysis.runs 0: want 1..100"},
		{"analysis:\n  runs: 101\n", "analysis.runs 101"},
		{"analysis:\n  runs: three\n", `analysis.runs: "three" is not a whole number`},
		{"analysis:\n  timeout: 0s\n", "analysis.timeout must be a positive duration"},
		{"analysis:\n  timeout: soon\n", `analysis.timeout: "soon" is not a duration`},
		{"analysis:\n  cache: \"\"\n", "analysis.cache is empty"},
		{"analysis:\n  run: 3\n", "unknown key analysis.run (did you mean analysis.runs?)"},
	} {
		_, err := Parse([]byte(tc.yaml), "bad.yaml", "/repo", "/cache")
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.want)
		}
	}
}
