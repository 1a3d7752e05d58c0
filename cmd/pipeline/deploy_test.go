package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	k8syaml "sigs.k8s.io/yaml"
)

// pipelineCommands finds every `pipeline` command line in a shell script: a command whose
// program is named pipeline (bin/pipeline, /usr/local/bin/pipeline), split on && ; | and lines.
func pipelineCommands(script string) [][]string {
	var found [][]string
	for _, part := range regexp.MustCompile(`&&|;|\|\||\n`).Split(strings.ReplaceAll(script, "\\\n", " "), -1) {
		fields := strings.Fields(part)
		for i, f := range fields {
			if filepath.Base(f) == "pipeline" {
				found = append(found, fields[i+1:])
				break
			}
		}
	}
	return found
}

// checkCommandLine parses one command line with the pipeline's own parsing (nothing runs).
func checkCommandLine(t *testing.T, where string, args []string) {
	t.Helper()
	var stderr bytes.Buffer
	if len(args) == 0 {
		t.Errorf("%s: `pipeline` without a command", where)
		return
	}
	if _, err := commands().parse(args, io.Discard, &stderr); err != nil {
		t.Errorf("%s: pipeline %s: %v\n%s", where, strings.Join(args, " "), err, stderr.String())
	}
}

// shardCounts returns N of every --shard I/N in the command lines.
func shardCounts(lines [][]string) []string {
	var counts []string
	for _, args := range lines {
		for i, a := range args {
			if a == "--shard" && i+1 < len(args) {
				_, n, _ := strings.Cut(args[i+1], "/")
				counts = append(counts, n)
			}
		}
	}
	return counts
}

// readJob decodes a file of deploy/kubernetes strictly (an unknown field fails) into the
// Kubernetes API's own Job type.
func readJob(t *testing.T, file string) batchv1.Job {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	js, err := k8syaml.YAMLToJSON(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var job batchv1.Job
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&job); err != nil {
		t.Fatalf("%s: not a Job of the Kubernetes API: %v", file, err)
	}
	return job
}

// pinnedImage is an image named by its digest: the deploy files run the pipeline's image so,
// never by a tag that can move.
var pinnedImage = regexp.MustCompile(`^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+@sha256:[0-9a-f]{64}$`)

