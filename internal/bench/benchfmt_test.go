package bench

import (
	"bytes"
	"strings"
	"testing"

	"golang.org/x/perf/benchfmt"

	"readie.dev/pipeline/pkg/manifest"
)

// TestBenchfmtParsesWithBenchstatsParser: bench.txt is read by benchstat's own parser, one
// result per run, with its name's keys and both units.
func TestBenchfmtParsesWithBenchstatsParser(t *testing.T) {
	r := &Report{Machine: Machine{CPUModel: "AMD EPYC"}, Runsc: manifest.Runsc{Version: "readie-x"}, RestoreFlags: []string{"-direct"},
		Results: Results{Rounds: 3, Series: []string{Restore, "variant:-direct,-background"}, Sets: []SetReport{{
			MeasuredSet: MeasuredSet{ID: "pandas", Bytes: 40 << 20},
			Series: map[string]Stats{
				Restore:                       Summarize([]float64{389.5, 401, 377}),
				"variant:-direct,-background": Summarize([]float64{380, 390, 385}),
			},
		}}}}
	var buf bytes.Buffer
	if err := WriteBenchfmt(&buf, r); err != nil {
		t.Fatal(err)
	}
	reader := benchfmt.NewReader(&buf, "bench.txt")
	var results int
	for reader.Scan() {
		switch rec := reader.Result().(type) {
		case *benchfmt.Result:
			results++
			name := rec.Name.String()
			if !strings.HasPrefix(name, "Restore/set=pandas/series=") || !strings.HasSuffix(name, "/conc=1") {
				t.Errorf("name %q", name)
			}
			ns, ok := rec.Value("sec/op")
			mib, ok2 := rec.Value("MiB")
			if !ok || !ok2 || ns <= 0.3 || ns >= 0.5 || mib != 40 {
				t.Errorf("%s: sec/op %v MiB %v", name, ns, mib)
			}
			if rec.GetConfig("cpu") != "AMD EPYC" || rec.GetConfig("runsc") != "readie-x" {
				t.Errorf("config %v", rec.Config)
			}
		case *benchfmt.SyntaxError:
			t.Errorf("benchstat's parser: %v", rec)
		}
	}
	if err := reader.Err(); err != nil || results != 6 {
		t.Fatalf("%d results, %v\n%s", results, err, buf.String())
	}
}
