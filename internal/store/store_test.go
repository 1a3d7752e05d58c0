package store

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"readie.dev/pipeline/internal/lease"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/filedigest"
	"readie.dev/pipeline/pkg/manifest"
)

// baseInputs are key inputs with every part set.
func baseInputs() KeyInputs {
	return KeyInputs{
		Schema: KeySchema, RunscSHA256: "sha256:runsc", RunscFlags: []string{"--network=none"},
		CheckpointOptions: map[string]string{}, SpecFingerprint: "sha256:spec", RootfsDigest: "sha256:rootfs",
		Imports: []string{"numpy", "pandas"}, ExecutorProtocol: 2,
		PassEnv: PassEnvValues([]string{"A"}, func(string) (string, bool) { return "1", true }),
		CPU:     CPU{Features: "sse,avx", CacheLine: 64},
		CPUs:    2,
	}
}

// TestKeyParts changes one part at a time: the key changes, and Diff names exactly that part.
func TestKeyParts(t *testing.T) {
	base := baseInputs()
	for _, tc := range []struct {
		part   string
		change func(*KeyInputs)
	}{
		{"schema", func(in *KeyInputs) { in.Schema++ }},
		{"runsc_sha256", func(in *KeyInputs) { in.RunscSHA256 = "sha256:other" }},
		{"runsc_helpers", func(in *KeyInputs) { in.RunscHelpers = map[string]string{"gvisor_sentry": "sha256:sentry"} }},
		{"runsc_flags", func(in *KeyInputs) { in.RunscFlags = append(in.RunscFlags, "--ignore-cgroups") }},
		{"checkpoint_options", func(in *KeyInputs) { in.CheckpointOptions = map[string]string{"compression": "none"} }},
		{"spec_fingerprint", func(in *KeyInputs) { in.SpecFingerprint = "sha256:other" }},
		{"rootfs_digest", func(in *KeyInputs) { in.RootfsDigest = "sha256:other" }},
		{"imports", func(in *KeyInputs) { in.Imports = []string{"pandas", "numpy"} }}, // order counts
		{"executor_protocol", func(in *KeyInputs) { in.ExecutorProtocol = 3 }},
		{"pass_env", func(in *KeyInputs) {
			in.PassEnv = PassEnvValues([]string{"A"}, func(string) (string, bool) { return "2", true })
		}},
		{"cpu", func(in *KeyInputs) { in.CPU.Features = "sse" }},
		{"cpu", func(in *KeyInputs) { in.CPU.CacheLine = 128 }},
		{"cpu", func(in *KeyInputs) { in.CPU.Controls = map[string]string{"OPENBLAS_CORETYPE": "Haswell"} }},
		{"cpus", func(in *KeyInputs) { in.CPUs = 1 }},
	} {
		in := baseInputs()
		tc.change(&in)
		if in.Key() == base.Key() {
			t.Errorf("%s changed, the key did not", tc.part)
		}
		if diff := Diff(base.Parts(), in.Parts()); len(diff) != 1 || diff[0] != tc.part {
			t.Errorf("%s changed, Diff says %v", tc.part, diff)
		}
	}
	if baseInputs().Key() != base.Key() || !strings.HasPrefix(base.Key(), "sha256:") || len(base.Key()) != 71 {
		t.Errorf("key %q is not a stable sha256", base.Key())
	}
	// Helpers are compared digest by digest; a runsc without them keys as before they were.
	sentry, other := baseInputs(), baseInputs()
	sentry.RunscHelpers = map[string]string{"gvisor_sentry": "sha256:sentry"}
	other.RunscHelpers = map[string]string{"gvisor_sentry": "sha256:other"}
	if diff := Diff(sentry.Parts(), other.Parts()); len(diff) != 1 || diff[0] != "runsc_helpers" {
		t.Errorf("another sentry: Diff says %v", diff)
	}
	none := baseInputs()
	none.RunscHelpers = map[string]string{}
	if _, ok := none.Parts()["runsc_helpers"]; ok || none.Key() != base.Key() {
		t.Error("a runsc without helpers changes the key")
	}
	// Empty and nil encode alike: a manifest round trip cannot change a key.
	a, b := baseInputs(), baseInputs()
	a.CheckpointOptions, a.RunscFlags = nil, nil
	b.CheckpointOptions, b.RunscFlags = map[string]string{}, []string{}
	if a.Key() != b.Key() {
		t.Error("nil and empty give different keys")
	}
}

