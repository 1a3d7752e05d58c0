package sandbox

import "testing"

// BenchmarkSpec is building one sandbox spec and its fingerprint: done for every restore.
func BenchmarkSpec(b *testing.B) {
	o := SpecOptions{Mode: ModeSandbox, Rootfs: "/images/rootfs", HostDir: "/tmp/host/a", Env: []string{"TOKEN=x"}}
	b.ReportAllocs()
	for b.Loop() {
		s, err := Spec(o)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Fingerprint(s, DefaultFlags()); err != nil {
			b.Fatal(err)
		}
	}
}
