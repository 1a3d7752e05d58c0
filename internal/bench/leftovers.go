package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"readie.dev/pipeline/internal/procs"
	"readie.dev/pipeline/pkg/runsc"
)

// Leftovers is what a soak samples of what its restores may leave behind. The counts named
// "Own" are the soak's alone (named after its lease, or under its runsc root or scratch
// directory); the others are the whole root, TMPDIR or host, which other runs share.
type Leftovers struct {
	At       time.Time `json:"at"`
	Restores int       `json:"restores"`
	// Sandboxes are the soak's containers in `runsc list` of its root (at the start and the
	// end; in between, their state files there).
	Sandboxes int `json:"sandboxes"`
	// RunscProcesses are the runsc processes (commands, sandboxes, gofers) of the soak's sandboxes.
	RunscProcesses int `json:"runsc_processes"`
	// FDs are the pipeline's own open file descriptors.
	FDs int `json:"fds"`
	// Mounts are the mounts under the runsc root or the scratch directory; AllMounts every
	// mount this process sees.
	Mounts    int `json:"mounts"`
	AllMounts int `json:"all_mounts"`
	// RootEntries and TmpEntries are the entries of the runsc root and of TMPDIR, all of
	// them (other runs' too); OwnRootEntries and OwnTmpEntries those named after the soak's
	// lease (its scratch directory is one, from start to end).
	RootEntries    int `json:"runsc_root_entries"`
	OwnRootEntries int `json:"own_runsc_root_entries"`
	TmpEntries     int `json:"tmpdir_entries"`
	OwnTmpEntries  int `json:"own_tmpdir_entries"`
	// MemAvailableKiB is the host's MemAvailable.
	MemAvailableKiB int64 `json:"mem_available_kib"`
	// Errors are what could not be sampled.
	Errors []string `json:"errors,omitempty"`
}

// leftoverProbe samples Leftovers of one soak.
type leftoverProbe struct {
	root, tmp, work, lease string
	driver                 *runsc.Runsc
}

// sample samples what is left now. With list, the sandboxes are counted by `runsc list`; without
// it, by their state files in the root: `runsc list` locks each container's state, and one that
// meets a container being deleted re-creates its lock file after `runsc delete` removed it (seen
// in a soak: a zero-byte ID_sandbox:ID.lock left for good), so while restores are under way the
// probe must not list.
func (p leftoverProbe) sample(ctx context.Context, restores int, list bool) Leftovers {
	l := Leftovers{At: time.Now().UTC(), Restores: restores}
	fail := func(what string, err error) { l.Errors = append(l.Errors, fmt.Sprintf("%s: %v", what, err)) }
	if list {
		if cs, err := p.driver.List(ctx); err != nil {
			fail("runsc list", err)
		} else {
			for _, c := range cs {
				if strings.Contains(c.ID, p.lease) {
					l.Sandboxes++
				}
			}
		}
	}
	if n, err := p.runscProcesses(); err != nil {
		fail("processes", err)
	} else {
		l.RunscProcesses = n
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err != nil {
		fail("fds", err)
	} else {
		l.FDs = len(fds) - 1 // the directory being read
	}
	if err := p.mounts(&l); err != nil {
		fail("mounts", err)
	}
	if entries, err := os.ReadDir(p.root); err != nil && !os.IsNotExist(err) {
		fail("runsc root", err)
	} else {
		l.RootEntries = len(entries)
		for _, e := range entries {
			if strings.Contains(e.Name(), p.lease) {
				l.OwnRootEntries++
				if !list && strings.HasSuffix(e.Name(), ".state") {
					l.Sandboxes++
				}
			}
		}
	}
	if entries, err := os.ReadDir(p.tmp); err != nil {
		fail("TMPDIR", err)
	} else {
		l.TmpEntries = len(entries)
		for _, e := range entries {
			if strings.Contains(e.Name(), p.lease) {
				l.OwnTmpEntries++
			}
		}
	}
	if kib, err := memAvailable(); err != nil {
		fail("MemAvailable", err)
	} else {
		l.MemAvailableKiB = kib
	}
	return l
}

// runscProcesses counts the runsc processes whose command line names one of the soak's
// sandboxes (its last argument is the sandbox's ID, named after the lease).
func (p leftoverProbe) runscProcesses() (int, error) {
	found, err := procs.Runsc(procs.NameID(p.lease))
	return len(found), err
}

// mounts counts every mount this process sees, and those under the runsc root or the soak's
// scratch directory.
func (p leftoverProbe) mounts(l *Leftovers) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		l.AllMounts++
		point := fields[4]
		for _, dir := range []string{p.root, p.work} {
			if point == dir || strings.HasPrefix(point, dir+"/") {
				l.Mounts++
				break
			}
		}
	}
	return sc.Err()
}

func memAvailable() (int64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
}

// left names what end has more of than start, of what a soak must not leave: its sandboxes,
// their processes, the pipeline's descriptors, mounts under its directories, its entries in
// the runsc root and TMPDIR (the totals there are other runs' too: reported, not judged). A
// sample that failed is named too.
func (start Leftovers) left(end Leftovers) []string {
	out := []string{} // [] in soak.json, not null
	for _, c := range []struct {
		name       string
		start, end int
	}{
		{"sandboxes in runsc list", 0, end.Sandboxes},
		{"runsc processes", 0, end.RunscProcesses},
		{"open file descriptors of the pipeline", start.FDs, end.FDs},
		{"mounts under the runsc root or the scratch directory", start.Mounts, end.Mounts},
		{"entries of the runsc root named after the soak", 0, end.OwnRootEntries},
		{"entries of TMPDIR named after the soak", start.OwnTmpEntries, end.OwnTmpEntries},
	} {
		if c.end > c.start {
			out = append(out, fmt.Sprintf("%d more %s (%d at the start, %d at the end)", c.end-c.start, c.name, c.start, c.end))
		}
	}
	for _, e := range append(start.Errors, end.Errors...) {
		out = append(out, "could not sample: "+e)
	}
	return out
}
