package store

import (
	"errors"
	"syscall"
)

// errNotEmpty is what rename(2) says when the target directory exists and is not empty.
var errNotEmpty = syscall.ENOTEMPTY

func isCrossDevice(err error) bool { return errors.Is(err, syscall.EXDEV) }
