package corpus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParseFormats(t *testing.T) {
	want := []Request{
		{Imports: []string{"pandas", "matplotlib.pyplot"}, Weight: 3, Line: 1},
		{Imports: []string{}, Weight: 1, Line: 3},
		{Imports: []string{"sklearn.svm.SVC"}, Weight: 0.5, Line: 4},
	}
	for name, input := range map[string]string{
		"lines": `{"imports": ["pandas", "matplotlib.pyplot"], "weight": 3, "category": "x"}

{"imports": []}
   {"imports": ["sklearn.svm.SVC", "sklearn.svm.SVC"], "weight": 0.5, "Weight": "ignored"}
`,
		"array": `[{"imports": ["pandas", "matplotlib.pyplot"], "weight": 3},
  
  {"imports": []}
  , {"imports": ["sklearn.svm.SVC"], "weight": 5e-1}]`,
		"lines with a BOM and CRLF": "\ufeff{\"imports\": [\"pandas\", \"matplotlib.pyplot\"], \"weight\": 3}\r\n\r\n{\"imports\": []}\r\n{\"imports\": [\"sklearn.svm.SVC\"], \"weight\": 0.5}",
		"array after white space":   "\t [{\"imports\": [\"pandas\", \"matplotlib.pyplot\"], \"weight\": 3},\n\n{\"imports\": []},\n{\"imports\": [\"sklearn.svm.SVC\"], \"weight\": 0.5}\n]\n",
	} {
		t.Run(name, func(t *testing.T) {
			c, err := Parse(strings.NewReader(input))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Requests, want) {
				t.Fatalf("got %+v\nwant %+v", c.Requests, want)
			}
		})
	}
}

