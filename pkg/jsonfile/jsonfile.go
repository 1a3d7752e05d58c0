// Package jsonfile reads the pipeline's own JSON files (analysis.json, plan.json,
// catalogue.json) strictly: one object, no field its type lacks, nothing after it.
package jsonfile

import (
	"bytes"
	"encoding/json"
	"fmt"

	"readie.dev/pipeline/pkg/limitread"
)

// MaxBytes bounds what Read reads of a file.
const MaxBytes = 256 << 20

// Decode decodes data, one JSON object, into v. A field v lacks, or data after the object, is
// an error; what names the object in that error ("data after the plan object").
func Decode(data []byte, v any, what string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("data after the %s object", what)
	}
	return nil
}

// Read reads the file at path and refuses one larger than MaxBytes, naming the limit. An
// error opening it is returned as it is (errors.Is(err, fs.ErrNotExist) holds); one reading it
// names the path.
func Read(path string) ([]byte, error) {
	return limitread.File(path, MaxBytes, "the limit on the pipeline's own JSON files")
}
