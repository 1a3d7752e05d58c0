package rootfs

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"readie.dev/pipeline/pkg/sandbox"
)

// TestReadBytecodeRefusesAFIFO: the image's code writes the precompile's host directory as it
// likes; a FIFO where the bytecode's directory (or a directory above it) should be is refused,
// rather than blocking the pipeline forever in open(2), which waits for a writer nobody will be.
func TestReadBytecodeRefusesAFIFO(t *testing.T) {
	const site = "usr/lib/python3/dist-packages"
	dir := filepath.Join(strings.TrimPrefix(pycachePrefix, sandbox.ExecutorDir+"/"), site, "readie_executor")
	for _, fifo := range []string{dir, filepath.Dir(dir)} {
		host := t.TempDir()
		if err := os.MkdirAll(filepath.Join(host, filepath.Dir(fifo)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(filepath.Join(host, fifo), 0o644); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := readBytecode(host, site, "test")
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "precompile wrote no bytecode") {
				t.Errorf("a FIFO at %s: %v, want an error saying no bytecode was written", fifo, err)
			}
		case <-time.After(30 * time.Second):
			// The fault is a hang: unblock the open so the goroutine ends, then fail.
			if w, err := os.OpenFile(filepath.Join(host, fifo), os.O_WRONLY, 0); err == nil {
				w.Close()
			}
			<-done
			t.Errorf("a FIFO at %s: readBytecode blocked opening it", fifo)
		}
	}
}
