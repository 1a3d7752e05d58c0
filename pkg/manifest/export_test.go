package manifest

// Sample is sample for the tests of package manifest_test, which may import internal/testenv
// (it reads a rootfs's RootfsInfo, so package manifest's own tests cannot).
var Sample = sample
