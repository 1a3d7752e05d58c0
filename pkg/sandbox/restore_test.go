package sandbox

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// shipped writes the restore spec as an output ships it (sandbox mode, the placeholder host
// directory) and returns its path and fingerprint with the default flags.
func shipped(t *testing.T, edit func(*specs.Spec)) (string, string) {
	t.Helper()
	s := mustSpec(t, SpecOptions{Mode: ModeSandbox, Rootfs: "/build/rootfs", HostDir: "/run/readie/sandboxes/SANDBOX_ID"})
	fp := fingerprint(t, s, DefaultFlags())
	if edit != nil {
		edit(s)
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "restore-spec.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, fp
}

// decoded is a JSON document as generic values, to compare two specs field by field without
// the Go types' help (a field the types dropped would show).
func decoded(t *testing.T, data []byte) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRestoreSpecReplacesThreeFields: root.path, the executor mount's source and the
// environment change, and nothing else of the file; the fingerprint stays.
func TestRestoreSpecReplacesThreeFields(t *testing.T) {
	path, fp := shipped(t, nil)
	o := RestoreOptions{Rootfs: "/worker/rootfs", HostDir: "/run/w/s1", Env: []string{"TOKEN=abc", "EXECUTOR_MODE=measure"}}
	got, err := RestoreSpec(path, fp, DefaultFlags().Args(), o)
	if err != nil {
		t.Fatal(err)
	}
	if got.Root.Path != "/worker/rootfs" {
		t.Errorf("root.path %q", got.Root.Path)
	}
	if m, _ := executorMount(got); m.Source != "/run/w/s1" {
		t.Errorf("executor mount source %q", m.Source)
	}
	// The base environment stays in order; EXECUTOR_MODE is replaced in place, TOKEN added.
	if !slices.Contains(got.Process.Env, "EXECUTOR_MODE=measure") || slices.Contains(got.Process.Env, "EXECUTOR_MODE=sandbox") ||
		got.Process.Env[len(got.Process.Env)-1] != "TOKEN=abc" || !slices.Contains(got.Process.Env, "EXECUTOR_DIR="+ExecutorDir) {
		t.Errorf("env %v", got.Process.Env)
	}
	if after := fingerprint(t, got, DefaultFlags()); after != fp {
		t.Errorf("fingerprint changed: %s -> %s", fp, after)
	}

	// Put the three fields back: the result is the file, to the last field.
	original, _ := os.ReadFile(path)
	want := decoded(t, original)
	restored, _ := json.Marshal(got)
	have := decoded(t, restored)
	have["root"].(map[string]any)["path"] = want["root"].(map[string]any)["path"]
	have["process"].(map[string]any)["env"] = want["process"].(map[string]any)["env"]
	for i, m := range have["mounts"].([]any) {
		if m.(map[string]any)["destination"] == ExecutorDir {
			m.(map[string]any)["source"] = want["mounts"].([]any)[i].(map[string]any)["source"]
		}
	}
	if !reflect.DeepEqual(have, want) {
		t.Errorf("more than the three fields changed:\n got %v\nwant %v", have, want)
	}
}

// TestRestoreSpecRefuses: every refusal names what is wrong and matches ErrRestoreSpec.
func TestRestoreSpecRefuses(t *testing.T) {
	good := RestoreOptions{Rootfs: "/worker/rootfs", HostDir: "/run/w/s1"}
	flags := DefaultFlags().Args()
	for _, tc := range []struct {
		name  string
		edit  func(*specs.Spec)
		flags []string
		o     RestoreOptions
		fp    string // replaces the recorded fingerprint when set
		want  []string
	}{
		{name: "args edited", edit: func(s *specs.Spec) { s.Process.Args = append(s.Process.Args, "-X") },
			want: []string{"fingerprint sha256:", "the manifest records", "differs from the captured shape in args"}},
		{name: "cwd and read-only root edited", edit: func(s *specs.Spec) { s.Process.Cwd = "/tmp"; s.Root.Readonly = false },
			want: []string{"cwd", "root_readonly"}},
		{name: "a mount's options", edit: func(s *specs.Spec) { s.Mounts[0].Options = []string{"ro"} }, want: []string{"in mounts"}},
		{name: "other network flags", flags: []string{"--network=sandbox", "--overlay2=none", "--host-uds=create"},
			want: []string{"neither this spec nor this pipeline's sandbox shape", "--network=sandbox"}},
		{name: "another pipeline's fingerprint", fp: "sha256:" + strings.Repeat("0", 64), want: []string{"another version of the pipeline"}},
		{name: "runsc flags without network", flags: []string{"--overlay2=none"}, want: []string{"runsc_flags", "lack --network"}},
		{name: "capture annotations", edit: func(s *specs.Spec) {
			s.Annotations = map[string]string{annotationCheckpointPath: "/img"}
		}, want: []string{"capture annotation " + annotationCheckpointPath}},
		// The fingerprint stays for these: what only the whole spec shows.
		{name: "a host hook", edit: func(s *specs.Spec) {
			s.Hooks = &specs.Hooks{CreateRuntime: []specs.Hook{{Path: "/bin/sh", Args: []string{"sh", "-c", "id > /tmp/owned"}}}}
		}, want: []string{"differs from the pipeline's sandbox spec in hooks"}},
		{name: "an annotation", edit: func(s *specs.Spec) {
			s.Annotations = map[string]string{"dev.gvisor.flag.debug-log": "/etc/"}
		}, want: []string{"in annotations"}},
		{name: "another mount source", edit: func(s *specs.Spec) { s.Mounts[0].Source = "/etc" }, want: []string{"in mounts"}},
		{name: "linux resources and hostname", edit: func(s *specs.Spec) {
			s.Linux.Resources = &specs.LinuxResources{}
			s.Hostname = "x"
		}, want: []string{"in hostname, linux"}},
		{name: "a debug log on the host", flags: append(DefaultFlags().Args(), "--debug-log=/etc/cron.d/x"),
			want: []string{`"--debug-log=/etc/cron.d/x" is not one of`}},
		{name: "the host's network", flags: []string{"--network=host", "--overlay2=none", "--host-uds=create"},
			want: []string{`"--network=host": --network takes one of none, sandbox`}},
		{name: "flag override", flags: append(DefaultFlags().Args(), "--allow-flag-override"), want: []string{"--allow-flag-override"}},
		{name: "relative rootfs", o: RestoreOptions{Rootfs: "rootfs", HostDir: "/h"}, want: []string{`rootfs "rootfs" is not an absolute path`}},
		{name: "relative host dir", o: RestoreOptions{Rootfs: "/r", HostDir: "h"}, want: []string{`host dir "h" is not an absolute path`}},
		{name: "host dir too long for a socket", o: RestoreOptions{Rootfs: "/r", HostDir: "/" + strings.Repeat("d", 100)},
			want: []string{"too long", "a Unix socket address holds 107"}},
		{name: "bad env", o: RestoreOptions{Rootfs: "/r", HostDir: "/h", Env: []string{"NOEQUALS", "=x"}},
			want: []string{`"NOEQUALS" is not KEY=VALUE`, `"=x" is not KEY=VALUE`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, fp := shipped(t, tc.edit)
			if tc.fp != "" {
				fp = tc.fp
			}
			f := flags
			if tc.flags != nil {
				f = tc.flags
			}
			o := tc.o
			if o.Rootfs == "" {
				o = good
			}
			before, _ := os.ReadFile(path)
			_, err := RestoreSpec(path, fp, f, o)
			if !errors.Is(err, ErrRestoreSpec) {
				t.Fatalf("err = %v, want ErrRestoreSpec", err)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not say %q:\n%v", want, err)
				}
			}
			if after, _ := os.ReadFile(path); string(after) != string(before) {
				t.Error("the restore spec file changed")
			}
		})
	}
	t.Run("no executor mount", func(t *testing.T) {
		path, _ := shipped(t, func(s *specs.Spec) { s.Mounts = s.Mounts[:len(s.Mounts)-1] })
		// The shape changed too, so a recorded fingerprint of this shape is what is compared.
		data, _ := os.ReadFile(path)
		var s specs.Spec
		json.Unmarshal(data, &s)
		fp := fingerprint(t, &s, DefaultFlags())
		if _, err := RestoreSpec(path, fp, flags, good); !errors.Is(err, ErrRestoreSpec) || !strings.Contains(err.Error(), "no bind mount on "+ExecutorDir) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		if _, err := RestoreSpec(filepath.Join(t.TempDir(), "none.json"), "sha256:x", flags, good); !errors.Is(err, ErrRestoreSpec) || !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("not json", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "restore-spec.json")
		os.WriteFile(path, []byte("{"), 0o644)
		if _, err := RestoreSpec(path, "sha256:x", flags, good); !errors.Is(err, ErrRestoreSpec) || !strings.Contains(err.Error(), "parse") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestCheckRestoreFlags(t *testing.T) {
	for _, ok := range [][]string{nil, {"-direct"}, {"--direct"}, {"-direct=false", "-background"}} {
		if err := CheckRestoreFlags(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for flags, want := range map[string]string{
		"-image-path=/etc":   "is not one of -background, -direct",
		"-direct=maybe":      `--direct takes one of`,
		"-direct=":           `--direct takes one of`,
		"direct":             "is not a flag (-NAME)",
		"-pid-file=/etc/x":   "-pid-file",
		"--debug-log=/etc/x": "is not one of",
	} {
		if err := CheckRestoreFlags([]string{flags}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", flags, err, want)
		}
	}
}

func TestParseFlagsAllowsWhatThePipelineWrites(t *testing.T) {
	for _, f := range []Flags{DefaultFlags(), {Network: "sandbox", Overlay: "root:memory", HostUDS: "all", Extra: []string{"--ignore-cgroups", "--platform=ptrace", "--directfs=false", "--file-access=shared", "--host-settings=ignore", "--app-huge-pages=false"}}} {
		got, err := ParseFlags(f.Args())
		if err != nil || !reflect.DeepEqual(got, f) {
			t.Errorf("%q: %+v, %v", f.Args(), got, err)
		}
	}
	if _, err := ParseFlags(append(DefaultFlags().Args(), "--platform=kvm;rm")); err == nil {
		t.Error("a platform outside the list was accepted")
	}
	// adjust and enforce would have runsc, as root, write the worker host's kernel settings.
	for _, bad := range []string{"--host-settings=adjust", "--host-settings=enforce", "--host-settings", "--app-huge-pages=maybe"} {
		if _, err := ParseFlags(append(DefaultFlags().Args(), bad)); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%s: %v, want an error naming it", bad, err)
		}
	}
}

// TestRestoreSpecImageProcess: the restore spec of an image keeps its Env (the worker's
// variables set over it), its cwd and its user; a user edited in the file is refused.
func TestRestoreSpecImageProcess(t *testing.T) {
	p := Process{Env: []string{"VIRTUAL_ENV=/opt/venv", "PATH=/opt/venv/bin:/usr/bin"}, Cwd: "/srv", User: specs.User{UID: 1000, GID: 1000}}
	s := mustSpec(t, SpecOptions{Mode: ModeSandbox, Rootfs: "/build/rootfs", HostDir: "/run/readie/sandboxes/SANDBOX_ID", Process: p})
	fingerprint, _ := Fingerprint(s, DefaultFlags())
	dir := t.TempDir()
	path := filepath.Join(dir, "restore-spec.json")
	data, _ := json.Marshal(s)
	os.WriteFile(path, data, 0o644)
	got, err := RestoreSpec(path, fingerprint, DefaultFlags().Args(), RestoreOptions{Rootfs: "/w/rootfs", HostDir: "/w/h", Env: []string{"PATH=/worker", "TOKEN=1"}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Process.Cwd != "/srv" || got.Process.User.UID != 1000 || !slices.Contains(got.Process.Env, "VIRTUAL_ENV=/opt/venv") ||
		!slices.Contains(got.Process.Env, "PATH=/worker") || !slices.Contains(got.Process.Env, "TOKEN=1") {
		t.Errorf("restore spec process %+v", got.Process)
	}
	s.Process.User.UID = 0
	data, _ = json.Marshal(s)
	os.WriteFile(path, data, 0o644)
	if _, err := RestoreSpec(path, fingerprint, DefaultFlags().Args(), RestoreOptions{Rootfs: "/w/rootfs", HostDir: "/w/h"}); !errors.Is(err, ErrRestoreSpec) || !strings.Contains(err.Error(), "the manifest records "+fingerprint) {
		t.Errorf("a spec whose user was edited: %v", err)
	}
}

// TestPrepareHostDir: a non-root user gets the directory; root's stays as it is.
func TestPrepareHostDir(t *testing.T) {
	dir := t.TempDir()
	if err := PrepareHostDir(dir, specs.User{}); err != nil {
		t.Fatal(err)
	}
	if err := PrepareHostDir(dir, specs.User{UID: 4242, GID: 4343}); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(dir)
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 4242 || st.Gid != 4343 {
		t.Errorf("owner %d:%d, want 4242:4343", st.Uid, st.Gid)
	}
}

// TestFillRestoreSpecCopies: a spec read once fills many sandboxes' specs, each with its own
// host directory and environment, and stays as it was read.
func TestFillRestoreSpecCopies(t *testing.T) {
	path, fp := shipped(t, nil)
	read, err := ReadSpec(path, fp, DefaultFlags().Args())
	if err != nil {
		t.Fatal(err)
	}
	before, _ := json.Marshal(read)
	for _, host := range []string{"/run/w/a", "/run/w/b"} {
		got, err := FillRestoreSpec(read, RestoreOptions{Rootfs: "/worker/rootfs", HostDir: host, Env: []string{"TOKEN=" + host}})
		if err != nil {
			t.Fatal(err)
		}
		if m, _ := executorMount(got); m.Source != host || got.Process.Env[len(got.Process.Env)-1] != "TOKEN="+host || got.Root.Path != "/worker/rootfs" {
			t.Errorf("filled for %s: mount %+v, env %v, root %q", host, m, got.Process.Env, got.Root.Path)
		}
	}
	if after, _ := json.Marshal(read); string(after) != string(before) {
		t.Errorf("FillRestoreSpec changed the spec it was given:\n%s\n%s", before, after)
	}
	if _, err := FillRestoreSpec(read, RestoreOptions{Rootfs: "relative", HostDir: "/run/w/a"}); !errors.Is(err, ErrRestoreSpec) {
		t.Errorf("FillRestoreSpec with a relative rootfs = %v, want ErrRestoreSpec", err)
	}
}
