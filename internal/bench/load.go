package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Load is the machine's load average (over one minute, /proc/loadavg) around a run: how busy
// the machine was says how far its figures can be trusted.
type Load struct {
	Before float64 `json:"before"`
	// During are samples taken every LoadInterval while the interleaved rounds ran; After is
	// read once they are done (before any restores at once, which load the machine on purpose).
	During []float64 `json:"during"`
	After  float64   `json:"after"`
	// Warning says why the load makes the figures doubtful; empty when it does not.
	Warning string `json:"warning,omitempty"`
}

// LoadInterval is how often the load is sampled during a run: the kernel updates it every 5 s.
const LoadInterval = 5 * time.Second

// readLoad returns the one-minute load average of /proc/loadavg.
func readLoad() (float64, error) {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, fmt.Errorf("the machine's load: %w", err)
	}
	fields := strings.Fields(string(data))
	if len(fields) == 0 {
		return 0, fmt.Errorf("the machine's load: /proc/loadavg is empty")
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return 0, fmt.Errorf("the machine's load: /proc/loadavg: %w", err)
	}
	return v, nil
}

// loadSampler samples the load in the background from start until stop.
type loadSampler struct {
	load   Load
	err    error
	cancel context.CancelFunc
	done   sync.WaitGroup
	mu     sync.Mutex
}

// sampleLoad reads the load now and keeps sampling it every interval until stop.
func sampleLoad(ctx context.Context, interval time.Duration) (*loadSampler, error) {
	before, err := readLoad()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &loadSampler{load: Load{Before: before}, cancel: cancel}
	s.done.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			v, err := readLoad()
			s.mu.Lock()
			if err != nil {
				s.err = err
			} else {
				s.load.During = append(s.load.During, v)
			}
			s.mu.Unlock()
		}
	})
	return s, nil
}

// stop ends the sampling, reads the load once more and judges the whole (loadWarning).
func (s *loadSampler) stop(cpus int) (Load, error) {
	s.cancel()
	s.done.Wait()
	if s.err != nil {
		return Load{}, s.err
	}
	after, err := readLoad()
	if err != nil {
		return Load{}, err
	}
	l := s.load
	l.After = after
	l.Warning = loadWarning(l, cpus)
	return l, nil
}

// loadWarning says when the load makes a run's figures doubtful, on a machine of cpus CPUs:
// when others kept half the CPUs busy before it began, or at some sample during or after it
// beyond the one restore at a time the bench runs itself (a load of about 1). Empty otherwise.
func loadWarning(l Load, cpus int) string {
	half := max(float64(cpus)/2, 0.5)
	const advice = "rerun on a quiet machine for absolute times (ratios of one interleaved run still compare)"
	if l.Before >= half {
		return fmt.Sprintf("the machine was busy before the run: load average %.2f on %d CPUs; %s", l.Before, cpus, advice)
	}
	if hi := slices.Max(append([]float64{l.After}, l.During...)); hi-1 >= half {
		return fmt.Sprintf("the machine got busy during the run: load average up to %.2f on %d CPUs (the bench itself adds about 1); %s", hi, cpus, advice)
	}
	return ""
}

// Describe is the load in one line: before, the range of the samples during, after.
func (l Load) Describe() string {
	during := "no sample"
	if len(l.During) > 0 {
		during = fmt.Sprintf("%.2f-%.2f over %d samples", slices.Min(l.During), slices.Max(l.During), len(l.During))
	}
	return fmt.Sprintf("before %.2f, during %s, after %.2f", l.Before, during, l.After)
}

// cpuTimes are the machine's CPU times since boot, in clock ticks, from /proc/stat's first
// line: idle (idle and iowait) and the total.
type cpuTimes struct{ idle, total uint64 }

// readCPUTimes reads /proc/stat's "cpu" line.
func readCPUTimes() (cpuTimes, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, fmt.Errorf("the machine's CPU time: %w", err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("the machine's CPU time: /proc/stat begins %.80q", line)
	}
	var t cpuTimes
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("the machine's CPU time: /proc/stat: %w", err)
		}
		if i >= 8 { // guest and guest_nice are already in user and nice
			break
		}
		t.total += v
		if i == 3 || i == 4 { // idle, iowait
			t.idle += v
		}
	}
	return t, nil
}

// busySince returns the share of the machine's CPU time that was busy between before and t.
func (t cpuTimes) busySince(before cpuTimes) float64 {
	total := t.total - before.total
	if total == 0 || t.total < before.total {
		return 0
	}
	return 1 - float64(t.idle-before.idle)/float64(total)
}
