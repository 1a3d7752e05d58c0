package pyreq

import (
	"errors"
	"strings"
	"testing"
)

// The examples below are PEP 440's own unless a comment says otherwise.

func TestOrdering(t *testing.T) {
	// "Summary of permitted suffixes and relative ordering", then the epoch example.
	for _, chain := range [][]string{
		{"1.0.dev456", "1.0a1", "1.0a2.dev456", "1.0a12.dev456", "1.0a12", "1.0b1.dev456", "1.0b2",
			"1.0b2.post345.dev456", "1.0b2.post345", "1.0rc1.dev456", "1.0rc1", "1.0", "1.0+abc.5",
			"1.0+abc.7", "1.0+5", "1.0.post456.dev34", "1.0.post456", "1.0.15", "1.1.dev1"},
		{"2013.10", "2014.04", "1!1.0", "1!1.1", "1!2.0"},
		{"1.0+abc", "1.0+abc.1", "1.0+1", "1.0+2", "1.0+10"}, // local: strings before numbers, numbers as numbers
	} {
		for i := 1; i < len(chain); i++ {
			a, b := mustVersion(t, chain[i-1]), mustVersion(t, chain[i])
			if a.Compare(b) != -1 || b.Compare(a) != 1 {
				t.Errorf("want %s < %s (Compare %d, %d)", chain[i-1], chain[i], a.Compare(b), b.Compare(a))
			}
		}
	}
	for _, eq := range [][2]string{{"1.0", "1.0.0"}, {"1.1", "1.1.0.0"}, {"0!1.0", "1.0"}, {"1.0+Ubuntu-1", "1.0+ubuntu.1"}, {"1.0-1", "1.0.post1"}} {
		if c := mustVersion(t, eq[0]).Compare(mustVersion(t, eq[1])); c != 0 {
			t.Errorf("%s vs %s: %d, want equal", eq[0], eq[1], c)
		}
	}
}

func TestNormalization(t *testing.T) {
	// "Normalization": each permitted spelling and its normal form.
	for in, want := range map[string]string{
		"1.1RC1": "1.1rc1", "1.0a": "1.0a0", "1.0-alpha1": "1.0a1", "1.0.beta.2": "1.0b2", "1.0c1": "1.0rc1",
		"1.0pre1": "1.0rc1", "1.0preview1": "1.0rc1", "1.0.post": "1.0.post0", "1.0-r4": "1.0.post4",
		"1.0rev4": "1.0.post4", "1.0-1": "1.0.post1", "1.0.dev": "1.0.dev0", "1.0-dev2": "1.0.dev2",
		"v1.0": "1.0", "V1.0": "1.0", "1.01": "1.1", "00.0": "0.0", " 1.0 ": "1.0", "1.0+ubuntu-1": "1.0+ubuntu.1",
		"1!1.0": "1!1.0", "0!1.0": "1.0", "2.2.3+dfsg": "2.2.3+dfsg", "1.0a1.post2.dev3": "1.0a1.post2.dev3",
	} {
		v, err := ParseVersion(in)
		if err != nil || v.String() != want {
			t.Errorf("ParseVersion(%q) = %q, %v; want %q", in, v, err, want)
		}
	}
	for _, bad := range []string{"", "1.0+", "1.0+-a", "french toast", "1.0.", ".1", "1..0", "1.0a1a2", "1.0+ab c", "1!", "1.0-", "18446744073709551616"} {
		if v, err := ParseVersion(bad); err == nil || !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseVersion(%q) = %s, %v; want an error", bad, v, err)
		}
	}
}

