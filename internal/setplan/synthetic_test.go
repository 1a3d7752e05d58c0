package setplan

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/pkg/catalogue"
)

// The synthetic image: plausible figures for a Debian data-science image, for benchmarks and
// for comparing strategies before real measurements exist. Anchors measured here (README):
// the empty image about 9 MiB, pandas' image 39.7 MiB and a cold pandas import about 0.6 s,
// the pandas + scipy + sklearn + matplotlib stack 95.6 MiB; the restore line 1.30-1.68 ms/MiB
// + 132-134 ms. The rest is an educated guess: own time (ms) and memory (MiB) of each module
// with its dependencies already imported.
type synthModule struct {
	ownMs, ownMiB float64
	deps          []string
}

func synthTable() map[string]synthModule {
	return map[string]synthModule{
		"numpy": {180, 8, nil}, "pytz": {10, 0.5, nil}, "dateutil": {25, 1, []string{"six"}}, "six": {3, 0.2, nil},
		"pandas":        {420, 21, []string{"numpy", "dateutil", "pytz"}},
		"PIL":           {40, 2, nil},
		"PIL.Image":     {60, 3, []string{"PIL"}},
		"PIL.ImageDraw": {8, 0.3, []string{"PIL.Image"}}, "PIL.ImageFont": {10, 0.4, []string{"PIL.Image"}},
		"pyparsing": {30, 1, nil}, "cycler": {3, 0.1, nil}, "kiwisolver": {5, 0.3, nil}, "packaging": {8, 0.3, nil}, "fontTools": {15, 0.6, nil},
		"matplotlib": {250, 9, []string{"numpy", "PIL", "PIL.Image", "pyparsing", "cycler", "kiwisolver", "dateutil", "packaging", "fontTools",
			"matplotlib.colors", "matplotlib.path"}},
		"matplotlib.colors": {0.5, 0.1, nil}, "matplotlib.path": {0.5, 0.1, nil}, "matplotlib.patches": {4, 0.2, []string{"matplotlib"}},
		"matplotlib.pyplot": {180, 6, []string{"matplotlib", "matplotlib.patches"}},
		"seaborn":           {200, 5, []string{"matplotlib.pyplot", "pandas", "scipy", "scipy.stats"}},
		"scipy":             {60, 2, []string{"numpy"}},
		"scipy.sparse":      {140, 5, []string{"scipy"}}, "scipy.linalg": {110, 4, []string{"scipy"}},
		"scipy.stats":   {380, 12, []string{"scipy.sparse", "scipy.linalg"}},
		"scipy.ndimage": {90, 3, []string{"scipy"}},
		"joblib":        {60, 3, nil}, "threadpoolctl": {5, 0.2, nil},
		"sklearn":                         {250, 9, []string{"numpy", "scipy", "scipy.sparse", "scipy.linalg", "joblib", "threadpoolctl"}},
		"sklearn.metrics":                 {220, 7, []string{"sklearn", "scipy.stats"}},
		"sklearn.metrics.pairwise":        {5, 0.2, []string{"sklearn.metrics"}},
		"sklearn.preprocessing":           {120, 4, []string{"sklearn"}},
		"sklearn.model_selection":         {150, 5, []string{"sklearn.metrics"}},
		"sklearn.tree":                    {90, 3, []string{"sklearn"}},
		"sklearn.ensemble":                {260, 8, []string{"sklearn.tree", "sklearn.metrics", "sklearn.preprocessing", "sklearn.model_selection"}},
		"sklearn.linear_model":            {200, 6, []string{"sklearn.metrics", "sklearn.model_selection"}},
		"sklearn.neural_network":          {60, 2, []string{"sklearn.metrics", "sklearn.model_selection", "sklearn.preprocessing"}},
		"sklearn.datasets":                {110, 4, []string{"sklearn", "sklearn.preprocessing"}},
		"sklearn.neighbors":               {140, 4, []string{"sklearn.metrics"}},
		"sklearn.feature_extraction.text": {90, 3, []string{"sklearn.preprocessing"}},
		"networkx":                        {350, 12, nil},
		"networkx.algorithms":             {0.5, 0.1, []string{"networkx"}},
		"cv2":                             {120, 25, []string{"numpy"}},
		"torch":                           {1400, 160, []string{"numpy"}},
		"torch.utils.data":                {20, 1, []string{"torch"}},
		"imageio":                         {40, 2, []string{"numpy", "PIL"}}, "lazy_loader": {2, 0.1, nil},
		"skimage": {80, 3, []string{"numpy", "scipy", "lazy_loader"}},
		"regex":   {30, 1, nil}, "tqdm": {25, 1, nil}, "click": {20, 1, nil},
		"nltk":                     {650, 18, []string{"regex", "tqdm", "click", "joblib"}},
		"xgboost":                  {380, 14, []string{"numpy", "scipy"}},
		"smart_open":               {60, 2, nil},
		"gensim":                   {700, 25, []string{"numpy", "scipy", "scipy.sparse", "scipy.linalg", "smart_open"}},
		"patsy":                    {60, 2, []string{"numpy"}},
		"statsmodels":              {120, 4, []string{"numpy", "scipy", "pandas", "patsy"}},
		"statsmodels.tsa.seasonal": {450, 15, []string{"statsmodels", "scipy.stats", "scipy.linalg"}},
		"fasttext":                 {30, 2, []string{"numpy"}},
		"pymysql":                  {40, 2, nil},
		"azure":                    {5, 0.2, nil},
		"azure.storage.blob":       {260, 9, []string{"azure"}},
		// The standard library: most of it is loaded by the executor already (0 ms).
		"re": {0, 0, nil}, "collections": {0, 0, nil}, "io": {0, 0, nil}, "json": {0, 0, nil}, "string": {0, 0, nil},
		"math": {0, 0, nil}, "warnings": {0, 0, nil}, "random": {2, 0.1, nil}, "glob": {1, 0.05, nil}, "sqlite3": {8, 0.5, nil},
		"datetime": {1, 0.05, nil}, "uuid": {3, 0.1, nil}, "hashlib": {1, 0.05, nil}, "ftplib": {4, 0.2, nil}, "ast": {2, 0.1, nil},
	}
}

