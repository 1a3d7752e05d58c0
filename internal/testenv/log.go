package testenv

import (
	"io"

	"github.com/sirupsen/logrus"
)

// DiscardLog returns a logger that writes nowhere, for a unit test of code that logs.
func DiscardLog() *logrus.Logger {
	log := logrus.New()
	log.SetOutput(io.Discard)
	return log
}
