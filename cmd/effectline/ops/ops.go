// Package ops is `effectline ops`, the operator's command line: it lists,
// shows, watches and decides operations through a running effectline API
// (with the same bearer tokens as any client), and reads the dead-letter
// topic from Kafka. Tables are for people; --json prints one JSON document
// per command (for watch, one event per line) for scripts. Every error
// exits non-zero, with the server's own error body when it answered one.
package ops

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/effectline/effectline/events"
)

// Environment variables ops reads. The Kafka ones are the ones every
// effectline process reads, so an operator's shell set up for the server
// works for ops too.
const (
	EnvAPIURL       = "EFFECTLINE_API_URL"
	EnvAPIToken     = "EFFECTLINE_API_TOKEN"
	EnvKafkaBrokers = "EFFECTLINE_KAFKA_BROKERS"
	EnvTopicPrefix  = "EFFECTLINE_TOPIC_PREFIX"
	DefaultAPIURL   = "http://127.0.0.1:8080"
	// dlqSuffix names the dead-letter topic of the intents topic.
	dlqSuffix = events.TopicIntentsDLQ
)

// Usage is the help of `effectline ops`.
const Usage = `Usage: effectline ops COMMAND [flags]

  list [--status S] [--tool T] [--limit N]   operations, newest first (every page, or the first N)
  show KEY                                   an operation's record and its event history
  watch KEY                                  print each event as it is journaled, until the operation settles
  decide KEY ACTION [--note TEXT] [--downstream-id ID]
                                             record a decision: record_success, retry, compensate or abandon;
                                             --downstream-id goes with record_success, to a server that takes it
  workflows [--status S] [ID]                the newest workflows, or one workflow with its steps
  dlq [--limit N]                            the dead letters on the intents' dead-letter topic (from Kafka), oldest first

Every command takes --json: one JSON document (watch: one event per line).
The API is EFFECTLINE_API_URL (default http://127.0.0.1:8080), with the bearer
token EFFECTLINE_API_TOKEN; dlq reads EFFECTLINE_KAFKA_BROKERS and
EFFECTLINE_TOPIC_PREFIX. The exit status is non-zero on any error.
`

// errHelp is returned by parse for -h: the flags were printed, and the
// command ends there, successfully.
var errHelp = errors.New("help requested")

// errUsage is returned for a command line that asks for nothing: the
// usage was printed.
var errUsage = errors.New("ops: a command is required")

// env is what a command needs from the environment.
type env struct {
	getenv func(string) string
	stdout io.Writer
	stderr io.Writer
	json   bool
}

func (e env) client() (*client, error) {
	u := e.getenv(EnvAPIURL)
	if u == "" {
		u = DefaultAPIURL
	}
	return newClient(u, e.getenv(EnvAPIToken))
}

// Run runs `effectline ops args…`.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, Usage)
		return errUsage
	}
	err := run(ctx, args, env{getenv: getenv, stdout: stdout, stderr: stderr})
	if errors.Is(err, errHelp) {
		return nil
	}
	return err
}

func run(ctx context.Context, args []string, e env) error {
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "list":
		return e.list(ctx, rest)
	case "show":
		return e.show(ctx, rest)
	case "watch":
		return e.watch(ctx, rest)
	case "decide":
		return e.decide(ctx, rest)
	case "workflows":
		return e.workflows(ctx, rest)
	case "dlq":
		return e.dlq(ctx, rest)
	case "help", "-h", "--help":
		fmt.Fprint(e.stdout, Usage)
		return nil
	}
	fmt.Fprint(e.stderr, Usage)
	return fmt.Errorf("ops: unknown command %q", cmd)
}

// flags returns a flag set with --json for the command name.
func (e *env) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("effectline ops "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.BoolVar(&e.json, "json", false, "print JSON for scripts instead of a table")
	return fs
}

// parse parses args with flags allowed anywhere (`show KEY --json` as well
// as `show --json KEY`), and returns the positional arguments, of which it
// wants from min to max. After "--" everything is positional, for a key
// that starts with a dash.
func parse(fs *flag.FlagSet, args []string, min, max int, what string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelp
			}
			return nil, fmt.Errorf("%s: %w", fs.Name(), err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if len(pos) < min || len(pos) > max {
		return nil, fmt.Errorf("%s: want %s, got %d argument(s)", fs.Name(), what, len(pos))
	}
	return pos, nil
}

// connect parses the command line of an API command (see parse) and makes
// the API's client.
func (e env) connect(fs *flag.FlagSet, args []string, min, max int, what string) ([]string, *client, error) {
	pos, err := parse(fs, args, min, max, what)
	if err != nil {
		return nil, nil, err
	}
	c, err := e.client()
	if err != nil {
		return nil, nil, err
	}
	return pos, c, nil
}

// printJSON writes v as one indented JSON document.
func (e env) printJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(e.stdout, "%s\n", b)
	return err
}

// listPage is a page of GET /v1/operations, items kept whole for --json.
type listPage struct {
	Items      []json.RawMessage `json:"items"`
	NextCursor string            `json:"next_cursor"`
}

