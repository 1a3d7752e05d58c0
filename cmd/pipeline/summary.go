package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/pkg/manifest"
)

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printSummary prints one row per set of a capture: how it ended, its image and timings; as
// JSON when the logs are JSON.
func printSummary(c *console, res *run.Result) error {
	if c.json {
		type row struct {
			manifest.Checkpoint
			Status  string `json:"status"`
			Error   string `json:"error,omitempty"`
			Timings string `json:"timings,omitempty"`
		}
		rows := []row{}
		for _, r := range res.Sets {
			x := row{Checkpoint: r.Checkpoint, Status: string(r.Status), Timings: r.Timings}
			if r.Err != nil {
				x.Error = r.Err.Error()
			}
			rows = append(rows, x)
		}
		doc := map[string]any{"sets": rows}
		if res.Catalogue != nil && res.Catalogue.Prediction != nil {
			doc["prediction"] = res.Catalogue.Prediction // capture --plan's, as printPrediction prints it
		}
		return writeJSON(c.stdout, doc)
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "set\tstatus\timports\timage MiB\trestore min ms\tmedian ms\tp90 ms\tmax ms\tsmoke\tready ms\t")
	var notes []string
	for _, r := range res.Sets {
		status := string(r.Status)
		if r.Timings != "" {
			status += "*"
			notes = append(notes, r.Checkpoint.ID+": "+r.Timings)
		}
		printRow(tw, r.Checkpoint, status)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, note := range notes {
		fmt.Fprintf(c.stdout, "* %s\n", note)
	}
	return nil
}

// printCheckpoints prints the checkpoints of a manifest (measure, smoke, merge); as JSON when
// the logs are JSON.
func printCheckpoints(c *console, m *manifest.Manifest, status string) error {
	if c.json {
		return writeJSON(c.stdout, m)
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "set\tstatus\timports\timage MiB\trestore min ms\tmedian ms\tp90 ms\tmax ms\tsmoke\tready ms\t")
	for _, cp := range m.Checkpoints {
		printRow(tw, cp, status)
	}
	return tw.Flush()
}

// verified is what verify and pull report of an output whose every hash they checked.
type verified struct {
	Output           string   `json:"output"`
	Checkpoints      []string `json:"checkpoints"`
	ExecutorProtocol int      `json:"executor_protocol"`
	RunscVersion     string   `json:"runsc_version"`
}

// printVerified prints the output dir of manifest m, verified: a line, or JSON when the logs are.
func printVerified(c *console, dir string, m *manifest.Manifest) error {
	v := verified{Output: dir, Checkpoints: []string{}, ExecutorProtocol: m.ExecutorProtocol, RunscVersion: m.Runsc.Version}
	for _, cp := range m.Checkpoints {
		v.Checkpoints = append(v.Checkpoints, cp.ID)
	}
	if c.json {
		return writeJSON(c.stdout, v)
	}
	_, err := fmt.Fprintf(c.stdout, "%s: %d checkpoints verified (executor protocol %d, runsc %s)\n", v.Output, len(v.Checkpoints), v.ExecutorProtocol, v.RunscVersion)
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printRow prints one checkpoint; a value that is not known (a set that failed or was
// interrupted before it was measured) prints as -, never as 0.
func printRow(tw *tabwriter.Writer, c manifest.Checkpoint, status string) {
	smoke := "-"
	switch {
	case c.Smoke.OK:
		smoke = "ok"
	case c.Smoke.Error != "":
		smoke = "FAIL"
	}
	size := "-"
	if c.Bytes > 0 {
		size = fmt.Sprintf("%.1f", float64(c.Bytes)/(1<<20))
	}
	timings := []string{"-", "-", "-", "-"}
	if len(c.RestoreMS.Runs) > 0 {
		for i, v := range []float64{c.RestoreMS.Min, c.RestoreMS.Median, c.RestoreMS.P90, c.RestoreMS.Max} {
			timings[i] = fmt.Sprintf("%.0f", v)
		}
	}
	ready := "-"
	if c.Smoke.OK {
		ready = fmt.Sprintf("%.0f", c.Smoke.ReadyMS)
	}
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", c.ID, status, orDash(strings.Join(c.Imports, ",")),
		size, timings[0], timings[1], timings[2], timings[3], smoke, ready)
}
