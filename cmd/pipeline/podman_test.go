package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"readie.dev/pipeline/internal/oci/ocitest"
	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/runsc"
)

// The registry host the deploy files name, which the podman test replaces with its own.
const deployRegistry = "registry.example.com"

// podmanRun is one container of a pod, as `podman run` arguments, and its output.
type podmanRun struct {
	name string
	args []string
	out  bytes.Buffer
}

// podmanPod is a pod as podman runs it: its init containers, then its container, one after
// another, each only once the one before succeeded, as the kubelet runs a pod whose
// restartPolicy is Never.
type podmanPod []*podmanRun

// run runs the pod's containers in order, bounded by ctx; it stops at the first that fails
// (output says what they wrote).
func (p podmanPod) run(ctx context.Context) error {
	for _, c := range p {
		if err := podman(ctx, &c.out, c.args...); err != nil {
			return fmt.Errorf("container %s: podman %s: %w", c.name, strings.Join(c.args, " "), err)
		}
	}
	return nil
}

// output is what every container of the pod wrote.
func (p podmanPod) output() string {
	var b strings.Builder
	for _, c := range p {
		fmt.Fprintf(&b, "--- %s\n%s", c.name, &c.out)
	}
	return b.String()
}

// podContainersForPodman returns the containers of pod in the order the kubelet runs them, or
// fails the test on anything of the pod spec it does not model: the test must break when the
// YAML drifts from what it runs.
func podContainersForPodman(t *testing.T, file string, pod corev1.PodSpec) []corev1.Container {
	t.Helper()
	if len(pod.Containers) != 1 {
		t.Fatalf("%s: %d containers; the test runs one after the init containers", file, len(pod.Containers))
	}
	for _, c := range pod.InitContainers {
		if c.RestartPolicy != nil {
			t.Fatalf("%s: init container %s is a sidecar (restartPolicy), which the test does not model", file, c.Name)
		}
	}
	// podman mounts no service-account token: the pod must ask for none.
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Fatalf("%s: the pod gets a service-account token, which the test does not model", file)
	}
	if pod.SecurityContext != nil || pod.HostNetwork || pod.HostPID || pod.HostIPC || pod.ShareProcessNamespace != nil {
		t.Fatalf("%s: the pod's securityContext or host namespaces, which the test does not model", file)
	}
	return podContainers(pod)
}

// securityArgs turns a container's securityContext into podman's flags, failing on what the
// test does not model. RuntimeDefault seccomp is podman's default, which --privileged turns
// off, as Kubernetes does for a privileged container.
func securityArgs(t *testing.T, file string, c corev1.Container) []string {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		return nil
	}
	var args []string
	rest := *sc
	if sc.Privileged != nil && *sc.Privileged {
		args = append(args, "--privileged")
	}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		// Nothing writable beyond the volumes: podman would add tmpfs at /tmp, /run, /var/tmp.
		args = append(args, "--read-only", "--read-only-tmpfs=false")
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		args = append(args, "--security-opt", "no-new-privileges")
	}
	if caps := sc.Capabilities; caps != nil {
		if len(caps.Add) > 0 {
			t.Fatalf("%s: container %s adds capabilities, which the test does not model", file, c.Name)
		}
		for _, d := range caps.Drop {
			args = append(args, "--cap-drop", strings.ToLower(string(d)))
		}
	}
	if p := sc.SeccompProfile; p != nil && p.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Fatalf("%s: container %s: seccomp profile %s, which the test does not model", file, c.Name, p.Type)
	}
	if sc.RunAsUser != nil {
		user := strconv.FormatInt(*sc.RunAsUser, 10)
		if sc.RunAsGroup != nil {
			user += ":" + strconv.FormatInt(*sc.RunAsGroup, 10)
		}
		args = append(args, "--user", user)
	} else if sc.RunAsGroup != nil {
		t.Fatalf("%s: container %s: runAsGroup without runAsUser, which the test does not model", file, c.Name)
	}
	// The kubelet refuses to start a container that would run as root (the image's user).
	if sc.RunAsNonRoot != nil && *sc.RunAsNonRoot && (sc.RunAsUser == nil || *sc.RunAsUser == 0) {
		t.Fatalf("%s: container %s: runAsNonRoot, but it runs as root: the kubelet would not start it", file, c.Name)
	}
	rest.Privileged, rest.ReadOnlyRootFilesystem, rest.AllowPrivilegeEscalation, rest.Capabilities = nil, nil, nil, nil
	rest.SeccompProfile, rest.RunAsUser, rest.RunAsGroup, rest.RunAsNonRoot = nil, nil, nil, nil
	if rest != (corev1.SecurityContext{}) {
		t.Fatalf("%s: container %s: securityContext %+v holds more than the test models", file, c.Name, *sc)
	}
	return args
}