func TestSpecifiers(t *testing.T) {
	for _, tc := range []struct {
		specs   string
		version string
		want    bool
	}{
		// "Version matching": exact and zero-padded.
		{"==1.1", "1.1.post1", false}, {"==1.1.post1", "1.1.post1", true}, {"==1.1.*", "1.1.post1", true},
		{"==1.1", "1.1a1", false}, {"==1.1a1", "1.1a1", true}, {"==1.1.*", "1.1a1", true},
		{"==1.1.0", "1.1", true}, {"==1.1.dev1", "1.1", false}, {"==1.1a1", "1.1", false},
		{"==1.1.post1", "1.1", false}, {"==1.1.*", "1.1", true},
		// Local versions: ignored unless the clause names one.
		{"==1.0", "1.0+local.7", true}, {"==1.0+local.7", "1.0+local.7", true}, {"==1.0+local.7", "1.0", false},
		{"==1.0+local.7", "1.0+local.8", false},
		// "Version exclusion".
		{"!=1.1", "1.1.post1", true}, {"!=1.1.post1", "1.1.post1", false}, {"!=1.1.*", "1.1.post1", false},
		// "Compatible release": ~=2.2 is >=2.2,==2.*, and so on.
		{"~=2.2", "2.2", true}, {"~=2.2", "2.9.1", true}, {"~=2.2", "3.0", false}, {"~=2.2", "2.1", false},
		{"~=1.4.5", "1.4.5", true}, {"~=1.4.5", "1.4.9", true}, {"~=1.4.5", "1.5.0", false},
		{"~=2.2.post3", "2.2.post3", true}, {"~=2.2.post3", "2.2", false}, {"~=2.2.post3", "2.5", true},
		{"~=1.4.5a4", "1.4.5a4", true}, {"~=1.4.5a4", "1.4.5", true}, {"~=1.4.5a4", "1.5", false},
		{"~=2.2.0", "2.2.9", true}, {"~=2.2.0", "2.3", false}, {"~=1.4.5.0", "1.4.5.9", true}, {"~=1.4.5.0", "1.4.6", false},
		// "Inclusive ordered comparison" and "Exclusive ordered comparison".
		{">1.7", "1.7.1", true}, {">1.7", "1.7.0.post1", false}, {">1.7.post2", "1.7.1", true},
		{">1.7.post2", "1.7.0.post3", true}, {">1.7.post2", "1.7.0", false}, {">1.7", "1.7+local", false},
		{"<3.1", "3.1.dev0", false}, {"<3.1", "3.0.dev0", true}, {"<3.1rc1", "3.1a1", true}, {"<3", "2.99", true},
		{"<=1.0", "1.0+local", true}, {">=1.0", "1.0+local", true}, {">=1.0", "1.0.dev0", false}, {"<=1.0", "1.0.post1", false},
		// Epochs: 1!1.0 is after every version without one.
		{">=2", "1!1.0", true}, {"<2014", "1!1.0", false}, {"==1!1.*", "1!1.0", true}, {"==1.*", "1!1.0", false},
		// Arbitrary equality compares strings.
		{"===foobar", "foobar", true}, {"===1.0", "1.0", true}, {"===1.0", "1.0.0", false}, {"===1.0", "1.0+local", false},
		// The examples, and Debian's local versions.
		{">=2.1,<3", "2.2.3+dfsg", true}, {">=2.2,<3", "2.2.3+dfsg", true}, {">=2", "1.5.3", false},
		{"==1.26.*", "1.26.4", true}, {"==1.26.*", "1.24.2", false}, {"==1.26.*", "1.26", true},
		{"~=1.4", "1.4.2", true}, {"~=1.4", "1.3.2", false}, {"!=1.24.*", "1.24.2", false},
		{"==1.0.0.*", "1", true}, // pypa/packaging pads the candidate
		{"", "anything at all", true},
		// A version that is not PEP 440 satisfies nothing but === that spells it.
		{">=0", "unknown", false}, {"===unknown", "UNKNOWN", true},
	} {
		ss, err := ParseSpecifiers(tc.specs)
		if err != nil {
			t.Errorf("ParseSpecifiers(%q): %v", tc.specs, err)
			continue
		}
		if got := ss.Allows(tc.version); got != tc.want {
			t.Errorf("%s allows %s: %v, want %v", tc.specs, tc.version, got, tc.want)
		}
	}
}

func TestBadSpecifiers(t *testing.T) {
	for spec, why := range map[string]string{
		">=":         "no version",
		"=>2":        "starts with one of",
		"2.0":        "starts with one of",
		">=2.*":      "only == and != take a .* prefix",
		"~=1.*":      "only == and != take a .* prefix",
		"~=2":        "two numbers or more",
		">=2+dfsg":   "local version",
		"~=2.2+dfsg": "local version",
		"==1.0a1.*":  "a .* prefix follows a release",
		"==1.*.1":    "not a PEP 440 version",
		">=v2":       "start with a digit",
		">=2,,<3":    "empty clause",
		">=2 <3":     "not a PEP 440 version",
		"=== a b":    "without spaces",
	} {
		_, err := ParseSpecifiers(spec)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseSpecifiers(%q): %v, want an error saying %q", spec, err, why)
		}
	}
}

