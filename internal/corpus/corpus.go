// Package corpus reads a corpus of requests (what each imports, how often it occurs), splits it
// deterministically into a part to plan from and a held-out part, and resolves the names the
// requests import to the modules of an image.
package corpus

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"

	"readie.dev/pipeline/pkg/catalogue"
	"readie.dev/pipeline/pkg/pyreq"
)

// ErrInvalid wraps every problem of a corpus.
var ErrInvalid = errors.New("invalid corpus")

const (
	// MaxLineBytes bounds one line of JSON Lines.
	MaxLineBytes = 1 << 20
	// MaxArrayBytes bounds a corpus given as one JSON array (read whole, to name lines).
	MaxArrayBytes = 1 << 30
	// MaxWeight bounds one request's weight, so that sums of weights times costs stay finite
	// (a corpus of 1e308s would plan on infinities and write no JSON).
	MaxWeight = 1e12
)

// Request is one request of a corpus.
type Request struct {
	// Imports are the names the request imports, as written in code (a module such as
	// matplotlib.pyplot, or a name imported from one such as sklearn.svm.SVC), in the order
	// given, each once. Empty: the request needs only the interpreter.
	Imports []string
	// Packages are the distributions the request needs, as pip requirements (pandas>=2.1,<3),
	// in the order given: a start whose loaded versions do not satisfy one is never chosen.
	Packages []pyreq.Requirement
	// Weight is how often the request occurs (default 1); it may be fractional.
	Weight float64
	// Line is the line of the file where the request starts, from 1.
	Line int
}

// Corpus is the requests of a file, in file order.
type Corpus struct {
	Requests []Request
}

