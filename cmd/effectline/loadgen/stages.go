package loadgen

import (
	"context"
	"fmt"
	"io"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/store"
)

// printStages says where an operation's time went, by the journal's own
// clock (each event's occurred_at, taken by the component that wrote it
// just before its commit): from the intent recorded to its first attempt
// started (the relay, the intents topic, the executor's claim), and from
// there to the attempt's success (the downstream call and the outcome's
// journal). The rest of the end-to-end figure is the outcome's way to the
// read model (the relay again, the outcomes topic, the projector). It
// reads the events of the run's keys once, after the run.
func printStages(ctx context.Context, st *store.Store, keys []string, w io.Writer) error {
	first, err := st.FirstEventTimes(ctx, keys, events.IntentRecorded, events.AttemptStarted, events.AttemptSucceeded)
	if err != nil {
		return err
	}
	started, succeeded := first[events.AttemptStarted], first[events.AttemptSucceeded]
	var claim, call histogram
	for key, rec := range first[events.IntentRecorded] {
		s, ok := started[key]
		if !ok {
			continue
		}
		claim.add(s.Sub(rec))
		if d, ok := succeeded[key]; ok {
			call.add(d.Sub(s))
		}
	}
	if claim.n == 0 {
		return nil
	}
	fmt.Fprintf(w, "stages: intent recorded → attempt started p50=%.1fms p99=%.1fms; attempt started → succeeded p50=%.1fms p99=%.1fms\n",
		ms(claim.quantile(0.50)), ms(claim.quantile(0.99)), ms(call.quantile(0.50)), ms(call.quantile(0.99)))
	return nil
}
