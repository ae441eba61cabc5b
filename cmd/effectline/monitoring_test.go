package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The monitoring that ships in deploy/: Prometheus alert rules and a
// Grafana dashboard. These tests keep them loadable and keep every metric
// they name one that effectline exports, so a renamed metric cannot leave
// an alert that silently never fires.

const (
	opsRoot       = "../.."
	opsAlerts     = "deploy/prometheus/alerts.yaml"
	opsAlertTests = "deploy/prometheus/alerts_test.yaml"
	opsDashboard  = "deploy/grafana/effectline.json"
	opsMetricsDoc = "docs/observability.md"
)

// opsForeignMetrics are metrics the rules may name that effectline does
// not export: Prometheus's own.
var opsForeignMetrics = []string{"up"}

func opsRead(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(opsRoot, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// opsDocumentedMetrics returns the metrics table of docs/observability.md
// (the authoritative list, which TestMetricsAfterAScriptedRun holds to what
// /metrics serves): each name with its type.
func opsDocumentedMetrics(t *testing.T) map[string]string {
	t.Helper()
	row := regexp.MustCompile("^\\| `([a-z_:][a-z0-9_:]*)` \\| (counter|gauge|histogram) \\|")
	out := map[string]string{}
	for _, line := range strings.Split(string(opsRead(t, opsMetricsDoc)), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			out[m[1]] = m[2]
		}
	}
	if len(out) < 10 {
		t.Fatalf("%s: found %d metrics in its table; has the table's format changed?", opsMetricsDoc, len(out))
	}
	return out
}

var (
	opsQuoted    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	opsMatchers  = regexp.MustCompile(`\{[^}]*\}`)
	opsGrafana   = regexp.MustCompile(`\$[A-Za-z_]+`)
	opsIdent     = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	opsOurMetric = regexp.MustCompile(`^(effectline_|http_server_)`)
)

// opsMetricsIn returns the metric names a PromQL expression reads: its
// identifiers outside strings and label matchers that look like
// effectline's, plus the foreign ones it knows.
func opsMetricsIn(expr string) []string {
	s := opsQuoted.ReplaceAllString(expr, `""`)
	s = opsMatchers.ReplaceAllString(s, "{}")
	s = opsGrafana.ReplaceAllString(s, "5m")
	var out []string
	for _, id := range opsIdent.FindAllString(s, -1) {
		if opsOurMetric.MatchString(id) || slices.Contains(opsForeignMetrics, id) {
			out = append(out, id)
		}
	}
	return out
}

// opsCheckMetric reports what is wrong with a metric name, "" if nothing:
// it must be documented, a histogram read through its _bucket, _sum or
// _count series.
func opsCheckMetric(name string, doc map[string]string) string {
	if slices.Contains(opsForeignMetrics, name) {
		return ""
	}
	if typ, ok := doc[name]; ok {
		if typ == "histogram" {
			return "a histogram is read through its _bucket, _sum or _count series"
		}
		return ""
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && doc[base] == "histogram" {
			return ""
		}
	}
	return "not a metric effectline exports (" + opsMetricsDoc + ")"
}

type opsRuleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestOpsAlertRulesNameExportedMetrics: every alert reads metrics that
// effectline exports, has a severity and says what to do; and the alerts
// deploy/OPERATIONS.md describes are all there.
func TestOpsAlertRulesNameExportedMetrics(t *testing.T) {
	t.Parallel()
	doc := opsDocumentedMetrics(t)
	var f opsRuleFile
	if err := yaml.Unmarshal(opsRead(t, opsAlerts), &f); err != nil {
		t.Fatalf("%s: %v", opsAlerts, err)
	}
	seen := map[string]bool{}
	read := map[string]bool{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || seen[r.Alert] {
				t.Errorf("%s: alert %q: empty or repeated name", g.Name, r.Alert)
			}
			seen[r.Alert] = true
			if sev := r.Labels["severity"]; sev != "warning" && sev != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", r.Alert, sev)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs a summary and a description", r.Alert)
			}
			metrics := opsMetricsIn(r.Expr)
			if len(metrics) == 0 {
				t.Errorf("%s: the expression names no metric: %s", r.Alert, r.Expr)
			}
			for _, m := range metrics {
				read[strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_count")] = true
				if why := opsCheckMetric(m, doc); why != "" {
					t.Errorf("%s: %s: %s", r.Alert, m, why)
				}
			}
		}
	}
	// The signals of OPERATIONS.md's alert table that Prometheus can see
	// (the states of the read model are a SQL query, not a metric).
	for _, m := range []string{
		"effectline_attempts_total", "effectline_escalations_total", "effectline_outbox_lag_seconds",
		"effectline_kafka_consumer_lag", "effectline_projection_lag_seconds", "effectline_projection_rewinds_total",
		"effectline_journal_commit_appends", "effectline_leases_expired_total", "up", "effectline_http_requests_total",
		"effectline_operation_duration_seconds", "effectline_dead_letters_total",
	} {
		if !read[m] {
			t.Errorf("no alert reads %s", m)
		}
	}
}