// synthFamilies get figures for modules the table lacks: a submodule of these packages that is
// written in lower case (sklearn.svm) is a module, with a figure drawn from the range by a hash
// of its name, and depends on the package.
var synthFamilies = map[string]struct{ lowMs, highMs, lowMiB, highMiB float64 }{
	"sklearn": {60, 300, 2, 8}, "scipy": {40, 200, 1, 6}, "skimage": {60, 250, 2, 8}, "nltk": {20, 150, 1, 4},
	"networkx": {1, 5, 0.1, 0.3}, "numpy": {1, 20, 0.1, 1}, "gensim": {50, 200, 2, 6}, "torch": {20, 200, 1, 10},
}

// synthModuleOf is the synthetic image's answer to "is this a module, and what does it cost".
func synthModuleOf(name string) (synthModule, bool) {
	table := synthTable()
	if m, ok := table[name]; ok {
		return m, true
	}
	parts := strings.Split(name, ".")
	fam, ok := synthFamilies[parts[0]]
	if !ok || len(parts) != 2 || !(parts[1][0] >= 'a' && parts[1][0] <= 'z') || strings.HasPrefix(parts[1], "make_") || strings.HasPrefix(parts[1], "load_") {
		return synthModule{}, false
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	r := float64(h.Sum64()%1000) / 1000
	return synthModule{ownMs: fam.lowMs + r*(fam.highMs-fam.lowMs), ownMiB: fam.lowMiB + r*(fam.highMiB-fam.lowMiB), deps: []string{parts[0]}}, true
}

// syntheticAnalysis is the analysis the synthetic image would give for names.
func syntheticAnalysis(names []string) *analysis.File {
	f := &analysis.File{Version: analysis.Version, Image: analysis.Provenance{Runs: 3}, Stdlib: []string{}, Names: map[string]analysis.Entry{}}
	// resolve and collect the modules, with the closure members.
	var closure func(m string, into map[string]bool)
	closure = func(m string, into map[string]bool) {
		if into[m] {
			return
		}
		into[m] = true
		sm, _ := synthModuleOf(m)
		for _, d := range sm.deps {
			closure(d, into)
		}
	}
	entry := func(m string) analysis.Entry {
		members := map[string]bool{}
		closure(m, members)
		e := analysis.Entry{Module: m, Available: true}
		for c := range members {
			e.Closure = append(e.Closure, c)
		}
		slices.Sort(e.Closure)
		for _, c := range e.Closure {
			sm, _ := synthModuleOf(c)
			e.ImportMs += sm.ownMs
			e.MiB += sm.ownMiB
		}
		sm, _ := synthModuleOf(m)
		e.OwnMs, e.OwnMiB = sm.ownMs, sm.ownMiB
		return e
	}
	for _, n := range names {
		module := ""
		for p := n; ; {
			if _, ok := synthModuleOf(p); ok {
				module = p
				break
			}
			dot := strings.LastIndexByte(p, '.')
			if dot < 0 {
				break
			}
			p = p[:dot]
		}
		if module == "" {
			top, _, _ := strings.Cut(n, ".")
			f.Names[n] = analysis.Entry{Module: top, Error: fmt.Sprintf("No module named %q", top)}
			continue
		}
		e := entry(module)
		f.Names[n] = e
		for _, c := range e.Closure {
			if _, ok := f.Names[c]; !ok {
				f.Names[c] = entry(c)
			}
		}
	}
	return f
}

// syntheticModel is the cost model of the comparisons: the README's restore line (between
// make bench's 1.30 ms/MiB + 132 ms and the size sweep's 1.68 + 134), a cold executor start of
// 350 ms before any import (the floor of a sandbox, 105-170 ms here, plus the interpreter and
// the executor), and a 9 MiB empty image.
func syntheticModel() catalogue.CostModel {
	return catalogue.CostModel{InterceptMs: 133, AlphaMsPerMiB: 1.5, ColdStartMs: 350, EmptyMiB: 9}
}

// syntheticCorpus writes n requests of JSON Lines, drawn deterministically: a stack chosen with
// Zipf-like frequencies (the sample corpus's most common import sets first), and with
// probability 0.4 one to three further names from a skewed vocabulary (sklearn classes, scipy
// functions, the standard library, packages the image lacks), so that the distinct sets have a
// long tail like a real corpus.
func syntheticCorpus(n int, seed uint64) []byte {
	stacks := [][]string{
		{"pandas"}, {"numpy", "pandas"}, {"matplotlib.pyplot", "numpy", "pandas"}, {"numpy"}, {},
		{"matplotlib.pyplot", "numpy"}, {"networkx"}, {"transformers.pipeline"}, {"matplotlib.pyplot", "numpy", "pandas", "seaborn"},
		{"cv2", "numpy"}, {"matplotlib.pyplot", "networkx"}, {"cv2"}, {"numpy", "pandas", "seaborn"}, {"networkx", "pandas"},
		{"matplotlib.pyplot", "pandas"}, {"pandas", "re"}, {"pandas", "sklearn.neighbors.NearestNeighbors"}, {"networkx", "numpy"},
		{"numpy", "sklearn.datasets.make_classification", "sklearn.ensemble.RandomForestClassifier"}, {"pandas", "spacy"},
		{"sklearn.datasets.make_classification", "sklearn.linear_model.LogisticRegression"}, {"torch", "transformers.AutoModel"},
		{"numpy", "scipy.ndimage.gaussian_filter"}, {"PIL.Image", "numpy"}, {"nltk", "pandas"}, {"skimage.io", "numpy"},
		{"statsmodels.tsa.seasonal.seasonal_decompose", "pandas"}, {"xgboost.XGBClassifier", "sklearn.datasets.make_classification"},
		{"torch", "numpy"}, {"gensim.models.Word2Vec"}, {"sqlite3", "pandas"},
	}
	extras := []string{
		"sklearn.preprocessing.StandardScaler", "sklearn.model_selection.train_test_split", "sklearn.metrics.accuracy_score",
		"sklearn.ensemble.RandomForestRegressor", "sklearn.svm.SVC", "sklearn.cluster.KMeans", "sklearn.decomposition.PCA",
		"sklearn.pipeline.Pipeline", "sklearn.neural_network.MLPClassifier", "sklearn.tree.DecisionTreeClassifier",
		"scipy.stats.mode", "scipy.sparse", "scipy.signal.find_peaks", "scipy.optimize.minimize", "collections.Counter",
		"random", "json", "datetime.datetime", "matplotlib.pyplot", "seaborn", "numpy", "pandas", "re", "math",
		"sklearn.covariance.MinCovDet", "sklearn.feature_extraction.text.TfidfVectorizer", "sklearn.metrics.pairwise.cosine_similarity",
		"skimage.transform.resize", "skimage.filters.sobel", "nltk.corpus.stopwords", "transformers.AutoTokenizer",
		"sklearn.impute.SimpleImputer", "sklearn.manifold.TSNE", "scipy.spatial.distance", "networkx.algorithms.community",
	}
	rng := rand.New(rand.NewPCG(seed, 19))
	zipf := func(k int) int {
		// P(i) proportional to 1/(i+1)^1.1, by inversion over the cumulative weights.
		var total float64
		for i := range k {
			total += 1 / pow11(i+1)
		}
		u := rng.Float64() * total
		for i := range k {
			u -= 1 / pow11(i+1)
			if u <= 0 {
				return i
			}
		}
		return k - 1
	}
	var sb strings.Builder
	for range n {
		names := slices.Clone(stacks[zipf(len(stacks))])
		if rng.Float64() < 0.4 {
			for range 1 + rng.IntN(3) {
				names = append(names, extras[zipf(len(extras))])
			}
		}
		fmt.Fprintf(&sb, `{"imports": [`)
		for i, name := range names {
			if i > 0 {
				sb.WriteString(", ")
			}
			fmt.Fprintf(&sb, "%q", name)
		}
		sb.WriteString("]}\n")
	}
	return []byte(sb.String())
}

func pow11(i int) float64 { return math.Pow(float64(i), 1.1) }
