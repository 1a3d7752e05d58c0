package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"readie.dev/pipeline/pkg/manifest"
)

func printSummary(w io.Writer, m *manifest.Manifest) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "set\timports\timage MiB\trestore min ms\tmedian ms\tp90 ms\tmax ms\tsmoke\tready ms\t")
	for _, c := range m.Checkpoints {
		smoke := "FAIL"
		if c.Smoke.OK {
			smoke = "ok"
		}
		imports := strings.Join(c.Imports, ",")
		if imports == "" {
			imports = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t%.0f\t\n", c.ID, imports,
			float64(c.Bytes)/(1<<20), c.RestoreMS.Min, c.RestoreMS.Median, c.RestoreMS.P90, c.RestoreMS.Max, smoke, c.Smoke.ReadyMS)
	}
	tw.Flush()
}
