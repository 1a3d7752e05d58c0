package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
)

// The registry host the deploy files name, which the podman test replaces with its own.
const deployRegistry = "registry.example.com"

// podmanRun is what one pod of a Job needs to be run by podman: its container, its volumes'
// host directories, its environment.
type podmanRun struct {
	name string
	args []string
	out  bytes.Buffer
}

// podmanArgs turns a pod's only container into `podman run` arguments as Kubernetes would run
// it: command as the entrypoint, args after the image, each $(VAR) expanded from the
// container's environment, privileged when the pod says so, each volume mounted where the pod
// mounts it. volumeDir gives a volume's host directory. Anything of the pod spec the test does
// not model fails it: the test must break when the YAML drifts from what it runs.
func podmanArgs(t *testing.T, file string, pod corev1.PodSpec, env map[string]string, image, registry string, volumeDir func(corev1.Volume) string) []string {
	t.Helper()
	if len(pod.Containers) != 1 || len(pod.InitContainers) > 0 {
		t.Fatalf("%s: %d containers and %d init containers; the test runs one container", file, len(pod.Containers), len(pod.InitContainers))
	}
	c := pod.Containers[0]
	if !strings.HasPrefix(c.Image, deployRegistry+"/readie/pipeline@sha256:") {
		t.Fatalf("%s: image %s, not %s/readie/pipeline@sha256:...", file, c.Image, deployRegistry)
	}
	args := []string{"--network", "host"} // for the loopback registry only: the pod's network is its own
	if sc := c.SecurityContext; sc != nil {
		if sc.Privileged != nil && *sc.Privileged {
			args = append(args, "--privileged")
		}
		if other := *sc; func() bool { other.Privileged = nil; return other != corev1.SecurityContext{} }() {
			t.Fatalf("%s: securityContext %+v holds more than privileged, which the test does not model", file, *sc)
		}
	}
	if c.WorkingDir != "" || len(c.EnvFrom) > 0 || len(c.Ports) > 0 || pod.HostNetwork || pod.HostPID {
		t.Fatalf("%s: the container's workingDir, envFrom, ports or the pod's host namespaces, which the test does not model", file)
	}
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
// the Jobs of deploy/kubernetes run it, their command, args, env, privileges and volumes read
// from the YAML: the image pulled by digest from a registry (with credentials, as the pods'
// secret holds them), the three capture pods at once, each with JOB_COMPLETION_INDEX, sharing
// the node's cache volume, each pushing its shard; then the merge pod pulling the shards and
// pushing the catalogue. The result is pulled here, verified, and one checkpoint restored and
// called through a worker's kit (examples/worker).
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

	// The volumes: the config map and the secret as files, the node's cache shared by the
	// capture pods, an empty directory per pod for each emptyDir.
	dir := testenv.WorkDir(t)
	configDir := filepath.Join(dir, "config")
	os.MkdirAll(configDir, 0o755)
	os.WriteFile(filepath.Join(configDir, "pipeline.yaml"), []byte(`restore_runs: 1
checkpoints:
  - {id: js, imports: [json]}
  - {id: mail, imports: [email.parser]}
  - {id: tables, imports: [csv]}
`), 0o644)
	node := filepath.Join(dir, "node")
	volumeDir := func(pod string) func(corev1.Volume) string {
		return func(v corev1.Volume) string {
			var d string
			switch {
			case v.ConfigMap != nil:
				return configDir
			case v.Secret != nil:
				d = filepath.Join(dir, "secret-"+v.Name)
				os.MkdirAll(d, 0o700)
				for _, item := range v.Secret.Items {
					if item.Key != corev1.DockerConfigJsonKey {
						t.Fatalf("secret %s: key %s, which the test does not model", v.Secret.SecretName, item.Key)
					}
					data, err := os.ReadFile(filepath.Join(dockerConfig, "config.json"))
					if err != nil {
						t.Fatal(err)
					}
					os.WriteFile(filepath.Join(d, item.Path), data, 0o600)
				}
			case v.HostPath != nil:
				d = filepath.Join(node, v.HostPath.Path)
			case v.EmptyDir != nil:
				d = filepath.Join(dir, pod, v.Name)
			default:
				t.Fatalf("volume %s: a kind the test does not model: %+v", v.Name, v.VolumeSource)
			}
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			return d
		}
	}
	limits := []string{"--ulimit", "nofile=" + hardLimit(t, unix.RLIMIT_NOFILE, 1<<16), "--ulimit", "nproc=" + hardLimit(t, unix.RLIMIT_NPROC, 1<<15)}
	suffix := make([]byte, 4)
	rand.Read(suffix)
	run := func(file, pod string, env map[string]string) *podmanRun {
		job := readJob(t, file)
		args := podmanArgs(t, file, job.Spec.Template.Spec, env, image, reg.Host, volumeDir(pod))
		r := &podmanRun{name: "readie-test-" + pod + "-" + hex.EncodeToString(suffix)}
		r.args = append(append([]string{"run", "--rm", "--name", r.name, "--pull", "never"}, limits...), args...)
		t.Cleanup(func() {
			rm, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out bytes.Buffer
			if err := podman(rm, &out, "rm", "--force", "--ignore", "--time", "0", r.name); err != nil {
				t.Errorf("podman rm %s: %v\n%s", r.name, err, &out)
			}
		})
		return r
	}

	capture := readJob(t, "../../deploy/kubernetes/capture-job.yaml")
	shards := int(*capture.Spec.Completions)
	runs := make([]*podmanRun, shards)
	errs := make([]error, shards)
	var wg sync.WaitGroup
	start = time.Now()
	for i := range shards {
		runs[i] = run("../../deploy/kubernetes/capture-job.yaml", fmt.Sprintf("capture-%d", i), map[string]string{"JOB_COMPLETION_INDEX": strconv.Itoa(i)})
		wg.Go(func() { errs[i] = podman(ctx, &runs[i].out, runs[i].args...) })
	}
	wg.Wait()
	for i, r := range runs {
		if errs[i] != nil {
			t.Fatalf("capture pod %d: podman %s: %v\n%s", i, strings.Join(r.args, " "), errs[i], &r.out)
		}
		if !strings.Contains(r.out.String(), reg.Host+"/readie/checkpoints@sha256:") {
			t.Errorf("capture pod %d pushed nothing:\n%s", i, &r.out)
		}
	}
	t.Logf("%d capture pods at once: %s", shards, time.Since(start).Round(time.Millisecond))
	// They shared the node's cache volume: its checkpoint store holds their checkpoints.
	for _, v := range capture.Spec.Template.Spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		if stored, err := os.ReadDir(filepath.Join(node, v.HostPath.Path, "checkpoints")); err != nil || len(stored) == 0 {
			t.Errorf("the node's cache volume %s holds no checkpoint store: %v %v", v.Name, stored, err)
		}
	}

	merge := run("../../deploy/kubernetes/merge-job.yaml", "merge", map[string]string{})
	if err := podman(ctx, &merge.out, merge.args...); err != nil {
		t.Fatalf("merge pod: podman %s: %v\n%s", strings.Join(merge.args, " "), err, &merge.out)
	}

	// Here, as a worker's host: pull the catalogue, verify it, restore one checkpoint of it
	// through the kit with this host's copy of the rootfs (the manifest names the image's path).
	pulled := filepath.Join(dir, "pulled")
	if code, _, stderr := runProcess(t, map[string]string{"DOCKER_CONFIG": dockerConfig}, 5*time.Minute, "pull", reg.Host+"/readie/checkpoints:latest", pulled); code != exitOK {
		t.Fatalf("pull of the merged catalogue: exit %d\n%s\nmerge pod:\n%s", code, stderr, &merge.out)
	}
	code, stdout, stderr := runCLI(t, "verify", pulled)
	if code != exitOK || !strings.Contains(stdout, "4 checkpoints verified") {
		t.Fatalf("verify of the merged catalogue: exit %d\n%s%s", code, stdout, stderr)
	}
	m := testenv.Manifest(t, pulled)
	if m.Rootfs.Path != "/usr/share/readie/rootfs" {
		t.Errorf("the manifest's rootfs %s: want the image's", m.Rootfs.Path)
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