func TestPassEnvValuesHideValues(t *testing.T) {
	env := map[string]string{"TOKEN": "s3cret-value"}
	values := PassEnvValues([]string{"TOKEN", "MISSING", "TOKEN"}, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if len(values) != 2 || values[0].Name != "MISSING" || values[0].SHA256 != "unset" || values[1].Name != "TOKEN" {
		t.Fatalf("%+v", values)
	}
	in := baseInputs()
	in.PassEnv = values
	if strings.Contains(string(canonical(in)), "s3cret") {
		t.Fatal("a pass_env value is in the key's encoding")
	}
}

// newStore is a store in a fresh directory with a run's lease.
func newStore(t *testing.T) *Store {
	t.Helper()
	return &Store{Dir: filepath.Join(t.TempDir(), "store"), Lease: testenv.NewLease(t)}
}

// pendingWith makes a pending entry holding image files with the given contents.
func pendingWith(t *testing.T, s *Store, key, content string) (*Pending, *manifest.Meta) {
	t.Helper()
	p, err := s.Begin(key)
	if err != nil {
		t.Fatal(err)
	}
	meta := &manifest.Meta{ID: "numpy", Files: map[string]manifest.File{}, CapturedAt: time.Now().UTC()}
	for _, name := range manifest.ImageFiles() {
		path := filepath.Join(p.Dir, name)
		os.WriteFile(path, []byte(content+name), 0o644)
		size, sum, err := filedigest.Of(path)
		if err != nil {
			t.Fatal(err)
		}
		meta.Files[name] = manifest.File{Bytes: size, SHA256: sum}
	}
	return p, meta
}

func TestCommitLookupAndCorruption(t *testing.T) {
	s := newStore(t)
	key := baseInputs().Key()
	if m, err := s.Lookup(key); m != nil || err != nil {
		t.Fatalf("empty store: %v %v", m, err)
	}
	p, meta := pendingWith(t, s, key, "one ")
	if _, err := p.Commit(meta); err != nil {
		t.Fatal(err)
	}
	got, err := s.Lookup(key)
	if err != nil || got == nil || got.Key != key {
		t.Fatalf("Lookup = %+v, %v", got, err)
	}
	dir, _ := s.Path(key)
	for _, name := range append(manifest.ImageFiles(), manifest.MetaFileName) {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != 0o400 {
			t.Errorf("%s: %v %v, want 0400: read-only, outputs share it", name, fi.Mode(), err)
		}
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("entry directory %v, want 0700", fi.Mode())
	}
	// One changed byte, a half-written file, a missing meta.json: corrupt, never served.
	pages := filepath.Join(dir, "pages.img")
	data, _ := os.ReadFile(pages)
	for name, damage := range map[string]func(){
		"flipped byte": func() { b := append([]byte{}, data...); b[0] ^= 1; os.WriteFile(pages, b, 0o600) },
		"short file":   func() { os.WriteFile(pages, data[:len(data)/2], 0o600) },
		"no meta.json": func() { os.Rename(filepath.Join(dir, manifest.MetaFileName), filepath.Join(dir, "x")) },
	} {
		damage()
		if m, err := s.Lookup(key); m != nil || !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Lookup = %v, %v; want ErrCorrupt", name, m, err)
		}
		os.WriteFile(pages, data, 0o600)
		os.Rename(filepath.Join(dir, "x"), filepath.Join(dir, manifest.MetaFileName))
	}
	if m, err := s.Lookup(key); m == nil || err != nil {
		t.Fatalf("repaired entry: %v %v", m, err)
	}
}

// TestConcurrentCommits: runs that capture the same key at once all end with the one valid
// entry, and no pending directory is left.
func TestConcurrentCommits(t *testing.T) {
	s := newStore(t)
	key := baseInputs().Key()
	var wg sync.WaitGroup
	results := make([]*manifest.Meta, 8)
	errs := make([]error, 8)
	for i := range results {
		p, meta := pendingWith(t, s, key, strings.Repeat("x", i+1))
		wg.Go(func() { results[i], errs[i] = p.Commit(meta) })
	}
	wg.Wait()
	stored, err := s.Lookup(key)
	if err != nil || stored == nil {
		t.Fatalf("after concurrent commits: %v %v", stored, err)
	}
	for i := range results {
		if errs[i] != nil || results[i] == nil || results[i].Files["pages.img"] != stored.Files["pages.img"] {
			t.Errorf("commit %d: %+v, %v; the store holds %+v", i, results[i], errs[i], stored.Files)
		}
	}
	if entries, _ := os.ReadDir(s.Dir); len(entries) != 2 || entries[0].Name() != lease.RunsDir {
		t.Errorf("store holds %v, want the one entry and the runs' lock files", entries)
	}
}

