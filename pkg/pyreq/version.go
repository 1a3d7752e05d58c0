// Package pyreq reads Python package requirements: PEP 440 versions and version specifiers,
// and PEP 508 requirement strings of a distribution name and specifiers (pandas>=2.1,<3), with
// names compared as PEP 503 normalizes them. It decides whether an installed version satisfies
// a requirement the way pip's resolver and `pip check` do (pypa/packaging), pre-releases
// included: an installed version is what it is.
//
// It implements every specifier operator (~=, ==, !=, <=, >=, <, >, ===), prefix matching
// (==1.26.*, !=1.*), epochs, pre-, post- and dev releases and local versions (2.2.3+dfsg).
// Extras, environment markers and URL requirements are refused with an error that says so.
package pyreq

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ErrInvalid wraps every parse error of this package.
var ErrInvalid = errors.New("invalid requirement")

// versionPattern is PEP 440's (Appendix B, as pypa/packaging spells it), with its permitted
// spellings: a leading v, separators - _ . between segments, alpha/beta/c/pre/preview/rev/r.
const versionPattern = `v?` +
	`(?:(?P<epoch>[0-9]+)!)?` +
	`(?P<release>[0-9]+(?:\.[0-9]+)*)` +
	`(?P<pre>[-_\.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_\.]?(?P<pre_n>[0-9]+)?)?` +
	`(?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_\.]?(?P<post_l>post|rev|r)[-_\.]?(?P<post_n2>[0-9]+)?))?` +
	`(?P<dev>[-_\.]?(?P<dev_l>dev)[-_\.]?(?P<dev_n>[0-9]+)?)?` +
	`(?:\+(?P<local>[a-z0-9]+(?:[-_\.][a-z0-9]+)*))?`

var versionRE = regexp.MustCompile(`(?i)^\s*` + versionPattern + `\s*$`)

// Pre-release kinds, in PEP 440's order.
const (
	noPre = iota
	alpha
	beta
	rc
)

// Version is a PEP 440 version.
type Version struct {
	Epoch   uint64
	Release []uint64
	// preKind is noPre or alpha, beta, rc; pre its number.
	preKind int
	pre     uint64
	hasPost bool
	post    uint64
	hasDev  bool
	dev     uint64
	// local are the local label's parts, lower case; a part of digits only compares as a number.
	local []string
}

// ParseVersion parses a PEP 440 version, in any spelling the PEP permits.
func ParseVersion(s string) (Version, error) {
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return Version{}, fmt.Errorf("%w: version %q is not a PEP 440 version", ErrInvalid, s)
	}
	g := func(name string) string { return m[versionRE.SubexpIndex(name)] }
	var v Version
	var err error
	num := func(digits string) uint64 {
		if digits == "" || err != nil {
			return 0
		}
		n, e := strconv.ParseUint(digits, 10, 64)
		if e != nil {
			err = fmt.Errorf("%w: version %q: number %s is too large", ErrInvalid, s, digits)
		}
		return n
	}
	v.Epoch = num(g("epoch"))
	for part := range strings.SplitSeq(g("release"), ".") {
		v.Release = append(v.Release, num(part))
	}
	if g("pre") != "" {
		switch strings.ToLower(g("pre_l")) {
		case "a", "alpha":
			v.preKind = alpha
		case "b", "beta":
			v.preKind = beta
		default: // c, rc, pre, preview
			v.preKind = rc
		}
		v.pre = num(g("pre_n"))
	}
	if g("post") != "" {
		v.hasPost = true
		v.post = num(g("post_n1") + g("post_n2")) // at most one of them is set
	}
	if g("dev") != "" {
		v.hasDev = true
		v.dev = num(g("dev_n"))
	}
	if l := g("local"); l != "" {
		v.local = strings.FieldsFunc(strings.ToLower(l), func(r rune) bool { return r == '-' || r == '_' || r == '.' })
	}
	if err != nil {
		return Version{}, err
	}
	return v, nil
}

// String returns the version's normal form (PEP 440, "Normalization").
func (v Version) String() string {
	var b strings.Builder
	if v.Epoch != 0 {
		fmt.Fprintf(&b, "%d!", v.Epoch)
	}
	b.WriteString(v.BaseRelease())
	if v.preKind != noPre {
		fmt.Fprintf(&b, "%s%d", [...]string{"", "a", "b", "rc"}[v.preKind], v.pre)
	}
	if v.hasPost {
		fmt.Fprintf(&b, ".post%d", v.post)
	}
	if v.hasDev {
		fmt.Fprintf(&b, ".dev%d", v.dev)
	}
	if len(v.local) > 0 {
		b.WriteString("+" + strings.Join(v.local, "."))
	}
	return b.String()
}

