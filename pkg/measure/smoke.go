package measure

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"readie.dev/pipeline/pkg/launch"
	"readie.dev/pipeline/pkg/manifest"
	"readie.dev/pipeline/pkg/pycall"
)

func newToken() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Smoke restores imageDir in sandbox mode with a token set only in the restore spec, dials the
// executor's socket through the bind mount, calls it, and checks the answer. ReadyMS runs from
// the start of `runsc restore` to the decoded answer; ResidentBytes and OwnBytes are the
// sandbox's memory then, idle (launch.Sandbox.Memory).
func (r *Restorer) Smoke(ctx context.Context, setID, imageDir string, imports []string) (manifest.Smoke, error) {
	request, err := pycall.SmokeRequest(imports)
	if err != nil {
		return manifest.Smoke{}, err
	}
	token := newToken()
	var memory launch.Memory
	marks, err := r.TimedCall(ctx, launch.Call{
		SetID: setID, Step: "smoke", Env: []string{pycall.SmokeTokenVar + "=" + token}, Image: launch.Image{Dir: imageDir, Flags: r.Flags},
		Request: request, Check: func(resp []byte) error { return pycall.CheckSmokeResponse(resp, token) },
		MaxResponseSize: pycall.SmallResponse,
		Inspect:         func(sb *launch.Sandbox) (err error) { memory, err = sb.Memory(); return err },
	})
	if err != nil {
		err = fmt.Errorf("%w: %s: %w", ErrSmoke, setID, err)
		return manifest.Smoke{OK: false, Error: err.Error()}, err
	}
	return manifest.Smoke{OK: true, ReadyMS: marks.TotalMS(), ResidentBytes: memory.Resident, OwnBytes: memory.Own}, nil
}
