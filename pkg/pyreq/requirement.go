package pyreq

import (
	"fmt"
	"regexp"
	"strings"
)

// MaxRequirementBytes bounds a requirement string.
const MaxRequirementBytes = 1024

// nameRE is PEP 508's distribution name: letters, digits, and . _ - inside.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?`)

var separatorsRE = regexp.MustCompile(`[-_.]+`)

// NormalizeName returns PEP 503's normal form of a distribution name: lower case, each run of
// - _ . one -. Scikit_Learn and scikit-learn are one distribution.
func NormalizeName(name string) string {
	return separatorsRE.ReplaceAllString(strings.ToLower(name), "-")
}

// IsName reports whether s is a PEP 508 distribution name.
func IsName(s string) bool {
	return nameRE.FindString(s) == s && s != ""
}

// Requirement is a distribution name and the versions it admits, as pip takes it on its
// command line (PEP 508, without extras, markers or URLs): pandas>=2.1,<3.
type Requirement struct {
	// Name is the distribution's name as written; Key compares.
	Name       string
	Specifiers Specifiers
}

// ParseRequirement parses a requirement string: a name, then optional clauses, possibly in
// parentheses (numpy (>=1.26)). Extras ([excel]), markers (; python_version...) and URLs
// (@ https://...) are refused, naming what was found.
func ParseRequirement(s string) (Requirement, error) {
	if len(s) > MaxRequirementBytes {
		return Requirement{}, fmt.Errorf("%w: longer than %d bytes", ErrInvalid, MaxRequirementBytes)
	}
	text := strings.TrimSpace(s)
	name := nameRE.FindString(text)
	if name == "" {
		return Requirement{}, fmt.Errorf("%w: %q does not start with a distribution name (letters, digits, . _ -)", ErrInvalid, text)
	}
	rest := strings.TrimSpace(text[len(name):])
	switch {
	case strings.HasPrefix(rest, "["):
		return Requirement{}, fmt.Errorf("%w: %q: extras ([...]) are not supported: name the distributions", ErrInvalid, text)
	case strings.Contains(rest, ";"):
		return Requirement{}, fmt.Errorf("%w: %q: environment markers (; ...) are not supported", ErrInvalid, text)
	case strings.HasPrefix(rest, "@"):
		return Requirement{}, fmt.Errorf("%w: %q: URL requirements (@ ...) are not supported", ErrInvalid, text)
	case strings.HasPrefix(rest, "("):
		inner, ok := strings.CutSuffix(rest[1:], ")")
		if !ok {
			return Requirement{}, fmt.Errorf("%w: %q: unclosed parenthesis", ErrInvalid, text)
		}
		rest = inner
	}
	specs, err := ParseSpecifiers(rest)
	if err != nil {
		return Requirement{}, fmt.Errorf("%w (in %q)", err, text)
	}
	return Requirement{Name: name, Specifiers: specs}, nil
}

// Key returns the normalized name (NormalizeName): distributions are looked up by it.
func (r Requirement) Key() string { return NormalizeName(r.Name) }

// String returns the requirement in a canonical spelling: name, then clauses (pandas>=2.1,<3).
func (r Requirement) String() string { return r.Name + r.Specifiers.String() }

// Allows reports whether the installed version satisfies the requirement's clauses (the name
// is the caller's to match).
func (r Requirement) Allows(installed string) bool { return r.Specifiers.Allows(installed) }
