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
	if imports == nil {
		imports = []string{}
	}
	// Module names are validated dotted identifiers; JSON strings are Python string literals.
	list, err := json.Marshal(imports)
	if err != nil {
		return nil, err
	}
	expr := fmt.Sprintf(`{"missing": [m for m in %s if m not in __import__("sys").modules], "token": __import__("os").environ.get(%q, "")}`, list, SmokeTokenVar)
	request := map[string]any{
		"func":   ogorek.Class{Module: "builtins", Name: "eval"},
		"args":   ogorek.Tuple{expr},
		"kwargs": map[string]any{},
	}
	var buf bytes.Buffer
	if err := ogorek.NewEncoderWithConfig(&buf, &ogorek.EncoderConfig{Protocol: 4}).Encode(request); err != nil {
		return nil, fmt.Errorf("pickle smoke request: %w", err)
	}
	return buf.Bytes(), nil
}

// CheckSmokeResponse decodes the response envelope of SmokeRequest and checks it: ok, no
// module missing, and the restore-time token visible.
func CheckSmokeResponse(response []byte, token string) error {
	v, err := ogorek.NewDecoderWithConfig(bytes.NewReader(response), &ogorek.DecoderConfig{StrictUnicode: true}).Decode()
	if err != nil {
		return fmt.Errorf("decode response envelope: %w", err)
	}
	envelope, ok := v.(map[any]any)
	if !ok {
		return fmt.Errorf("response envelope is %T, not a dict", v)
	}
	if envelope["ok"] != true {
		return fmt.Errorf("executor answered ok=False: %v: %v\n%v", envelope["exc_type"], envelope["message"], envelope["traceback"])
	}
	value, ok := envelope["value"].(map[any]any)
	if !ok {
		return fmt.Errorf("smoke value is %T, not a dict", envelope["value"])
	}
	if missing, _ := value["missing"].([]any); len(missing) > 0 {
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

// Smoke restores imageDir in sandbox mode with a token set only in the restore spec, dials the
// executor's socket through the bind mount, calls it, and checks the answer. ReadyMS runs from
// the start of `runsc restore` to the decoded answer.
func (r *Restorer) Smoke(ctx context.Context, setID, imageDir string, imports []string) (manifest.Smoke, error) {
	return r.call(ctx, setID, imports, func(ctx context.Context, sb *sandbox.Sandbox) error {
		_, err := sb.Restore(ctx, sandbox.RestoreOptions{ImageDir: imageDir, Flags: r.Flags, Detach: true})
		return err
	})
}

// ColdCall starts the executor in sandbox mode without a checkpoint and makes the same call,
// which then imports the modules itself; ReadyMS runs from `runsc create` to the answer.
func (r *Restorer) ColdCall(ctx context.Context, setID string, imports []string) (manifest.Smoke, error) {
	return r.call(ctx, setID, nil, func(ctx context.Context, sb *sandbox.Sandbox) error {
		if err := sb.Create(ctx); err != nil {
			return err
		}
		return sb.Start(ctx)
	})
}

func (r *Restorer) call(ctx context.Context, setID string, imports []string, start func(context.Context, *sandbox.Sandbox) error) (manifest.Smoke, error) {
	fail := func(err error) (manifest.Smoke, error) {
		err = fmt.Errorf("%w: %s: %w", ErrSmoke, setID, err)
		return manifest.Smoke{OK: false, Error: err.Error()}, err
	}
	request, err := SmokeRequest(imports)
	if err != nil {
		return fail(err)
	}
	token := newToken()
	sb, err := r.newSandbox(setID, "smoke", sandbox.ModeSandbox, []string{SmokeTokenVar + "=" + token})
	if err != nil {
		return fail(err)
	}
	defer sb.Delete(ctx)
	ctx, cancel := context.WithTimeoutCause(ctx, r.Timeout,
		fmt.Errorf("smoke test exceeded its timeout of %s", r.Timeout))
	defer cancel()

	began := time.Now()
	withTail := func(err error) error {
		if tail := sb.Tail(10); tail != "" {
			return fmt.Errorf("%w\nexecutor stderr:\n%s", err, tail)
		}
		return err
	}
	if err := start(ctx, sb); err != nil {
		return fail(withTail(err))
	}
	conn, err := executorproto.Dial(ctx, sb.SocketPath())
	if err != nil {
		return fail(withTail(err))
	}
	defer conn.Close()
	response, err := executorproto.Call(ctx, conn, request)
	if err != nil {
		return fail(withTail(err))
	}
	ready := time.Since(began)
	if err := CheckSmokeResponse(response, token); err != nil {
		return fail(err)
	}
	return manifest.Smoke{OK: true, ReadyMS: float64(ready.Microseconds()) / 1000}, nil
}
