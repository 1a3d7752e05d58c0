package measure

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	ogorek "github.com/kisielk/og-rek"

	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/sandbox"
)

// SmokeTokenVar is set only in the restore spec; the smoke call reads it back to prove the
// executor replaced the frozen capture-time environment with the restore-time one.
const SmokeTokenVar = "READIE_SMOKE_TOKEN"

// SmokeRequest builds a request that a plain pickle can express: builtins.eval of an
// expression that reports which of imports were not yet in sys.modules (before the call ran
// any import) and the value of SmokeTokenVar.
func SmokeRequest(imports []string) ([]byte, error) {
	list, err := pyList(imports)
	if err != nil {
		return nil, err
	}
	return pickleEval(fmt.Sprintf(`{"missing": [m for m in %s if m not in __import__("sys").modules], "token": __import__("os").environ.get(%q, "")}`, list, SmokeTokenVar))
}

// CheckSmokeResponse decodes the response envelope of SmokeRequest and checks it: ok, no
// module missing, and the restore-time token visible.
func CheckSmokeResponse(response []byte, token string) error {
	v, err := decodeEnvelope(response)
	if err != nil {
		return err
	}
	value, ok := v.(map[any]any)
	if !ok {
		return fmt.Errorf("smoke value is %T, not a dict", v)
	}
	missing, ok := value["missing"].([]any)
	if !ok {
		return fmt.Errorf("smoke value has no list of missing modules: %v", value)
	}
	if len(missing) > 0 {
		return fmt.Errorf("modules not loaded before the call: %v", missing)
	}
	if got := value["token"]; got != token {
		return fmt.Errorf("the function saw %s=%q, the restore spec set %q: the executor kept the capture-time environment", SmokeTokenVar, got, token)
	}
	return nil
}

func newToken() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ImportRequest builds a request that imports every module of imports and returns how many
// it imported: the first call of a cold executor, and the same call on a restored one.
func ImportRequest(imports []string) ([]byte, error) {
	list, err := pyList(imports)
	if err != nil {
		return nil, err
	}
	return pickleEval(fmt.Sprintf(`len([__import__(m) for m in %s])`, list))
}

// pyList renders module names as a Python list literal. They are validated dotted identifiers,
// and JSON strings are Python string literals.
func pyList(imports []string) ([]byte, error) {
	if imports == nil {
		imports = []string{}
	}
	return json.Marshal(imports)
}

func pickleEval(expr string) ([]byte, error) {
	request := map[string]any{
		"func":   ogorek.Class{Module: "builtins", Name: "eval"},
		"args":   ogorek.Tuple{expr},
		"kwargs": map[string]any{},
	}
	var buf bytes.Buffer
	if err := ogorek.NewEncoderWithConfig(&buf, &ogorek.EncoderConfig{Protocol: 4}).Encode(request); err != nil {
		return nil, fmt.Errorf("pickle request: %w", err)
	}
	return buf.Bytes(), nil
}

// decodeEnvelope returns the value of an ok envelope, or an error describing a failed one.
func decodeEnvelope(response []byte) (any, error) {
	v, err := ogorek.NewDecoderWithConfig(bytes.NewReader(response), &ogorek.DecoderConfig{StrictUnicode: true}).Decode()
	if err != nil {
		return nil, fmt.Errorf("decode response envelope: %w", err)
	}
	envelope, ok := v.(map[any]any)
	if !ok {
		return nil, fmt.Errorf("response envelope is %T, not a dict", v)
	}
	if envelope["ok"] != true {
		return nil, fmt.Errorf("executor answered ok=False: %v: %v\n%v", envelope["exc_type"], envelope["message"], envelope["traceback"])
	}
	return envelope["value"], nil
}

// checkImported checks the answer to ImportRequest.
func checkImported(response []byte, imports []string) error {
	value, err := decodeEnvelope(response)
	if err != nil {
		return err
	}
	if n, ok := value.(int64); !ok || n != int64(len(imports)) {
		return fmt.Errorf("import call returned %v, want %d", value, len(imports))
	}
	return nil
}

// Smoke restores imageDir in sandbox mode with a token set only in the restore spec, dials the
// executor's socket through the bind mount, calls it, and checks the answer. ReadyMS runs from
// the start of `runsc restore` to the decoded answer.
func (r *Restorer) Smoke(ctx context.Context, setID, imageDir string, imports []string) (manifest.Smoke, error) {
	request, err := SmokeRequest(imports)
	if err != nil {
		return manifest.Smoke{}, err
	}
	token := newToken()
	marks, err := r.timedCall(ctx, setID, "smoke", []string{SmokeTokenVar + "=" + token}, nil, r.restore(imageDir),
		request, func(resp []byte) error { return CheckSmokeResponse(resp, token) })
	if err != nil {
		err = fmt.Errorf("%w: %s: %w", ErrSmoke, setID, err)
		return manifest.Smoke{OK: false, Error: err.Error()}, err
	}
	return manifest.Smoke{OK: true, ReadyMS: marks.TotalMS()}, nil
}