// expandKubernetes expands $(VAR) in a container's command or args as Kubernetes does: a
// variable of env is replaced by its value, $$ is a literal $, and a reference to a variable
// env does not hold is left as it is.
func expandKubernetes(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
			continue
		case '(':
			if end := strings.IndexByte(s[i+2:], ')'); end >= 0 {
				if v, ok := env[s[i+2:i+2+end]]; ok {
					b.WriteString(v)
					i += 2 + end
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// TestExpandKubernetes: $(VAR) as Kubernetes expands it in command and args.
func TestExpandKubernetes(t *testing.T) {
	env := map[string]string{"JOB_COMPLETION_INDEX": "2", "A": "x"}
	for in, want := range map[string]string{
		"--shard $(JOB_COMPLETION_INDEX)/3": "--shard 2/3",
		"$(A)$(A) $$(A) $(B) $ $":           "xx $(A) $(B) $ $",
		"$(A":                               "$(A",
		"shard-$(JOB_COMPLETION_INDEX)":     "shard-2",
	} {
		if got := expandKubernetes(in, env); got != want {
			t.Errorf("expand %q = %q, want %q", in, got, want)
		}
	}
}

// podContainers returns every container a pod runs: its init containers in order, then its
// containers.
func podContainers(pod corev1.PodSpec) []corev1.Container {
	return append(slices.Clone(pod.InitContainers), pod.Containers...)
}

// containerCommands returns the pipeline command lines a container runs, with $(VAR) expanded
// as Kubernetes expands it before the shell sees it (JOB_COMPLETION_INDEX 0).
func containerCommands(c corev1.Container) [][]string {
	env := map[string]string{"JOB_COMPLETION_INDEX": "0"}
	var expanded []string
	for _, s := range append(slices.Clone(c.Command), c.Args...) {
		expanded = append(expanded, expandKubernetes(s, env))
	}
	return pipelineCommands(strings.Join(expanded, "\n"))
}

// runsCommand reports whether one of lines is the pipeline command path ("pipeline capture").
func runsCommand(lines [][]string, path string) bool {
	for _, args := range lines {
		if p, err := commands().parse(args, io.Discard, io.Discard); err == nil && p.path == path {
			return true
		}
	}
	return false
}

// TestKubernetesManifests: the files under deploy/kubernetes decode strictly (an unknown
// field fails) into the Kubernetes API's own Job type; the capture job is an Indexed Job
// whose shard count equals its completions and whose pods are pinned to a machine family;
// every pipeline command line parses; every container runs the pipeline's image by digest.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if len(files) < 2 {
		t.Fatalf("deploy/kubernetes holds %v", files)
	}
	var indexed int
	for _, file := range files {
		job := readJob(t, file)
		if job.Kind != "Job" || job.APIVersion != "batch/v1" || job.Spec.Template.Spec.RestartPolicy == "" {
			t.Errorf("%s: %s %s, restartPolicy %q", file, job.APIVersion, job.Kind, job.Spec.Template.Spec.RestartPolicy)
		}
		var lines [][]string
		for _, c := range podContainers(job.Spec.Template.Spec) {
			if !pinnedImage.MatchString(c.Image) {
				t.Errorf("%s: container %s runs %s, not the pipeline's image by digest (HOST/REPO@sha256:...)", file, c.Name, c.Image)
			}
			own := containerCommands(c)
			// runsc makes namespaces, mounts and a seccomp sandbox of its own.
			if sc := c.SecurityContext; runsCommand(own, "pipeline capture") && (sc == nil || sc.Privileged == nil || !*sc.Privileged) {
				t.Errorf("%s: container %s captures but is not privileged: runsc cannot start", file, c.Name)
			}
			lines = append(lines, own...)
		}
		if len(lines) == 0 {
			t.Errorf("%s runs no pipeline command", file)
		}
		for _, args := range lines {
			checkCommandLine(t, file, args)
		}
		if counts := shardCounts(lines); len(counts) > 0 {
			indexed++
			if job.Spec.CompletionMode == nil || *job.Spec.CompletionMode != batchv1.IndexedCompletion || job.Spec.Completions == nil {
				t.Errorf("%s shards but is not an Indexed Job with completions", file)
				continue
			}
			for _, n := range counts {
				if n != strconv.Itoa(int(*job.Spec.Completions)) {
					t.Errorf("%s: --shard .../%s but completions %d", file, n, *job.Spec.Completions)
				}
			}
			// A checkpoint needs its capture host's CPU features: the capture pods are pinned.
			if spec := job.Spec.Template.Spec; len(spec.NodeSelector) == 0 && (spec.Affinity == nil || spec.Affinity.NodeAffinity == nil ||
				spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil) {
				t.Errorf("%s: the capture pods are not pinned to a machine family (node selector or required node affinity)", file)
			}
		}
	}
	if indexed != 1 {
		t.Errorf("%d capture jobs with --shard, want 1", indexed)
	}
}

// sandboxFree are the commands that start no sandbox: the only ones a container holding
// registry credentials may run, so that no stranger's image runs where they are.
var sandboxFree = map[string]bool{"pipeline pull": true, "pipeline push": true, "pipeline merge": true, "pipeline verify": true}

// sandboxCommands returns the command lines of lines that may start a sandbox (capture, bench,
// analyze, measure, smoke, rootfs...): every command but the sandboxFree ones, and a line that
// does not parse, since what it runs is unknown.
func sandboxCommands(lines [][]string) []string {
	var found []string
	for _, args := range lines {
		p, err := commands().parse(args, io.Discard, io.Discard)
		switch {
		case err != nil:
			found = append(found, "pipeline "+strings.Join(args, " ")+" (does not parse)")
		case !sandboxFree[p.path]:
			found = append(found, p.path)
		}
	}
	return found
}

// volumeKind names the kind of v ("hostPath", "csi", "secret"), or "missing" when the pod
// defines no such volume.
func volumeKind(v corev1.Volume, defined bool) string {
	if !defined {
		return "missing"
	}
	data, _ := json.Marshal(v.VolumeSource)
	var kinds map[string]json.RawMessage
	_ = json.Unmarshal(data, &kinds)
	if len(kinds) == 0 {
		return "unknown"
	}
	return strings.Join(slices.Sorted(maps.Keys(kinds)), ", ")
}

// podProblems says what of pod a security reviewer would refuse. A capture runs a stranger's
// image (in gVisor) in a privileged container, root on the node but for gVisor: that container
// holds nothing that may be a credential, and those that do start no sandbox. What may hold one
// is every volume but the pod's own scratch (emptyDir) and its config (configMap, read-only by
// the rule below): a secret, a projected volume, a hostPath even read-only (/var/lib/kubelet
// holds every pod's secrets), a csi volume (a secrets store), a claim; a raw device; and env
// from a secret or a config map, or DOCKER_CONFIG. The pod gets no service-account token.
// Every container has a memory limit, a read-only root and, unless privileged, no way
// to gain privileges; and every volume a container may write is the pod's own (an emptyDir),
// never one other pods can mount and write (a hostPath), since the store a capture reuses is
// trusted by whoever reuses it.
func podProblems(pod corev1.PodSpec) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		add("the pod gets a service-account token: set automountServiceAccountToken: false (the pipeline never calls the Kubernetes API)")
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.ServiceAccountToken != nil {
					add("volume %s projects a service-account token", v.Name)
				}
			}
		}
	}
	for _, c := range podContainers(pod) {
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		privileged := sc.Privileged != nil && *sc.Privileged
		var holds []string // what of c may hold a credential
		for _, m := range c.VolumeMounts {
			v, defined := volumes[m.Name]
			if !defined || (v.EmptyDir == nil && v.ConfigMap == nil) {
				holds = append(holds, fmt.Sprintf("volume %s (%s)", m.Name, volumeKind(v, defined)))
			}
			if !m.ReadOnly && v.EmptyDir == nil {
				add("container %s mounts volume %s writable and it is not the pod's own (an emptyDir): other pods can write what it reuses", c.Name, m.Name)
			}
		}
		for _, d := range c.VolumeDevices {
			holds = append(holds, "device "+d.Name)
		}
		for _, e := range c.Env {
			switch {
			case e.Name == "DOCKER_CONFIG":
				holds = append(holds, "env "+e.Name)
			case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
				holds = append(holds, "env "+e.Name+" (secretKeyRef)")
			case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
				holds = append(holds, "env "+e.Name+" (configMapKeyRef)")
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil {
				holds = append(holds, "env from secret "+e.SecretRef.Name)
			}
			if e.ConfigMapRef != nil {
				holds = append(holds, "env from config map "+e.ConfigMapRef.Name)
			}
		}
		if privileged && len(holds) > 0 {
			add("container %s is privileged (it runs sandboxes of a stranger's image) and holds what may be a credential: %s (it may mount only emptyDir and read-only configMap volumes)", c.Name, strings.Join(holds, ", "))
		}
		if len(holds) > 0 && !privileged {
			for _, cmd := range sandboxCommands(containerCommands(c)) {
				add("container %s holds what may be a credential (%s) and runs %s, which starts sandboxes", c.Name, strings.Join(holds, ", "), cmd)
			}
		}
		if c.Resources.Limits.Memory().IsZero() {
			add("container %s has no memory limit", c.Name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			add("container %s: its root file system is writable (readOnlyRootFilesystem)", c.Name)
		}
		if privileged {
			continue
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			add("container %s may gain privileges (allowPrivilegeEscalation)", c.Name)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			add("container %s keeps capabilities (capabilities: drop [ALL], add none)", c.Name)
		}
	}
	return problems
}

// TestKubernetesSecurity: the Jobs' pods pass podProblems.
func TestKubernetesSecurity(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if len(files) < 2 {
		t.Fatalf("deploy/kubernetes holds %v", files)
	}
	for _, file := range files {
		for _, p := range podProblems(readJob(t, file).Spec.Template.Spec) {
			t.Errorf("%s: %s", file, p)
		}
	}
}

// TestKubernetesSecurityCatchesProblems: each rule of podProblems fails the capture pod when
// the pod breaks it.
func TestKubernetesSecurityCatchesProblems(t *testing.T) {
	t.Parallel()
	job := readJob(t, "../../deploy/kubernetes/capture-job.yaml")
	container := func(pod *corev1.PodSpec, name string) *corev1.Container {
		for i := range pod.InitContainers {
			if pod.InitContainers[i].Name == name {
				return &pod.InitContainers[i]
			}
		}
		for i := range pod.Containers {
			if pod.Containers[i].Name == name {
				return &pod.Containers[i]
			}
		}
		t.Fatalf("the capture pod has no container %s", name)
		return nil
	}
	volume := func(pod *corev1.PodSpec, name string) *corev1.Volume {
		for i := range pod.Volumes {
			if pod.Volumes[i].Name == name {
				return &pod.Volumes[i]
			}
		}
		t.Fatalf("the capture pod has no volume %s", name)
		return nil
	}
	for _, tc := range []struct {
		name, want string
		change     func(*corev1.PodSpec)
	}{
		{"token", "service-account token", func(p *corev1.PodSpec) { p.AutomountServiceAccountToken = nil }},
		{"projected token", "projects a service-account token", func(p *corev1.PodSpec) {
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}})
		}},
		{"DOCKER_CONFIG in capture", "capture is privileged", func(p *corev1.PodSpec) {
			c := container(p, "capture")
			c.Env = append(c.Env, corev1.EnvVar{Name: "DOCKER_CONFIG", Value: "/etc/readie-registry"})
		}},
		{"secret in capture", "capture is privileged", func(p *corev1.PodSpec) {
			c := container(p, "capture")
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "docker-config", MountPath: "/etc/readie-registry", ReadOnly: true})
		}},
		{"kubelet's files in capture", "holds what may be a credential: volume kubelet (hostPath)", func(p *corev1.PodSpec) {
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "kubelet", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet"}}})
			c := container(p, "capture")
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "kubelet", MountPath: "/var/lib/kubelet", ReadOnly: true})
		}},
		{"secrets store in capture", "holds what may be a credential: volume secrets-store (csi)", func(p *corev1.PodSpec) {
			readOnly := true
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "secrets-store", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: "secrets-store.csi.k8s.io", ReadOnly: &readOnly, VolumeAttributes: map[string]string{"secretProviderClass": "registry"}}}})
			c := container(p, "capture")
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "secrets-store", MountPath: "/mnt/secrets", ReadOnly: true})
		}},
		{"config map env in capture", "holds what may be a credential: env REGISTRY_PASSWORD (configMapKeyRef)", func(p *corev1.PodSpec) {
			c := container(p, "capture")
			c.Env = append(c.Env, corev1.EnvVar{Name: "REGISTRY_PASSWORD", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "registry"}, Key: "password"}}})
		}},
		{"secret env from in capture", "holds what may be a credential: env from secret registry", func(p *corev1.PodSpec) {
			c := container(p, "capture")
			c.EnvFrom = append(c.EnvFrom, corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "registry"}}})
		}},
		{"capture beside the credentials", "which starts sandboxes", func(p *corev1.PodSpec) {
			c := container(p, "push")
			c.Args = []string{"pipeline capture --out /work/out && " + c.Args[0]}
		}},
		{"no memory limit", "push has no memory limit", func(p *corev1.PodSpec) { container(p, "push").Resources.Limits = nil }},
		{"node-wide store", "volume cache writable", func(p *corev1.PodSpec) {
			volume(p, "cache").VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/cache/readie"}}
		}},
		{"writable root", "capture: its root file system is writable", func(p *corev1.PodSpec) {
			container(p, "capture").SecurityContext.ReadOnlyRootFilesystem = nil
		}},
		{"privilege escalation", "push may gain privileges", func(p *corev1.PodSpec) {
			container(p, "push").SecurityContext.AllowPrivilegeEscalation = nil
		}},
		{"capabilities", "push keeps capabilities", func(p *corev1.PodSpec) {
			container(p, "push").SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		}},
	} {
		pod := job.Spec.Template.Spec.DeepCopy()
		tc.change(pod)
		problems := podProblems(*pod)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%s: podProblems = %q, want one saying %q", tc.name, problems, tc.want)
		}
	}
}

