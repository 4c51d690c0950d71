//go:build unix

package proxy

import "syscall"

// descriptorLimit returns the process's soft limit on open file
// descriptors (RLIMIT_NOFILE), and whether it could be read.
func descriptorLimit() (uint64, bool) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, false
	}
	return uint64(r.Cur), true
}
