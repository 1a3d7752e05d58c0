package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	batchv1 "k8s.io/api/batch/v1"
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
		for _, c := range job.Spec.Template.Spec.Containers {
			if !pinnedImage.MatchString(c.Image) {
				t.Errorf("%s: container %s runs %s, not the pipeline's image by digest (HOST/REPO@sha256:...)", file, c.Name, c.Image)
			}
			// Kubernetes expands $(VAR) in command and args before the shell sees them.
			env := map[string]string{"JOB_COMPLETION_INDEX": "0"}
			var expanded []string
			for _, s := range append(append([]string{}, c.Command...), c.Args...) {
				expanded = append(expanded, expandKubernetes(s, env))
			}
			lines = append(lines, pipelineCommands(strings.Join(expanded, "\n"))...)
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
			if c := job.Spec.Template.Spec.Containers[0]; c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
				t.Errorf("%s: the capture container is not privileged: runsc cannot start", file)
			}
		}
	}
	if indexed != 1 {
		t.Errorf("%d capture jobs with --shard, want 1", indexed)
	}
}

// TestGitHubActionsWorkflow: every pipeline command line of the workflow parses, the capture
// job's matrix has as many shards as --shard says, and the pipeline's image is named by digest.
func TestGitHubActionsWorkflow(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../deploy/github-actions/checkpoints.yml")
	if err != nil {
		t.Fatal(err)
	}
	var wf struct {
		Env  map[string]string `yaml:"env"`
		Jobs map[string]struct {
			Strategy struct {
				Matrix struct {
					Shard []int `yaml:"shard"`
				} `yaml:"matrix"`
			} `yaml:"strategy"`
			Steps []struct {
				Run string `yaml:"run"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal(data, &wf); err != nil {
		t.Fatal(err)
	}
	if !pinnedImage.MatchString(wf.Env["PIPELINE_IMAGE"]) {
		t.Errorf("the workflow runs the pipeline's image %q, not by digest (HOST/REPO@sha256:...)", wf.Env["PIPELINE_IMAGE"])
	}
	expand := strings.NewReplacer("${{ matrix.shard }}", "0", "${{ env.IMAGE }}", "ghcr.io/owner/repo/checkpoints", "$shard", "0")
	var total int
	for name, job := range wf.Jobs {
		var lines [][]string
		for _, step := range job.Steps {
			lines = append(lines, pipelineCommands(expand.Replace(step.Run))...)
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
