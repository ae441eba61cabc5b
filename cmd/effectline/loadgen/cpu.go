package loadgen

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSample is the CPU time spent so far by this process and by the whole
// machine. Throughput on a shared 2-core machine swings by a third from run
// to run; CPU time per operation barely moves, so it is what tells whether a
// change made the pipeline cheaper.
type cpuSample struct {
	process time.Duration
	machine time.Duration // every CPU's non-idle time; zero where /proc/stat is missing
}

func sampleCPU() cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.process = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.machine = machineBusy()
	return s
}

// machineBusy sums the non-idle ticks of /proc/stat's "cpu" line: user,
// nice, system, irq, softirq and steal (idle and iowait left out).
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0
		}
		ticks += n
	}
	// USER_HZ is 100 on every Linux configuration Go supports.
	return time.Duration(ticks) * 10 * time.Millisecond
}

// perOp returns the CPU time per operation between two samples.
func (s cpuSample) perOp(since cpuSample, ops int) (process, machine float64) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(ops) }
	return ms(s.process - since.process), ms(s.machine - since.machine)
}
