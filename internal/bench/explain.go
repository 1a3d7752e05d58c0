package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"readie.dev/pipeline/pkg/launch"
)

// Breakdown is where the time of one restore-to-answer goes, in milliseconds, from runsc's
// debug timeline and the pipeline's own marks.
type Breakdown struct {
	Set string `json:"set"`
	// Path is "restore" (a restore that makes its sandbox), "pooled" (a restore onto a
	// sandbox created ahead, as a pool's: the sandbox boot is off the clock) or "warm" (a
	// sandbox restored ahead, as a warm pool's: only the take and the call are on the clock).
	Path string `json:"path"`
	// AheadMs is, on the warm path, the restore the pool ran ahead, off the clock: from its
	// start to the executor's accept.
	AheadMs float64 `json:"ahead_ms,omitempty"`
	// Total runs from the start of `runsc restore` to the decoded answer.
	Total float64 `json:"total_ms"`
	// Spawn: starting the runsc process, until its first log line (the pipeline's cost).
	Spawn float64 `json:"spawn_ms"`
	// SandboxStart: runsc creating the sandbox (gofer, sentry boot) until it handles the
	// restore RPC; on the pooled path, runsc restore reaching the sandbox created ahead.
	SandboxStart float64 `json:"sandbox_start_ms"`
	// PageLoad and KernelLoad: loading the memory file and the kernel state; RestoreOther is
	// the rest of the restore RPC.
	PageLoad     float64 `json:"page_load_ms"`
	KernelLoad   float64 `json:"kernel_load_ms"`
	RestoreOther float64 `json:"restore_other_ms"`
	// RunscExit: from the end of the restore until `runsc restore -detach` returned.
	RunscExit float64 `json:"runsc_exit_ms"`
	// Wake: from runsc's return until the executor accepted the connection (it re-reads its
	// environment, binds the socket; includes the pipeline's dial retries).
	Wake float64 `json:"wake_ms"`
	// Call: one request and response on the restored executor.
	Call float64 `json:"call_ms"`
}

// PipelineOverhead returns the part the pipeline adds itself: process start-up of runsc.
func (b Breakdown) PipelineOverhead() float64 { return b.Spawn }

var (
	glogTime     = regexp.MustCompile(`^[IWDE](\d{4}) (\d{2}:\d{2}:\d{2}\.\d{6})`)
	midpointLine = regexp.MustCompile(`Timeline (.+?) reached midpoint (.+?) at \S+ \(unix nanos: (\d+)\)`)
	timerLine    = regexp.MustCompile(`Timer for [^:]+: time (\d+) \S+ (start|mid|end) (\S+(?: \S+)*?)(?: = (.+))?$`)
)

// restoreTimeline holds the events of one restore's debug logs, in unix nanoseconds.
type restoreTimeline struct {
	processStart                       int64 // first line of the restore command's log
	rpc                                int64 // the sandbox handles the restore RPC
	pagesStart, pagesEnd               int64
	kernelStart, kernelEnd, restoreEnd int64
}

// parseRestoreLogs reads the restore command's and the sandbox's debug logs in dir. The
// restore command's lines carry a wall-clock time without a zone: the pipeline runs runsc with
// TZ=UTC (launch.Runtime), so they are read as UTC, in year.
func parseRestoreLogs(dir string, year int) (restoreTimeline, error) {
	var tl restoreTimeline
	restoreLogs, _ := filepath.Glob(filepath.Join(dir, "*.restore.txt"))
	bootLogs, _ := filepath.Glob(filepath.Join(dir, "*.boot.txt"))
	if len(restoreLogs) != 1 || len(bootLogs) != 1 {
		return tl, fmt.Errorf("want one restore and one boot debug log in %s, found %d and %d", dir, len(restoreLogs), len(bootLogs))
	}
	if err := scanLines(restoreLogs[0], func(line string) bool {
		t, err := glogLineTime(line, year, time.UTC)
		if err != nil {
			return true
		}
		tl.processStart = t.UnixNano()
		return false
	}); err != nil {
		return tl, err
	}
	err := scanLines(bootLogs[0], func(line string) bool {
		if m := midpointLine.FindStringSubmatch(line); m != nil {
			if m[1] == "Restore" && m[2] == "cm.Restore RPC" {
				tl.rpc, _ = strconv.ParseInt(m[3], 10, 64)
			}
			return true
		}
		m := timerLine.FindStringSubmatch(line)
		if m == nil {
			return true
		}
		ns, _ := strconv.ParseInt(m[1], 10, 64)
		kind, name, label := m[2], m[3], m[4]
		switch {
		case kind == "mid" && name == "Restore/PagesFileLoader" && label == "forked":
			tl.pagesStart = ns
		case kind == "end" && name == "Restore/PagesFileLoader":
			tl.pagesEnd = ns
		case kind == "start" && name == "Restore/kernel load":
			tl.kernelStart = ns
		case kind == "end" && name == "Restore/kernel load":
			tl.kernelEnd = ns
		case kind == "end" && name == "Restore":
			tl.restoreEnd = ns
		}
		return true
	})
	if err != nil {
		return tl, err
	}
	for name, v := range map[string]int64{"restore process start": tl.processStart, "cm.Restore RPC": tl.rpc,
		"page loader": tl.pagesEnd, "kernel load": tl.kernelEnd, "end of restore": tl.restoreEnd} {
		if v == 0 {
			return tl, fmt.Errorf("runsc's debug log in %s has no %s event", dir, name)
		}
	}
	return tl, nil
}