// workflowPermissions are a workflow's or a job's permissions: "read-all", "write-all", or
// scopes ("contents: read"); unset, the token gets the repository's default, which may be
// write-all.
type workflowPermissions struct {
	set    bool
	all    string
	scopes map[string]string
}

func (p *workflowPermissions) UnmarshalYAML(n *yaml.Node) error {
	p.set = true
	if n.Kind == yaml.ScalarNode {
		p.all = n.Value
		return nil
	}
	return n.Decode(&p.scopes)
}

// writes lists the scopes the permissions let the token write ("everything" when they grant
// all or are unset).
func (p workflowPermissions) writes() []string {
	if !p.set || p.all == "write-all" {
		return []string{"everything"}
	}
	var w []string
	for scope, level := range p.scopes {
		if level == "write" {
			w = append(w, scope)
		}
	}
	slices.Sort(w)
	return w
}

type workflowStep struct {
	Name string            `yaml:"name"`
	ID   string            `yaml:"id"`
	If   string            `yaml:"if"`
	Uses string            `yaml:"uses"`
	With map[string]string `yaml:"with"`
	Env  map[string]string `yaml:"env"`
	Run  string            `yaml:"run"`
}

type workflowJob struct {
	Needs       string              `yaml:"needs"`
	RunsOn      string              `yaml:"runs-on"`
	Permissions workflowPermissions `yaml:"permissions"`
	Env         map[string]string   `yaml:"env"`
	Strategy    struct {
		FailFast bool `yaml:"fail-fast"`
		Matrix   struct {
			Shard []int `yaml:"shard"`
		} `yaml:"matrix"`
	} `yaml:"strategy"`
	Steps []workflowStep `yaml:"steps"`
}

