// Package procstat reads a process's CPU times from Linux's
// /proc/<pid>/stat, for the benchmarks that tell another process's CPU
// (PostgreSQL's backends, a split bench's components) from their own.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Stat is what /proc/<pid>/stat says of a process's CPU.
type Stat struct {
	Comm string // the command, as the kernel keeps it
	PPID string // the parent's pid
	// User and System are the process's own CPU times; ChildrenUser and
	// ChildrenSystem those of the children it has reaped.
	User, System, ChildrenUser, ChildrenSystem time.Duration
}

// CPU is the process's own CPU time.
func (s Stat) CPU() time.Duration { return s.User + s.System }

// ReapedCPU is the CPU time of the children the process has reaped.
func (s Stat) ReapedCPU() time.Duration { return s.ChildrenUser + s.ChildrenSystem }

// Read reads the stat of the process pid.
func Read(pid string) (Stat, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return Stat{}, err
	}
	s, ok := Parse(b)
	if !ok {
		return Stat{}, fmt.Errorf("procstat: /proc/%s/stat: unexpected format", pid)
	}
	return s, nil
}

// Parse reads b, a /proc/<pid>/stat. The command may hold spaces and
// parentheses, so the fields are those after its last ')': the state, the
// parent's pid, then utime, stime, cutime and cstime as the 12th to 15th.
func Parse(b []byte) (Stat, bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return Stat{}, false
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 15 {
		return Stat{}, false
	}
	s := Stat{Comm: string(b[open+1 : end]), PPID: f[1]}
	for i, dst := range []*time.Duration{&s.User, &s.System, &s.ChildrenUser, &s.ChildrenSystem} {
		n, err := strconv.ParseInt(f[11+i], 10, 64)
		if err != nil {
			return Stat{}, false
		}
		*dst = Ticks(n)
	}
	return s, true
}

// Ticks is a duration of clock ticks: USER_HZ is 100 on every Linux
// configuration Go supports.
func Ticks(n int64) time.Duration { return time.Duration(n) * 10 * time.Millisecond }
