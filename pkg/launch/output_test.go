package launch_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// fakeOutput writes an output's manifest.json and restore-spec.json (no images: it is opened
// without Verify) whose spec runs as specUser and whose manifest records recorded as its
// image's process (nil: the default rootfs's); edit changes the manifest before it is written.
// It returns the output's directory and a rootfs that records the manifest's digest.
func fakeOutput(t *testing.T, specUser specs.User, recorded *sandbox.Process, edit func(*manifest.Manifest)) (string, string) {
	t.Helper()
	dir, rootfs := t.TempDir(), t.TempDir()
	const digest = "sha256:" + "ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12"
	info := filepath.Join(rootfs, manifest.RootfsInfoFile)
	if err := os.MkdirAll(filepath.Dir(info), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(info, []byte(`{"digest":"`+digest+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := sandbox.Spec(sandbox.SpecOptions{Mode: sandbox.ModeSandbox, Rootfs: "/build/rootfs", HostDir: "/run/readie/sandboxes/SANDBOX_ID",
		Process: sandbox.Process{User: specUser}})
	if err != nil {
		t.Fatal(err)
	}
	fingerprint, err := sandbox.Fingerprint(spec, sandbox.DefaultFlags())
	if err != nil {
		t.Fatal(err)
	}
	m := &manifest.Manifest{
		ExecutorProtocol: executorproto.Version, RunscFlags: sandbox.DefaultFlags().Args(), SpecFingerprint: fingerprint,
		Spec: manifest.RestoreSpecFileName, Rootfs: manifest.Rootfs{Path: rootfs, Digest: digest}, Process: recorded,
		Checkpoints: []manifest.Checkpoint{{ID: "small", Dir: "small"}},
	}
	if edit != nil {
		edit(m)
	}
	for name, v := range map[string]any{manifest.FileName: m, manifest.RestoreSpecFileName: spec} {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, rootfs
}

// TestOutputRefusesAnotherUser: a restore spec whose process runs as a user other than the one
// the output records for its image is refused, naming both, before any sandbox: the host
// directory of each sandbox would be handed to that user. With the recorded user, the
// sandboxes' host directories are that user's, in a work directory only root can enter.
func TestOutputRefusesAnotherUser(t *testing.T) {
	uid1000 := specs.User{UID: 1000, GID: 1000}
	for name, recorded := range map[string]*sandbox.Process{"the default rootfs (root)": nil, "another image user": {User: specs.User{UID: 1001, GID: 1001}}} {
		dir, rootfs := fakeOutput(t, uid1000, recorded, nil)
		_, err := launch.OpenOutput(dir, launch.OpenOptions{Rootfs: rootfs})
		if !errors.Is(err, launch.ErrOutput) || !errors.Is(err, sandbox.ErrRestoreSpec) || !strings.Contains(err.Error(), "uid 1000, gid 1000") {
			t.Errorf("%s recorded, a spec of uid 1000: OpenOutput = %v, want ErrRestoreSpec naming both users", name, err)
		}
	}

	dir, rootfs := fakeOutput(t, uid1000, &sandbox.Process{User: uid1000}, nil)
	out, err := launch.OpenOutput(dir, launch.OpenOptions{Rootfs: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	f := testenv.NewFakeSandboxRunsc(t)
	rt := f.Runtime(t)
	work := filepath.Join(testenv.WorkDir(t), "w") // made by the kit
	r, err := out.Restorer(launch.Options{Runtime: rt, WorkDir: work, IDs: launch.RandomIDs{Prefix: "worker"}})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := r.NewSandbox()
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(t.Context())
	for path, want := range map[string]uint32{sb.HostDir: 1000, work: 0} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != want || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s is %s, uid %d; want 0700, uid %d", path, fi.Mode(), st.Uid, want)
		}
	}
}

// TestOpenOutputRefuses: what reaches runsc or the host is refused before anything runs,
// naming it, with ErrOutput: flags outside the allow-list, a rootfs that records another
// digest, a set the output lacks; and a runtime with other runsc flags than the output's.
func TestOpenOutputRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		edit func(*manifest.Manifest)
		want string
	}{
		"runsc flags":   {func(m *manifest.Manifest) { m.RunscFlags = append(m.RunscFlags, "--debug-log=/etc/x") }, "the manifest's runsc_flags"},
		"restore flags": {func(m *manifest.Manifest) { m.RestoreFlags = []string{"-pid-file=/etc/x"} }, "the manifest's restore_flags"},
		"rootfs":        {func(m *manifest.Manifest) { m.Rootfs.Digest = "sha256:" + strings.Repeat("0", 64) }, "the checkpoints were captured on"},
		"protocol":      {func(m *manifest.Manifest) { m.ExecutorProtocol = 99 }, "protocol"},
	} {
		dir, rootfs := fakeOutput(t, specs.User{}, nil, c.edit)
		if _, err := launch.OpenOutput(dir, launch.OpenOptions{Rootfs: rootfs}); !errors.Is(err, launch.ErrOutput) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: OpenOutput = %v, want ErrOutput saying %q", name, err, c.want)
		}
	}
	dir, rootfs := fakeOutput(t, specs.User{}, nil, nil)
	out, err := launch.OpenOutput(dir, launch.OpenOptions{Rootfs: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := out.Image("nosuch"); !errors.Is(err, launch.ErrOutput) || !strings.Contains(err.Error(), `no checkpoint "nosuch"`) {
		t.Errorf("Image of a set the output lacks = %v", err)
	}
	if img, err := out.Image("small"); err != nil || img.Dir != filepath.Join(dir, "small") {
		t.Errorf("Image(small) = %+v, %v", img, err)
	}
	rt := testenv.NewFakeSandboxRunsc(t).Runtime(t)
	rt.Flags.Network = "sandbox"
	if _, err := out.Restorer(launch.Options{Runtime: rt, WorkDir: testenv.WorkDir(t)}); err == nil || !strings.Contains(err.Error(), "not the output's") {
		t.Errorf("a restorer whose runtime has other flags = %v", err)
	}
	rt.Flags = out.Flags
	if _, err := out.Restorer(launch.Options{Runtime: rt, WorkDir: testenv.WorkDir(t), Env: []string{"NOT AN ENTRY"}}); !errors.Is(err, sandbox.ErrRestoreSpec) {
		t.Errorf("a restorer with a bad environment entry = %v, want ErrRestoreSpec", err)
	}
}