// podmanArgs turns one container of a pod into `podman run` arguments as Kubernetes would run
// it: command as the entrypoint, args after the image, each $(VAR) expanded from the
// container's environment (the pod's, env, is left as it is), its securityContext, its memory
// limit (requests only place the pod), each volume mounted where the container mounts it.
// volumeDir gives a volume's host directory. Anything of the container the test does not model
// fails it.
func podmanArgs(t *testing.T, file string, pod corev1.PodSpec, c corev1.Container, env map[string]string, image, registry string, volumeDir func(corev1.Volume) string) []string {
	t.Helper()
	if !strings.HasPrefix(c.Image, deployRegistry+"/readie/pipeline@sha256:") {
		t.Fatalf("%s: image %s, not %s/readie/pipeline@sha256:...", file, c.Image, deployRegistry)
	}
	args := []string{"--network", "host"} // for the loopback registry only: the pod's network is its own
	args = append(args, securityArgs(t, file, c)...)
	for name, q := range c.Resources.Limits {
		if name != corev1.ResourceMemory {
			t.Fatalf("%s: container %s: a limit of %s, which the test does not model", file, c.Name, name)
		}
		args = append(args, "--memory", strconv.FormatInt(q.Value(), 10))
	}
	if c.WorkingDir != "" || len(c.EnvFrom) > 0 || len(c.Ports) > 0 {
		t.Fatalf("%s: container %s: workingDir, envFrom or ports, which the test does not model", file, c.Name)
	}
	env = maps.Clone(env)
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Fatalf("%s: env %s has valueFrom, which the test does not model", file, e.Name)
		}
		env[e.Name] = expandKubernetes(e.Value, env)
	}
	for k, v := range env {
		args = append(args, "--env", k+"="+v)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok || m.SubPath != "" || m.SubPathExpr != "" || m.MountPropagation != nil {
			t.Fatalf("%s: volume mount %+v: no such volume, or a sub-path or propagation the test does not model", file, m)
		}
		mount := volumeDir(v) + ":" + m.MountPath
		if m.ReadOnly {
			mount += ":ro"
		}
		args = append(args, "--volume", mount)
	}
	entrypoint, err := json.Marshal(c.Command)
	if err != nil || len(c.Command) == 0 {
		t.Fatalf("%s: command %v", file, c.Command)
	}
	args = append(args, "--entrypoint", string(entrypoint), image)
	for _, a := range c.Args {
		args = append(args, strings.ReplaceAll(expandKubernetes(a, env), deployRegistry, registry))
	}
	return args
}

// hardLimit is the hard limit of resource r, at most max: podman's rootful defaults are above
// this host's, and root here may not raise them (no CAP_SYS_RESOURCE).
func hardLimit(t *testing.T, r int, max uint64) string {
	var l unix.Rlimit
	if err := unix.Getrlimit(r, &l); err != nil {
		t.Fatal(err)
	}
	n := strconv.FormatUint(min(l.Max, max), 10)
	return n + ":" + n
}