// listPageSize is the page size asked for: the API's largest, so a long
// list takes few requests.
const listPageSize = 500

func (e env) list(ctx context.Context, args []string) error {
	fs := e.flags("list")
	status := fs.String("status", "", "only operations in this status")
	tool := fs.String("tool", "", "only operations of this tool")
	limit := fs.Int("limit", 0, "at most this many operations (0: all)")
	_, c, err := e.connect(fs, args, 0, 0, "no arguments")
	if err != nil {
		return err
	}
	if *limit < 0 {
		return errors.New("effectline ops list: --limit must be 0 or more")
	}
	var items []json.RawMessage
	cursor := ""
	for {
		q := url.Values{}
		if *status != "" {
			q.Set("status", *status)
		}
		if *tool != "" {
			q.Set("tool", *tool)
		}
		size := listPageSize
		if *limit > 0 {
			size = min(size, *limit-len(items))
		}
		q.Set("limit", strconv.Itoa(size))
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		b, err := c.get(ctx, "/v1/operations", q)
		if err != nil {
			return err
		}
		var page listPage
		if err := json.Unmarshal(b, &page); err != nil {
			return fmt.Errorf("GET /v1/operations: the answer is not a page of operations: %w", err)
		}
		items = append(items, page.Items...)
		if page.NextCursor == "" || (*limit > 0 && len(items) >= *limit) {
			break
		}
		if page.NextCursor == cursor {
			return errors.New("GET /v1/operations: the server answered the same cursor twice")
		}
		cursor = page.NextCursor
	}
	if *limit > 0 && len(items) > *limit {
		items = items[:*limit]
	}
	if e.json {
		if items == nil {
			items = []json.RawMessage{}
		}
		return e.printJSON(struct {
			Items []json.RawMessage `json:"items"`
		}{items})
	}
	ops := make([]Operation, 0, len(items))
	for _, raw := range items {
		var o Operation
		if err := json.Unmarshal(raw, &o); err != nil {
			return fmt.Errorf("GET /v1/operations: an item is not an operation: %w", err)
		}
		ops = append(ops, o)
	}
	return writeOperations(e.stdout, ops)
}

// operation loads one record with its history, and returns it whole too.
func (c *client) operation(ctx context.Context, key string) (Operation, json.RawMessage, error) {
	path := "/v1/operations/" + pathKey(key)
	b, err := c.get(ctx, path, nil)
	if err != nil {
		return Operation{}, nil, err
	}
	op, err := decodeOperation(b)
	if err != nil {
		return Operation{}, nil, fmt.Errorf("GET %s: %w", path, err)
	}
	return op, b, nil
}

func decodeOperation(b []byte) (Operation, error) {
	var op Operation
	if err := json.Unmarshal(b, &op); err != nil {
		return Operation{}, fmt.Errorf("the answer is not an operation record: %w", err)
	}
	var raw struct {
		Events []json.RawMessage `json:"events"`
	}
	_ = json.Unmarshal(b, &raw)
	for i := range op.Events {
		if i < len(raw.Events) {
			op.Events[i].raw = raw.Events[i]
		}
	}
	return op, nil
}

func (e env) show(ctx context.Context, args []string) error {
	pos, c, err := e.connect(e.flags("show"), args, 1, 1, "one operation key")
	if err != nil {
		return err
	}
	op, raw, err := c.operation(ctx, pos[0])
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(raw)
	}
	return writeOperation(e.stdout, op)
}

func (e env) watch(ctx context.Context, args []string) error {
	pos, c, err := e.connect(e.flags("watch"), args, 1, 1, "one operation key")
	if err != nil {
		return err
	}
	first := true
	emit := func(evs []Event) error {
		if e.json {
			for _, ev := range evs {
				if _, err := fmt.Fprintf(e.stdout, "%s\n", compactJSON(ev.raw)); err != nil {
					return err
				}
			}
			return nil
		}
		for _, ev := range evs {
			if first {
				fmt.Fprintf(e.stdout, "%-5s  %-23s  %-7s  %-20s  %s\n", "SEQ", "TYPE", "ATTEMPT", "OCCURRED", "DETAIL")
				first = false
			}
			if _, err := fmt.Fprintln(e.stdout, watchLine(ev)); err != nil {
				return err
			}
		}
		return nil
	}
	s := &sseStream{c: c, key: pos[0]}
	defer s.close()
	op, err := watch(ctx, s, emit)
	if err != nil {
		return err
	}
	if !e.json {
		fmt.Fprintf(e.stdout, "settled: %s\n", settledLine(op))
	}
	return nil
}

// watchLine is one event of a watch: fixed columns, since the rows are
// printed one by one as they come and cannot be aligned afterwards.
func watchLine(ev Event) string {
	attempt := ""
	if ev.Attempt > 0 {
		attempt = strconv.Itoa(ev.Attempt)
	}
	return strings.TrimRight(fmt.Sprintf("%-5d  %-23s  %-7s  %-20s  %s", ev.Seq, ev.Type, attempt, stamp(ev.OccurredAt), eventDetail(ev.Data)), " ")
}

