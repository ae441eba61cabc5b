package events_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/effectline/effectline/events"
)

// stateEdges applies every event variant of the transition matrix to every
// starting state of TestApplyMatrix and returns the status changes the fold
// makes, as "from --> to: event type" lines, sorted. The "new" row's edge
// into pending is written from "[*]", as a state diagram draws a start.
func stateEdges(tb testing.TB) []string {
	tb.Helper()
	starts := [][]step{nil, hPending0, hRunning1, hRunning2, hRetryDue1, hCompleted, hFailed,
		hNeedsRec, hEscalated, hEscalated0, hCompPending, hCompRunning, hCompensated,
		hUndoneRetryDue, hCompNeedsRec, hCompEscalated}
	seen := map[string]bool{}
	for _, class := range events.EffectClasses() {
		for _, h := range starts {
			evs := make([]events.Envelope, len(h))
			for i, s := range h {
				evs[i] = envAt(tb, class, int64(i+1), s)
			}
			before, err := events.Fold(evs)
			if err != nil {
				continue // a compensation history of a class that is never compensated
			}
			for _, col := range matrixEvents() {
				e := envAt(tb, class, before.Seq+1, col.mk(before))
				after, err := events.Apply(before, e)
				if err != nil || after.Status == before.Status {
					continue
				}
				from := string(before.Status)
				if before.Seq == 0 {
					from = "[*]"
				}
				seen[fmt.Sprintf("%s --> %s: %s", from, after.Status, e.Type)] = true
			}
		}
	}
	var out []string
	for k := range seen {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestStateDiagramMatchesTheFold keeps docs/states.md honest: the edges of
// its diagram are exactly the status changes Apply makes. A new transition
// in the fold, or one removed, fails here until the picture is redrawn
// (the test prints the lines to paste).
func TestStateDiagramMatchesTheFold(t *testing.T) {
	t.Parallel()
	want := stateEdges(t)
	f, err := os.Open(filepath.Join("..", "docs", "states.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	edge := regexp.MustCompile(`^\s*(\[\*\]|[a-z_]+) --> ([a-z_]+): ([a-z._]+)\s*$`)
	var got []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```mermaid"):
			in = true
		case in && strings.HasPrefix(line, "```"):
			in = false
		case in:
			if m := edge.FindStringSubmatch(line); m != nil {
				got = append(got, fmt.Sprintf("%s --> %s: %s", m[1], m[2], m[3]))
			}
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("docs/states.md's diagram differs from the fold.\nThe fold's edges:\n    %s\nThe diagram's:\n    %s",
			strings.Join(want, "\n    "), strings.Join(got, "\n    "))
	}
}
