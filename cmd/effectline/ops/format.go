package ops

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// Tables are for people: aligned columns, times in UTC to the second, long
// values cut. Scripts use --json, which passes the server's records through.

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// fieldRow returns a writer of one record's name-value rows on tw, which
// leaves out the empty values: a record shows what it has.
func fieldRow(tw io.Writer) func(name, value string) {
	return func(name, value string) {
		if value != "" {
			fmt.Fprintf(tw, "%s\t%s\n", name, value)
		}
	}
}

// writeOperations writes a list of operations as a table.
func writeOperations(w io.Writer, ops []Operation) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "KEY\tTOOL\tCLASS\tSTATUS\tATTEMPT\tUPDATED")
	for _, o := range ops {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", cell(o.OperationKey, 64), cell(o.Tool, 32),
			o.EffectClass, o.Status, o.Attempt, stamp(o.UpdatedAt))
	}
	return tw.Flush()
}

// writeOperation writes one record, then its history.
func writeOperation(w io.Writer, o Operation) error {
	tw := newTable(w)
	row := fieldRow(tw)
	row("operation_key", cell(o.OperationKey, 512))
	row("tool", o.Tool)
	row("effect_class", o.EffectClass)
	row("status", o.Status)
	if oc := o.Outcome; oc != nil && oc.State != "" {
		s := oc.State
		if oc.Next != "" {
			s += ", next: " + oc.Next
		}
		if oc.Retryable {
			s += ", retryable"
		}
		row("outcome", s)
		row("reason", cell(oc.Reason, 200))
	}
	row("attempt", strconv.Itoa(o.Attempt))
	row("principal", o.Principal)
	row("downstream_id", o.DownstreamID)
	row("undo_ref", o.UndoRef)
	row("last_error_class", o.LastErrorClass)
	if o.LeaseUntil != nil {
		row("lease_until", stamp(*o.LeaseUntil))
	}
	row("created_at", stamp(o.CreatedAt))
	row("updated_at", stamp(o.UpdatedAt))
	if len(o.Result) > 0 && string(o.Result) != "null" {
		row("result", cell(compactJSON(o.Result), 200))
	}
	if e := o.Escalation; e != nil {
		row("escalation", e.Reason)
		row("proposed_action", e.ProposedAction)
		row("escalation_detail", cell(e.Detail, 200))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(o.Events) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	return writeEvents(w, o.Events, true)
}

// writeEvents writes events as a table, with its header when header is set
// (a watch prints the header once, then a row per event as it comes).
func writeEvents(w io.Writer, evs []Event, header bool) error {
	tw := newTable(w)
	if header {
		fmt.Fprintln(tw, "SEQ\tTYPE\tATTEMPT\tOCCURRED\tDETAIL")
	}
	for _, e := range evs {
		attempt := ""
		if e.Attempt > 0 {
			attempt = strconv.Itoa(e.Attempt)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", e.Seq, e.Type, attempt, stamp(e.OccurredAt), eventDetail(e.Data))
	}
	return tw.Flush()
}

// eventDetailKeys are the members of event data worth a glance, in the
// order shown. Arguments, results, requests and free-text errors are left
// to `show --json`: they are long, and the table is for scanning.
var eventDetailKeys = []string{
	"principal", "downstream_key", "status_code", "kind", "error_class", "next", "outcome",
	"found", "source", "downstream_id", "reason", "proposed_action", "action", "approver", "note", "retry_at", "late",
}

// eventDetail summarizes an event's data as key=value pairs.
func eventDetail(data json.RawMessage) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return ""
	}
	var parts []string
	for _, k := range eventDetailKeys {
		v, ok := m[k]
		if !ok {
			continue
		}
		var s string
		if json.Unmarshal(v, &s) != nil {
			s = string(v)
		}
		if s == "" {
			continue
		}
		parts = append(parts, k+"="+cell(s, 60))
	}
	return strings.Join(parts, " ")
}

// writeWorkflows writes a list of workflows as a table.
func writeWorkflows(w io.Writer, wfs []Workflow) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tWORKFLOW\tSTATUS\tUPDATED")
	for _, f := range wfs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cell(f.WorkflowID, 64), cell(f.Workflow, 32), f.Status, stamp(f.UpdatedAt))
	}
	return tw.Flush()
}

// writeWorkflow writes one workflow record, then its steps.
func writeWorkflow(w io.Writer, f Workflow) error {
	tw := newTable(w)
	row := fieldRow(tw)
	row("workflow_id", cell(f.WorkflowID, 512))
	row("workflow", f.Workflow)
	row("status", f.Status)
	row("principal", f.Principal)
	row("current_step", f.Current)
	row("awaiting", cell(f.Awaiting, 512))
	row("created_at", stamp(f.CreatedAt))
	row("updated_at", stamp(f.UpdatedAt))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(f.Steps) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "STEP\tTOOL\tCLASS\tSTATUS\tOPERATION\tDOWNSTREAM_ID")
	for _, s := range f.Steps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", cell(s.Name, 32), cell(s.Tool, 32), s.EffectClass, s.Status,
			cell(s.OperationKey, 64), cell(s.DownstreamID, 48))
	}
	return tw.Flush()
}

// writeDeadLetters writes dead letters as a table.
func writeDeadLetters(w io.Writer, dls []DeadLetter) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "PARTITION\tOFFSET\tTIME\tKEY\tREASON\tSOURCE\tVALUE")
	for _, d := range dls {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\n", d.DLQPartition, d.DLQOffset, stamp(d.At),
			cell(string(d.Key), 48), cell(d.Reason, 60), d.source(), cell(string(d.Value), 80))
	}
	return tw.Flush()
}

// stamp is a time for a table: UTC, to the second; "" for the zero time.
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// cell makes s safe for one table cell: control characters and invalid
// UTF-8 are escaped (a key or a dead letter may hold anything, and must not
// break the table or the terminal), and it is cut to max runes with "…".
func cell(s string, max int) string {
	var b strings.Builder
	n := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		var piece string
		switch {
		case r == utf8.RuneError && size == 1:
			piece = fmt.Sprintf(`\x%02x`, s[i])
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			piece = strings.Trim(strconv.QuoteRune(r), "'")
		default:
			piece = string(r)
		}
		if n+utf8.RuneCountInString(piece) > max {
			b.WriteString("…")
			return b.String()
		}
		b.WriteString(piece)
		n += utf8.RuneCountInString(piece)
		i += size
	}
	return b.String()
}

// compactJSON returns raw on one line.
func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}
