module readie.dev/pipeline

go 1.26

require (
	github.com/containerd/go-runc v1.2.1
	github.com/kisielk/og-rek v1.3.0
	github.com/opencontainers/runtime-spec v1.3.0
	github.com/sirupsen/logrus v1.9.3
	gonum.org/v1/plot v0.17.0
	gopkg.in/yaml.v3 v3.0.1
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.2.0 // indirect
	codeberg.org/go-pdf/fpdf v0.11.1 // indirect
	git.sr.ht/~sbinet/gg v0.7.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/aristanetworks/gomap v0.0.0-20230726210543-f4e41046dced // indirect
	github.com/containerd/console v1.0.5 // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	golang.org/x/exp v0.0.0-20230725093048-515e97ebf090 // indirect
	golang.org/x/image v0.30.0 // indirect
	golang.org/x/sys v0.1.0 // indirect
	golang.org/x/text v0.28.0 // indirect
)