func TestRequirements(t *testing.T) {
	for in, want := range map[string]struct{ name, key, specs string }{
		"pandas>=2.1,<3":        {"pandas", "pandas", ">=2.1,<3"},
		"numpy==1.26.*":         {"numpy", "numpy", "==1.26.*"},
		"scikit-learn~=1.4":     {"scikit-learn", "scikit-learn", "~=1.4"},
		" Scikit_Learn ~= 1.4 ": {"Scikit_Learn", "scikit-learn", "~=1.4"},
		"zope.interface":        {"zope.interface", "zope-interface", ""},
		"numpy (>=1.26)":        {"numpy", "numpy", ">=1.26"},
		"PyYAML>=6, !=6.0.1":    {"PyYAML", "pyyaml", ">=6,!=6.0.1"},
		"a":                     {"a", "a", ""},
	} {
		r, err := ParseRequirement(in)
		if err != nil || r.Name != want.name || r.Key() != want.key || r.Specifiers.String() != want.specs {
			t.Errorf("ParseRequirement(%q) = %+v (key %s, specs %s), %v; want %+v", in, r, r.Key(), r.Specifiers, err, want)
		}
	}
	for in, why := range map[string]string{
		"":                              "does not start with a distribution name",
		">=2":                           "does not start with a distribution name",
		"-pandas":                       "does not start with a distribution name",
		"pandas[excel]>=2":              "extras",
		"pandas>=2; python_version>'3'": "markers",
		"pandas @ https://x/p.whl":      "URL",
		"pandas (>=2":                   "unclosed",
		"pandas>=2,<":                   "no version",
		"pandas 2":                      "starts with one of",
		"pandas>=two":                   "start with a digit",
		strings.Repeat("a", 2000):       "longer than",
	} {
		_, err := ParseRequirement(in)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseRequirement(%q): %v, want an error saying %q", in, err, why)
		}
	}
	r, _ := ParseRequirement("pandas>=2.2,<3")
	if !r.Allows("2.2.3+dfsg") || r.Allows("1.5.3") || r.Allows("3.0.0") {
		t.Errorf("%s: want 2.2.3+dfsg in, 1.5.3 and 3.0.0 out", r)
	}
}

func TestNormalizeName(t *testing.T) {
	// PEP 503's examples: all of these are one name.
	for _, n := range []string{"friendly-bard", "Friendly-Bard", "FRIENDLY-BARD", "friendly.bard", "friendly_bard", "friendly--bard", "FrIeNdLy-._.-bArD"} {
		if got := NormalizeName(n); got != "friendly-bard" {
			t.Errorf("NormalizeName(%q) = %q", n, got)
		}
		if !IsName(n) {
			t.Errorf("IsName(%q) = false", n)
		}
	}
	for _, n := range []string{"", "-a", "a-", "a b", "a@b"} {
		if IsName(n) {
			t.Errorf("IsName(%q) = true", n)
		}
	}
}

func mustVersion(t *testing.T, s string) Version {
	t.Helper()
	v, err := ParseVersion(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// FuzzRequirement parses anything without panicking; what parses has a canonical spelling that
// parses again to the same requirement, and a version that parses prints a normal form that
// parses to an equal version.
func FuzzRequirement(f *testing.F) {
	for _, s := range []string{"pandas>=2.1,<3", "numpy==1.26.*", "scikit-learn~=1.4", "a (===x)", "b!=1!2.0a1.post2.dev3+x.4", "c<=0"} {
		f.Add(s, "2.2.3+dfsg")
	}
	f.Fuzz(func(t *testing.T, req, version string) {
		if v, err := ParseVersion(version); err == nil {
			w, err := ParseVersion(v.String())
			if err != nil || w.Compare(v) != 0 || w.String() != v.String() {
				t.Errorf("version %q: normal form %q reparses to %q, %v", version, v, w, err)
			}
		}
		r, err := ParseRequirement(req)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%q: error %v does not wrap ErrInvalid", req, err)
			}
			return
		}
		again, err := ParseRequirement(r.String())
		if err != nil || again.String() != r.String() || again.Key() != r.Key() {
			t.Errorf("%q: canonical %q reparses to %q, %v", req, r, again, err)
		}
		_ = r.Allows(version)
	})
}

// TestSpecifierLiteral: a Specifier built field by field, not parsed, says no rather than
// panicking (a ~= without a release has no prefix to cut).
func TestSpecifierLiteral(t *testing.T) {
	v := mustVersion(t, "1.0")
	for _, sp := range []Specifier{{Op: "~="}, {Op: "=="}, {Op: "<"}, {Op: "?"}} {
		_ = sp.Contains(v)
	}
	if (Specifier{Op: "~="}).Contains(v) {
		t.Error("~= without a version contains 1.0")
	}
}
