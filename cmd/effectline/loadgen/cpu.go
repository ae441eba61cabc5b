package loadgen

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/effectline/effectline/internal/procstat"
)

// cpuSample is the CPU time spent so far by this process and by the whole
// machine. Throughput on a shared 2-core machine swings by a third from run
// to run; CPU time per operation barely moves, so it is what tells whether a
// change made the pipeline cheaper.
type cpuSample struct {
	process time.Duration
	machine time.Duration // every CPU's non-idle time; zero where /proc/stat is missing
	// postgres is the CPU time of the PostgreSQL processes on this machine
	// (see postgresBusy); postgresSeen is false where there are none, as
	// with a database on another host.
	postgres     time.Duration
	postgresSeen bool
}

func sampleCPU() cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.process = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.machine = machineBusy()
	s.postgres, s.postgresSeen = postgresBusy()
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
	var busy int64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0
		}
		busy += n
	}
	return procstat.Ticks(busy)
}

// postgresBusy sums the CPU time of every process named postgres on this
// machine: each live one's own, and the postmaster's reaped children's
// (cutime, cstime), so a backend that ends between two samples still
// counts. Without it the bench could only say "the rest is PostgreSQL and
// whatever else runs", and on this shared machine whatever else runs
// (the last run's database being dropped, a checkpoint of another
// cluster's) moved that rest by half from run to run. It counts every
// cluster on the machine, and none on another host (found is then false).
func postgresBusy() (busy time.Duration, found bool) {
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	procs := map[string]procstat.Stat{}
	for _, e := range dir {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		if p, err := procstat.Read(pid); err == nil && p.Comm == "postgres" { // an error: it ended since the listing
			procs[pid] = p
		}
	}
	for _, p := range procs {
		busy += p.CPU()
		if _, child := procs[p.PPID]; !child {
			busy += p.ReapedCPU() // the postmaster: its backends that ended
		}
	}
	return busy, len(procs) > 0
}

// cpuPerOp is the CPU time per operation between two samples, in
// milliseconds.
type cpuPerOp struct {
	process, machine, postgres float64
	postgresSeen               bool
}

// perOp returns the CPU time per operation between two samples.
func (s cpuSample) perOp(since cpuSample, ops int) cpuPerOp {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(ops) }
	return cpuPerOp{
		process:      ms(s.process - since.process),
		machine:      ms(s.machine - since.machine),
		postgres:     ms(s.postgres - since.postgres),
		postgresSeen: s.postgresSeen && since.postgresSeen,
	}
}

// line is the bench's cpu line, per unit ("operation", "step"). children
// is the CPU of the components' processes with -split (split true); the
// first figure is always the whole machine's, which scripts/bench-ab.sh
// takes.
func (c cpuPerOp) line(unit string, split bool, children float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "cpu: %.2f ms per %s on the whole machine", c.machine, unit)
	rest := c.machine - c.process
	if split {
		fmt.Fprintf(&b, ", %.2f ms of it in the components' processes, %.2f ms in this one (the agent, the tool)", children, c.process)
		rest -= children
	} else {
		fmt.Fprintf(&b, ", %.2f ms of it in this process", c.process)
	}
	if !c.postgresSeen {
		b.WriteString(" (the rest is PostgreSQL and whatever else runs)")
		return b.String()
	}
	fmt.Fprintf(&b, ", %.2f ms in PostgreSQL's processes", c.postgres)
	// The machine's total is sampled at each clock tick; the processes'
	// times are the scheduler's exact run times. Work in bursts shorter
	// than a tick is missed by the first, so at a paced moderate rate it
	// can come out below the sum of the others.
	if elsewhere := rest - c.postgres; elsewhere >= 0 {
		fmt.Fprintf(&b, ", %.2f ms elsewhere", elsewhere)
	} else {
		fmt.Fprintf(&b, " (the machine's tick-sampled total is %.2f ms below these: it misses short bursts)", -elsewhere)
	}
	return b.String()
}