// TestParsePackages reads a request's pip requirements beside its imports.
func TestParsePackages(t *testing.T) {
	c, err := Parse(strings.NewReader(`{"imports": ["pandas", "seaborn"], "packages": ["pandas>=2.1,<3", "numpy==1.26.*", "Scikit_Learn ~= 1.4"]}
{"imports": ["numpy"], "packages": []}
{"imports": ["numpy"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range c.Requests[0].Packages {
		got = append(got, r.Key()+" "+r.String())
	}
	if want := []string{"pandas pandas>=2.1,<3", "numpy numpy==1.26.*", "scikit-learn Scikit_Learn~=1.4"}; !slices.Equal(got, want) {
		t.Errorf("packages %q, want %q", got, want)
	}
	if p := c.Requests[0].Packages[0]; !p.Allows("2.2.3+dfsg") || p.Allows("1.5.3") {
		t.Errorf("%s: want 2.2.3+dfsg in and 1.5.3 out", p)
	}
	if len(c.Requests[1].Packages) != 0 || c.Requests[2].Packages != nil {
		t.Errorf("requests without packages: %+v", c.Requests[1:])
	}
}

func TestParseErrorsNameTheLine(t *testing.T) {
	for _, tc := range []struct{ name, input, want string }{
		{"empty", "", "no requests"},
		{"blank lines only", "\n  \n\n", "no requests"},
		{"empty array", " [ ] ", "no requests"},
		{"not an object", "{\"imports\": []}\n[\"pandas\"]\n", "line 2: a list, not an object"},
		{"number line", "\n\n42\n", "line 3: a number, not an object"},
		{"no imports", `{"weight": 2}`, `line 1: no "imports"`},
		{"imports null", `{"imports": null}`, "line 1: imports is null, not a list"},
		{"imports a string", `{"imports": "pandas"}`, "line 1: imports is a string, not a list"},
		{"imports not strings", `{"imports": ["pandas", 3]}`, "line 1: imports[1] is a number, not a module name"},
		{"bad name", "{\"imports\": []}\n{\"imports\": [\"pandas\", \"sk learn\"]}", `line 2: imports[1] "sk learn" is not a dotted Python name`},
		{"empty name", `{"imports": [""]}`, `imports[0] "" is not a dotted`},
		{"dotted wrong", `{"imports": ["a..b"]}`, `imports[0] "a..b" is not a dotted`},
		{"weight zero", `{"imports": [], "weight": 0}`, "line 1: weight 0: want a number > 0"},
		{"weight negative", `{"imports": [], "weight": -2}`, "weight -2: want a number > 0"},
		{"weight too large", "{\"imports\": []}\n{\"imports\": [], \"weight\": 1e308}", "line 2: weight 1e308: want a number > 0 and at most 1e+12"},
		{"weight string", `{"imports": [], "weight": "3"}`, "weight is a string, not a number"},
		{"weight null", `{"imports": [], "weight": null}`, "weight is null, not a number"},
		{"weight huge", `{"imports": [], "weight": 1e400}`, "weight 1e400 is out of range"},
		{"broken JSON", "{\"imports\": []}\n{\"imports\": [\"x\"\n", "line 2"},
		{"array broken on line 3", "[\n{\"imports\": []},\n{\"imports\": [}\n]", "line 3"},
		{"array element not an object", "[\n{\"imports\": []},\n\"pandas\"]", "line 3: a string, not an object"},
		{"array bad weight line 4", "[{\"imports\": []},\n\n\n {\"imports\": [], \"weight\": -1}]", "line 4: weight -1"},
		{"array not closed", "[{\"imports\": []}", "not closed"},
		{"data after array", "[{\"imports\": []}]\n{\"imports\": []}", "line 2: data after the array"},
		{"line too long", `{"imports": ["` + strings.Repeat("a", MaxLineBytes) + `"]}`, "line 1: longer than"},
		{"packages a string", `{"imports": [], "packages": "pandas>=2"}`, "line 1: packages is a string, not a list"},
		{"packages not strings", `{"imports": [], "packages": ["numpy", 2]}`, "line 1: packages[1] is a number, not a requirement"},
		{"bad specifier", "{\"imports\": []}\n{\"imports\": [\"pandas\"], \"packages\": [\"numpy\", \"pandas=>2\"]}", `line 2: packages[1]: invalid requirement: "=>2"`},
		{"wildcard on >=", `{"imports": [], "packages": ["numpy>=1.26.*"]}`, "line 1: packages[0]: invalid requirement"},
		{"no name", "[\n{\"imports\": [], \"packages\": [\">=2\"]}]", "line 2: packages[0]: invalid requirement"},
		{"extras", `{"imports": [], "packages": ["pandas[excel]"]}`, "extras"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.input))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrInvalid with %q", err, tc.want)
			}
		})
	}
}

func TestSplitIsStableAndFormatFree(t *testing.T) {
	var lines, array []string
	for i := range 1000 {
		r := fmt.Sprintf(`{"imports": ["m%d"]}`, i%37)
		lines = append(lines, r)
		array = append(array, r)
	}
	a, err := Parse(strings.NewReader(strings.Join(lines, "\n\n")))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse(strings.NewReader("[" + strings.Join(array, ",\n") + "]"))
	if err != nil {
		t.Fatal(err)
	}
	pa, ha := a.Split()
	pb, hb := b.Split()
	if len(pa)+len(ha) != 1000 || len(ha) != len(hb) || len(pa) != len(pb) {
		t.Fatalf("split sizes %d+%d and %d+%d", len(pa), len(ha), len(pb), len(hb))
	}
	// About one in five, in file order.
	if len(ha) < 150 || len(ha) > 250 {
		t.Errorf("%d of 1000 held out, want about 200", len(ha))
	}
	for i := range ha {
		if !slices.Equal(ha[i].Imports, hb[i].Imports) {
			t.Fatalf("held-out request %d differs between formats", i)
		}
	}
	// Fixed values: the split must never change between versions, machines or runs.
	var first []int
	for i := 0; len(first) < 8; i++ {
		if HeldOut(i) {
			first = append(first, i)
		}
	}
	if want := []int{0, 1, 2, 13, 16, 18, 29, 30}; !slices.Equal(first, want) {
		t.Errorf("first held-out indexes %v, want %v", first, want)
	}
	// Appending requests keeps the earlier ones where they were.
	more, _ := Parse(strings.NewReader(strings.Join(append(lines, `{"imports": []}`), "\n\n")))
	_, hm := more.Split()
	if len(hm) < len(ha) || !reflect.DeepEqual(hm[:len(ha)], ha) {
		t.Error("appending a request moved earlier ones")
	}
}

func TestPrefixesAndResolve(t *testing.T) {
	names := []string{"sklearn.svm.SVC", "matplotlib.pyplot", "transformers.pipeline", "re", "sklearn.foo.Bar"}
	if got, want := Prefixes(names), []string{"matplotlib", "matplotlib.pyplot", "re", "sklearn", "sklearn.foo", "sklearn.foo.Bar", "sklearn.svm", "sklearn.svm.SVC", "transformers", "transformers.pipeline"}; !slices.Equal(got, want) {
		t.Fatalf("Prefixes %v", got)
	}
	image := map[string]bool{"sklearn": true, "sklearn.svm": true, "matplotlib": true, "matplotlib.pyplot": true, "re": true}
	calls := 0
	got, err := Resolve(context.Background(), names, func(_ context.Context, candidates []string) (map[string]bool, error) {
		calls++
		out := map[string]bool{}
		for _, c := range candidates {
			out[c] = image[c]
		}
		return out, nil
	})
	if err != nil || calls != 1 {
		t.Fatalf("%v, %d calls", err, calls)
	}
	want := map[string]Resolution{
		"sklearn.svm.SVC":       {"sklearn.svm", true},
		"matplotlib.pyplot":     {"matplotlib.pyplot", true},
		"transformers.pipeline": {"transformers", false},
		"re":                    {"re", true},
		"sklearn.foo.Bar":       {"sklearn", true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Resolve %v", got)
	}
	boom := errors.New("sandbox failed")
	if _, err := Resolve(context.Background(), names, func(context.Context, []string) (map[string]bool, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Errorf("error %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"imports": ["pandas"], "weight": 2}` + "\n" + `{"imports": []}`))
	f.Add([]byte(`[{"imports": ["a.b"]}, {"imports": ["c"], "weight": 0.1}]`))
	f.Add([]byte(`[{"imports": ["a.b"]}`))
	f.Add([]byte("\ufeff\n\n{\"imports\":[\"x\"]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(strings.NewReader(string(data)))
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		if len(c.Requests) == 0 {
			t.Fatal("no requests and no error")
		}
		// A parsed corpus is valid, and written back as a JSON array it parses the same.
		var objects []map[string]any
		for _, r := range c.Requests {
			if !(r.Weight > 0) || math.IsInf(r.Weight, 0) || r.Line < 1 {
				t.Fatalf("request %+v", r)
			}
			objects = append(objects, map[string]any{"imports": r.Imports, "weight": r.Weight})
		}
		data, err = json.Marshal(objects)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(strings.NewReader(string(data)))
		if err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		for i := range c.Requests {
			if !slices.Equal(again.Requests[i].Imports, c.Requests[i].Imports) || again.Requests[i].Weight != c.Requests[i].Weight {
				t.Fatalf("request %d: %+v then %+v", i, c.Requests[i], again.Requests[i])
			}
		}
	})
}

// BenchmarkParse100k parses 100,000 requests of JSON Lines; B/op is what parsing allocates.
func BenchmarkParse100k(b *testing.B) {
	var sb strings.Builder
	for i := range 100_000 {
		fmt.Fprintf(&sb, `{"category": "Exploratory Data Analysis", "imports": ["pandas", "numpy", "sklearn.m%d.Thing"], "weight": %d, "has_models": false}`+"\n", i%300, 1+i%3)
	}
	data := sb.String()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(strings.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}