func scanLines(path string, f func(string) bool) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if !f(sc.Text()) {
			return nil
		}
	}
	return sc.Err()
}

func msBetween(a, b int64) float64 { return float64(b-a) / 1e6 }

// explain combines a restore's debug timeline with the pipeline's marks of the same call.
func explain(set string, tl restoreTimeline, marks launch.CallMarks) Breakdown {
	began, started := marks.Began.UnixNano(), marks.Started.UnixNano()
	connected, answered := marks.Connected.UnixNano(), marks.Answered.UnixNano()
	b := Breakdown{
		Set:          set,
		Total:        msBetween(began, answered),
		Spawn:        msBetween(began, tl.processStart),
		SandboxStart: msBetween(tl.processStart, tl.rpc),
		PageLoad:     msBetween(tl.pagesStart, tl.pagesEnd),
		KernelLoad:   msBetween(tl.kernelStart, tl.kernelEnd),
		RunscExit:    msBetween(tl.restoreEnd, started),
		Wake:         msBetween(started, connected),
		Call:         msBetween(connected, answered),
	}
	b.RestoreOther = msBetween(tl.rpc, tl.restoreEnd) - b.PageLoad - b.KernelLoad
	return b
}

// WriteBreakdowns prints the breakdowns as a table.
func WriteBreakdowns(w io.Writer, bs []Breakdown) error {
	if len(bs) == 0 {
		return errors.New("no breakdown")
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-10s %-8s %8s %8s %9s %8s %8s %8s %8s %8s %8s %10s\n", "set", "path", "total", "spawn", "sandbox", "pages", "kernel", "other", "runsc", "wake", "call", "pipeline")
	for _, b := range bs {
		fmt.Fprintf(&sb, "%-10s %-8s %8.0f %8.1f %9.0f %8.0f %8.0f %8.0f %8.0f %8.1f %8.1f %10.1f\n", b.Set, b.Path, b.Total, b.Spawn, b.SandboxStart,
			b.PageLoad, b.KernelLoad, b.RestoreOther, b.RunscExit, b.Wake, b.Call, b.PipelineOverhead())
	}
	sb.WriteString("ms; path: restore makes its sandbox, pooled restores onto one created ahead (a pool's);\n" +
		"spawn: runsc process start-up; sandbox: gofer and sentry boot until the restore RPC (pooled: runsc reaching the created sandbox); pages/kernel/other: the restore RPC;\n" +
		"runsc: until `runsc restore -detach` returns; wake: executor re-reads its environment and binds its socket, until it accepts;\n" +
		"call: one request and response; pipeline: what the pipeline itself adds (spawn);\n" +
		"warm: a sandbox restored ahead and taken (wake: the take), its restore off the clock (ahead_ms in bench.json)\n")
	_, err := io.WriteString(w, sb.String())
	return err
}

// Explain breaks down a restore-to-answer whose runsc debug logs are in logDir (one restore:
// the restore command's log and the sandbox's boot log; the delete command's log is ignored).
func Explain(set, logDir string, marks launch.CallMarks) (Breakdown, error) {
	tl, err := parseRestoreLogs(logDir, marks.Began.UTC().Year())
	if err != nil {
		return Breakdown{}, err
	}
	return explain(set, tl, marks), nil
}
