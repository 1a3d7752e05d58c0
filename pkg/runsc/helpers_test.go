package runsc_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/exitcode"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/runsc"
	"readie.dev/pipeline/pkg/sandbox"
)

// fallback matches what runsc logs when it boots without a helper, or runs an embedded copy
// of one (runsc/gvisorbinaries and runsc/sandbox of the pinned gVisor).
var fallback = regexp.MustCompile(`(?i)sidecar.*not (found|usable)|embedded (copy|sidecar)`)

// helperProblems reads runsc's debug logs in logDir (every command's, --debug-log=DIR/) and
// says what shows a sandbox booted without the helpers in helpersDir: runsc must say, as often
// as it started a sandbox, that it found the sentry and the prewarmer there; every sentry's own
// log must say it is the gvisor_sentry helper; and no line may say a helper was not found, not
// usable, or run from runsc's embedded copy.
func helperProblems(t *testing.T, logDir, helpersDir string) []string {
	t.Helper()
	logs, err := filepath.Glob(filepath.Join(logDir, "*.txt"))
	if err != nil || len(logs) == 0 {
		t.Fatalf("no runsc debug log in %s: %v", logDir, err)
	}
	var problems []string
	starts, sentries, prewarmers, boots, sidecarBoots := 0, 0, 0, 0, 0
	for _, log := range logs {
		data, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		boot, bySidecar := strings.HasSuffix(log, ".boot.txt"), false
		if boot {
			boots++
		}
		for _, line := range strings.Split(string(data), "\n") {
			switch {
			case strings.Contains(line, "] Starting sandbox: "): // runsc/sandbox, as it starts one
				starts++
			case strings.Contains(line, fmt.Sprintf("Sidecar %q found: booting sandbox with %s", runsc.Sentry, filepath.Join(helpersDir, runsc.Sentry))):
				sentries++
			case strings.Contains(line, fmt.Sprintf("Sidecar %q found: prepending Sentry boot command with %s", runsc.Prewarmer, filepath.Join(helpersDir, runsc.Prewarmer))):
				prewarmers++
			case boot && strings.Contains(line, fmt.Sprintf("in sidecar %q", runsc.Sentry)):
				bySidecar = true
			case fallback.MatchString(line):
				problems = append(problems, filepath.Base(log)+": "+line)
			}
		}
		if bySidecar {
			sidecarBoots++
		}
	}
	if starts == 0 || boots == 0 {
		t.Fatalf("runsc's logs in %s show no sandbox started (%d) or booted (%d)", logDir, starts, boots)
	}
	if sentries != starts || prewarmers != starts {
		problems = append(problems, fmt.Sprintf("%d sandboxes started, %d with the sentry and %d with the prewarmer of %s", starts, sentries, prewarmers, helpersDir))
	}
	if sidecarBoots != boots {
		problems = append(problems, fmt.Sprintf("%d sentry logs, %d of them by the %s helper", boots, sidecarBoots, runsc.Sentry))
	}
	return problems
}

// runLogged runs /bin/true in a sandbox of r, with runsc's debug log in a fresh directory,
// and returns that directory.
func runLogged(t *testing.T, r *runsc.Runsc, id string) string {
	t.Helper()
	work := testenv.WorkDir(t)
	spec, err := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeSandbox, Rootfs: testenv.Rootfs(t), HostDir: hostDir(t, work, "h"), Args: []string{"/bin/true"}})
	if err != nil {
		t.Fatal(err)
	}
	logged := *r
	logged.DebugLog = filepath.Join(work, "logs") + "/"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err = logged.Run(ctx, id, bundle(t, work, "b", spec), nil)
	if delErr := r.Delete(context.WithoutCancel(ctx), id, &runsc.DeleteOpts{Force: true}); delErr != nil {
		t.Error(delErr)
	}
	if err != nil {
		t.Fatal(err)
	}
	return logged.DebugLog
}

