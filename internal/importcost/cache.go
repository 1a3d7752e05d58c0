package importcost

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"

	"readie.dev/pipeline/pkg/atomicfile"
)

// key is everything one measurement depends on, by digest or by name, never by path or time
// (as BuildKit keys its cache): the same inputs on any machine give the same key. Host is set
// only for timings: a figure of the image (a closure, an image size) holds on any machine, a
// time only on machines like this one.
type key struct {
	// Kind is what is measured: "find" (is Module a module), "stdlib", "probe" (closure and
	// availability), "cold" (timed imports), "own" (timed imports after Preload),
	// "cold-start" (the bare executor), "restore-line" (captures and timed restores of Sets),
	// "pooled-line" (the same, restored onto sandboxes created ahead, and their cold starts).
	Kind string `json:"kind"`
	// Code is a digest of the Python that measures: changing it measures everything again.
	Code         string   `json:"code"`
	RootfsDigest string   `json:"rootfs_digest"`
	RunscSHA256  string   `json:"runsc_sha256"`
	Spec         string   `json:"spec"`
	RunscFlags   []string `json:"runsc_flags"`
	Host         string   `json:"host,omitempty"`
	Runs         int      `json:"runs,omitempty"`
	Module       string   `json:"module,omitempty"`
	Preload      []string `json:"preload,omitempty"`
	// RestoreFlags, CheckpointOptions and Sets shape "restore-line" and "pooled-line".
	RestoreFlags      []string          `json:"restore_flags,omitempty"`
	CheckpointOptions map[string]string `json:"checkpoint_options,omitempty"`
	Sets              [][]string        `json:"sets,omitempty"`
}

// of returns the key of kind over k, with a list of its own.
func (k key) of(kind string) key {
	k.Kind = kind
	k.RunscFlags = slices.Clone(k.RunscFlags)
	return k
}

// digest returns the key's sha256 over its canonical JSON (struct fields in a fixed order).
func (k key) digest() string {
	data, _ := json.Marshal(k) // a struct of strings, ints and string slices always marshals
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// cache holds measurements, one file per key: dir/KIND/HEX.json holding the key and the value.
// Files are written atomically (a reader sees a whole entry or none), so runs on other
// machines and in other pods may share it: two runs measuring the same key both write a valid
// entry and the last rename wins. An entry is taken only when it names its own key and its
// value decodes; anything else is measured again and overwritten.
type cache struct {
	dir string
	// readOnly refuses to measure: what is not cached is reported (errNotCached).
	readOnly bool
}

// errNotCached reports a measurement that a read-only analysis would have had to make.
var errNotCached = errors.New("not in the analysis cache")

type entry struct {
	Key   key             `json:"key"`
	Value json.RawMessage `json:"value"`
}

func (c *cache) path(k key) string {
	return filepath.Join(c.dir, k.Kind, k.digest()+".json")
}

// get decodes the entry of k into v and reports whether there was a valid one.
func (c *cache) get(k key, v any) (bool, error) {
	f, err := os.Open(c.path(k))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("analysis cache: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return false, fmt.Errorf("analysis cache: %w", err)
	}
	var e entry
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if dec.Decode(&e) != nil || !reflect.DeepEqual(normal(e.Key), normal(k)) {
		return false, nil // torn by hand, or another key's: measured again, then overwritten
	}
	vdec := json.NewDecoder(bytes.NewReader(e.Value))
	vdec.DisallowUnknownFields()
	if vdec.Decode(v) != nil {
		return false, nil
	}
	return true, nil
}

// normal makes empty and absent slices compare equal.
func normal(k key) key {
	for _, s := range []*[]string{&k.RunscFlags, &k.Preload, &k.RestoreFlags} {
		if len(*s) == 0 {
			*s = nil
		}
	}
	if len(k.Sets) == 0 {
		k.Sets = nil
	}
	if len(k.CheckpointOptions) == 0 {
		k.CheckpointOptions = nil
	}
	return k
}

// put writes v as the entry of k, atomically.
func (c *cache) put(k key, v any) error {
	value, err := json.Marshal(v)
	if err != nil {
		return err
	}
	path := c.path(k)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("analysis cache: %w", err)
	}
	data, err := json.Marshal(entry{Key: k, Value: value})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("analysis cache: %w", err)
	}
	return nil
}

// lookup returns the cached value of k, or measures it with measure and caches it. measured
// says whether it was measured now.
func lookup[T any](c *cache, k key, measure func() (T, error)) (v T, measured bool, err error) {
	ok, err := c.get(k, &v)
	if err != nil || ok {
		return v, false, err
	}
	if c.readOnly {
		return v, false, fmt.Errorf("%w: %s %s", errNotCached, k.Kind, k.Module)
	}
	if v, err = measure(); err != nil {
		return v, true, err
	}
	return v, true, c.put(k, v)
}
