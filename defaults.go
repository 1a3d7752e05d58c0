// Package pipeline holds what the binary carries with it: the default config, so it runs
// without a config file, and the executor's files, so it can put the executor into any image.
package pipeline

import (
	"embed"
	"io/fs"
)

//go:embed pipeline.yaml
var defaultConfig []byte

//go:embed images/executor/readie_executor/*.py images/executor/testing/*.py
var executor embed.FS

// DefaultConfig returns the text of the default pipeline.yaml.
func DefaultConfig() []byte { return append([]byte(nil), defaultConfig...) }

// ExecutorFiles are the executor's sources: readie_executor/*.py and testing/*.py.
func ExecutorFiles() fs.FS {
	sub, err := fs.Sub(executor, "images/executor")
	if err != nil {
		panic(err) // a fixed path inside the embedded tree
	}
	return sub
}
