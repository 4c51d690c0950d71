package overhead

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat: the kernel
// reports them in USER_HZ ticks, 100 a second on every Linux architecture
// Go runs on (sysconf(_SC_CLK_TCK)).
const userHZ = 100

// procUsage is what a proxy's processes have used so far: CPU time
// (user plus system, all threads) and the sum of their resident-set peaks.
type procUsage struct {
	CPU     time.Duration
	PeakRSS int64 // bytes
}

// usageOf reads the CPU time and VmHWM of pid and of every process below
// it (nginx's workers are children of its master), from /proc. ok is
// false off Linux or when pid is gone.
func usageOf(pid int) (u procUsage, ok bool) {
	for _, p := range procTree(pid) {
		stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "stat"))
		if err != nil {
			continue
		}
		f := statFields(stat)
		if len(f) < 15 {
			continue
		}
		// Fields 14 and 15 of proc(5), utime and stime; f starts at
		// field 3.
		ut, _ := strconv.ParseInt(string(f[11]), 10, 64)
		st, _ := strconv.ParseInt(string(f[12]), 10, 64)
		u.CPU += time.Duration(ut+st) * time.Second / userHZ
		u.PeakRSS += statusKB(p, "VmHWM:") << 10
		ok = true
	}
	return u, ok
}

// resetPeaks sets the VmHWM of pid and its descendants back to their
// current RSS (proc(5), clear_refs value 5), so that the next read gives
// the peak since now. Where the kernel refuses, VmHWM stays the peak
// since the process started.
func resetPeaks(pid int) {
	for _, p := range procTree(pid) {
		_ = os.WriteFile(filepath.Join("/proc", strconv.Itoa(p), "clear_refs"), []byte("5"), 0)
	}
}

// procTree returns pid and the pids of its descendants.
func procTree(pid int) []int {
	tree := []int{pid}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return tree
	}
	parent := map[int]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		if f := statFields(stat); len(f) > 1 {
			pp, _ := strconv.Atoi(string(f[1]))
			parent[p] = pp
		}
	}
	for i := 0; i < len(tree); i++ {
		for p, pp := range parent {
			if pp == tree[i] {
				tree = append(tree, p)
			}
		}
	}
	return tree
}

// statFields splits a /proc/<pid>/stat line after the command name, which
// is in parentheses and may hold spaces: the first field returned is the
// state (field 3 of proc(5)).
func statFields(stat []byte) [][]byte {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return nil
	}
	return bytes.Fields(stat[i+1:])
}

// statusKB reads a "Name: N kB" line of /proc/<pid>/status; 0 when absent.
func statusKB(pid int, name string) int64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte(name)); ok {
			f := bytes.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(string(f[0]), 10, 64)
				return n
			}
		}
	}
	return 0
}