// TestHelpersInUse: a sandbox of the pinned runsc boots with the helpers `make runsc` lays out
// in gvisor-bin/ beside it, as runsc's own log shows (helperProblems); the same sandbox with
// HelpersDir an empty directory boots as runsc did before them, and the check says so.
// TestCaptureAndRestore checks the logs of a capture and its restores too.
func TestHelpersInUse(t *testing.T) {
	t.Parallel()
	r := driver(t)
	dir, err := r.ResolvedHelpersDir()
	if err != nil {
		t.Fatal(err)
	}
	if problems := helperProblems(t, runLogged(t, r, "kit-helpers"), dir); len(problems) > 0 {
		t.Errorf("a sandbox booted without the helpers in %s (`make runsc` lays them out):\n  %s", dir, strings.Join(problems, "\n  "))
	}

	bare := *r
	bare.HelpersDir = t.TempDir()
	problems := helperProblems(t, runLogged(t, &bare, "kit-no-helpers"), bare.HelpersDir)
	for _, want := range []string{
		fmt.Sprintf("Sidecar %q not usable", runsc.Sentry),
		fmt.Sprintf("Sidecar %q not found or usable", runsc.Prewarmer),
		"1 sandboxes started, 0 with the sentry and 0 with the prewarmer",
		"1 sentry logs, 0 of them by the gvisor_sentry helper",
	} {
		if !strings.Contains(strings.Join(problems, "\n"), want) {
			t.Errorf("runsc without helpers: the check's problems lack %q:\n  %s", want, strings.Join(problems, "\n  "))
		}
	}
}

