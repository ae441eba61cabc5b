package projector_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/projector"
)

const readerRuns = 60

var (
	readerPrincipals = []string{"alice", "bob", "carol"}
	readerStatuses   = []events.WorkflowStatus{events.WorkflowRunning, events.WorkflowEscalated, events.WorkflowCompleted, events.WorkflowUnwound}
)

// workflowReaderSetup writes readerRuns rows into workflow_state: three
// principals and four statuses in cycles of different lengths, so every
// principal has runs in every status spread across the list, four runs at
// a time sharing one created_at (paging must break ties by id), with ids
// in an order unrelated to their creation. It returns them newest first.
func workflowReaderSetup(t *testing.T) (*harness, []events.Workflow) {
	h := setupDB(t)
	var all []events.Workflow
	for i := range readerRuns {
		at := epoch.Add(time.Duration(i/4) * time.Second).Add(123456 * time.Nanosecond) // beyond the column's microseconds
		rec := events.Workflow{WorkflowID: fmt.Sprintf("run-%03d", (i*7)%readerRuns), Workflow: "order",
			Status: readerStatuses[i%4], Principal: readerPrincipals[i%3], Input: json.RawMessage(`{"n":1}`),
			Steps: []events.WorkflowStep{{Name: "charge", Tool: "payments.charge", Effect: events.Irreversible, Status: events.StepPending}},
			Seq:   int64(1 + i%5), CreatedAt: at, UpdatedAt: at.Add(time.Minute)}
		raw, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.pool.Exec(t.Context(), `INSERT INTO workflow_state (workflow_id, workflow, status, principal, seq, record, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, rec.WorkflowID, rec.Workflow, string(rec.Status), rec.Principal, rec.Seq, raw,
			rec.CreatedAt, rec.UpdatedAt); err != nil {
			t.Fatal(err)
		}
		all = append(all, rec)
	}
	slices.SortFunc(all, func(a, b events.Workflow) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return compareStrings(b.WorkflowID, a.WorkflowID)
	})
	return h, all
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Every filter and page size pages through exactly the matching runs,
// newest first, each once, and every page but the last is full: the
// status and the principal are applied before the limit, not after it.
func TestReaderListWorkflowsFiltersBeforeTheLimit(t *testing.T) {
	t.Parallel()
	h, all := workflowReaderSetup(t)
	r := projector.NewReader(h.pool)
	filters := []events.WorkflowFilter{{}, {Status: events.WorkflowEscalated}, {Principal: "bob"},
		{Status: events.WorkflowCompleted, Principal: "carol"}, {Status: events.WorkflowAbandoned}}
	for _, base := range filters {
		var want []string
		for _, rec := range all {
			if (base.Status == "" || rec.Status == base.Status) && (base.Principal == "" || rec.Principal == base.Principal) {
				want = append(want, rec.WorkflowID)
			}
		}
		for _, limit := range []int{1, 2, 3, 7, 500} {
			f := base
			f.Limit = limit
			var got []string
			for pages := 0; ; pages++ {
				if pages > readerRuns {
					t.Fatalf("%+v: paging does not end", f)
				}
				p, err := r.ListWorkflows(t.Context(), f)
				if err != nil {
					t.Fatalf("%+v: %v", f, err)
				}
				for _, rec := range p.Items {
					if base.Principal != "" && rec.Principal != base.Principal || base.Status != "" && rec.Status != base.Status {
						t.Errorf("%+v: page holds %s of %s, %s", f, rec.WorkflowID, rec.Principal, rec.Status)
					}
					got = append(got, rec.WorkflowID)
				}
				if p.NextCursor == "" {
					break
				}
				if len(p.Items) != limit {
					t.Errorf("%+v: a page with a next page holds %d runs, want %d", f, len(p.Items), limit)
				}
				f.Cursor = p.NextCursor
			}
			if !slices.Equal(got, want) {
				t.Errorf("%+v: paged\n %v\nwant\n %v", f, got, want)
			}
		}
	}
	p, err := r.ListWorkflows(t.Context(), events.WorkflowFilter{Limit: 1})
	if err != nil || len(p.Items) != 1 || p.Items[0].WorkflowID != all[0].WorkflowID || len(p.Items[0].Steps) != 1 ||
		string(p.Items[0].Input) != `{"n": 1}` {
		t.Errorf("first run = %+v, %v; want the newest, %s, with its record", p.Items, err, all[0].WorkflowID)
	}
}

func TestReaderListWorkflowsRejectsInvalidFilters(t *testing.T) {
	t.Parallel()
	h := setupDB(t)
	r := projector.NewReader(h.pool)
	for _, f := range []events.WorkflowFilter{{Status: "sleeping"}, {Limit: -1}, {Cursor: "not-a-cursor"}} {
		if _, err := r.ListWorkflows(t.Context(), f); !errors.Is(err, events.ErrInvalidFilter) {
			t.Errorf("ListWorkflows(%+v) = %v; want an invalid filter", f, err)
		}
	}
}