// ColdCall starts the executor in sandbox mode without a checkpoint and makes the call that
// imports the set's modules; the time runs from `runsc create` to the answer.
func (r *Restorer) ColdCall(ctx context.Context, setID string, imports []string) (float64, error) {
	request, err := ImportRequest(imports)
	if err != nil {
		return 0, err
	}
	marks, err := r.timedCall(ctx, setID, "cold", nil, nil, func(ctx context.Context, sb *sandbox.Sandbox) error {
		if err := sb.Create(ctx); err != nil {
			return err
		}
		return sb.Start(ctx)
	}, request, func(resp []byte) error { return checkImported(resp, imports) })
	return marks.TotalMS(), err
}

// RestoreCall restores imageDir in sandbox mode and makes the same call as ColdCall; the time
// runs from `runsc restore` to the answer. With prestarted, the sandbox is made by
// `runsc create` first, off the clock, as a worker with a pool of created sandboxes would.
func (r *Restorer) RestoreCall(ctx context.Context, setID, imageDir string, imports []string, prestarted bool) (float64, error) {
	marks, err := r.RestoreCallMarks(ctx, setID, imageDir, imports, prestarted)
	return marks.TotalMS(), err
}

// RestoreCallMarks is RestoreCall, returning when each step of the call ended.
func (r *Restorer) RestoreCallMarks(ctx context.Context, setID, imageDir string, imports []string, prestarted bool) (CallMarks, error) {
	request, err := ImportRequest(imports)
	if err != nil {
		return CallMarks{}, err
	}
	var prepare func(context.Context, *sandbox.Sandbox) error
	step := "restore"
	if prestarted {
		prepare = func(ctx context.Context, sb *sandbox.Sandbox) error { return sb.Create(ctx) }
		step = "prestarted"
	}
	return r.timedCall(ctx, setID, step, nil, prepare, r.restore(imageDir), request,
		func(resp []byte) error { return checkImported(resp, imports) })
}

// Floor runs a sandbox of the executor's shape whose process exits at once (/bin/true): the
// cost of any sandbox on this machine.
func (r *Restorer) Floor(ctx context.Context) (float64, error) {
	sb, err := r.newSandboxArgs("floor", "floor", sandbox.ModeSandbox, nil, []string{"/bin/true"})
	if err != nil {
		return 0, err
	}
	defer sb.Delete(ctx)
	ctx, cancel := context.WithTimeoutCause(ctx, r.Timeout, fmt.Errorf("floor sandbox exceeded its timeout of %s", r.Timeout))
	defer cancel()
	start := time.Now()
	status, err := sb.Run(ctx)
	elapsed := time.Since(start)
	if err == nil && status != 0 {
		err = fmt.Errorf("/bin/true exited with status %d", status)
	}
	return ms(elapsed), err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// withStderr deletes the sandbox, so that its log holds everything the executor wrote, and
// adds the log's last lines to err.
func withStderr(ctx context.Context, sb *sandbox.Sandbox, err error) error {
	sb.Delete(ctx)
	if tail := sb.Tail(10); tail != "" {
		return fmt.Errorf("%w\nexecutor stderr:\n%s", err, tail)
	}
	return err
}

func (r *Restorer) restore(imageDir string) func(context.Context, *sandbox.Sandbox) error {
	return func(ctx context.Context, sb *sandbox.Sandbox) error {
		_, err := sb.Restore(ctx, sandbox.RestoreOptions{ImageDir: imageDir, Flags: r.Flags, Detach: true})
		return err
	}
}

// CallMarks are the moments a timed call passed: the start of the runsc command, its return,
// the executor accepting the connection, and the decoded answer.
type CallMarks struct {
	Began, Started, Connected, Answered time.Time
}

// TotalMS is the time from the start of the runsc command to the answer.
func (m CallMarks) TotalMS() float64 { return ms(m.Answered.Sub(m.Began)) }

// timedCall prepares a sandbox (off the clock), then times start, dial and one call until the
// answer has been checked. The sandbox is deleted on every path.
func (r *Restorer) timedCall(ctx context.Context, setID, step string, env []string, prepare, start func(context.Context, *sandbox.Sandbox) error, request []byte, check func([]byte) error) (CallMarks, error) {
	var marks CallMarks
	sb, err := r.newSandbox(setID, step, sandbox.ModeSandbox, env)
	if err != nil {
		return marks, err
	}
	defer sb.Delete(ctx)
	ctx, cancel := context.WithTimeoutCause(ctx, r.Timeout,
		fmt.Errorf("%s of %s exceeded its timeout of %s", step, setID, r.Timeout))
	defer cancel()
	withTail := func(err error) error { return withStderr(ctx, sb, err) }
	if prepare != nil {
		if err := prepare(ctx, sb); err != nil {
			return marks, withTail(err)
		}
	}
	marks.Began = time.Now()
	if err := start(ctx, sb); err != nil {
		return marks, withTail(err)
	}
	marks.Started = time.Now()
	conn, err := executorproto.Dial(ctx, sb.SocketPath())
	if err != nil {
		return marks, withTail(err)
	}
	defer conn.Close()
	marks.Connected = time.Now()
	response, err := executorproto.Call(ctx, conn, request)
	if err != nil {
		return marks, withTail(err)
	}
	marks.Answered = time.Now()
	if err := check(response); err != nil {
		return marks, err
	}
	return marks, nil
}
