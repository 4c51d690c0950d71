//go:build !unix

package proxy

// descriptorLimit reports that the system has no RLIMIT_NOFILE to read.
func descriptorLimit() (uint64, bool) { return 0, false }
