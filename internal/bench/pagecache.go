package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"readie.dev/pipeline/pkg/manifest"
)

// EvictPageCache drops the page cache of a checkpoint's image files (posix_fadvise
// POSIX_FADV_DONTNEED on each), so that the next restore reads them from the disk, as the
// first restore after a pull does. It touches no other file: unlike drop_caches, the rest of
// the machine keeps its cache. The files are clean (synced when they were written), so the
// kernel can drop every page.
func EvictPageCache(dir string) error {
	var errs []error
	for _, name := range manifest.ImageFiles() {
		path := filepath.Join(dir, name)
		f, err := os.Open(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			errs = append(errs, fmt.Errorf("evict %s from the page cache: %w", path, err))
		}
		f.Close()
	}
	return errors.Join(errs...)
}

// ResidentPages returns how many of a file's pages are in the page cache, and how many pages
// it has (mincore over a read-only mapping; the mapping reads nothing).
func ResidentPages(path string) (resident, total int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return 0, 0, err
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Munmap(data)
	page := os.Getpagesize()
	vec := make([]byte, (len(data)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		return 0, 0, fmt.Errorf("mincore %s: %w", path, errno)
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident, len(vec), nil
}