type workflow struct {
	Name        string                 `yaml:"name"`
	On          yaml.Node              `yaml:"on"`
	Permissions workflowPermissions    `yaml:"permissions"`
	Env         map[string]string      `yaml:"env"`
	Jobs        map[string]workflowJob `yaml:"jobs"`
}

// readWorkflow decodes the workflow strictly: a field this file's types do not know (a job's
// container or services, say, which could hold credentials) fails, so the checks below see all.
func readWorkflow(t *testing.T) workflow {
	t.Helper()
	data, err := os.ReadFile("../../deploy/github-actions/checkpoints.yml")
	if err != nil {
		t.Fatal(err)
	}
	var wf workflow
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&wf); err != nil {
		t.Fatalf("deploy/github-actions/checkpoints.yml: %v", err)
	}
	return wf
}

// workflowExpand stands in for the expressions and variables of the workflow's command lines.
var workflowExpand = strings.NewReplacer("${{ matrix.shard }}", "0", "${{ env.IMAGE }}", "ghcr.io/owner/repo/checkpoints")

// TestGitHubActionsWorkflow: every pipeline command line of the workflow parses, the capture
// job's matrix has as many shards as --shard says, and the pipeline's image is named by digest.
func TestGitHubActionsWorkflow(t *testing.T) {
	t.Parallel()
	wf := readWorkflow(t)
	if !pinnedImage.MatchString(wf.Env["PIPELINE_IMAGE"]) {
		t.Errorf("the workflow runs the pipeline's image %q, not by digest (HOST/REPO@sha256:...)", wf.Env["PIPELINE_IMAGE"])
	}
	var total int
	for name, job := range wf.Jobs {
		var lines [][]string
		for _, step := range job.Steps {
			lines = append(lines, pipelineCommands(workflowExpand.Replace(step.Run))...)
		}
		for _, args := range lines {
			checkCommandLine(t, "job "+name, args)
		}
		total += len(lines)
		for _, n := range shardCounts(lines) {
			if n != strconv.Itoa(len(job.Strategy.Matrix.Shard)) {
				t.Errorf("job %s: --shard .../%s but a matrix of %d shards", name, n, len(job.Strategy.Matrix.Shard))
			}
		}
	}
	if total < 4 {
		t.Errorf("the workflow runs %d pipeline commands", total)
	}
}