// settledLine says how a watched operation settled.
func settledLine(op Operation) string {
	s := op.Status
	if oc := op.Outcome; oc != nil && oc.State != "" {
		s += " (" + oc.State
		if oc.Next != "" {
			s += ", next: " + oc.Next
		}
		s += ")"
	}
	return s
}

// decisionRequest is the body of POST /v1/operations/{key}/decisions.
// downstream_id is for record_success, and is sent only when given: the
// API refuses members it does not know (400 on downstream_id) until it
// takes the id, so every decision without one works against any server.
type decisionRequest struct {
	Action       string `json:"action"`
	Note         string `json:"note,omitempty"`
	DownstreamID string `json:"downstream_id,omitempty"`
}

func (e env) decide(ctx context.Context, args []string) error {
	fs := e.flags("decide")
	note := fs.String("note", "", "why: journaled with the decision and the approver's identity")
	downstreamID := fs.String("downstream-id", "", "record_success: the downstream's id of the effect that happened (a server that does not take it yet answers 400)")
	pos, c, err := e.connect(fs, args, 2, 2, "an operation key and an action")
	if err != nil {
		return err
	}
	b, err := c.post(ctx, "/v1/operations/"+pathKey(pos[0])+"/decisions",
		decisionRequest{Action: pos[1], Note: *note, DownstreamID: *downstreamID})
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(json.RawMessage(b))
	}
	op, err := decodeOperation(b)
	if err != nil {
		return fmt.Errorf("POST decisions: %w", err)
	}
	fmt.Fprintf(e.stdout, "decision %s recorded on %s: now %s\n", pos[1], cell(op.OperationKey, 512), settledLine(op))
	return nil
}

// ErrNoWorkflowAPI is returned when the server has no workflow routes.
var ErrNoWorkflowAPI = errors.New("the server has no workflow API")

func (e env) workflows(ctx context.Context, args []string) error {
	fs := e.flags("workflows")
	status := fs.String("status", "", "only workflows in this status")
	pos, c, err := e.connect(fs, args, 0, 1, "at most one workflow id")
	if err != nil {
		return err
	}
	// A 404 on the list means the route itself is missing. A 404 on one
	// workflow may mean either, so the list is asked first: an unknown id
	// must not be reported as a missing API, nor the reverse.
	q := url.Values{}
	if *status != "" {
		q.Set("status", *status)
	}
	b, err := c.get(ctx, "/v1/workflows", q)
	if IsStatus(err, http.StatusNotFound) || IsStatus(err, http.StatusMethodNotAllowed) {
		return fmt.Errorf("%w: %s answered GET /v1/workflows with 404; this server predates workflows, or runs without them",
			ErrNoWorkflowAPI, c.base.Redacted())
	}
	if err != nil {
		return err
	}
	if len(pos) == 1 {
		if b, err = c.get(ctx, "/v1/workflows/"+pathKey(pos[0]), nil); err != nil {
			return err
		}
		if e.json {
			return e.printJSON(json.RawMessage(b))
		}
		var wf Workflow
		if err := json.Unmarshal(b, &wf); err != nil {
			return fmt.Errorf("GET /v1/workflows/%s: the answer is not a workflow: %w", pos[0], err)
		}
		return writeWorkflow(e.stdout, wf)
	}
	if e.json {
		return e.printJSON(json.RawMessage(b))
	}
	var page workflowPage
	if err := json.Unmarshal(b, &page); err != nil {
		return fmt.Errorf("GET /v1/workflows: the answer is not a page of workflows: %w", err)
	}
	return writeWorkflows(e.stdout, page.Workflows)
}

func (e env) dlq(ctx context.Context, args []string) error {
	fs := e.flags("dlq")
	limit := fs.Int("limit", 0, "only the newest N dead letters (0: all)")
	if _, err := parse(fs, args, 0, 0, "no arguments"); err != nil {
		return err
	}
	if *limit < 0 {
		return errors.New("effectline ops dlq: --limit must be 0 or more")
	}
	var brokers []string
	for _, b := range strings.Split(e.getenv(EnvKafkaBrokers), ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) == 0 {
		return fmt.Errorf("%s is not set: dlq reads the dead-letter topic from Kafka, not from the API", EnvKafkaBrokers)
	}
	prefix := e.getenv(EnvTopicPrefix)
	if prefix == "" {
		prefix = events.DefaultTopicPrefix
	}
	dls, err := readDeadLetters(ctx, brokers, prefix, *limit)
	if err != nil {
		return err
	}
	if e.json {
		if dls == nil {
			dls = []DeadLetter{}
		}
		return e.printJSON(struct {
			Topic string       `json:"topic"`
			Items []DeadLetter `json:"items"`
		}{prefix + dlqSuffix, dls})
	}
	return writeDeadLetters(e.stdout, dls)
}
