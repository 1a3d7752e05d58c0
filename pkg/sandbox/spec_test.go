package sandbox

import (
	"errors"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func testOptions(mode Mode) SpecOptions {
	o := SpecOptions{Mode: mode, Rootfs: "/images/rootfs", HostDir: "/tmp/host/a"}
	if mode == ModeCapture {
		o.ImageDir = "/out/numpy"
		o.Imports = []string{"numpy", "pandas"}
	}
	return o
}

func mustSpec(t *testing.T, o SpecOptions) *specs.Spec {
	t.Helper()
	s, err := Spec(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSpecShape(t *testing.T) {
	for _, mode := range []Mode{ModeCapture, ModeMeasure, ModeSandbox} {
		s := mustSpec(t, testOptions(mode))
		if !slices.Equal(s.Process.Args, []string{"python3", "-u", "-m", "readie_executor"}) {
			t.Errorf("%s: args %v", mode, s.Process.Args)
		}
		if !s.Root.Readonly || s.Root.Path != "/images/rootfs" {
			t.Errorf("%s: root %+v", mode, s.Root)
		}
		if !s.Process.NoNewPrivileges || len(s.Process.Rlimits) != 1 || s.Process.Rlimits[0].Type != "RLIMIT_NOFILE" {
			t.Errorf("%s: process limits %+v", mode, s.Process)
		}
		var dests []string
		for _, m := range s.Mounts {
			dests = append(dests, m.Destination)
			if m.Destination == "/sys" && !slices.Contains(m.Options, "ro") {
				t.Errorf("%s: /sys is not read-only", mode)
			}
			if m.Destination == ExecutorDir && (m.Type != "bind" || m.Source != "/tmp/host/a") {
				t.Errorf("%s: executor dir mount %+v", mode, m)
			}
		}
		for _, want := range []string{"/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", ExecutorDir} {
			if !slices.Contains(dests, want) {
				t.Errorf("%s: no mount at %s", mode, want)
			}
		}
		if !slices.Contains(s.Process.Env, "EXECUTOR_MODE="+string(mode)) || !slices.Contains(s.Process.Env, "EXECUTOR_DIR="+ExecutorDir) {
			t.Errorf("%s: env %v", mode, s.Process.Env)
		}
		_, annotated := s.Annotations[annotationCheckpointPath]
		if annotated != (mode == ModeCapture) {
			t.Errorf("%s: checkpoint annotations present = %v", mode, annotated)
		}
		hasPreimport := slices.ContainsFunc(s.Process.Env, func(kv string) bool { return strings.HasPrefix(kv, "READIE_PREIMPORT=") })
		if hasPreimport != (mode == ModeCapture) {
			t.Errorf("%s: READIE_PREIMPORT present = %v", mode, hasPreimport)
		}
	}
	if s := mustSpec(t, testOptions(ModeCapture)); !slices.Contains(s.Process.Env, "READIE_PREIMPORT=numpy,pandas") {
		t.Errorf("capture env %v", s.Process.Env)
	}
}

func TestSpecEnvIsOnlyExplicit(t *testing.T) {
	t.Setenv("AWS_SECRET_ACCESS_KEY", "canary-secret")
	s := mustSpec(t, testOptions(ModeSandbox))
	for _, kv := range s.Process.Env {
		if strings.Contains(kv, "canary-secret") || strings.HasPrefix(kv, "AWS_") {
			t.Fatalf("the pipeline's environment leaked into the spec: %s", kv)
		}
	}
	want := []string{"PATH", "HOME", "LANG", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "EXECUTOR_DIR", "EXECUTOR_MODE"}
	var keys []string
	for _, kv := range s.Process.Env {
		keys = append(keys, strings.SplitN(kv, "=", 2)[0])
	}
	if !slices.Equal(keys, want) {
		t.Fatalf("env keys %v, want %v", keys, want)
	}
}

func TestSpecRejectsBadOptions(t *testing.T) {
	bad := []SpecOptions{
		{Mode: "bogus", Rootfs: "/r", HostDir: "/h"},
		{Mode: ModeSandbox, Rootfs: "relative", HostDir: "/h"},
		{Mode: ModeSandbox, Rootfs: "/r", HostDir: "h"},
		{Mode: ModeCapture, Rootfs: "/r", HostDir: "/h"},                   // no image dir
		{Mode: ModeSandbox, Rootfs: "/r", HostDir: "/h", ImageDir: "/img"}, // image dir outside capture
		{Mode: ModeSandbox, Rootfs: "/r", HostDir: "/h", Env: []string{"NOEQUALS"}},
		{Mode: ModeSandbox, Rootfs: "/r"},                                              // no host dir for the executor
		{Mode: ModeSandbox, Rootfs: "/r", HostDir: "/h", CPUFeatures: []string{"fpu"}}, // outside capture
		{Mode: ModeCapture, Rootfs: "/r", HostDir: "/h", ImageDir: "/img", CPUFeatures: []string{"fpu", "avx512ifma"}},
	}
	for _, o := range bad {
		if _, err := Spec(o); !errors.Is(err, ErrSpec) {
			t.Errorf("Spec(%+v) = %v, want ErrSpec", o, err)
		}
	}
}

// TestSpecRefusesALongSocketPath: a host directory whose executor.sock does not fit in a Unix
// socket address is refused up front, naming the path and its length: runsc would start the
// executor, whose socket then never appears on the host (a dial only timed out, after a minute).
func TestSpecRefusesALongSocketPath(t *testing.T) {
	fits := "/" + strings.Repeat("d", maxSocketPath-len("/"+SocketName)-1)
	if _, err := Spec(SpecOptions{Mode: ModeSandbox, Rootfs: "/r", HostDir: fits}); err != nil {
		t.Fatalf("a socket path of %d bytes: %v", len(fits+"/"+SocketName), err)
	}
	long := fits + "d"
	_, err := Spec(SpecOptions{Mode: ModeSandbox, Rootfs: "/r", HostDir: long})
	if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), long+"/"+SocketName+" has 108 bytes, a Unix socket address holds 107") {
		t.Fatalf("Spec with a socket path of 108 bytes = %v, want ErrSpec naming the path and its length", err)
	}
}

// TestSpecWithoutHostDir: a sandbox that runs something other than the executor may have no
// host directory: it then has no bind mount at all, so runsc makes no mount point in its root.
func TestSpecWithoutHostDir(t *testing.T) {
	s, err := Spec(SpecOptions{Mode: ModeSandbox, Rootfs: "/r", Args: []string{"python3", "-c", "pass"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Mounts {
		if m.Type == "bind" || m.Destination == ExecutorDir {
			t.Errorf("mount %+v", m)
		}
	}
	if !s.Root.Readonly {
		t.Error("the root is writable")
	}
}

// TestSpecCPUFeatures: the annotation in capture mode, names as given; none without them; an
// empty list is an annotation that allows nothing (gVisor boots the sandbox with no features).
func TestSpecCPUFeatures(t *testing.T) {
	o := testOptions(ModeCapture)
	if _, ok := mustSpec(t, o).Annotations[AnnotationCPUFeatures]; ok {
		t.Error("an annotation without CPU features")
	}
	o.CPUFeatures = []string{"fpu", "sse2", "avx2"}
	if got := mustSpec(t, o).Annotations[AnnotationCPUFeatures]; got != "fpu,sse2,avx2" {
		t.Errorf("annotation %q", got)
	}
	o.CPUFeatures = []string{}
	if got, ok := mustSpec(t, o).Annotations[AnnotationCPUFeatures]; !ok || got != "" {
		t.Errorf("empty list: %q %v", got, ok)
	}
	o.CPUFeatures = []string{"fpu", "AVX2", "clflushopt"}
	if _, err := Spec(o); !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "AVX2, clflushopt") {
		t.Errorf("unknown names: %v", err)
	}
}

// TestSpecCPUs: a capture's CPU count is a quota of that many CPUs from 2 up, a cpuset of the
// single CPU for 1 (runsc lowers its count by a quota to no fewer than 2), nothing unpinned;
// the fingerprint leaves it out (a restore keeps the checkpoint's count, and runsc lets a
// restore change the resources); other modes and bad counts are refused.
func TestSpecCPUs(t *testing.T) {
	o := testOptions(ModeCapture)
	if r := mustSpec(t, o).Linux.Resources; r != nil {
		t.Errorf("unpinned: resources %+v", r)
	}
	o.CPUs = 3
	cpu := mustSpec(t, o).Linux.Resources.CPU
	if cpu.Quota == nil || cpu.Period == nil || *cpu.Quota != 300_000 || *cpu.Period != 100_000 || cpu.Cpus != "" {
		t.Errorf("3 CPUs: %+v", cpu)
	}
	o.CPUs, o.SingleCPU = 1, 5
	cpu = mustSpec(t, o).Linux.Resources.CPU
	if cpu.Cpus != "5" || cpu.Quota != nil {
		t.Errorf("1 CPU: %+v", cpu)
	}
	plain := testOptions(ModeCapture)
	if fingerprint(t, mustSpec(t, o), DefaultFlags()) != fingerprint(t, mustSpec(t, plain), DefaultFlags()) {
		t.Error("the CPU count changes the fingerprint of the shape a restore must match")
	}
	for _, bad := range []SpecOptions{
		{Mode: ModeSandbox, Rootfs: "/r", HostDir: "/h", CPUs: 2},
		{Mode: ModeCapture, Rootfs: "/r", HostDir: "/h", ImageDir: "/i", CPUs: -1},
		{Mode: ModeCapture, Rootfs: "/r", HostDir: "/h", ImageDir: "/i", CPUs: 2000},
		{Mode: ModeCapture, Rootfs: "/r", HostDir: "/h", ImageDir: "/i", CPUs: 2, SingleCPU: 1},
	} {
		if _, err := Spec(bad); !errors.Is(err, ErrSpec) {
			t.Errorf("%+v: err = %v, want ErrSpec", bad, err)
		}
	}
}

func fingerprint(t *testing.T, s *specs.Spec, f Flags) string {
	t.Helper()
	fp, err := Fingerprint(s, f)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(fp, "sha256:") || len(fp) != len("sha256:")+64 {
		t.Fatalf("fingerprint %q", fp)
	}
	return fp
}

func TestFingerprint(t *testing.T) {
	flags := DefaultFlags()
	base := fingerprint(t, mustSpec(t, testOptions(ModeSandbox)), flags)

	// What restore allows to differ: environment, mode, mount sources, annotations.
	same := map[string]SpecOptions{
		"env":          {Mode: ModeSandbox, Rootfs: "/images/rootfs", HostDir: "/tmp/host/a", Env: []string{"TOKEN=x"}},
		"mode":         testOptions(ModeMeasure),
		"capture":      testOptions(ModeCapture),
		"mount source": {Mode: ModeSandbox, Rootfs: "/images/rootfs", HostDir: "/elsewhere/b"},
	}
	for name, o := range same {
		if fp := fingerprint(t, mustSpec(t, o), flags); fp != base {
			t.Errorf("fingerprint changed with %s", name)
		}
	}
	// What restore requires to match.
	args := mustSpec(t, testOptions(ModeSandbox))
	args.Process.Args = append(args.Process.Args, "--extra")
	mounts := mustSpec(t, testOptions(ModeSandbox))
	mounts.Mounts = mounts.Mounts[:len(mounts.Mounts)-1]
	options := mustSpec(t, testOptions(ModeSandbox))
	options.Mounts[0].Options = []string{"ro"}
	readonly := mustSpec(t, testOptions(ModeSandbox))
	readonly.Root.Readonly = false
	user := mustSpec(t, testOptions(ModeSandbox))
	user.Process.User.UID = 1000
	differ := map[string]struct {
		spec  *specs.Spec
		flags Flags
	}{
		"args":          {args, flags},
		"mounts":        {mounts, flags},
		"mount options": {options, flags},
		"read-only":     {readonly, flags},
		"user":          {user, flags},
		"network":       {mustSpec(t, testOptions(ModeSandbox)), Flags{Network: "sandbox", Overlay: "none", HostUDS: "create"}},
		"overlay":       {mustSpec(t, testOptions(ModeSandbox)), Flags{Network: "none", Overlay: "root:memory", HostUDS: "create"}},
	}
	for name, d := range differ {
		if fp := fingerprint(t, d.spec, d.flags); fp == base {
			t.Errorf("fingerprint did not change with %s", name)
		}
	}
}

// TestSpecProcess: an image's Env is the base of the environment, under the pipeline's
// overrides, with defaults only for what it lacks; its cwd and user shape the process and the
// fingerprint, its Env does not; the zero Process gives the default rootfs's spec.
func TestSpecProcess(t *testing.T) {
	image := Process{
		Env:  []string{"PATH=/opt/venv/bin:/usr/bin", "VIRTUAL_ENV=/opt/venv", "PYTHONUNBUFFERED=0", "EXECUTOR_DIR=/elsewhere", "HOME=/home/app"},
		Cwd:  "/srv/app",
		User: specs.User{UID: 1000, GID: 1001, AdditionalGids: []uint32{50}},
	}
	o := testOptions(ModeCapture)
	o.Process = image
	o.Env = []string{"PASSED=1", "VIRTUAL_ENV=/from/pass_env"}
	s := mustSpec(t, o)
	want := []string{
		"PATH=/opt/venv/bin:/usr/bin", "VIRTUAL_ENV=/from/pass_env", "PYTHONUNBUFFERED=1", "EXECUTOR_DIR=" + ExecutorDir, "HOME=/home/app",
		"LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1", "EXECUTOR_MODE=capture", "READIE_PRE_CHECKPOINT=", "READIE_PREIMPORT=numpy,pandas", "PASSED=1",
	}
	if !slices.Equal(s.Process.Env, want) {
		t.Errorf("env\n%q\nwant\n%q", s.Process.Env, want)
	}
	if s.Process.Cwd != "/srv/app" || s.Process.User.UID != 1000 || s.Process.User.GID != 1001 {
		t.Errorf("cwd %q user %+v", s.Process.Cwd, s.Process.User)
	}
	def := mustSpec(t, testOptions(ModeSandbox))
	wantDefault := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1", "EXECUTOR_DIR=" + ExecutorDir, "EXECUTOR_MODE=sandbox"}
	if !slices.Equal(def.Process.Env, wantDefault) || def.Process.Cwd != "/" || def.Process.User.UID != 0 {
		t.Errorf("default env %q cwd %q user %+v", def.Process.Env, def.Process.Cwd, def.Process.User)
	}
	fp := func(p Process) string {
		o := testOptions(ModeSandbox)
		o.Process = p
		f, err := Fingerprint(mustSpec(t, o), DefaultFlags())
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	if fp(Process{Env: image.Env}) != fp(Process{}) {
		t.Error("the image's Env changed the fingerprint")
	}
	if fp(Process{Cwd: "/srv/app"}) == fp(Process{}) || fp(Process{User: image.User}) == fp(Process{}) {
		t.Error("the image's cwd or user left the fingerprint unchanged")
	}
	for _, bad := range []Process{{Env: []string{"NOVALUE"}}, {Cwd: "relative"}} {
		o := testOptions(ModeSandbox)
		o.Process = bad
		if _, err := Spec(o); !errors.Is(err, ErrSpec) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}

// TestImageCannotChoosePreCheckpointSteps: an image's Env reaches every sandbox, but in a
// capture the pipeline sets the pre-checkpoint steps blank over it (a bench variant sets them
// over that), so a stranger's image never changes what the pipeline's captures run.
func TestImageCannotChoosePreCheckpointSteps(t *testing.T) {
	p := Process{Env: []string{PreCheckpointEnv + "=gc.freeze", "A=1"}}
	capture := p.env(ModeCapture, nil)
	if !slices.Contains(capture, PreCheckpointEnv+"=") || slices.Contains(capture, PreCheckpointEnv+"=gc.freeze") || !slices.Contains(capture, "A=1") {
		t.Errorf("capture env %q: want %s blank over the image's, the image's other variables kept", capture, PreCheckpointEnv)
	}
	variant := p.env(ModeCapture, []string{PreCheckpointEnv + "=gc.collect"})
	if !slices.Contains(variant, PreCheckpointEnv+"=gc.collect") || slices.Contains(variant, PreCheckpointEnv+"=") {
		t.Errorf("a variant's capture env %q: want its steps", variant)
	}
}
