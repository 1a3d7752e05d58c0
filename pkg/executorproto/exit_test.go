package executorproto

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

// TestExitCodesMatchTheExecutor: the Go names of the executor's exit codes have the values the
// executor itself exits with.
func TestExitCodesMatchTheExecutor(t *testing.T) {
	src, err := os.ReadFile("../../images/executor/readie_executor/server.py")
	if err != nil {
		t.Fatal(err)
	}
	python := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^EXIT_([A-Z]+) = ([0-9]+)$`).FindAllStringSubmatch(string(src), -1) {
		python[m[1]], _ = strconv.Atoi(m[2])
	}
	want := map[string]int{"OK": 0, "SETTINGS": ExitSettings, "IMPORT": ExitImport, "CHECKPOINT": ExitCheckpoint, "ENVIRON": ExitEnviron}
	if len(python) != len(want) {
		t.Errorf("server.py defines EXIT_ codes %v; this package names %v", python, want)
	}
	for name, code := range want {
		if got, ok := python[name]; !ok || got != code {
			t.Errorf("server.py EXIT_%s = %d (defined: %v); the Go side says %d", name, got, ok, code)
		}
	}
}

// TestExitMeaning: each code the executor chooses, and a signal's, is explained; others are not.
func TestExitMeaning(t *testing.T) {
	for code, want := range map[int]string{
		0:              "",
		1:              "",
		ExitSettings:   "bad executor settings",
		ExitImport:     "an import of the package set failed",
		ExitCheckpoint: "the checkpoint could not be triggered or gVisor reported an error",
		ExitEnviron:    "the restore-time environment could not be applied",
		6:              "",
		137:            "killed by signal 9, killed",
		143:            "killed by signal 15, terminated",
	} {
		if got := ExitMeaning(code); got != want {
			t.Errorf("ExitMeaning(%d) = %q; want %q", code, got, want)
		}
	}
}
