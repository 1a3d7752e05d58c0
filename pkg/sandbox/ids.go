package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// NewID names a sandbox after its package set, its step and the pipeline's pid, unique per
// call, so `runsc list` says what each sandbox is for and a later run can tell the leftovers of
// a run that died from the sandboxes of a run still going (OwnerPID).
func NewID(setID, step string) string {
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("readie-%s-%s-%d-%s", setID, step, os.Getpid(), hex.EncodeToString(b[:]))
}

// OwnerPID returns the pid that a pipeline sandbox ID ("readie-...-PID-RAND") carries.
func OwnerPID(id string) (int, bool) {
	if !strings.HasPrefix(id, "readie-") {
		return 0, false
	}
	parts := strings.Split(id, "-")
	if len(parts) < 4 {
		return 0, false
	}
	pid, err := strconv.Atoi(parts[len(parts)-2])
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, true
}

// ProcessAlive reports whether pid names a live process.
func ProcessAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
