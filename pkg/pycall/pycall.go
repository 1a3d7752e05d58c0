// Package pycall builds the requests a plain pickle can express and reads the executor's
// answers, for anyone who calls an executor (a worker, the pipeline): EvalRequest pickles a
// call of builtins.eval (a valid request without cloudpickle: cloudpickle.loads is
// pickle.loads), PyList renders names as a Python list literal, DecodeEnvelope reads a
// response; SmokeRequest and CheckSmokeResponse are the smoke test's call (every module of a
// set already imported, the restore-time SmokeTokenVar seen). The standard library and a
// pickle codec only: nothing of the pipeline's own packages. It is the one package of the
// module that imports og-rek (TestWorkerKitDependencies), beside the framing it rides on
// (pkg/executorproto, standard library alone, for a worker that pickles its own requests).
//
// A reply is data from a stranger: the process that wrote it ran whatever its caller sent.
// Decode reads it with a decoder of its own rather than og-rek's, because bounding og-rek from
// outside would take a second pass that models the whole pickle machine anyway (to see cycles
// and sharing), and og-rek gets the memo wrong for lists (a list memoized empty and filled
// later decodes empty where it is referred to again). The decoder reads the subset of pickle a
// reply needs (protocols 2 to 5: containers, scalars, strings and bytes, the memo, frames;
// globals and the objects REDUCE, NEWOBJ and BUILD make, as an Object that records the call
// instead of making it) and is bounded in every dimension by the pickle's length: each opcode
// is at least a byte and pushes at most one value, the memo holds no more entries than the
// pickle made objects (ErrMemo), lengths are checked against the bytes left before anything is
// allocated, and sharing costs a pointer, never a copy. What it returns contains no cycle
// (ErrCycle), nests at most MaxDepth deep (ErrDepth) and expands, walked as a tree, to at most
// ExpansionPerByte times the pickle's length (ErrTooLarge), so that code walking it naively
// stays bounded too. Decoding allocates at most 320 bytes per byte of the pickle, plus 64 KiB
// (FuzzDecodeEnvelope checks it on every input; a pickle of nothing but empty sets comes
// nearest), so callers bound what they decode with executorproto.Caller.MaxResponseSize
// (SmallResponse for the pipeline's own calls). Format prints a decoded value within a budget.
package pycall

import (
	"bytes"
	"encoding/json"
	"fmt"

	ogorek "github.com/kisielk/og-rek"
)

// SmallResponse is the most the pipeline reads of an answer of a few values (the smoke call,
// the bench's import counts): their envelopes are a few hundred bytes, a smoke answer naming
// every module of a large set as missing a few KiB. An executor that sends more gets
// executorproto.ErrMessageTooLarge, and the pipeline never decodes more than this.
const SmallResponse = 64 << 10

// The ok=False error shows at most this much of each part of the envelope.
const (
	excTypeBytes   = 256
	messageBytes   = 4 << 10
	tracebackBytes = 16 << 10
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
		return fmt.Errorf("smoke value has no list of missing modules: %s", Format(value, ErrorBytes))
	}
	if len(missing) > 0 {
		return fmt.Errorf("modules not loaded before the call: %s", Format(missing, ErrorBytes))
	}
	if got := value["token"]; got != token {
		return fmt.Errorf("the function saw %s=%s, the restore spec set %q: the executor kept the capture-time environment", SmokeTokenVar, Format(got, ErrorBytes), token)
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

// DecodeEnvelope decodes a response (Decode) and returns the value of an ok envelope, or an
// error describing a failed one, which shows a bounded part of its exception type, message
// and traceback.
func DecodeEnvelope(response []byte) (any, error) {
	v, err := Decode(response)
	if err != nil {
		return nil, fmt.Errorf("decode response envelope: %w", err)
	}
	envelope, ok := v.(map[any]any)
	if !ok {
		return nil, fmt.Errorf("response envelope is %T, not a dict", v)
	}
	if envelope["ok"] != true {
		return nil, fmt.Errorf("executor answered ok=False: %s: %s\n%s", formatText(envelope["exc_type"], excTypeBytes),
			formatText(envelope["message"], messageBytes), formatText(envelope["traceback"], tracebackBytes))
	}
	return envelope["value"], nil
}