func TestLinkListPrune(t *testing.T) {
	s := newStore(t)
	old, recent := baseInputs(), baseInputs()
	recent.Imports = []string{"json"}
	for _, in := range []KeyInputs{old, recent} {
		p, meta := pendingWith(t, s, in.Key(), in.Imports[0])
		meta.Imports = in.Imports
		if _, err := p.Commit(meta); err != nil {
			t.Fatal(err)
		}
	}
	s.Use(old.Key(), "np")
	s.Use(recent.Key(), "js")
	s.Use(recent.Key(), "js2")
	oldDir, _ := s.Path(old.Key())
	past := time.Now().Add(-48 * time.Hour)
	os.Chtimes(filepath.Join(oldDir, usesFile), past, past)

	out := filepath.Join(t.TempDir(), "out", "np")
	if err := LinkFiles(oldDir, out); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(filepath.Join(oldDir, "pages.img"))
	b, _ := os.Stat(filepath.Join(out, "pages.img"))
	if !os.SameFile(a, b) {
		t.Error("the output's pages.img is not a hard link of the store's")
	}

	entries, err := s.List()
	if err != nil || len(entries) != 2 || entries[0].Key != recent.Key() || strings.Join(entries[0].Sets, ",") != "js,js2" {
		t.Fatalf("List = %+v, %v", entries, err)
	}
	// A pending directory of a run that is over goes too.
	dead := &Store{Dir: s.Dir, Lease: testenv.NewLease(t)}
	deadPending, _ := pendingWith(t, dead, old.Key(), "dead")
	dead.Lease.Release()
	cutoff := time.Now().Add(-24 * time.Hour)
	// While a run holds its lease in the store (here s's own), a prune removes nothing.
	if pruned, err := s.Prune(cutoff, nil, false); !errors.Is(err, lease.ErrInUse) || len(pruned) != 0 {
		t.Fatalf("prune while a run uses the store: %+v %v", pruned, err)
	}
	if m, _ := s.Lookup(old.Key()); m == nil {
		t.Fatal("a prune refused removed the entry")
	}
	s.Lease.Release()
	s = &Store{Dir: s.Dir} // as `pipeline cache prune` opens it: no lease of its own
	if pruned, _ := s.Prune(cutoff, map[string]bool{old.Key(): true}, false); len(pruned) != 0 {
		t.Fatalf("pruned an entry an output uses: %+v", pruned)
	}
	if pruned, _ := s.Prune(cutoff, nil, true); len(pruned) != 1 || pruned[0].Key != old.Key() {
		t.Fatalf("dry run: %+v", pruned)
	}
	if m, _ := s.Lookup(old.Key()); m == nil {
		t.Fatal("the dry run removed the entry")
	}
	if pruned, err := s.Prune(cutoff, nil, false); err != nil || len(pruned) != 1 {
		t.Fatalf("prune: %+v %v", pruned, err)
	}
	if m, _ := s.Lookup(old.Key()); m != nil {
		t.Fatal("the old entry is still there")
	}
	if m, _ := s.Lookup(recent.Key()); m == nil {
		t.Fatal("the recent entry was removed")
	}
	if _, err := os.Stat(deadPending.Dir); !os.IsNotExist(err) {
		t.Error("a dead run's pending directory was kept")
	}
}

// TestLinkFilesAcrossFileSystems: into another file system (a tmpfs), the files are copied,
// byte for byte, private.
func TestLinkFilesAcrossFileSystems(t *testing.T) {
	s := newStore(t)
	key := baseInputs().Key()
	p, meta := pendingWith(t, s, key, "content ")
	if _, err := p.Commit(meta); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if out, err := testenv.Command(t, time.Minute, "mount", "-t", "tmpfs", "-o", "size=4m", "readie-test", other).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs (the tests run as root): %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", other).Run() })
	entry, _ := s.Path(key)
	dst := filepath.Join(other, "out", "numpy")
	if err := LinkFiles(entry, dst); err != nil {
		t.Fatal(err)
	}
	if err := VerifyFiles(dst, meta); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(filepath.Join(entry, "pages.img"))
	b, _ := os.Stat(filepath.Join(dst, "pages.img"))
	if os.SameFile(a, b) || b.Mode().Perm() != 0o400 {
		t.Errorf("across file systems: same file %v, mode %v", os.SameFile(a, b), b.Mode())
	}
}

