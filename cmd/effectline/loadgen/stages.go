package loadgen

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/effectline/effectline/cmd/effectline/app"
	"github.com/effectline/effectline/events"
)

// printStages splits each operation's latency at the journal's own times,
// so a regression can be placed: the intent's commit to the executor's
// attempt.started (the relay, Kafka, the executor's consumer), that to
// attempt.succeeded (the claim's commit and the tool call), and that to
// the end the run measures (the outcome's commit, the relay, Kafka, and
// the projector or, with -wait, the waiter's answer). An event's
// occurred_at is taken when the executor builds it, before its commit.
func (bc Config) printStages(ctx context.Context, a *app.App, w io.Writer, index map[string]int, committed []time.Time, projected map[string]time.Time) error {
	at, err := a.Store.FirstEventTimes(ctx, "bench/", events.AttemptStarted, events.AttemptSucceeded)
	if err != nil {
		return err
	}
	end, endName := projected, "projected"
	if bc.waits != nil {
		end, endName = bc.waits.answered, "answered"
	}
	var toClaim, call, toEnd []time.Duration
	for key, i := range index {
		c := committed[i]
		started, ok1 := at[events.AttemptStarted][key]
		succeeded, ok2 := at[events.AttemptSucceeded][key]
		e, ok3 := end[key]
		if c.IsZero() || !ok1 || !ok2 || !ok3 {
			continue
		}
		toClaim = append(toClaim, started.Sub(c))
		call = append(call, succeeded.Sub(started))
		toEnd = append(toEnd, e.Sub(succeeded))
	}
	if len(toClaim) == 0 {
		return nil
	}
	fmt.Fprintf(w, "stages (p50/p99 ms, %d operations): intent→attempt.started %s, →attempt.succeeded %s, →%s %s\n",
		len(toClaim), p50p99(toClaim), p50p99(call), endName, p50p99(toEnd))
	return nil
}

func p50p99(d []time.Duration) string {
	slices.Sort(d)
	q := func(p float64) string {
		v := d[min(len(d)-1, int(p*float64(len(d))))]
		return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(v.Microseconds())/1000), ".0")
	}
	return q(0.50) + "/" + q(0.99)
}
