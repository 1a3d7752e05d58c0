// Package pipeline holds the default config, embedded so the binary runs without a config file.
package pipeline

import _ "embed"

//go:embed pipeline.yaml
var defaultConfig []byte

// DefaultConfig returns the text of the default pipeline.yaml.
func DefaultConfig() []byte { return append([]byte(nil), defaultConfig...) }
