package measure

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"

	ogorek "github.com/kisielk/og-rek"

	"readie.dev/pipeline/internal/sandboxes"
	"readie.dev/pipeline/pkg/manifest"
)

// SmokeTokenVar is set only in the restore spec; the smoke call reads it back to prove the
// executor replaced the frozen capture-time environment with the restore-time one.
const SmokeTokenVar = "READIE_SMOKE_TOKEN"

// SmokeRequest builds a request that a plain pickle can express: builtins.eval of an
// expression that reports which of imports were not yet in sys.modules (before the call ran
// any import) and the value of SmokeTokenVar.
func SmokeRequest(imports []string) ([]byte, error) {
	list, err := PyList(imports)
	if err != nil {
		return nil, err
	}
	return EvalRequest(fmt.Sprintf(`{"missing": [m for m in %s if m not in __import__("sys").modules], "token": __import__("os").environ.get(%q, "")}`, list, SmokeTokenVar))
}

// CheckSmokeResponse decodes the response envelope of SmokeRequest and checks it: ok, no
// module missing, and the restore-time token visible.
func CheckSmokeResponse(response []byte, token string) error {
	v, err := DecodeEnvelope(response)
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

// PyList renders module names as a Python list literal. They are validated dotted identifiers,
// and JSON strings are Python string literals.
func PyList(imports []string) ([]byte, error) {
	if imports == nil {
		imports = []string{}
	}
	return json.Marshal(imports)
}

// EvalRequest builds a request that a plain pickle can express (cloudpickle.loads is
// pickle.loads): builtins.eval of expr.
func EvalRequest(expr string) ([]byte, error) {
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

// DecodeEnvelope returns the value of an ok envelope, or an error describing a failed one.
func DecodeEnvelope(response []byte) (any, error) {
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

// Smoke restores imageDir in sandbox mode with a token set only in the restore spec, dials the
// executor's socket through the bind mount, calls it, and checks the answer. ReadyMS runs from
// the start of `runsc restore` to the decoded answer.
func (r *Restorer) Smoke(ctx context.Context, setID, imageDir string, imports []string) (manifest.Smoke, error) {
	request, err := SmokeRequest(imports)
	if err != nil {
		return manifest.Smoke{}, err
	}
	token := newToken()
	marks, err := r.TimedCall(ctx, sandboxes.Call{
		SetID: setID, Step: "smoke", Env: []string{SmokeTokenVar + "=" + token}, Start: sandboxes.RestoreStep(imageDir, r.Flags),
		Request: request, Check: func(resp []byte) error { return CheckSmokeResponse(resp, token) },
	})
	if err != nil {
		err = fmt.Errorf("%w: %s: %w", ErrSmoke, setID, err)
		return manifest.Smoke{OK: false, Error: err.Error()}, err
	}
	return manifest.Smoke{OK: true, ReadyMS: marks.TotalMS()}, nil
}