// TestRemoveDeadPending: pending entries are judged by the lease of the run they are named
// after: a live run's (another's or this one's) stay, a run's that is over go with its lock
// file, and directories named by a pid (pipelines from before leases) are left alone.
func TestRemoveDeadPending(t *testing.T) {
	s := newStore(t)
	key := baseInputs().Key()
	own, _ := pendingWith(t, s, key, "own")
	live := &Store{Dir: s.Dir, Lease: testenv.NewLease(t)}
	livePending, _ := pendingWith(t, live, key, "live")
	dead := &Store{Dir: s.Dir, Lease: testenv.NewLease(t)}
	deadPending, _ := pendingWith(t, dead, key, "dead")
	deadLock := filepath.Join(s.Dir, lease.RunsDir, dead.Lease.ID()+".lock")
	// A killed run: its lock is dropped by the kernel, its file stays.
	if err := os.Rename(deadLock, deadLock+".x"); err != nil {
		t.Fatal(err)
	}
	dead.Lease.Release()
	if err := os.Rename(deadLock+".x", deadLock); err != nil {
		t.Fatal(err)
	}
	byPid := filepath.Join(s.Dir, ".tmp-0123456789ab-999999999-x")
	os.MkdirAll(byPid, 0o700)
	removed, err := s.RemoveDeadPending()
	if err != nil || len(removed) != 1 || removed[0] != deadPending.Dir {
		t.Fatalf("RemoveDeadPending = %v, %v; want only %s", removed, err, deadPending.Dir)
	}
	for _, dir := range []string{own.Dir, livePending.Dir, byPid} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s was removed: %v", dir, err)
		}
	}
	if _, err := os.Stat(deadLock); !os.IsNotExist(err) {
		t.Errorf("the dead run's lock file is still there: %v", err)
	}
	// Begin without a lease refuses: its directory could not be told from a dead run's.
	if _, err := (&Store{Dir: s.Dir}).Begin(key); err == nil {
		t.Error("Begin without a lease succeeded")
	}
}

// TestLookupIOErrorIsNotCorrupt: an error reading an entry says nothing about its content: it
// is not ErrCorrupt, and a commit that meets such an entry keeps it and fails.
func TestLookupIOErrorIsNotCorrupt(t *testing.T) {
	s := newStore(t)
	key := baseInputs().Key()
	p, meta := pendingWith(t, s, key, "one ")
	if _, err := p.Commit(meta); err != nil {
		t.Fatal(err)
	}
	dir, _ := s.Path(key)
	metaPath := filepath.Join(dir, manifest.MetaFileName)
	data, _ := os.ReadFile(metaPath)
	// meta.json as a directory: reading it fails with EISDIR.
	os.Rename(metaPath, metaPath+".saved")
	os.Mkdir(metaPath, 0o700)
	m, err := s.Lookup(key)
	if m != nil || err == nil || errors.Is(err, ErrCorrupt) || !errors.Is(err, syscall.EISDIR) {
		t.Fatalf("Lookup with meta.json a directory = %v, %v; want EISDIR, not ErrCorrupt", m, err)
	}
	second, meta2 := pendingWith(t, s, key, "two ")
	if got, err := second.Commit(meta2); got != nil || err == nil || errors.Is(err, ErrCorrupt) {
		t.Fatalf("Commit over an unreadable entry = %v, %v; want its read error", got, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pages.img")); err != nil {
		t.Fatalf("the unreadable entry was removed: %v", err)
	}
	os.Remove(metaPath)
	os.Rename(metaPath+".saved", metaPath)
	if m, err := s.Lookup(key); m == nil || err != nil {
		t.Fatalf("after meta.json came back: %v %v", m, err)
	}
	// A valid entry that this thread may not read (EACCES): root without CAP_DAC_OVERRIDE and
	// CAP_DAC_READ_SEARCH, on this OS thread only, meets a file of mode 000.
	pages := filepath.Join(dir, "pages.img")
	os.Chmod(pages, 0)
	defer os.Chmod(pages, EntryFilePerm)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := dropDACCapabilities(); err != nil {
			done <- err
			return
		}
		_, err := s.Lookup(key)
		done <- err
	}()
	err = <-done
	if err == nil || errors.Is(err, ErrCorrupt) || !errors.Is(err, os.ErrPermission) {
		t.Fatalf("Lookup of a valid entry it may not read = %v; want EACCES, not ErrCorrupt", err)
	}
	if !strings.Contains(string(data), key) {
		t.Fatal("meta.json lost its key")
	}
}

// dropDACCapabilities removes CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the calling
// thread's effective set (capset(2) with pid 0 acts on the calling thread alone).
func dropDACCapabilities() error {
	const version3 = 0x20080522
	const dacOverride, dacReadSearch = 1, 2
	header := struct {
		version uint32
		pid     int32
	}{version3, 0}
	var data [2]struct{ effective, permitted, inheritable uint32 }
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CAPGET, uintptr(unsafe.Pointer(&header)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return errno
	}
	data[0].effective &^= 1<<dacOverride | 1<<dacReadSearch
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&header)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return errno
	}
	return nil
}