// TestHelpers: the helpers' digests are read where runsc looks (gvisor-bin/ beside the binary
// a symbolic link names, $GVISOR_SIDECAR_BINARIES_DIR, HelpersDir), and a file runsc would not
// use (not executable, not a regular file) is left out, as one that is absent.
func TestHelpers(t *testing.T) {
	dir := t.TempDir()
	install := filepath.Join(dir, "install")
	bin := filepath.Join(install, "gvisor-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(path, data string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(path, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(install, "runsc"), "runsc", 0o755)
	write(filepath.Join(bin, runsc.Sentry), "sentry", 0o755)
	write(filepath.Join(bin, runsc.Prewarmer), "prewarmer", 0o755)
	linked := filepath.Join(dir, "runsc")
	if err := os.Symlink(filepath.Join(install, "runsc"), linked); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GVISOR_SIDECAR_BINARIES_DIR", "")
	r := &runsc.Runsc{Path: linked}
	got, err := r.Helpers()
	want := map[string]string{runsc.Sentry: filedigest.OfBytes([]byte("sentry")), runsc.Prewarmer: filedigest.OfBytes([]byte("prewarmer"))}
	if err != nil || !maps.Equal(got, want) {
		t.Fatalf("Helpers beside the linked runsc = %v, %v; want %v", got, err, want)
	}

	// runsc's test of a usable helper: a regular file with an execute bit.
	if err := os.Chmod(filepath.Join(bin, runsc.Prewarmer), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(bin, runsc.Sentry)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(bin, runsc.Sentry), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Helpers(); err != nil || len(got) != 0 {
		t.Errorf("Helpers of a helper not executable and a directory = %v, %v; want none", got, err)
	}

	other := filepath.Join(dir, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(other, runsc.Sentry), "another sentry", 0o700)
	t.Setenv("GVISOR_SIDECAR_BINARIES_DIR", other)
	if got, err := r.Helpers(); err != nil || len(got) != 1 || got[runsc.Sentry] != filedigest.OfBytes([]byte("another sentry")) {
		t.Errorf("Helpers with $GVISOR_SIDECAR_BINARIES_DIR = %v, %v; want its sentry alone", got, err)
	}
	empty := &runsc.Runsc{Path: linked, HelpersDir: t.TempDir()}
	if got, err := empty.Helpers(); err != nil || len(got) != 0 {
		t.Errorf("Helpers with HelpersDir an empty directory = %v, %v; want none", got, err)
	}
}

// report is the script of the process the prewarmer starts in the tests: its argument vector
// (a line each), $PW, the size of its descriptor table, and whether descriptors 3 (inherited)
// and 255 (the highest the sentry uses, which the prewarmer must not leave open) are open.
const report = `tr '\0' '\n' </proc/$$/cmdline; echo "PW=$PW"; grep FDSize /proc/$$/status; [ -e /proc/$$/fd/3 ] && echo fd3; [ -e /proc/$$/fd/255 ] && echo fd255; true`

// reported is how report begins for a process of the argument vector argv.
func reported(argv ...string) string { return strings.Join(argv, "\n") + "\nPW=kept\n" }

// fdTableSize reads the FDSize line of a report.
func fdTableSize(t *testing.T, out string) int {
	t.Helper()
	m := regexp.MustCompile(`FDSize:\s+(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no FDSize in %q", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestPrewarmer runs the prewarmer `make runsc` installed beside READIE_RUNSC as runsc does,
// `gvisor-sentry-prewarmer SENTRY ARGV0 [ARG...]` with descriptors and an environment of its
// own: SENTRY runs with ARGV0 ARG..., the environment and the descriptors as they were, no
// descriptor added, and a descriptor table that holds 255 already (one started directly has
// the kernel's 64); the same when the standard descriptors are closed (the table grown from
// "/"), and with a limit of open files below 256 (said on stderr, SENTRY run all the same).
// Bad usage exits 2, an execve that fails 127, each saying why.
func TestPrewarmer(t *testing.T) {
	dir, err := (&runsc.Runsc{Path: testenv.RunscPath(t)}).ResolvedHelpersDir()
	if err != nil {
		t.Fatal(err)
	}
	prewarmer := filepath.Join(dir, runsc.Prewarmer)
	if _, err := os.Stat(prewarmer); err != nil {
		t.Fatalf("no prewarmer beside READIE_RUNSC: %v (run `make runsc`)", err)
	}
	inherited, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer inherited.Close()
	// Each command runs as a child of a bash that first closes every descriptor above 3: a
	// process's table is sized at fork by the highest descriptor open, so one this test process
	// inherited (here, 251 from its caller) would give every child a table of 256 already.
	run := func(name string, args ...string) (int, string, string) {
		t.Helper()
		closeAbove3 := `for fd in /proc/$$/fd/*; do n=${fd##*/}; if [ "$n" -gt 3 ]; then eval "exec $n>&-"; fi; done; "$@"; exit $?`
		cmd := testenv.Command(t, time.Minute, "/bin/bash", append([]string{"-c", closeAbove3, "bash", name}, args...)...)
		cmd.Env = []string{"PW=kept", "PATH=/usr/bin:/bin"}
		cmd.ExtraFiles = []*os.File{inherited}
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		code := 0
		if err := cmd.Run(); err != nil {
			var ok bool
			if code, ok = exitcode.Of(err); !ok {
				t.Fatalf("%s: %v", name, err)
			}
		}
		return code, stdout.String(), stderr.String()
	}

	_, direct, _ := run("/bin/sh", "-c", report)
	if size := fdTableSize(t, direct); size > sentryHighestFD {
		t.Fatalf("a process started directly has a table of %d descriptors already, so the check below means nothing", size)
	}
	argv := []string{"sentry-argv0", "-c", report, "sh", "arg 1", ""}
	code, out, stderr := run(prewarmer, append([]string{"/bin/sh"}, argv...)...)
	if code != 0 || !strings.HasPrefix(out, reported(argv...)) || !strings.HasSuffix(out, "\nfd3\n") || stderr != "" {
		t.Errorf("through the prewarmer: exit %d, stdout %q, stderr %q; want the argument vector %q, PW=kept, fd3 and not fd255", code, out, stderr, argv)
	}
	if size := fdTableSize(t, out); size <= sentryHighestFD {
		t.Errorf("through the prewarmer, a table of %d descriptors; want room for %d (a process started directly: %d)", size, sentryHighestFD, fdTableSize(t, direct))
	}

	// No standard descriptors: the table is grown from "/"; the report goes to a file.
	file := filepath.Join(t.TempDir(), "report")
	script := "exec >" + file + "; " + report
	code, _, stderr = run("/bin/sh", "-c", `exec "$0" /bin/sh sentry-argv0 -c "$1" <&- >&- 2>&-`, prewarmer, script)
	data, _ := os.ReadFile(file)
	if code != 0 || !strings.HasPrefix(string(data), reported("sentry-argv0", "-c", script)) || fdTableSize(t, string(data)) <= sentryHighestFD || stderr != "" {
		t.Errorf("without standard descriptors: exit %d, report %q, stderr %q", code, data, stderr)
	}

	// A limit of open files below the sentry's descriptors: said, and the sentry run anyway.
	code, out, stderr = run("/bin/sh", "-c", `ulimit -n 64; exec "$0" /bin/sh sentry-argv0 -c "$1"`, prewarmer, report)
	if code != 0 || !strings.HasPrefix(out, reported("sentry-argv0", "-c", report)) || !strings.Contains(stderr, "the descriptor table was not grown") || !strings.Contains(stderr, "(errno 22)") {
		t.Errorf("with 64 open files at most: exit %d, stdout %q, stderr %q; want the sentry run and EINVAL said", code, out, stderr)
	}

	for _, args := range [][]string{nil, {"/bin/sh"}} {
		if code, out, stderr := run(prewarmer, args...); code != 2 || out != "" || !strings.HasPrefix(stderr, "usage: gvisor-sentry-prewarmer SENTRY ARGV0") {
			t.Errorf("prewarmer %q: exit %d, stdout %q, stderr %q; want 2 and the usage", args, code, out, stderr)
		}
	}
	missing := filepath.Join(t.TempDir(), "no-sentry")
	if code, _, stderr := run(prewarmer, missing, "sentry-argv0"); code != 127 || stderr != "gvisor-sentry-prewarmer: execve "+missing+" (errno 2)\n" {
		t.Errorf("prewarmer of a missing sentry: exit %d, stderr %q; want 127 and the path", code, stderr)
	}
}

// sentryHighestFD is the highest descriptor the pinned sentry uses: its stdio moved up to
// startingStdioFD .. startingStdioFD+2 (runsc/boot/loader.go), which TestHelpersPinned reads.
const sentryHighestFD = 255

// TestHelpersPinned: the helpers' sources follow the pin. runsc/sentry's go.mod requires the
// gVisor module of the Makefile's RUNSC_VERSION, and the prewarmer grows the table for the
// descriptors the pinned sentry moves its stdio to (startingStdioFD in runsc/boot/loader.go).
func TestHelpersPinned(t *testing.T) {
	version, gvisor := testenv.PinnedGVisor(t, "../../Makefile")
	goMod, err := os.ReadFile("../../runsc/sentry/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if want := "\nrequire gvisor.dev/gvisor " + version + "\n"; !strings.Contains(string(goMod), want) {
		t.Errorf("runsc/sentry/go.mod does not hold %q: the sentry would be built from another gVisor than runsc", strings.TrimSpace(want))
	}
	loader, err := os.ReadFile(filepath.Join(gvisor, "runsc/boot/loader.go"))
	if err != nil {
		t.Fatal(err)
	}
	theirs := regexp.MustCompile(`(?m)^\s*startingStdioFD\s*=\s*(\d+)\s*$`).FindSubmatch(loader)
	source, err := os.ReadFile("../../runsc/prewarmer.c")
	if err != nil {
		t.Fatal(err)
	}
	ours := regexp.MustCompile(`(?m)^#define SENTRY_FIRST_STDIO_FD (\d+)$`).FindSubmatch(source)
	if theirs == nil || ours == nil {
		t.Fatalf("startingStdioFD in the pinned loader.go: %q; SENTRY_FIRST_STDIO_FD in prewarmer.c: %q", theirs, ours)
	}
	if string(ours[1]) != string(theirs[1]) {
		t.Errorf("prewarmer.c grows the table for stdio from %s, the pinned sentry moves it to %s (runsc/boot/loader.go)", ours[1], theirs[1])
	}
	if first, _ := strconv.Atoi(string(theirs[1])); first+2 != sentryHighestFD {
		t.Errorf("sentryHighestFD is %d, the pinned sentry's stdio ends at %d", sentryHighestFD, first+2)
	}
}