// TestOpsPromtool runs promtool on the rules, their unit tests, and the
// dashboard's queries.
func TestOpsPromtool(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("promtool is not installed (Debian: apt-get install prometheus; .ci/run does this): %v", err)
		}
		t.Skip("promtool is not installed: apt-get install prometheus (Debian) to check the alert rules")
	}
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(promtool, args...)
		cmd.Dir = opsRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("check", "rules", opsAlerts)
	run("test", "rules", opsAlertTests)

	// The dashboard's queries, as recording rules, so promtool parses each.
	// Grafana's variables become what Grafana would put there.
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for i, q := range opsDashboardQueries(t) {
		expr := strings.NewReplacer("$__rate_interval", "5m", "$__range", "6h", "$tool", ".*").Replace(q.expr)
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: expr})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	run("check", "rules", p)
}

type opsQuery struct{ panel, expr string }

type opsGrafanaDashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		GridPos struct{ X, Y, W, H int } `json:"gridPos"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func opsLoadDashboard(t *testing.T) opsGrafanaDashboard {
	t.Helper()
	var d opsGrafanaDashboard
	raw := opsRead(t, opsDashboard)
	if !json.Valid(raw) {
		t.Fatalf("%s is not valid JSON", opsDashboard)
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", opsDashboard, err)
	}
	return d
}

func opsDashboardQueries(t *testing.T) []opsQuery {
	var out []opsQuery
	for _, p := range opsLoadDashboard(t).Panels {
		for _, tg := range p.Targets {
			out = append(out, opsQuery{p.Title, tg.Expr})
		}
	}
	return out
}

// TestOpsDashboard: the Grafana dashboard is a dashboard Grafana imports
// (valid JSON, unique panel ids, panels on the 24-column grid, every query
// on the datasource variable), its queries read exported metrics, and it
// shows what an SRE watches.
func TestOpsDashboard(t *testing.T) {
	t.Parallel()
	doc := opsDocumentedMetrics(t)
	d := opsLoadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("the dashboard needs a uid and a title")
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["datasource"] {
		t.Errorf("no datasource variable: the dashboard would be tied to one Prometheus")
	}
	ids := map[int]bool{}
	read := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("panel %q: id %d is zero or repeated", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v is off the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || len(p.Targets) == 0 {
			t.Errorf("panel %d: needs a title and a query", p.ID)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource is not the ${datasource} variable", p.Title)
		}
		for _, tg := range p.Targets {
			ms := opsMetricsIn(tg.Expr)
			if len(ms) == 0 {
				t.Errorf("panel %q: query names no metric: %s", p.Title, tg.Expr)
			}
			for _, m := range ms {
				read[m] = true
				if why := opsCheckMetric(m, doc); why != "" {
					t.Errorf("panel %q: %s: %s", p.Title, m, why)
				}
			}
			for _, v := range opsGrafana.FindAllString(tg.Expr, -1) {
				if v != "$__rate_interval" && v != "$__range" && !vars[v[1:]] {
					t.Errorf("panel %q: %s is not a variable of the dashboard", p.Title, v)
				}
			}
		}
	}
	for what, m := range map[string]string{
		"attempts by outcome":   "effectline_attempts_total",
		"unknowns":              "effectline_unknowns_total",
		"escalations":           "effectline_escalations_total",
		"decisions":             "effectline_decisions_total",
		"outbox lag":            "effectline_outbox_lag_seconds",
		"consumer lag":          "effectline_kafka_consumer_lag",
		"end-to-end latency":    "effectline_operation_duration_seconds_bucket",
		"dead letters":          "effectline_dead_letters_total",
		"projection staleness":  "effectline_projection_lag_seconds_bucket",
		"tool call durations":   "effectline_call_duration_seconds_bucket",
		"journal commit counts": "effectline_journal_commit_appends_count",
	} {
		if !read[m] {
			t.Errorf("the dashboard does not show %s (%s)", what, m)
		}
	}
}

// TestOpsMonitoringIsLinked: OPERATIONS.md points operators at the files.
func TestOpsMonitoringIsLinked(t *testing.T) {
	t.Parallel()
	ops := string(opsRead(t, "deploy/OPERATIONS.md"))
	for _, f := range []string{"prometheus/alerts.yaml", "grafana/effectline.json"} {
		if !strings.Contains(ops, f) {
			t.Errorf("deploy/OPERATIONS.md does not mention %s", f)
		}
	}
}
