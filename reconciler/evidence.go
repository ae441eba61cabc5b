package reconciler

import (
	"encoding/json"
	"regexp"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/tool"
)

// requestEvidence is the original request as the approval gate shows it
// (contract §4): what was asked, by whom, under which key — with the tool's
// sensitive arguments redacted. Raw args never leave the event store's
// intent event.
func requestEvidence(op events.Operation, spec *tool.Spec) json.RawMessage {
	b, _ := json.Marshal(struct {
		OperationKey  string             `json:"operation_key"`
		Tool          string             `json:"tool"`
		EffectClass   events.EffectClass `json:"effect_class"`
		Principal     string             `json:"principal"`
		Attempt       int                `json:"attempt"`
		DownstreamKey string             `json:"downstream_key,omitempty"`
		Args          json.RawMessage    `json:"args"`
	}{op.Key, op.Tool, op.EffectClass, op.Principal, op.Attempt, op.DownstreamKey,
		tool.Scrub(spec, validJSON(op.Args), validJSON(op.Args))})
	return b
}

// downstreamEvidence is what the downstream showed when asked. Its body is
// redacted like the args, and so are the args' sensitive values wherever it
// echoes them: a downstream's record of an effect often echoes the request
// that made it.
func downstreamEvidence(op events.Operation, spec *tool.Spec, ans tool.Reconciliation, asks int) json.RawMessage {
	var body json.RawMessage
	if len(ans.Body) > 0 {
		body = downstreamBody(op, spec, ans.Body)
	}
	var errText string
	if ans.Err != nil {
		errText = scrubError(ans.Err.Error())
	}
	b, _ := json.Marshal(struct {
		Answer       tool.Answer     `json:"answer"`
		Asks         int             `json:"asks"`
		DownstreamID string          `json:"downstream_id,omitempty"`
		ErrorClass   string          `json:"error_class,omitempty"`
		Error        string          `json:"error,omitempty"`
		Body         json.RawMessage `json:"body,omitempty"`
	}{ans.Answer, asks, ans.DownstreamID, ans.ErrorClass, errText, body})
	return b
}

// downstreamBody is a downstream's answer as it may be journaled: as
// evidence, and as the result of an operation found done. Raw args never
// leave the intent event, and an answer that echoes them must not carry
// them into the record the API and the approval UI serve.
func downstreamBody(op events.Operation, spec *tool.Spec, body []byte) json.RawMessage {
	return tool.Scrub(spec, validJSON(op.Args), validJSON(body))
}

// queryString matches the query of a URL quoted in an error message. A
// reconcile URL template may put arguments into the query, and net/http
// quotes the whole URL in its errors.
var queryString = regexp.MustCompile(`\?[^\s"']*`)

// scrubError shortens an error message for evidence and strips URL queries.
func scrubError(s string) string {
	s = queryString.ReplaceAllString(s, "?…")
	if len(s) > 500 {
		s = s[:500]
	}
	return s
}
