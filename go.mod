module readie.dev/pipeline

go 1.26

require (
	github.com/containerd/go-runc v1.2.1
	github.com/opencontainers/runtime-spec v1.3.0
)

require (
	github.com/containerd/console v1.0.5 // indirect
	golang.org/x/sys v0.1.0 // indirect
)