// podman runs `podman --runtime runc ARGS`, bounded by ctx, its output into out.
func podman(ctx context.Context, out *bytes.Buffer, args ...string) error {
	// crun refuses this host's hybrid cgroup layout; runc runs.
	cmd := exec.CommandContext(ctx, "podman", append([]string{"--runtime", "runc"}, args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 30 * time.Second
	return cmd.Run()
}

// TestPipelineImageInPodman runs the pipeline's image (`make pipeline-image`) with podman as
// the Jobs of deploy/kubernetes run it, their containers in order with their command, args,
// env, securityContext, memory limits and volumes read from the YAML: the image pulled by
// digest from a registry (with credentials, as the pods' secret holds them), the three capture
// pods at once, each with JOB_COMPLETION_INDEX, each pulling its shard's previous output (none
// yet), capturing and pushing its shard; then the merge pod pulling the shards and pushing the
// catalogue; then a capture pod again, which reuses its previous output's sets. The result is
// pulled here, verified, and one checkpoint restored and called through a worker's kit
// (examples/worker).
func TestPipelineImageInPodman(t *testing.T) {
	t.Parallel()
	layoutDir, runscPath, rootfs := testenv.PipelineImage(t), testenv.RunscPath(t), testenv.Rootfs(t)
	for _, bin := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is not installed: run the tests with `make test` (its deps install Debian's podman and runc): %v", bin, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	reg := testenv.StartRegistry(t, true)
	dockerConfig := reg.DockerConfig(t) // for the pods' secret and this test's pull

	// The image, pushed to the registry and pulled by podman by digest, as a node does.
	img, _ := ocitest.FirstImage(t, layoutDir)
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	tagged, err := name.ParseReference(reg.Host+"/readie/pipeline:test", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tagged, img, remote.WithContext(ctx), remote.WithAuth(&authn.Basic{Username: reg.User, Password: reg.Password})); err != nil {
		t.Fatal(err)
	}
	image := reg.Host + "/readie/pipeline@" + digest.String()
	var pullLog bytes.Buffer
	start := time.Now()
	if err := podman(ctx, &pullLog, "pull", "--tls-verify=false", "--creds", reg.User+":"+reg.Password, image); err != nil {
		t.Fatalf("podman pull %s: %v\n%s", image, err, &pullLog)
	}
	t.Logf("podman pull %s: %s (layers it already had are skipped)", image, time.Since(start).Round(time.Millisecond))

	// The volumes: the config map and the secret as files, an empty directory per pod for each
	// emptyDir.
	dir := testenv.WorkDir(t)
	configDir := filepath.Join(dir, "config")
	os.MkdirAll(configDir, 0o755)
	os.WriteFile(filepath.Join(configDir, "pipeline.yaml"), []byte(`restore_runs: 1
checkpoints:
  - {id: js, imports: [json]}
  - {id: mail, imports: [email.parser]}
  - {id: tables, imports: [csv]}
`), 0o644)
	volumeDir := func(pod string) func(corev1.Volume) string {
		return func(v corev1.Volume) string {
			var d string
			switch {
			case v.ConfigMap != nil:
				return configDir
			case v.Secret != nil:
				d = filepath.Join(dir, pod, "secret-"+v.Name)
				os.MkdirAll(d, 0o755)
				mode := os.FileMode(corev1.SecretVolumeSourceDefaultMode)
				if v.Secret.DefaultMode != nil {
					mode = os.FileMode(*v.Secret.DefaultMode)
				}
				for _, item := range v.Secret.Items {
					if item.Key != corev1.DockerConfigJsonKey || item.Mode != nil {
						t.Fatalf("secret %s: key %s or a mode of its own, which the test does not model", v.Secret.SecretName, item.Key)
					}
					data, err := os.ReadFile(filepath.Join(dockerConfig, "config.json"))
					if err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(d, item.Path), data, mode); err != nil {
						t.Fatal(err)
					}
				}
			case v.EmptyDir != nil && *v.EmptyDir == (corev1.EmptyDirVolumeSource{}):
				d = filepath.Join(dir, pod, v.Name)
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
				// The kubelet makes an emptyDir open to every user: a container that runs as a
				// user of its own writes there.
				if err := os.Chmod(d, 0o777); err != nil {
					t.Fatal(err)
				}
			default:
				t.Fatalf("volume %s: a kind the test does not model: %+v", v.Name, v.VolumeSource)
			}
			return d
		}
	}
	limits := []string{"--ulimit", "nofile=" + hardLimit(t, unix.RLIMIT_NOFILE, 1<<16), "--ulimit", "nproc=" + hardLimit(t, unix.RLIMIT_NPROC, 1<<15)}
	suffix := make([]byte, 4)
	rand.Read(suffix)
	pod := func(file, name string, env map[string]string) podmanPod {
		spec := readJob(t, file).Spec.Template.Spec
		var p podmanPod
		for _, c := range podContainersForPodman(t, file, spec) {
			args := podmanArgs(t, file, spec, c, env, image, reg.Host, volumeDir(name))
			r := &podmanRun{name: "readie-test-" + name + "-" + c.Name + "-" + hex.EncodeToString(suffix)}
			r.args = append(append([]string{"run", "--rm", "--name", r.name, "--pull", "never"}, limits...), args...)
			t.Cleanup(func() {
				rm, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				var out bytes.Buffer
				if err := podman(rm, &out, "rm", "--force", "--ignore", "--time", "0", r.name); err != nil {
					t.Errorf("podman rm %s: %v\n%s", r.name, err, &out)
				}
			})
			p = append(p, r)
		}
		return p
	}
	captureFile := "../../deploy/kubernetes/capture-job.yaml"
	shardEnv := func(i int) map[string]string { return map[string]string{"JOB_COMPLETION_INDEX": strconv.Itoa(i)} }

	shards := int(*readJob(t, captureFile).Spec.Completions)
	pods := make([]podmanPod, shards)
	errs := make([]error, shards)
	var wg sync.WaitGroup
	start = time.Now()
	for i := range shards {
		pods[i] = pod(captureFile, fmt.Sprintf("capture-%d", i), shardEnv(i))
		wg.Go(func() { errs[i] = pods[i].run(ctx) })
	}
	wg.Wait()
	for i, p := range pods {
		if errs[i] != nil {
			t.Fatalf("capture pod %d: %v\n%s", i, errs[i], p.output())
		}
		// The registry holds no shard yet: the pull finds none, and the pod captures them all.
		if out := p.output(); !strings.Contains(out, reg.Host+"/readie/checkpoints@sha256:") || !strings.Contains(out, "no previous shard-") {
			t.Errorf("capture pod %d pushed nothing, or pulled a previous shard that no pod pushed:\n%s", i, out)
		}
	}
	t.Logf("%d capture pods at once: %s", shards, time.Since(start).Round(time.Millisecond))

	merge := pod("../../deploy/kubernetes/merge-job.yaml", "merge", map[string]string{})
	if err := merge.run(ctx); err != nil {
		t.Fatalf("merge pod: %v\n%s", err, merge.output())
	}

	// A capture pod again, on fresh volumes (its store empty, as the pod's own): its pull
	// brings the shard's previous output, and the capture reuses every set of it.
	again := pod(captureFile, "capture-0-again", shardEnv(0))
	if err := again.run(ctx); err != nil {
		t.Fatalf("capture pod 0 again: %v\n%s", err, again.output())
	}
	if out := again.output(); !strings.Contains(out, `"status": "reused"`) || strings.Contains(out, `"status": "captured"`) {
		t.Errorf("capture pod 0 again did not reuse its previous output's sets:\n%s", out)
	}

	// Here, as a worker's host: pull the catalogue, verify it, restore one checkpoint of it
	// through the kit with this host's copy of the rootfs (the manifest names the image's path).
	pulled := filepath.Join(dir, "pulled")
	if code, _, stderr := runProcess(t, map[string]string{"DOCKER_CONFIG": dockerConfig}, 5*time.Minute, "pull", reg.Host+"/readie/checkpoints:latest", pulled); code != exitOK {
		t.Fatalf("pull of the merged catalogue: exit %d\n%s\nmerge pod:\n%s", code, stderr, merge.output())
	}
	code, stdout, stderr := runCLI(t, "verify", pulled)
	if code != exitOK || !strings.Contains(stdout, "4 checkpoints verified") {
		t.Fatalf("verify of the merged catalogue: exit %d\n%s%s", code, stdout, stderr)
	}
	m := testenv.Manifest(t, pulled)
	if m.Rootfs.Path != "/usr/share/readie/rootfs" {
		t.Errorf("the manifest's rootfs %s: want the image's", m.Rootfs.Path)
	}
	// The image's runsc booted its sandboxes with the helpers it carries, the same bytes as
	// this host's: the worker below checks them (manifest.CheckHost) before it restores.
	if helpers, err := (&runsc.Runsc{Path: runscPath}).Helpers(); err != nil || len(m.Runsc.Helpers) != len(runsc.HelperNames()) || !maps.Equal(m.Runsc.Helpers, helpers) {
		t.Errorf("the manifest records the helpers %v; beside this host's runsc: %v, %v", m.Runsc.Helpers, helpers, err)
	}
	worker := filepath.Join(dir, "worker")
	build := exec.CommandContext(ctx, "go", "build", "-o", worker, "./examples/worker")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/worker: %v\n%s", err, out)
	}
	root := runscRoot(t, filepath.Join(dir, "worker-runsc"))
	cmd := exec.CommandContext(ctx, worker, "-out", pulled, "-runsc", runscPath, "-rootfs", rootfs, "-root", root, "-set", "mail", "-eval", "sum(range(10))")
	cmd.WaitDelay = 30 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "worker: = 45") {
		t.Fatalf("the worker's restore of mail: %v\n%s", err, out)
	}
}
