package run

import (
	"context"
	"fmt"
	"os"

	"readie.dev/pipeline/internal/scratch"
)

// Scratch makes the scratch directory of a command that starts sandboxes outside a capture
// (analyze, the corpus bench): runs that are over are swept from the shared directories first (their sandboxes,
// scratch directories and pending store entries), then a scratch directory named after this
// run's lease is made. cleanup removes it; call it after every sandbox is deleted.
func (e *Env) Scratch(ctx context.Context) (work string, cleanup func(), err error) {
	if err := os.MkdirAll(e.Runtime.Root, 0o700); err != nil {
		return "", nil, fmt.Errorf("%w: runsc root: %w", ErrSetup, err)
	}
	if err := e.sweep.shared(ctx); err != nil {
		return "", nil, err
	}
	return scratch.Dir(e.lease)
}
