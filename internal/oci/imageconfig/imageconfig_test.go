package imageconfig

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func testRoot(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	os.MkdirAll(filepath.Join(dir, "srv/app"), 0o755)
	os.WriteFile(filepath.Join(dir, "srv/file"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n# a comment\napp:x:1000:1001::/home/app:/bin/sh\nbroken:x\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "etc/group"), []byte("root:x:0:\nstaff:x:50:app,other\napp:x:1001:\ndata:x:2000:app\n"), 0o644)
	return dir
}

func TestProcess(t *testing.T) {
	root := testRoot(t)
	for _, c := range []struct {
		user, cwd     string
		env           []string
		uid, gid      uint32
		extra         []uint32
		home, wantCwd string
	}{
		{user: "", uid: 0, gid: 0, home: "/root"},
		{user: "root", uid: 0, gid: 0, home: "/root"},
		{user: "app", uid: 1000, gid: 1001, extra: []uint32{50, 2000}, home: "/home/app"},
		{user: "1000", uid: 1000, gid: 1001, extra: []uint32{50, 2000}, home: "/home/app"},
		{user: "app:staff", uid: 1000, gid: 50, home: "/home/app"},
		{user: "1000:7", uid: 1000, gid: 7, home: "/home/app"},
		{user: "4242", uid: 4242, gid: 0, home: "/"},
		{user: "4242:data", uid: 4242, gid: 2000, home: "/"},
		{user: "app", env: []string{"HOME=/data", "PATH=/opt/venv/bin:/usr/bin"}, uid: 1000, gid: 1001, extra: []uint32{50, 2000}},
		{user: "app", cwd: "/srv/app/", wantCwd: "/srv/app", uid: 1000, gid: 1001, extra: []uint32{50, 2000}, home: "/home/app"},
		{cwd: "/", home: "/root"},
	} {
		p, err := Process(v1.Config{User: c.user, WorkingDir: c.cwd, Env: c.env}, root)
		if err != nil {
			t.Errorf("User %q: %v", c.user, err)
			continue
		}
		if p.User.UID != c.uid || p.User.GID != c.gid || !slices.Equal(p.User.AdditionalGids, c.extra) || p.Cwd != c.wantCwd {
			t.Errorf("User %q WorkingDir %q: %+v cwd %q, want %d:%d %v cwd %q", c.user, c.cwd, p.User, p.Cwd, c.uid, c.gid, c.extra, c.wantCwd)
		}
		wantEnv := slices.Clone(c.env)
		if c.home != "" {
			wantEnv = append(wantEnv, "HOME="+c.home)
		}
		if !slices.Equal(p.Env, wantEnv) {
			t.Errorf("User %q: env %q, want %q", c.user, p.Env, wantEnv)
		}
	}
}

func TestProcessRefuses(t *testing.T) {
	root := testRoot(t)
	for _, c := range []struct {
		cfg  v1.Config
		want string
	}{
		{v1.Config{User: "nobody"}, `no user "nobody"`},
		{v1.Config{User: "app:nogroup"}, `no group "nogroup"`},
		{v1.Config{User: ":50"}, "no user before the colon"},
		{v1.Config{User: "app:"}, "no group after the colon"},
		{v1.Config{User: "99999999999"}, `no user "99999999999"`},
		{v1.Config{WorkingDir: "srv/app"}, "not an absolute path"},
		{v1.Config{WorkingDir: "/srv/missing"}, `WorkingDir "/srv/missing" is not a directory`},
		{v1.Config{WorkingDir: "/srv/file"}, `WorkingDir "/srv/file" is not a directory`},
		{v1.Config{Env: []string{"JUSTANAME"}}, `"JUSTANAME" is not KEY=VALUE`},
	} {
		_, err := Process(c.cfg, root)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want ErrConfig saying %q", c.cfg, err, c.want)
		}
	}
	// A symlinked /etc/passwd that leaves the image is not followed out of it.
	os.Remove(filepath.Join(root, "etc/passwd"))
	os.Symlink("/etc/passwd", filepath.Join(root, "etc/passwd"))
	if _, err := Process(v1.Config{User: "root"}, root); err == nil {
		t.Error("a user resolved through a symlink out of the image")
	}
}

// An image whose /etc/passwd or /etc/group is a FIFO (the unpack makes what a layer's tar
// says) is refused, naming the file, rather than blocking the pipeline forever in open(2),
// which waits for a writer nobody will be.
func TestProcessRefusesNonRegularDatabase(t *testing.T) {
	for _, name := range []string{"passwd", "group"} {
		root := testRoot(t)
		fifo := filepath.Join(root, "etc", name)
		os.Remove(fifo)
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := Process(v1.Config{User: "app"}, root)
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "/etc/"+name+" is not a regular file") {
				t.Errorf("/etc/%s a FIFO: %v, want ErrConfig naming it", name, err)
			}
		case <-time.After(30 * time.Second):
			// The fault is a hang: unblock the open so the goroutine ends, then fail.
			if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
				w.Close()
			}
			<-done
			t.Errorf("/etc/%s a FIFO: Process blocked opening it", name)
		}
	}
}
