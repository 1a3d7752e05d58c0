package capture

import (
	"maps"
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
		PackagesPrefix + `{"packages":{"pandas":"1.5.3"}}` + "\n" + // the executor's
		Marker + " imports=pandas\n" +
		PackagesPrefix + `{"packages":{"pandas":"9"}}` + "\n" // after the marker: not the report
	got, err := loadedPackages([]byte(stdout))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"pandas": "1.5.3"}; !maps.Equal(got, want) {
		t.Errorf("packages %v, want the executor's %v", got, want)
	}
}
