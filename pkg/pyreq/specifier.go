package pyreq

import (
	"fmt"
	"regexp"
	"strings"
)

// Specifier is one version clause of a requirement, such as >=2.1 or ==1.26.*.
type Specifier struct {
	// Op is one of ~= == != <= >= < > ===.
	Op string
	// Version is the clause's version (unset for ===, which compares strings).
	Version Version
	// Wildcard is true for ==V.* and !=V.*: a prefix match on V's release.
	Wildcard bool
	raw      string
}

var specifierRE = regexp.MustCompile(`^\s*(~=|===|==|!=|<=|>=|<|>)\s*(.*?)\s*$`)

// ParseSpecifier parses one clause: an operator and a version.
func ParseSpecifier(s string) (Specifier, error) {
	m := specifierRE.FindStringSubmatch(s)
	if m == nil {
		return Specifier{}, fmt.Errorf("%w: %q: a version clause starts with one of ~= == != <= >= < > ===", ErrInvalid, strings.TrimSpace(s))
	}
	sp := Specifier{Op: m[1], raw: m[2]}
	text := m[2]
	if text == "" {
		return Specifier{}, fmt.Errorf("%w: %q: no version after %s", ErrInvalid, strings.TrimSpace(s), sp.Op)
	}
	if sp.Op == "===" {
		// Arbitrary equality compares strings: anything without white space or separators.
		if strings.ContainsAny(text, " \t,;()") {
			return Specifier{}, fmt.Errorf("%w: %q: === takes one string without spaces, commas or ;", ErrInvalid, strings.TrimSpace(s))
		}
		return sp, nil
	}
	if text[0] < '0' || text[0] > '9' {
		return Specifier{}, fmt.Errorf("%w: %q: the version must start with a digit", ErrInvalid, strings.TrimSpace(s))
	}
	if v, ok := strings.CutSuffix(text, ".*"); ok {
		if sp.Op != "==" && sp.Op != "!=" {
			return Specifier{}, fmt.Errorf("%w: %q: only == and != take a .* prefix", ErrInvalid, strings.TrimSpace(s))
		}
		sp.Wildcard, text = true, v
	}
	v, err := ParseVersion(text)
	if err != nil {
		return Specifier{}, fmt.Errorf("%w: %q: %q is not a PEP 440 version", ErrInvalid, strings.TrimSpace(s), text)
	}
	sp.Version = v
	switch {
	case sp.Wildcard && (v.IsPrerelease() || v.IsPostrelease() || v.Local()):
		return Specifier{}, fmt.Errorf("%w: %q: a .* prefix follows a release (1.26.*), not a pre-, post-, dev or local version", ErrInvalid, strings.TrimSpace(s))
	case v.Local() && sp.Op != "==" && sp.Op != "!=":
		return Specifier{}, fmt.Errorf("%w: %q: only == and != take a local version (+label)", ErrInvalid, strings.TrimSpace(s))
	case sp.Op == "~=" && len(v.Release) < 2:
		return Specifier{}, fmt.Errorf("%w: %q: ~= needs a release of two numbers or more (~=1.4)", ErrInvalid, strings.TrimSpace(s))
	}
	return sp, nil
}

// String returns the clause as written, without spaces.
func (sp Specifier) String() string { return sp.Op + sp.raw }

// Contains reports whether v satisfies the clause (PEP 440, "Version specifiers";
// pypa/packaging's Specifier.contains with pre-releases allowed).
func (sp Specifier) Contains(v Version) bool {
	s := sp.Version
	switch sp.Op {
	case "==":
		return sp.equal(v)
	case "!=":
		return !sp.equal(v)
	case "<=":
		return v.public().Compare(s) <= 0
	case ">=":
		return v.public().Compare(s) >= 0
	case "<":
		// <V excludes V's own pre-releases unless V is one: <3.1 does not admit 3.1.dev0.
		if v.Compare(s) >= 0 {
			return false
		}
		return s.IsPrerelease() || !v.IsPrerelease() || v.base().Compare(s.base()) != 0
	case ">":
		// >V excludes V's post-releases unless V is one, and V's local versions.
		if v.Compare(s) <= 0 {
			return false
		}
		if !s.IsPostrelease() && v.IsPostrelease() && v.base().Compare(s.base()) == 0 {
			return false
		}
		return !v.Local() || v.base().Compare(s.base()) != 0
	case "~=":
		// ~=2.2.1 is >=2.2.1, ==2.2.*: the release without its last number as a prefix. A
		// Specifier built without ParseSpecifier may lack the release.
		return len(s.Release) > 0 && v.public().Compare(s) >= 0 && v.releasePrefix(s.Epoch, s.Release[:len(s.Release)-1])
	}
	return false // === is matched on strings: see Requirement.Allows
}

// equal reports whether v matches ==: a prefix match for V.*; otherwise v's public version
// equals V, or v itself when V has a local label.
func (sp Specifier) equal(v Version) bool {
	if sp.Wildcard {
		return v.releasePrefix(sp.Version.Epoch, sp.Version.Release)
	}
	if !sp.Version.Local() {
		v = v.public()
	}
	return v.Compare(sp.Version) == 0
}

// Specifiers are a requirement's clauses, all of which a version must satisfy.
type Specifiers []Specifier

// ParseSpecifiers parses comma-separated clauses (>=2.1,<3); "" is none (any version).
func ParseSpecifiers(s string) (Specifiers, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out Specifiers
	for clause := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(clause) == "" {
			return nil, fmt.Errorf("%w: %q: an empty clause between commas", ErrInvalid, s)
		}
		sp, err := ParseSpecifier(clause)
		if err != nil {
			return nil, err
		}
		out = append(out, sp)
	}
	return out, nil
}

// String returns the clauses joined by commas.
func (ss Specifiers) String() string {
	parts := make([]string, len(ss))
	for i, sp := range ss {
		parts[i] = sp.String()
	}
	return strings.Join(parts, ",")
}

// Allows reports whether an installed version, as its metadata spells it, satisfies every
// clause. A version that is not PEP 440 satisfies only === clauses that spell it (case aside),
// and no other clause.
func (ss Specifiers) Allows(installed string) bool {
	v, err := ParseVersion(installed)
	for _, sp := range ss {
		switch {
		case sp.Op == "===":
			if !strings.EqualFold(strings.TrimSpace(installed), sp.raw) {
				return false
			}
		case err != nil || !sp.Contains(v):
			return false
		}
	}
	return true
}
