package pycall_test

import (
	"bytes"
	"strings"
	"testing"

	ogorek "github.com/kisielk/og-rek"

	"readie.dev/pipeline/pkg/pycall"
)

// envelope pickles a response envelope the way the executor's would decode.
func envelope(t *testing.T, env map[string]any) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := ogorek.NewEncoderWithConfig(&buf, &ogorek.EncoderConfig{Protocol: 4}).Encode(env); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestCheckSmokeResponse(t *testing.T) {
	ok := func(value any) []byte {
		return envelope(t, map[string]any{"ok": true, "value": value, "output": []any{}})
	}
	tests := []struct {
		name     string
		response []byte
		want     string // "" means accepted
	}{
		{"good", ok(map[string]any{"missing": []any{}, "token": "t0k"}), ""},
		{"module not pre-imported", ok(map[string]any{"missing": []any{"pandas"}, "token": "t0k"}), "modules not loaded before the call: ['pandas']"},
		{"capture-time environment", ok(map[string]any{"missing": []any{}, "token": ""}), "kept the capture-time environment"},
		{"no missing list", ok(map[string]any{"token": "t0k"}), "no list of missing modules"},
		{"value not a dict", ok("hello"), "not a dict"},
		{"ok False", envelope(t, map[string]any{"ok": false, "exc_type": "NameError", "message": "boom", "traceback": "", "output": []any{}}), "ok=False: NameError: boom"},
		{"not a pickle", []byte("not a pickle"), "decode response envelope"},
	}
	for _, tt := range tests {
		err := pycall.CheckSmokeResponse(tt.response, "t0k")
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: rejected: %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: err = %v, want %q", tt.name, err, tt.want)
		}
	}
}
