package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Registry is Debian's docker-registry (the CNCF distribution registry) on a free loopback
// port with a temporary storage directory, stopped when the test ends.
type Registry struct {
	Host string // 127.0.0.1:PORT
	// User and Password are set when the registry requires them (htpasswd).
	User, Password string

	mu  sync.Mutex
	log bytes.Buffer
}

// Log returns everything the registry logged so far (one line per request).
func (r *Registry) Log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.String()
}

func (r *Registry) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.Write(p)
}

// StartRegistry starts a registry; with auth it requires a user and password (htpasswd). It
// fails the test, saying how to install it, when docker-registry is missing.
func StartRegistry(t testing.TB, auth bool) *Registry {
	t.Helper()
	SkipIfShort(t, "docker-registry")
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		t.Fatalf("docker-registry is not installed: run the tests with `make test` (its deps install Debian's docker-registry): %v", err)
	}
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := ln.Addr().String()
	ln.Close()
	r := &Registry{Host: host}
	config := fmt.Sprintf("version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), host)
	if auth {
		r.User, r.Password = "readie", fmt.Sprintf("pw-%d-canary", time.Now().UnixNano())
		hash, err := bcrypt.GenerateFromPassword([]byte(r.Password), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		htpasswd := filepath.Join(dir, "htpasswd")
		os.WriteFile(htpasswd, []byte(r.User+":"+string(hash)+"\n"), 0o600)
		config += fmt.Sprintf("auth:\n  htpasswd:\n    realm: readie-test\n    path: %s\n", htpasswd)
	}
	configPath := filepath.Join(dir, "config.yml")
	os.WriteFile(configPath, []byte(config), 0o600)
	cmd := exec.Command(bin, "serve", configPath)
	cmd.Stdout, cmd.Stderr = r, r
	cmd.WaitDelay = 10 * time.Second // its log goes into memory: Wait must not wait for the pipe
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/v2/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			return r
		}
		select {
		case <-exited:
			t.Fatalf("docker-registry exited at start:\n%s", r.Log())
		case <-ctx.Done():
			t.Fatalf("docker-registry did not answer on %s within a minute:\n%s", host, r.Log())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// DockerConfig writes a Docker config with the registry's credentials into a new directory
// and returns it, for DOCKER_CONFIG in the environment of the runs that use it (not this
// process's: tests that set it cannot run in parallel).
func (r *Registry) DockerConfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	auth := fmt.Sprintf(`{"auths":{%q:{"username":%q,"password":%q}}}`, r.Host, r.User, r.Password)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(auth), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Uploads counts the blob uploads the registry has been asked to start.
func (r *Registry) Uploads() int {
	return strings.Count(r.Log(), "POST /v2/") // POST .../blobs/uploads/ starts every upload
}
