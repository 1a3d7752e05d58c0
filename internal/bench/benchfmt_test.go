package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// goldenFile compares got with the file testdata/name, or rewrites it when
// READIE_UPDATE_GOLDEN=1.
func goldenFile(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if os.Getenv("READIE_UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (READIE_UPDATE_GOLDEN=1 rewrites it):\n%s\nwant:\n%s", path, got, want)
	}
}

// TestBenchfmtHeaderGolden: bench.txt's configuration lines come from the report, never from
// the machine the test runs on: an arm64 report says arm64, a time in another zone is written
// in UTC, and a load that moved is written with its warning.
func TestBenchfmtHeaderGolden(t *testing.T) {
	load := Load{Before: 0.12, During: []float64{0.9, 1.4, 3.1}, After: 2.8}
	load.Warning = loadWarning(load, 2)
	r := &Report{
		CreatedAt: time.Date(2026, 12, 6, 6, 40, 5, 0, time.FixedZone("CET", 3600)),
		Machine:   Machine{CPUs: 2, CPUModel: "AMD EPYC 7B13", GOOS: "linux", GOARCH: "arm64"},
		Load:      load, Revision: "(devel) 37c042b", Runsc: manifest.Runsc{Version: "readie-20260905-160fafc42237"},
		Results: Results{Rounds: 2, Series: []string{Restore, "variant:none"}, Sets: []SetReport{{
			MeasuredSet: MeasuredSet{ID: "pandas", Bytes: 40 << 20},
			Series: map[string]Stats{
				Restore:        Summarize([]float64{151.5, 160.25}),
				"variant:none": {Stats: Summarize([]float64{170, 180}).Stats, RestoreCPU: []float64{96, 101}},
			},
		}}},
	}
	var buf bytes.Buffer
	if err := WriteBenchfmt(&buf, r); err != nil {
		t.Fatal(err)
	}
	goldenFile(t, "bench.txt.golden", buf.Bytes())
	// benchstat's own parser reads the header as configuration, and the CPU time as a unit.
	reader := benchfmt.NewReader(bytes.NewReader(buf.Bytes()), "bench.txt")
	cpus := 0
	for reader.Scan() {
		rec, ok := reader.Result().(*benchfmt.Result)
		if !ok {
			t.Fatalf("benchstat's parser: %v", reader.Result())
		}
		for key, want := range map[string]string{"goarch": "arm64", "date": "2026-12-06T05:40:05Z", "rounds": "2", "revision": "(devel) 37c042b", "cpu": "AMD EPYC 7B13"} {
			if got := rec.GetConfig(key); got != want {
				t.Errorf("%s: %q, want %q", key, got, want)
			}
		}
		if v, ok := rec.Value("restore-cpu-ms"); ok && v > 90 {
			cpus++
		}
	}
	if err := reader.Err(); err != nil || cpus != 2 {
		t.Errorf("%d restore CPU times read, %v", cpus, err)
	}
}

// TestPercentilesGolden: the percentiles of bench.json on samples recorded from a real run
// (testdata/recorded-runs.json, series to runs in ms).
func TestPercentilesGolden(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "recorded-runs.json"))
	if err != nil {
		t.Fatal(err)
	}
	var recorded map[string][]float64
	if err := json.Unmarshal(data, &recorded); err != nil {
		t.Fatal(err)
	}
	summaries := map[string]Stats{}
	for name, runs := range recorded {
		summaries[name] = Summarize(runs)
	}
	got, err := json.MarshalIndent(summaries, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	goldenFile(t, "percentiles.golden.json", append(got, '\n'))
}
