package capture

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// TestLoadedPackagesIsTheExecutorsLine: the image's code runs before the executor's report (a
// preimport prints at import time) and may print a line that looks like one; the report read
// is the executor's, the last before the checkpoint marker, which nothing of the image prints
// between.
func TestLoadedPackagesIsTheExecutorsLine(t *testing.T) {
	stdout := "" +
		PackagesPrefix + `{"packages":{"pandas":"2.2.0"}}` + "\n" + // printed by a preimported module
		"readie-executor: cpu ok\n" +
		PackagesPrefix + `{"packages":{"pandas":"1.5.3"},"unmapped":["zmod","appmod"]}` + "\n" + // the executor's
		Marker + " imports=pandas\n" +
		PackagesPrefix + `{"packages":{"pandas":"9"}}` + "\n" // after the marker: not the report
	got, unmapped, err := loadedPackages([]byte(stdout))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"pandas": "1.5.3"}; !maps.Equal(got, want) || !slices.Equal(unmapped, []string{"appmod", "zmod"}) {
		t.Errorf("packages %v, unmapped %v; want the executor's %v, [appmod zmod]", got, unmapped, want)
	}
}

// TestLoadedPackagesUnmapped: a report without "unmapped" (an executor of before it) or with an
// empty list means none; a name that is no top-level module name is refused, quoted.
func TestLoadedPackagesUnmapped(t *testing.T) {
	for _, report := range []string{`{"packages":{}}`, `{"packages":{},"unmapped":[]}`} {
		got, unmapped, err := loadedPackages([]byte(PackagesPrefix + report + "\n" + Marker + "\n"))
		if err != nil || got == nil || unmapped != nil {
			t.Errorf("%s: %v, %#v, %v; want no packages, nil, no error", report, got, unmapped, err)
		}
	}
	_, _, err := loadedPackages([]byte(PackagesPrefix + `{"packages":{},"unmapped":["ok","a\u001b[2Jb"]}` + "\n" + Marker + "\n"))
	if err == nil || !strings.Contains(err.Error(), `unmapped modules: "a\x1b[2Jb"`) {
		t.Errorf("a bad unmapped name: %v", err)
	}
}

// TestLoadedPackagesErrorsBounded: what the image's python says of its failure reaches the
// capture's error, quoted (no escapes reach a terminal) and cut short.
func TestLoadedPackagesErrorsBounded(t *testing.T) {
	long := strings.Repeat("a", 100000)
	var many, manyUnmapped []string
	for i := range 5000 {
		many = append(many, fmt.Sprintf(`"Bad_%d\u001b":"1"`, i))
		manyUnmapped = append(manyUnmapped, fmt.Sprintf(`"m%d"`, i))
	}
	for _, report := range []string{
		`{"error":"\u001b[2J` + long + `"}`,
		`{"packages":{},"errors":{"pandas":"\u001b[2J` + long + `"}}`,
		`{"packages":{"a\u001b[2J` + long + `":""}}`,
		`{"packages":{"pandas":"\u001b[2J` + long + `"}}`,
		`{"packages":{` + strings.Join(many, ",") + `}}`,
		`{"packages":{},"unmapped":[` + strings.Join(manyUnmapped, ",") + `]}`,
	} {
		_, _, err := loadedPackages([]byte(PackagesPrefix + report + "\n" + Marker + "\n"))
		if err == nil || len(err.Error()) > 1000 || strings.ContainsRune(err.Error(), 0x1b) {
			t.Errorf("%.40s...: error of %d bytes: %.200q", report, len(err.Error()), err)
		}
	}
}

// TestCPUCheckIsTheExecutorsLine: as for the packages report, a preimport's look-alike CPU check
// line does not decide the checkpoint's.
func TestCPUCheckIsTheExecutorsLine(t *testing.T) {
	stdout := CPUCheckPrefix + `{"verdict":"forged"}` + "\n" +
		CPUCheckPrefix + `{"verdict":"real"}` + "\n" +
		PackagesPrefix + `{"packages":{}}` + "\n" + Marker + "\n"
	check, err := cpuCheck([]byte(stdout))
	if err != nil || check.Verdict != "real" {
		t.Errorf("%+v, %v; want the executor's verdict", check, err)
	}
}