// BaseRelease returns the release segment, dotted (1.26.4).
func (v Version) BaseRelease() string {
	parts := make([]string, len(v.Release))
	for i, n := range v.Release {
		parts[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(parts, ".")
}

// IsPrerelease reports whether v is a pre-release or a development release.
func (v Version) IsPrerelease() bool { return v.preKind != noPre || v.hasDev }

// IsPostrelease reports whether v is a post-release.
func (v Version) IsPostrelease() bool { return v.hasPost }

// Local reports whether v has a local version label.
func (v Version) Local() bool { return len(v.local) > 0 }

// public returns v without its local label.
func (v Version) public() Version {
	v.local = nil
	return v
}

// base returns v's epoch and release alone.
func (v Version) base() Version {
	return Version{Epoch: v.Epoch, Release: v.Release}
}

// Compare orders versions as PEP 440 does: -1 when v sorts before w, 0 when they are equal
// (1.0 and 1.0.0 are), +1 after. Within a release, .devN < aN < bN < rcN < the release <
// .postN; a local label sorts after the same public version.
func (v Version) Compare(w Version) int {
	if c := cmp.Compare(v.Epoch, w.Epoch); c != 0 {
		return c
	}
	if c := cmpRelease(v.Release, w.Release); c != 0 {
		return c
	}
	// A dev release of a final release sorts before its pre-releases.
	if c := cmp.Compare(v.preRank(), w.preRank()); c != 0 {
		return c
	}
	if v.preKind != noPre {
		if c := cmp.Compare(v.pre, w.pre); c != 0 {
			return c
		}
	}
	if v.hasPost != w.hasPost {
		return cmpBool(v.hasPost, w.hasPost)
	}
	if c := cmp.Compare(v.post, w.post); c != 0 {
		return c
	}
	if v.hasDev != w.hasDev {
		return -cmpBool(v.hasDev, w.hasDev) // no dev sorts after any dev
	}
	if c := cmp.Compare(v.dev, w.dev); c != 0 {
		return c
	}
	return cmpLocal(v.local, w.local)
}

// preRank places v's pre-release among its release's: 0 for a dev release of the final
// release (1.0.dev1), then alpha, beta, rc, then 4 for no pre-release.
func (v Version) preRank() int {
	switch {
	case v.preKind != noPre:
		return v.preKind
	case v.hasDev && !v.hasPost:
		return 0
	}
	return 4
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// cmpRelease compares releases as if the shorter were padded with zeros.
func cmpRelease(a, b []uint64) int {
	for i := range max(len(a), len(b)) {
		var x, y uint64
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if c := cmp.Compare(x, y); c != 0 {
			return c
		}
	}
	return 0
}

// cmpLocal compares local labels: none sorts first; part by part, a number sorts after a
// string, numbers as numbers, strings as strings; a label that is a prefix of another first.
func cmpLocal(a, b []string) int {
	for i := range min(len(a), len(b)) {
		x, xErr := strconv.ParseUint(a[i], 10, 64)
		y, yErr := strconv.ParseUint(b[i], 10, 64)
		xNum, yNum := isDigits(a[i]), isDigits(b[i])
		var c int
		switch {
		case xNum && yNum && xErr == nil && yErr == nil:
			c = cmp.Compare(x, y)
		case xNum && yNum: // past uint64: compare the digits without leading zeros
			c = cmpDigits(a[i], b[i])
		case xNum != yNum:
			c = cmpBool(xNum, yNum)
		default:
			c = strings.Compare(a[i], b[i])
		}
		if c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

func cmpDigits(a, b string) int {
	a, b = strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")
	if c := cmp.Compare(len(a), len(b)); c != 0 {
		return c
	}
	return strings.Compare(a, b)
}

// releasePrefix reports whether v's release, padded with zeros or cut to len(prefix), is
// prefix, with the same epoch: the test of ==prefix.*.
func (v Version) releasePrefix(epoch uint64, prefix []uint64) bool {
	if v.Epoch != epoch {
		return false
	}
	r := slices.Clone(v.Release)
	for len(r) < len(prefix) {
		r = append(r, 0)
	}
	return slices.Equal(r[:len(prefix)], prefix)
}