// storeKeyParts are what the checkpoint store a capture job caches depends on, as its cache
// key must name them: a key that stays when one of them changes restores the old store and,
// being an exact hit, never saves the new one. Only the config's hash may be left out of a
// restore key: the store of the same image, shard and CPU under another config holds entries
// by their own keys (docs/store.md), so a set whose inputs did not change is reused and no
// other one is.
var storeKeyParts = []struct{ part, what string }{
	{"hashFiles('deploy/pipeline.yaml')", "the config (the sets, the flags)"},
	{"env.PIPELINE_IMAGE", "the pipeline's image by digest (runsc, the rootfs, the pipeline)"},
	{"matrix.shard", "the shard (its sets)"},
	{"steps.cpu.outputs.features", "the runner's CPU (in every key)"},
}

// memoryFlag is docker run's memory limit.
var memoryFlag = regexp.MustCompile(`--memory[ =][0-9]+[bkmg]? `)

// sandboxFlag is what docker run is given to let runsc start sandboxes in its container.
var sandboxFlag = regexp.MustCompile(`--privileged|--cap-add`)

// workflowProblems says what of wf a security reviewer would refuse. A job that starts
// sandboxes (a capture: a stranger's image in gVisor) runs on a machine where gVisor alone
// stands between that image and everything the job holds. A job starts sandboxes when one of
// its pipeline commands may (sandboxCommands: whether in a container or straight on the
// runner) or it gives docker run --privileged or --cap-add. Such a job holds no registry
// credential (no login, no ~/.docker, no secret, in no step's env, nor the job's, nor the
// workflow's, which reaches every job) and a token that writes nothing, and leaves no token in
// .git/config. (The runner's ACTIONS_RUNTIME_TOKEN, which writes caches and artifacts, is
// not the job's to withhold: docs/fleet.md says what an escape can write with it.) Packages
// are written only by a job that pushes to a registry. The workflow's own permissions write
// nothing, so a job gets only what it says. The capture's cache key names what the store
// depends on; every docker run has a memory limit.
func workflowProblems(wf workflow) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if w := wf.Permissions.writes(); len(w) > 0 {
		add("the workflow's permissions let every job's token write %s: set permissions: {} and give each job what it needs", strings.Join(w, ", "))
	}
	var caches int
	for _, name := range slices.Sorted(maps.Keys(wf.Jobs)) {
		job := wf.Jobs[name]
		perms := job.Permissions
		if !perms.set {
			perms = wf.Permissions
		}
		var sandboxes []string // why job starts sandboxes
		var pushes bool
		for _, step := range job.Steps {
			script := strings.ReplaceAll(step.Run, "\\\n", " ")
			for _, line := range strings.Split(script, "\n") {
				if strings.Contains(line, "docker run") && !memoryFlag.MatchString(line) {
					add("job %s: a docker run without a memory limit (--memory): %s", name, strings.TrimSpace(line))
				}
				if flag := sandboxFlag.FindString(line); flag != "" && !slices.Contains(sandboxes, "docker run "+flag) {
					sandboxes = append(sandboxes, "docker run "+flag)
				}
			}
			for _, cmd := range sandboxCommands(pipelineCommands(workflowExpand.Replace(step.Run))) {
				if !slices.Contains(sandboxes, cmd) {
					sandboxes = append(sandboxes, cmd)
				}
			}
			for _, args := range pipelineCommands(workflowExpand.Replace(step.Run)) {
				if p, err := commands().parse(args, io.Discard, io.Discard); err == nil && p.path == "pipeline push" && len(p.args) == 1 && !strings.HasPrefix(p.args[0], "oci-layout:") {
					pushes = true
				}
			}
			if strings.HasPrefix(step.Uses, "actions/cache@") {
				caches++
				key := step.With["key"]
				for _, k := range storeKeyParts {
					if !strings.Contains(key, k.part) {
						add("job %s: the cache key %q does not name %s (%s)", name, key, k.what, k.part)
					}
				}
				for _, rk := range strings.Split(strings.TrimSpace(step.With["restore-keys"]), "\n") {
					if rk = strings.TrimSpace(rk); rk == "" {
						continue
					}
					if !strings.HasPrefix(key, rk) {
						add("job %s: restore key %q is not a prefix of the key %q", name, rk, key)
					}
					for _, k := range storeKeyParts[1:] {
						if !strings.Contains(rk, k.part) {
							add("job %s: restore key %q restores a store of another %s", name, rk, k.what)
						}
					}
				}
			}
		}
		if slices.Contains(perms.writes(), "packages") && !pushes {
			add("job %s may write packages but pushes nothing to a registry", name)
		}
		if len(sandboxes) == 0 {
			continue
		}
		why := fmt.Sprintf("job %s, which starts sandboxes (%s)", name, strings.Join(sandboxes, ", "))
		if w := perms.writes(); len(w) > 0 {
			add("the token of %s, may write %s", why, strings.Join(w, ", "))
		}
		namesSecret := func(value string) bool {
			return strings.Contains(value, "secrets.") || strings.Contains(value, "github.token")
		}
		for _, k := range slices.Sorted(maps.Keys(wf.Env)) {
			if namesSecret(wf.Env[k]) {
				add("the workflow's env %s names a secret or the job's token, and reaches the runner of %s", k, why)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(job.Env)) {
			if namesSecret(job.Env[k]) {
				add("the env %s of %s, names a secret or the job's token", k, why)
			}
		}
		for i, step := range job.Steps {
			where := fmt.Sprintf("step %d (%s%s) of %s", i+1, step.Name, step.Uses, why)
			text := step.Run + fmt.Sprint(step.With) + fmt.Sprint(step.Env)
			switch {
			case strings.Contains(step.Uses, "login"), strings.Contains(step.Run, "docker login"):
				add("%s, logs in to a registry", where)
			case namesSecret(text):
				add("%s, names a secret or the job's token", where)
			case strings.Contains(step.Run, ".docker"), strings.Contains(step.Run, "DOCKER_CONFIG"):
				add("%s, hands registry credentials (~/.docker, DOCKER_CONFIG) to a container", where)
			case strings.HasPrefix(step.Uses, "actions/checkout@") && step.With["persist-credentials"] != "false":
				add("%s leaves the job's token in .git/config (persist-credentials: false)", where)
			}
		}
	}
	if caches == 0 {
		add("no job caches the checkpoint store (actions/cache)")
	}
	return problems
}

