package procstat

import (
	"os"
	"strconv"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	// A command with a space and a ')' of its own: the fields start after
	// the last one.
	line := []byte("4242 (post gres) x) S 17 4242 4242 0 -1 4194560 900 0 0 0 311 42 7 3 20 0 1 0 100 0 0\n")
	got, ok := Parse(line)
	want := Stat{Comm: "post gres) x", PPID: "17", User: 3110 * time.Millisecond, System: 420 * time.Millisecond,
		ChildrenUser: 70 * time.Millisecond, ChildrenSystem: 30 * time.Millisecond}
	if !ok || got != want {
		t.Errorf("Parse = %+v, %v; want %+v", got, ok, want)
	}
	for _, bad := range []string{"", "4242 postgres S 1", "4242 (postgres) S 1 2 3", "4242 (postgres) S 17 4242 4242 0 -1 4194560 900 0 0 0 x 42 7 3 20"} {
		if _, ok := Parse([]byte(bad)); ok {
			t.Errorf("Parse(%q) read a process", bad)
		}
	}
}

func TestReadSelf(t *testing.T) {
	s, err := Read(strconv.Itoa(os.Getpid()))
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	if s.PPID != strconv.Itoa(os.Getppid()) {
		t.Errorf("PPID = %s, want %d", s.PPID, os.Getppid())
	}
}
