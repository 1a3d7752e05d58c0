// Package pycall builds the requests a plain pickle can express and reads the executor's
// answers, for anyone who calls an executor (a worker, the pipeline): EvalRequest pickles a
// call of builtins.eval (a valid request without cloudpickle: cloudpickle.loads is
// pickle.loads), PyList renders names as a Python list literal, DecodeEnvelope reads a
// response; SmokeRequest and CheckSmokeResponse are the smoke test's call (every module of a
// set already imported, the restore-time SmokeTokenVar seen). The standard library and a
// pickle codec only: nothing of the pipeline's own packages. It is the one package of the
// module that imports og-rek (TestWorkerKitDependencies), beside the framing it rides on
// (pkg/executorproto, standard library alone, for a worker that pickles its own requests).
package pycall

import (
	"bytes"
	"encoding/json"
	"fmt"

	ogorek "github.com/kisielk/og-rek"
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

// ImportRequest builds a request that imports every module of imports and returns how many
// it imported: what a cold start of a set does (a benchmark's cold series, a worker's cold
// fallback, launch.Restorer.ColdStart).
func ImportRequest(imports []string) ([]byte, error) {
	list, err := PyList(imports)
	if err != nil {
		return nil, err
	}
	return EvalRequest(fmt.Sprintf(`len([__import__(m) for m in %s])`, list))
}

// CheckImported checks the answer to ImportRequest: ok, and every module imported.
func CheckImported(response []byte, imports []string) error {
	value, err := DecodeEnvelope(response)
	if err != nil {
		return err
	}
	if n, ok := value.(int64); !ok || n != int64(len(imports)) {
		return fmt.Errorf("import call returned %v, want %d", value, len(imports))
	}
	return nil
}

// PyList returns module names as a Python list literal. They are validated dotted identifiers,
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