// TestGitHubActionsSecurity: the workflow passes workflowProblems.
func TestGitHubActionsSecurity(t *testing.T) {
	t.Parallel()
	for _, p := range workflowProblems(readWorkflow(t)) {
		t.Error(p)
	}
}

// TestGitHubActionsSecurityCatchesProblems: each rule of workflowProblems fails the workflow
// when it breaks it.
func TestGitHubActionsSecurityCatchesProblems(t *testing.T) {
	t.Parallel()
	step := func(wf workflow, job, uses string) *workflowStep {
		for i, s := range wf.Jobs[job].Steps {
			if strings.HasPrefix(s.Uses, uses) || (uses == "run" && strings.Contains(s.Run, "--privileged")) {
				return &wf.Jobs[job].Steps[i]
			}
		}
		t.Fatalf("job %s has no step %s", job, uses)
		return nil
	}
	setJob := func(wf workflow, name string, change func(*workflowJob)) {
		job := wf.Jobs[name]
		change(&job)
		wf.Jobs[name] = job
	}
	for _, tc := range []struct {
		name, want string
		change     func(workflow) workflow
	}{
		{"workflow permissions", "the workflow's permissions", func(wf workflow) workflow {
			wf.Permissions = workflowPermissions{set: true, scopes: map[string]string{"packages": "write"}}
			return wf
		}},
		{"unset permissions", "the workflow's permissions let every job's token write everything", func(wf workflow) workflow {
			wf.Permissions = workflowPermissions{}
			return wf
		}},
		{"capture token writes", "the token of job capture, which starts sandboxes (docker run --privileged, pipeline capture), may write packages", func(wf workflow) workflow {
			setJob(wf, "capture", func(j *workflowJob) { j.Permissions.scopes["packages"] = "write" })
			return wf
		}},
		{"login beside capture", "logs in to a registry", func(wf workflow) workflow {
			setJob(wf, "capture", func(j *workflowJob) {
				j.Steps = append([]workflowStep{{Uses: "docker/login-action@v3", With: map[string]string{"password": "${{ secrets.GITHUB_TOKEN }}"}}}, j.Steps...)
			})
			return wf
		}},
		{"token in a step", "names a secret or the job's token", func(wf workflow) workflow {
			step(wf, "capture", "run").Env = map[string]string{"TOKEN": "${{ github.token }}"}
			return wf
		}},
		{"secret in the workflow's env", "the workflow's env REGISTRY_PASSWORD names a secret or the job's token, and reaches the runner of job capture", func(wf workflow) workflow {
			wf.Env["REGISTRY_PASSWORD"] = "${{ secrets.REGISTRY_PASSWORD }}"
			return wf
		}},
		{"token in the job's env", "the env GH_TOKEN of job capture, which starts sandboxes (docker run --privileged, pipeline capture), names a secret or the job's token", func(wf workflow) workflow {
			setJob(wf, "capture", func(j *workflowJob) { j.Env = map[string]string{"GH_TOKEN": "${{ github.token }}"} })
			return wf
		}},
		{"capture straight on the runner", "of job capture, which starts sandboxes (pipeline capture), logs in to a registry", func(wf workflow) workflow {
			step(wf, "capture", "run").Run = "bin/pipeline capture --config deploy/pipeline.yaml --out work/out --shard ${{ matrix.shard }}/3\n"
			setJob(wf, "capture", func(j *workflowJob) {
				j.Steps = append([]workflowStep{{Uses: "docker/login-action@v3", With: map[string]string{"password": "${{ secrets.GITHUB_TOKEN }}"}}}, j.Steps...)
			})
			return wf
		}},
		{"capabilities instead of --privileged", "the token of job capture, which starts sandboxes (docker run --cap-add), may write packages", func(wf workflow) workflow {
			step(wf, "capture", "run").Run = `docker run --rm --cap-add ALL --read-only --memory 2g "$PIPELINE_IMAGE" capture --config /etc/readie/pipeline.yaml --out /work/out` + "\n"
			setJob(wf, "capture", func(j *workflowJob) { j.Permissions.scopes["packages"] = "write" })
			return wf
		}},
		{"credentials mounted", "hands registry credentials", func(wf workflow) workflow {
			s := step(wf, "capture", "run")
			s.Run = strings.Replace(s.Run, "--privileged", `--privileged -v "$HOME/.docker:/etc/readie-registry:ro"`, 1)
			return wf
		}},
		{"token in .git", "persist-credentials", func(wf workflow) workflow {
			delete(step(wf, "capture", "actions/checkout@").With, "persist-credentials")
			return wf
		}},
		{"key without the config", "does not name the config", func(wf workflow) workflow {
			s := step(wf, "capture", "actions/cache@")
			s.With["key"] = strings.ReplaceAll(s.With["key"], "hashFiles('deploy/pipeline.yaml')", "")
			return wf
		}},
		{"key without the image", "does not name the pipeline's image", func(wf workflow) workflow {
			s := step(wf, "capture", "actions/cache@")
			s.With["key"] = strings.ReplaceAll(s.With["key"], "env.PIPELINE_IMAGE", "")
			return wf
		}},
		{"broad restore key", "restores a store of another", func(wf workflow) workflow {
			step(wf, "capture", "actions/cache@").With["restore-keys"] = "readie-store-"
			return wf
		}},
		{"packages without a push", "job capture may write packages but pushes nothing", func(wf workflow) workflow {
			setJob(wf, "capture", func(j *workflowJob) { j.Permissions.scopes["packages"] = "write" })
			return wf
		}},
		{"no memory limit", "without a memory limit", func(wf workflow) workflow {
			s := step(wf, "capture", "run")
			s.Run = memoryFlag.ReplaceAllString(s.Run, "")
			return wf
		}},
	} {
		problems := workflowProblems(tc.change(readWorkflow(t)))
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%s: workflowProblems = %q, want one saying %q", tc.name, problems, tc.want)
		}
	}
}

// TestPipelineCommandsCatchErrors: the check above fails on a bad command line.
func TestPipelineCommandsCatchErrors(t *testing.T) {
	t.Parallel()
	for _, script := range []string{"pipeline capture --shard 3/3", "pipeline frobnicate", "bin/pipeline push", "pipeline merge a b", "pipeline capture --bogus"} {
		lines := pipelineCommands(script)
		if len(lines) != 1 {
			t.Fatalf("%q: %v", script, lines)
		}
		if _, err := commands().parse(lines[0], io.Discard, io.Discard); err == nil {
			t.Errorf("%q parses", script)
		}
	}
}
