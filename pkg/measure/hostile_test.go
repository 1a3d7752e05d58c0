package measure_test

import (
	"bytes"
	"strings"
	"testing"

	ogorek "github.com/kisielk/og-rek"

	"readie.dev/pipeline/pkg/executorproto"
	"readie.dev/pipeline/pkg/pycall"
)

// execRequest is a plain pickle of builtins.exec(code, {}): a function a worker may send,
// written without cloudpickle.
func execRequest(t *testing.T, code string) []byte {
	t.Helper()
	var buf bytes.Buffer
	err := ogorek.NewEncoderWithConfig(&buf, &ogorek.EncoderConfig{Protocol: 4}).Encode(map[string]any{
		"func": ogorek.Class{Module: "builtins", Name: "exec"}, "args": ogorek.Tuple{code, map[string]any{}}, "kwargs": map[string]any{},
	})
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestHostileFunctionsInSandbox: the executor in a real sandbox (gVisor's memfd, descriptor
// limit and stdio, not the host's) answers each hostile function with the envelope the spec
// asks for, and then answers the next call on a new connection with its output captured.
// The host-side table (images/executor/tests) has the rest; os._exit is TestExecutorDiesDuringCall.
func TestHostileFunctionsInSandbox(t *testing.T) {
	ctx, sb := startColdExecutor(t, "hostile")
	call := func(code string) map[any]any {
		t.Helper()
		conn, err := executorproto.Dial(ctx, sb.SocketPath())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		response, err := executorproto.Call(ctx, conn, execRequest(t, code))
		if err != nil {
			t.Fatalf("the executor did not answer: %v", err)
		}
		v, err := pycall.Decode(response)
		if err != nil {
			t.Fatal(err)
		}
		return v.(map[any]any)
	}
	for _, tc := range []struct {
		name, code string
		ok         bool
		excType    string
		// outputHas is a piece of the output's text.
		outputHas string
	}{
		{"raising __str__ and __repr__", "class E(Exception):\n def __str__(s): raise RuntimeError()\n def __repr__(s): raise RuntimeError()\nraise E()", false, "E", ""},
		{"__str__ raises SystemExit", "class E(Exception):\n def __str__(s): raise SystemExit(3)\nraise E()", false, "E", ""},
		{"descriptor exhaustion", "import os\ntry:\n while True: os.open('/dev/null', os.O_RDONLY)\nexcept OSError as e: print(e.strerror)", true, "", "Too many open files"},
		{"a gigabyte to stdout", "import os\nb = b'x' * (1 << 20)\nfor _ in range(1024): os.write(1, b)\nprint('end')", true, "", "bytes of output dropped here"},
		{"closes its stdio", "import sys\nsys.stdout.close()\nsys.stderr.close()", true, "", ""},
		{"sys.exit", "import sys\nsys.exit(4)", false, "SystemExit", ""},
		{"recursion bomb", "def f(): return f()\nf()", false, "RecursionError", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := call(tc.code)
			if env["ok"] != tc.ok || (!tc.ok && env["exc_type"] != tc.excType) {
				t.Fatalf("envelope ok=%s exc_type=%s message=%s, want ok=%v exc_type=%q", pycall.Format(env["ok"], pycall.ErrorBytes),
					pycall.Format(env["exc_type"], pycall.ErrorBytes), pycall.Format(env["message"], 200), tc.ok, tc.excType)
			}
			var out strings.Builder
			for _, line := range env["output"].([]any) {
				out.WriteString(line.(string))
			}
			if !strings.Contains(out.String(), tc.outputHas) || out.Len() > 17<<20 {
				t.Errorf("output of %d bytes, want at most 17 MiB holding %q: %.300s", out.Len(), tc.outputHas, out.String())
			}
			next := call("print('next call')")
			if got := pycall.Format([]any{next["ok"], next["output"]}, pycall.ErrorBytes); got != `[True, ['next call\n']]` {
				t.Fatalf("the next call got %s", pycall.Format(next, pycall.ErrorBytes))
			}
		})
	}
}