// Load reads the corpus at path.
func Load(path string) (*Corpus, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	defer f.Close()
	c, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse reads a corpus: JSON Lines, one object per line ({"imports": [...], "weight": 3}; blank
// lines are skipped), or one JSON array of such objects, told apart by the first byte that is
// not white space; packages ({"imports": ["pandas"], "packages": ["pandas>=2.1,<3"]}) are pip
// requirement strings. Other keys are ignored. Every problem is an error
// wrapping ErrInvalid that names the line; a corpus without requests is an error.
func Parse(r io.Reader) (*Corpus, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	first, err := firstByte(br)
	if err != nil {
		return nil, err
	}
	p := &parser{names: map[string]string{}}
	if first == '[' {
		err = p.array(br)
	} else {
		err = p.lines(br)
	}
	if err != nil {
		return nil, err
	}
	if len(p.corpus.Requests) == 0 {
		return nil, fmt.Errorf("%w: no requests", ErrInvalid)
	}
	return &p.corpus, nil
}

// firstByte skips a UTF-8 byte order mark and returns the first byte that is not white space,
// leaving it unread; 0 at the end of the input.
func firstByte(br *bufio.Reader) (byte, error) {
	if bom, err := br.Peek(3); err == nil && bytes.Equal(bom, []byte("\xef\xbb\xbf")) {
		br.Discard(3)
	}
	for n := 1; ; n++ {
		b, err := br.Peek(n)
		if len(b) < n {
			if errors.Is(err, io.EOF) || err == nil {
				return 0, nil
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				// Over 64 KiB of white space: read as JSON Lines, which skips it line by line.
				return ' ', nil
			}
			return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if c := b[n-1]; !isSpace(c) {
			return c, nil
		}
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

type parser struct {
	corpus Corpus
	// names interns the names, so that the requests of a large corpus share their strings.
	names map[string]string
}

func (p *parser) lines(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxLineBytes)
	line := 0
	for sc.Scan() {
		line++
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		if err := p.add(raw, line); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("%w: line %d: longer than %d bytes", ErrInvalid, line+1, MaxLineBytes)
		}
		return fmt.Errorf("%w: after line %d: %w", ErrInvalid, line, err)
	}
	return nil
}

func (p *parser) array(r io.Reader) error {
	data, err := io.ReadAll(io.LimitReader(r, MaxArrayBytes+1))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(data) > MaxArrayBytes {
		return fmt.Errorf("%w: a JSON array corpus larger than %d bytes: use JSON Lines", ErrInvalid, MaxArrayBytes)
	}
	lines := lineCounter{data: data}
	dec := json.NewDecoder(bytes.NewReader(data))
	syntax := func(err error) error {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fmt.Errorf("%w: line %d: %w", ErrInvalid, lines.at(int(se.Offset)), err)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: line %d: the array is not closed", ErrInvalid, lines.at(len(data)))
		}
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if _, err := dec.Token(); err != nil { // '['
		return syntax(err)
	}
	for dec.More() {
		start := skipSpace(data, int(dec.InputOffset()))
		// Decode past the separating comma first: InputOffset stops before it.
		if start < len(data) && data[start] == ',' {
			start = skipSpace(data, start+1)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return syntax(err)
		}
		if err := p.add(raw, lines.at(start)); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // ']'
		return syntax(err)
	}
	if rest := skipSpace(data, int(dec.InputOffset())); rest < len(data) {
		return fmt.Errorf("%w: line %d: data after the array", ErrInvalid, lines.at(rest))
	}
	return nil
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && isSpace(data[i]) {
		i++
	}
	return i
}

// lineCounter maps offsets, asked in increasing order, to line numbers.
type lineCounter struct {
	data       []byte
	off, lines int
}

func (l *lineCounter) at(offset int) int {
	offset = min(offset, len(l.data))
	if offset < l.off {
		l.off, l.lines = 0, 0
	}
	l.lines += bytes.Count(l.data[l.off:offset], []byte{'\n'})
	l.off = offset
	return l.lines + 1
}

// add parses one request object.
func (p *parser) add(raw []byte, line int) error {
	req, err := p.request(raw)
	if err != nil {
		return fmt.Errorf("%w: line %d: %w", ErrInvalid, line, err)
	}
	req.Line = line
	p.corpus.Requests = append(p.corpus.Requests, req)
	return nil
}

func (p *parser) request(raw []byte) (Request, error) {
	if kind := jsonKind(raw); kind != "an object" {
		return Request{}, fmt.Errorf("%s, not an object", kind)
	}
	// A map, not a struct: encoding/json would match "Imports" or "WEIGHT" to the fields.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return Request{}, err
	}
	req := Request{Weight: 1}
	imports, ok := fields["imports"]
	if !ok {
		return Request{}, errors.New(`no "imports" (a list of module names; [] for none)`)
	}
	if kind := jsonKind(imports); kind != "a list" {
		return Request{}, fmt.Errorf("imports is %s, not a list of module names", kind)
	}
	var names []string
	if err := json.Unmarshal(imports, &names); err != nil {
		return Request{}, importsError(imports, err)
	}
	req.Imports = names[:0]
	for i, name := range names {
		if !catalogue.IsModuleName(name) {
			return Request{}, fmt.Errorf("imports[%d] %q is not a dotted Python name (such as matplotlib.pyplot)", i, name)
		}
		if slices.Contains(req.Imports, name) {
			continue
		}
		interned, ok := p.names[name]
		if !ok {
			interned = name
			p.names[name] = name
		}
		req.Imports = append(req.Imports, interned)
	}
	req.Imports = slices.Clip(req.Imports)
	if packages, ok := fields["packages"]; ok {
		reqs, err := parsePackages(packages)
		if err != nil {
			return Request{}, err
		}
		req.Packages = reqs
	}
	if w, ok := fields["weight"]; ok {
		if kind := jsonKind(w); kind != "a number" {
			return Request{}, fmt.Errorf("weight is %s, not a number", kind)
		}
		v, err := strconv.ParseFloat(string(w), 64)
		if err != nil || math.IsInf(v, 0) {
			return Request{}, fmt.Errorf("weight %s is out of range", w)
		}
		if v <= 0 || v > MaxWeight {
			return Request{}, fmt.Errorf("weight %s: want a number > 0 and at most %g", w, float64(MaxWeight))
		}
		req.Weight = v
	}
	return req, nil
}

// parsePackages reads a request's packages: a list of pip requirement strings.
func parsePackages(raw []byte) ([]pyreq.Requirement, error) {
	if kind := jsonKind(raw); kind != "a list" {
		return nil, fmt.Errorf("packages is %s, not a list of requirements (such as \"pandas>=2.1,<3\")", kind)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("packages: %w", err)
	}
	out := make([]pyreq.Requirement, 0, len(items))
	for i, item := range items {
		var s string
		if jsonKind(item) != "a string" || json.Unmarshal(item, &s) != nil {
			return nil, fmt.Errorf("packages[%d] is %s, not a requirement string", i, jsonKind(item))
		}
		r, err := pyreq.ParseRequirement(s)
		if err != nil {
			return nil, fmt.Errorf("packages[%d]: %w", i, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// importsError says which item of a list that is not a list of strings is wrong.
func importsError(imports []byte, err error) error {
	var items []json.RawMessage
	if json.Unmarshal(imports, &items) == nil {
		for i, item := range items {
			if kind := jsonKind(item); kind != "a string" {
				return fmt.Errorf("imports[%d] is %s, not a module name", i, kind)
			}
		}
	}
	return fmt.Errorf("imports: %w", err)
}

// jsonKind names the kind of a JSON value by its first byte.
func jsonKind(raw []byte) string {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return "nothing"
	}
	switch c := raw[0]; {
	case c == '{':
		return "an object"
	case c == '[':
		return "a list"
	case c == '"':
		return "a string"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	case c == '-' || c >= '0' && c <= '9':
		return "a number"
	default:
		return "not JSON"
	}
}

// Weight returns the sum of the requests' weights.
func Weight(requests []Request) float64 {
	var w float64
	for _, r := range requests {
		w += r.Weight
	}
	return w
}

// Names returns the distinct names the requests import, sorted.
func (c *Corpus) Names() []string {
	seen := map[string]bool{}
	var names []string
	for _, r := range c.Requests {
		for _, n := range r.Imports {
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	return names
}
