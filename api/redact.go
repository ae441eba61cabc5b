package api

import (
	"encoding/json"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// Every operation and event the API or the UI shows passes through
// redactOperation or redactEvent, and through nothing else: one place where
// sensitive values are taken out, whichever path reads them. Results and
// evidence are already scrubbed when they are journaled (the executor, the
// reconciler and the webhooks scrub what a downstream answered); they are
// scrubbed again here, which changes nothing for them, so a record journaled
// by an older release or by a writer that forgot is shown redacted all the
// same. Args are journaled whole (the executor needs them) and are only ever
// shown through here.

// redactedWhole stands for args that cannot be redacted field by field
// because their tool is no longer registered: without its schema nothing
// says which fields are secret, so none are shown.
var redactedWhole = json.RawMessage(`"[redacted]"`)

// specOf returns the spec of t, nil when the tool is gone or has none.
func specOf(t tool.Tool) *tool.Spec {
	if t == nil {
		return nil
	}
	return t.Spec()
}

// redactArgs returns args as they may leave in a response.
func redactArgs(t tool.Tool, args json.RawMessage) json.RawMessage {
	if len(args) == 0 {
		return nil
	}
	spec := specOf(t)
	if spec == nil {
		return redactedWhole
	}
	return tool.Scrub(spec, args, args)
}

// redactDoc returns v, a result or evidence about the operation whose args
// are args, as it may leave in a response.
func redactDoc(t tool.Tool, args, v json.RawMessage) json.RawMessage {
	if len(v) == 0 {
		return v
	}
	return tool.Scrub(specOf(t), args, v)
}

// redactOperation returns op with its args, result and escalation evidence
// redacted by t (nil: the tool is gone; args are withheld whole and the
// rest redacted by field names).
func redactOperation(op events.Operation, t tool.Tool) events.Operation {
	out := op
	out.Args = redactArgs(t, op.Args)
	out.Result = redactDoc(t, op.Args, op.Result)
	if f := op.LastFailure; f != nil {
		red := *f
		red.Response = redactDoc(t, op.Args, f.Response)
		out.LastFailure = &red
	}
	if e := op.Escalation; e != nil {
		red := *e
		red.Request = redactDoc(t, op.Args, e.Request)
		red.Downstream = redactDoc(t, op.Args, e.Downstream)
		out.Escalation = &red
	}
	return out
}

// redactEvent returns the data of an event of the operation whose args are
// args, as it may leave in a response: the args of an intent, results and
// evidence redacted.
func redactEvent(e events.Envelope, t tool.Tool, args json.RawMessage) (events.Envelope, error) {
	d, err := e.DecodeData()
	if err != nil {
		return e, err
	}
	var data any
	switch d := d.(type) {
	case *events.IntentData:
		red := *d
		red.Args = redactArgs(t, d.Args)
		data = red
	case *events.AttemptSucceededData:
		red := *d
		red.Result = redactDoc(t, args, d.Result)
		data = red
	case *events.AttemptFailedData:
		red := *d
		red.Response = redactDoc(t, args, d.Response)
		data = red
	case *events.ReconciliationResolvedData:
		red := *d
		red.Result = redactDoc(t, args, d.Result)
		data = red
	case *events.EscalationData:
		red := *d
		red.Request = redactDoc(t, args, d.Request)
		red.Downstream = redactDoc(t, args, d.Downstream)
		data = red
	}
	if data != nil {
		if e.Data, err = json.Marshal(data); err != nil {
			return e, err
		}
	}
	return e, nil
}
