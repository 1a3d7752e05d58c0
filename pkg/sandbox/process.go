package sandbox

import (
	"fmt"
	"os"
	"path"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Process is what an image's config says of the process every sandbox made from it runs: the
// base environment, the working directory and the user (resolved to numbers in the image's
// own /etc/passwd and /etc/group). The zero Process is the default rootfs's: no environment
// of its own, cwd "/", root.
type Process struct {
	// Env is the image config's Env, in its order: the base of every sandbox's environment,
	// under the variables the pipeline sets (Overrides).
	Env []string `json:"env,omitempty"`
	// Cwd is the image config's WorkingDir ("" is "/").
	Cwd string `json:"cwd,omitempty"`
	// User is the image config's User as numbers, with the user's supplementary groups.
	User specs.User `json:"user"`
}

// IsZero reports whether p is the default rootfs's process.
func (p Process) IsZero() bool {
	return len(p.Env) == 0 && (p.Cwd == "" || p.Cwd == "/") && p.User.UID == 0 && p.User.GID == 0 && len(p.User.AdditionalGids) == 0
}

// cwd returns the process's working directory.
func (p Process) cwd() string {
	if p.Cwd == "" {
		return "/"
	}
	return p.Cwd
}

// Defaults returns the variables a sandbox gets when the image's Env does not set them: a PATH
// where Debian's python3 is, root's HOME (the image's user's HOME comes from its /etc/passwd)
// and a UTF-8 locale every image has.
func Defaults() []string {
	return []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8"}
}

// Overrides returns the variables the pipeline sets over the image's Env in every sandbox, and
// why: PYTHONUNBUFFERED (the executor's lines reach the pipeline as they are written, the
// capture's marker included), PYTHONDONTWRITEBYTECODE (the root is read-only: no .pyc can be
// written), EXECUTOR_DIR (where the socket goes: the bind mount of the host directory) and
// EXECUTOR_MODE (capture, measure or sandbox). A capture also sets PreCheckpointEnv blank, so
// that an image's own Env never chooses steps for the pipeline's captures (a bench variant sets
// it over this), and adds READIE_PREIMPORT (the set); the pipeline's pass_env and CPU baseline
// controls come over all of them.
func Overrides(mode Mode) []string {
	env := []string{
		"PYTHONUNBUFFERED=1",
		"PYTHONDONTWRITEBYTECODE=1",
		"EXECUTOR_DIR=" + ExecutorDir,
		"EXECUTOR_MODE=" + string(mode),
	}
	if mode == ModeCapture {
		env = append(env, PreCheckpointEnv+"=")
	}
	return env
}

// PreCheckpointEnv names the executor's steps just before the checkpoint in a capture
// (images/executor/readie_executor/precheckpoint.py): a pipeline extension of capture mode,
// set only in the capture of a bench variant's own image.
const PreCheckpointEnv = "READIE_PRE_CHECKPOINT"

// PreimportEnv names the modules a capture imports before its checkpoint.
const PreimportEnv = "READIE_PREIMPORT"

// env returns the environment of a sandbox in mode for p: p's Env with Defaults for what it
// lacks, then Overrides and extra set over it (each replacing an entry of the same name in
// place).
func (p Process) env(mode Mode, extra []string) []string {
	env := mergeEnv(nil, p.Env)
	for _, kv := range Defaults() {
		name, _, _ := strings.Cut(kv, "=")
		if !hasVar(env, name) {
			env = append(env, kv)
		}
	}
	return mergeEnv(mergeEnv(env, Overrides(mode)), extra)
}

func hasVar(env []string, name string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, name+"=") {
			return true
		}
	}
	return false
}

// Check refuses a process no sandbox can run, naming the problem.
func (p Process) Check() error {
	for _, kv := range p.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
			return fmt.Errorf("%w: environment entry %q is not KEY=VALUE", ErrSpec, kv)
		}
	}
	if p.Cwd != "" && (!path.IsAbs(p.Cwd) || strings.ContainsRune(p.Cwd, 0)) {
		return fmt.Errorf("%w: working directory %q is not an absolute path", ErrSpec, p.Cwd)
	}
	return nil
}

// PrepareHostDir gives the host directory of a sandbox to the user its process runs as (the
// spec's process.user), so that the executor can bind its socket there: gVisor checks the
// host directory's owner and mode as they are, and a directory of root's with mode 0755 makes
// the bind fail with EACCES for any other user. A worker calls it on the directory it passes
// as RestoreOptions.HostDir, with the restore spec's user.
func PrepareHostDir(dir string, user specs.User) error {
	if user.UID == 0 && user.GID == 0 {
		return nil
	}
	if err := os.Chown(dir, int(user.UID), int(user.GID)); err != nil {
		return fmt.Errorf("give the sandbox directory to the image's user %d:%d: %w", user.UID, user.GID, err)
	}
	return nil
}
