module readie.dev/pipeline

go 1.26

require (
	github.com/containerd/go-runc v1.2.1
	github.com/kisielk/og-rek v1.3.0
	github.com/opencontainers/runtime-spec v1.3.0
	github.com/sirupsen/logrus v1.9.3
	gopkg.in/yaml.v3 v3.0.1
)

require (
	github.com/aristanetworks/gomap v0.0.0-20230726210543-f4e41046dced // indirect
	github.com/containerd/console v1.0.5 // indirect
	golang.org/x/exp v0.0.0-20230725093048-515e97ebf090 // indirect
	golang.org/x/sys v0.1.0 // indirect
)