// TestRemoveCorruptLeavesAGoodEntry: a run judges an entry corrupt; before it removes it,
// another run (another pod sharing the store) judges it too, removes it and commits a good
// one. The first run's removal, minutes late, must leave the good entry; an entry still
// corrupt goes; a judged directory made good in place (as a reused inode number would look)
// is judged again and put back. Nothing pending is left.
func TestRemoveCorruptLeavesAGoodEntry(t *testing.T) {
	s := newStore(t)
	key := baseInputs().Key()
	dir, _ := s.Path(key)
	pages := filepath.Join(dir, "pages.img")
	commit := func(s *Store, content string) {
		t.Helper()
		p, meta := pendingWith(t, s, key, content)
		if _, err := p.Commit(meta); err != nil {
			t.Fatal(err)
		}
	}
	damage := func() []byte {
		t.Helper()
		data, err := os.ReadFile(pages)
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(pages, 0o600)
		if err := os.WriteFile(pages, []byte("changed"), 0o600); err != nil {
			t.Fatal(err)
		}
		return data
	}
	judged := func(s *Store) error {
		t.Helper()
		m, err := s.Lookup(key)
		if m != nil || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Lookup of a damaged entry = %v, %v; want ErrCorrupt", m, err)
		}
		return err
	}
	good := func(want string) {
		t.Helper()
		m, err := s.Lookup(key)
		if m == nil || err != nil {
			t.Fatalf("the good entry is gone: %v, %v", m, err)
		}
		if data, _ := os.ReadFile(pages); string(data) != want+"pages.img" {
			t.Fatalf("the entry holds %q, want the good one's %q", data, want+"pages.img")
		}
	}

	commit(s, "one ")
	damage()
	late := judged(s)
	other := &Store{Dir: s.Dir, Lease: testenv.NewLease(t)}
	if removed, err := other.RemoveCorrupt(judged(other)); !removed || err != nil {
		t.Fatalf("the other run's RemoveCorrupt = %v, %v; want removed", removed, err)
	}
	commit(other, "two ")
	if removed, err := s.RemoveCorrupt(late); removed || err != nil {
		t.Fatalf("a late RemoveCorrupt = %v, %v; want the other run's entry left", removed, err)
	}
	good("two ")

	// The directory judged, made good in place since: judged again, put back.
	data := damage()
	late = judged(s)
	os.WriteFile(pages, data, 0o400)
	if removed, err := s.RemoveCorrupt(late); removed || err != nil {
		t.Fatalf("RemoveCorrupt of an entry good again = %v, %v; want it put back", removed, err)
	}
	good("two ")

	// Still corrupt: removed.
	damage()
	if removed, err := s.RemoveCorrupt(judged(s)); !removed || err != nil {
		t.Fatalf("RemoveCorrupt of a corrupt entry = %v, %v; want removed", removed, err)
	}
	if m, err := s.Lookup(key); m != nil || err != nil {
		t.Fatalf("after its removal Lookup = %v, %v; want none", m, err)
	}
	if _, err := s.RemoveCorrupt(errors.New("not a verdict")); err == nil {
		t.Error("RemoveCorrupt took an error that is not Lookup's verdict")
	}
	pending, _ := filepath.Glob(filepath.Join(s.Dir, pendingPrefix+"*"))
	if len(pending) != 0 {
		t.Errorf("left %v", pending)
	}
}

// TestCommitAfterTheEntryInPlaceWent: Commit finds another run's entry in place, and before it
// looks at it that entry goes (a prune, or another run's RemoveCorrupt moving it aside). There
// is then nothing to keep or remove: Commit must put its own entry in place, not fail.
func TestCommitAfterTheEntryInPlaceWent(t *testing.T) {
	s := newStore(t)
	key := baseInputs().Key()
	dir, _ := s.Path(key)
	first, meta := pendingWith(t, s, key, "one ")
	if _, err := first.Commit(meta); err != nil {
		t.Fatal(err)
	}
	other := &Store{Dir: s.Dir, Lease: testenv.NewLease(t)}
	p, meta := pendingWith(t, other, key, "two ")
	p.found = func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Commit(meta); err != nil {
		t.Fatalf("Commit after the entry in place went: %v", err)
	}
	if m, err := s.Lookup(key); m == nil || err != nil {
		t.Fatalf("Lookup after the commit = %v, %v; want the committed entry", m, err)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "pages.img")); string(data) != "two pages.img" {
		t.Errorf("the entry holds %q, want the second commit's", data)
	}
}
