package measure_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"readie.dev/pipeline/internal/testenv"
	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/pycall"
)

// TestDNSInSandboxNetwork: in a sandbox with a network (runsc --network=sandbox), the image
// has no resolver configured, so before the first call the executor writes the shipped one
// (through /etc/resolv.conf, a link into the writable /tmp on a read-only root), and the call
// sees it; /etc/hosts resolves localhost without a resolver.
func TestDNSInSandboxNetwork(t *testing.T) {
	rt := testenv.Runtime(t)
	rt.Flags.Network = "sandbox"
	l := &launch.Launcher{Runtime: rt, Rootfs: testenv.Rootfs(t), WorkDir: testenv.WorkDir(t), Timeout: time.Minute}
	request, err := pycall.EvalRequest(`[open("/etc/resolv.conf").read(), __import__("socket").gethostbyname("localhost")]`)
	if err != nil {
		t.Fatal(err)
	}
	var answer []any
	_, err = l.TimedCall(context.Background(), launch.Call{SetID: "dns", Step: "cold", Request: request, Check: func(resp []byte) error {
		v, err := pycall.DecodeEnvelope(resp)
		if err != nil {
			return err
		}
		answer, _ = v.([]any)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(answer) != 2 {
		t.Fatalf("answer %s", pycall.Format(answer, pycall.ErrorBytes))
	}
	if conf, _ := answer[0].(string); !strings.Contains(conf, "nameserver 1.1.1.1") {
		t.Errorf("the call saw /etc/resolv.conf = %q, want the shipped resolver", conf)
	}
	if answer[1] != "127.0.0.1" {
		t.Errorf("localhost resolved to %s", pycall.Format(answer[1], pycall.ErrorBytes))
	}
}
