// Package jsonfile reads the pipeline's own JSON files (analysis.json, plan.json,
// catalogue.json) strictly: one object, no field its type lacks, nothing after it.
package jsonfile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
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

// Read reads the file at path, at most MaxBytes of it. An error opening it is returned as it
// is (errors.Is(err, fs.ErrNotExist) holds); one reading it names the path.
func Read(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxBytes))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return data, nil
}
