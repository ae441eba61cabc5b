package main

// The deployment files (docker-compose.kafka.yml, deploy/Dockerfile,
// deploy/kubernetes) are read by Docker and Kubernetes, never by Go, so no
// compiler notices when they drift from the binary: a renamed variable, a new
// component without a service, a probe on the wrong path, a port published on
// every interface, a real secret pasted into a manifest. These tests parse the
// files and hold them to what the binary reads (app.EnvVars, app.Components).
//
// Identifiers here start with "deploy" so they cannot collide with the rest of
// package main's tests.

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/effectline/effectline/cmd/effectline/app"
)

// Paths relative to the repository root.
const (
	deployRootDir     = "../.."
	deployComposePath = "docker-compose.kafka.yml"
	deployDockerfile  = "deploy/Dockerfile"
	deployToolsPath   = "deploy/tools.example.yaml"
	deployK8sDir      = "deploy/kubernetes"
	// deploySecretExample is the Secret with placeholder values. It is kept
	// out of kustomization.yaml on purpose: an apply must never overwrite the
	// real Secret with placeholders.
	deploySecretExample = "secret-example.yaml"
	// deployPlaceholder marks every credential written in a deployment file.
	deployPlaceholder = "REPLACE_ME"
	deployBinary      = "/effectline"
)

// deployToolUsers are the components that load the tools file: the executor
// calls the tools, the reconciler asks them "did it happen?" and verifies
// their webhooks, the api validates intents against their args_schema.
var deployToolUsers = []string{app.Executor, app.Reconciler, app.API}

// deployPartitionBound are the components that consume a topic in a consumer
// group: replicas beyond the topic's partitions would sit idle.
var deployPartitionBound = []string{app.Executor, app.Projector, app.Reconciler}

// deploySecretName matches environment variables and config keys that hold
// credentials.
var deploySecretName = regexp.MustCompile(`(?i)(PASSWORD|SECRET|TOKEN|CREDENTIAL|PRIVATE_KEY|DATABASE_URL)`)

func deployRead(t *testing.T, rel string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployRootDir, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatalf("reading %s: %v", rel, err)
	}
	return data
}

// TestDeployEnvVarsAreKnown: every EFFECTLINE_* name written anywhere in the
// deployment files and docs is one the binary reads. A misspelled or retired
// variable is otherwise silently ignored by the binary.
func TestDeployEnvVarsAreKnown(t *testing.T) {
	t.Parallel()
	files := []string{deployComposePath}
	err := filepath.WalkDir(filepath.Join(deployRootDir, "deploy"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(deployRootDir, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`EFFECTLINE_[A-Z0-9_]*[A-Z0-9]`)
	seen := 0
	for _, f := range files {
		for i, line := range strings.Split(string(deployRead(t, f)), "\n") {
			for _, v := range name.FindAllString(line, -1) {
				seen++
				if !slices.Contains(app.EnvVars, v) {
					t.Errorf("%s:%d: %s is not an environment variable the binary reads (app.EnvVars: %v)", f, i+1, v, app.EnvVars)
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("found no EFFECTLINE_* variable in the deployment files; is the walk reading the right tree?")
	}
}

// ---- docker-compose.kafka.yml -----------------------------------------------

type deployCompose struct {
	Services map[string]deployComposeService `yaml:"services"`
}

// deployComposeService holds the fields the checks read, in the forms the
// file uses: map-form environment and depends_on, short-syntax ports and
// volumes, list-form command.
type deployComposeService struct {
	Image string `yaml:"image"`
	Build struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck struct {
		Test    []string `yaml:"test"`
		Disable bool     `yaml:"disable"`
	} `yaml:"healthcheck"`
	ReadOnly bool `yaml:"read_only"`
}

// deployInterpolation is Compose's ${NAME}, ${NAME:-default}, ${NAME-default}.
var deployInterpolation = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}`)

// deployResolve interpolates as Compose would with none of the variables set,
// so the checks see the file's own defaults, whatever the test's environment.
func deployResolve(s string) string {
	const dollar = "\x00"
	s = strings.ReplaceAll(s, "$$", dollar)
	s = deployInterpolation.ReplaceAllString(s, "$2")
	return strings.ReplaceAll(s, dollar, "$")
}

func deployLoadCompose(t *testing.T) deployCompose {
	t.Helper()
	var c deployCompose
	if err := yaml.Unmarshal(deployRead(t, deployComposePath), &c); err != nil {
		t.Fatalf("%s: %v", deployComposePath, err)
	}
	for name, s := range c.Services {
		for k, v := range s.Environment {
			s.Environment[k] = deployResolve(v)
		}
		for i, v := range s.Volumes {
			s.Volumes[i] = deployResolve(v)
		}
		c.Services[name] = s
	}
	return c
}

// deployToolsFile is the part of the tools file the checks need.
type deployToolsFile struct {
	Tools []struct {
		Name             string `yaml:"name"`
		SigningSecretEnv string `yaml:"signing_secret_env"`
	} `yaml:"tools"`
}

func deployLoadTools(t *testing.T, data []byte) deployToolsFile {
	t.Helper()
	var f deployToolsFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("tools file: %v", err)
	}
	if len(f.Tools) == 0 {
		t.Fatal("tools file lists no tools")
	}
	return f
}

// deploySigningEnvs are the variables the tools file names in
// signing_secret_env: every process that loads it must have each one set, or
// the binary refuses the file.
func deploySigningEnvs(f deployToolsFile) []string {
	var out []string
	for _, tool := range f.Tools {
		if tool.SigningSecretEnv != "" {
			out = append(out, tool.SigningSecretEnv)
		}
	}
	return out
}

func TestDeployCompose(t *testing.T) {
	t.Parallel()
	c := deployLoadCompose(t)
	tools := deployLoadTools(t, deployRead(t, deployToolsPath))

	for _, name := range []string{"kafka", "postgres", "jaeger", "migrate"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("%s has no %q service", deployComposePath, name)
		}
	}

	// Kafka: a single KRaft node (broker and controller), no auto-created
	// topics since effectline provisions its own, internal topics sized for
	// one broker.
	kafka := c.Services["kafka"]
	if !strings.HasPrefix(kafka.Image, "apache/kafka:") {
		t.Errorf("kafka image %q: want the official apache/kafka", kafka.Image)
	}
	roles := strings.Split(kafka.Environment["KAFKA_PROCESS_ROLES"], ",")
	if !slices.Contains(roles, "controller") || !slices.Contains(roles, "broker") {
		t.Errorf("kafka KAFKA_PROCESS_ROLES=%q: want broker,controller (KRaft, single node)", kafka.Environment["KAFKA_PROCESS_ROLES"])
	}
	node := kafka.Environment["KAFKA_NODE_ID"]
	if node == "" || !strings.Contains(kafka.Environment["KAFKA_CONTROLLER_QUORUM_VOTERS"], node+"@") {
		t.Errorf("kafka: KAFKA_NODE_ID=%q must be a voter in KAFKA_CONTROLLER_QUORUM_VOTERS=%q",
			node, kafka.Environment["KAFKA_CONTROLLER_QUORUM_VOTERS"])
	}
	for k, want := range map[string]string{
		"KAFKA_AUTO_CREATE_TOPICS_ENABLE":        "false",
		"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
	} {
		if got := kafka.Environment[k]; got != want {
			t.Errorf("kafka %s=%q, want %q", k, got, want)
		}
	}
	if len(kafka.Healthcheck.Test) == 0 || kafka.Healthcheck.Disable {
		t.Error("kafka has no healthcheck: the components wait for service_healthy")
	}
	advertised := deployAdvertised(kafka.Environment["KAFKA_ADVERTISED_LISTENERS"], "kafka")
	if len(advertised) == 0 {
		t.Errorf("kafka advertises no listener on the service name: KAFKA_ADVERTISED_LISTENERS=%q", kafka.Environment["KAFKA_ADVERTISED_LISTENERS"])
	}

	pg := c.Services["postgres"]
	if !strings.HasPrefix(pg.Image, "postgres:16") {
		t.Errorf("postgres image %q: want postgres:16", pg.Image)
	}
	if !strings.Contains(strings.Join(pg.Healthcheck.Test, " "), "pg_isready") {
		t.Errorf("postgres healthcheck %q: want pg_isready", pg.Healthcheck.Test)
	}
	if img := c.Services["jaeger"].Image; !strings.HasPrefix(img, "jaegertracing/") {
		t.Errorf("jaeger image %q: want jaegertracing/…", img)
	}

	// effectline's services are the ones built from deploy/Dockerfile: the
	// one-shot migrate and one per component, each running exactly one.
	byComponent := map[string]string{}
	for name, s := range c.Services {
		if path.Clean(s.Build.Dockerfile) != deployDockerfile {
			continue
		}
		if !s.ReadOnly {
			t.Errorf("service %s: want read_only: true (the binary writes nothing)", name)
		}
		if name == "migrate" {
			if !reflect.DeepEqual(s.Command, []string{"migrate"}) {
				t.Errorf("service migrate: command %q, want [migrate]", s.Command)
			}
			deployWantDependsOn(t, name, s, "postgres", "service_healthy")
			continue
		}
		comp, ok := deployRunsComponent(s.Command)
		if !ok {
			t.Errorf("service %s: command %q, want [run --components <one component>] with a component of %v", name, s.Command, app.Components)
			continue
		}
		if comp != name {
			t.Errorf("service %s runs component %q: name the service after its component", name, comp)
		}
		if prev, dup := byComponent[comp]; dup {
			t.Errorf("component %s runs in two services, %s and %s", comp, prev, name)
		}
		byComponent[comp] = name
	}
	for _, comp := range app.Components {
		name, ok := byComponent[comp]
		if !ok {
			t.Errorf("component %s has no service running `run --components %s` built from %s", comp, comp, deployDockerfile)
			continue
		}
		t.Run(comp, func(t *testing.T) {
			deployCheckComposeComponent(t, c, name, comp, advertised, tools)
		})
	}
	deployCheckComposeDatabase(t, c, "migrate")

	// Published ports: loopback only, for every service.
	for name, s := range c.Services {
		for _, p := range s.Ports {
			if ip, _, _, err := deployParsePort(p); err != nil || ip != "127.0.0.1" {
				t.Errorf("service %s publishes %q: bind it to 127.0.0.1 (\"127.0.0.1:HOST:CONTAINER\")", name, p)
			}
		}
	}

	// Credentials: only placeholders.
	for name, s := range c.Services {
		for k, v := range s.Environment {
			if err := deployCheckSecretValue(k, v); err != nil {
				t.Errorf("service %s: %v", name, err)
			}
		}
	}
}

// deployCheckComposeComponent checks one component's service.
func deployCheckComposeComponent(t *testing.T, c deployCompose, name, comp string, advertised []string, tools deployToolsFile) {
	s := c.Services[name]
	port := deployCheckComposeEnv(t, c, name, advertised)

	wantHC := []string{"CMD", deployBinary, "healthcheck", "http://127.0.0.1:" + port + "/healthz"}
	if s.Healthcheck.Disable || !reflect.DeepEqual(s.Healthcheck.Test, wantHC) {
		t.Errorf("service %s: healthcheck %q, want %q (distroless has no shell or curl: the binary checks itself)",
			name, s.Healthcheck.Test, wantHC)
	}
	deployWantDependsOn(t, name, s, "postgres", "service_healthy")
	deployWantDependsOn(t, name, s, "kafka", "service_healthy")
	deployWantDependsOn(t, name, s, "migrate", "service_completed_successfully")

	if got, want := s.Environment["OTEL_SERVICE_NAME"], "effectline-"+comp; got != want {
		t.Errorf("service %s: OTEL_SERVICE_NAME=%q, want %q", name, got, want)
	}

	toolsPath, hasTools := s.Environment[envTools]
	if slices.Contains(deployToolUsers, comp) && !hasTools {
		t.Errorf("service %s: component %s loads the tools file; set %s", name, comp, envTools)
	}
	if hasTools {
		mounted := false
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) >= 2 && parts[1] == toolsPath && path.Clean(parts[0]) == deployToolsPath {
				mounted = true
			}
		}
		if !mounted {
			t.Errorf("service %s: %s=%s but ./%s is not mounted there", name, envTools, toolsPath, deployToolsPath)
		}
		for _, env := range deploySigningEnvs(tools) {
			secret, ok := s.Environment[env]
			if !ok || secret == "" {
				t.Errorf("service %s: the tools file names signing_secret_env %s, which is not set (the binary refuses the file)", name, env)
				continue
			}
			if _, err := deployDecodeWhsec(secret); err != nil {
				t.Errorf("service %s: %s: %v", name, env, err)
			}
		}
	}

	if comp == app.API {
		principals, err := deployTokenPrincipals(s.Environment[envAPITokens])
		if err != nil {
			t.Errorf("service %s: %s: %v", name, envAPITokens, err)
		}
		approvers := app.SplitList(s.Environment[envApprovers])
		if len(approvers) == 0 {
			t.Errorf("service %s: %s is empty: nobody could decide an escalation", name, envApprovers)
		}
		for _, a := range approvers {
			if !slices.Contains(principals, a) {
				t.Errorf("service %s: approver %q has no token in %s", name, a, envAPITokens)
			}
		}
		published := false
		for _, p := range s.Ports {
			if _, _, container, err := deployParsePort(p); err == nil && container == port {
				published = true
			}
		}
		if !published {
			t.Errorf("service %s: the API's port %s is not published (want \"127.0.0.1:%s:%s\")", name, port, port, port)
		}
	}
}

// deployCheckComposeEnv checks what every component's service shares: the
// HTTP address, Kafka, Postgres and the trace exporter. It returns the HTTP
// port.
func deployCheckComposeEnv(t *testing.T, c deployCompose, name string, advertised []string) (port string) {
	t.Helper()
	env := c.Services[name].Environment

	host, port, err := net.SplitHostPort(env[envHTTPAddr])
	if err != nil || host != "0.0.0.0" {
		// The binary's default is loopback: unreachable through a
		// container's published port.
		t.Errorf("service %s: %s=%q, want 0.0.0.0:PORT inside a container", name, envHTTPAddr, env[envHTTPAddr])
	}

	brokers := app.SplitList(env[envKafkaBrokers])
	if len(brokers) == 0 {
		t.Errorf("service %s: %s is not set", name, envKafkaBrokers)
	}
	for _, b := range brokers {
		if !slices.Contains(advertised, b) {
			t.Errorf("service %s: %s names %q, which the kafka service does not advertise (it advertises %v)", name, envKafkaBrokers, b, advertised)
		}
	}

	deployCheckComposeDatabase(t, c, name)

	if u, err := url.Parse(env["OTEL_EXPORTER_OTLP_ENDPOINT"]); err != nil || u.Hostname() != "jaeger" {
		t.Errorf("service %s: OTEL_EXPORTER_OTLP_ENDPOINT=%q, want the jaeger service", name, env["OTEL_EXPORTER_OTLP_ENDPOINT"])
	}
	return port
}

// deployCheckComposeDatabase checks that a service's database URL reaches the
// postgres service with the user, password and database it creates.
func deployCheckComposeDatabase(t *testing.T, c deployCompose, name string) {
	t.Helper()
	pg := c.Services["postgres"].Environment
	raw, ok := c.Services[name].Environment[envDatabaseURL]
	if !ok {
		t.Errorf("service %s: %s is not set (the default is a Postgres on the container's own loopback)", name, envDatabaseURL)
		return
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Errorf("service %s: %s: %v", name, envDatabaseURL, err)
		return
	}
	pass, _ := u.User.Password()
	switch {
	case u.Hostname() != "postgres" || (u.Port() != "" && u.Port() != "5432"):
		t.Errorf("service %s: %s points at %s, want the postgres service", name, envDatabaseURL, u.Host)
	case u.User.Username() != pg["POSTGRES_USER"] || pass != pg["POSTGRES_PASSWORD"]:
		t.Errorf("service %s: %s's user and password differ from the postgres service's POSTGRES_USER and POSTGRES_PASSWORD", name, envDatabaseURL)
	case strings.TrimPrefix(u.Path, "/") != pg["POSTGRES_DB"]:
		t.Errorf("service %s: %s names database %q, the postgres service creates %q", name, envDatabaseURL, strings.TrimPrefix(u.Path, "/"), pg["POSTGRES_DB"])
	}
}

func deployWantDependsOn(t *testing.T, name string, s deployComposeService, dep, condition string) {
	t.Helper()
	d, ok := s.DependsOn[dep]
	if !ok || d.Condition != condition {
		t.Errorf("service %s: want depends_on %s with condition %s", name, dep, condition)
	}
}

// deployRunsComponent reports which single component a command runs.
func deployRunsComponent(args []string) (string, bool) {
	if len(args) != 3 || args[0] != "run" || args[1] != "--components" {
		return "", false
	}
	list, err := app.ParseComponents(args[2])
	if err != nil || len(list) != 1 {
		return "", false
	}
	return list[0], true
}

// deployAdvertised returns the host:port of each advertised listener on host.
func deployAdvertised(listeners, host string) []string {
	var out []string
	for _, l := range app.SplitList(listeners) {
		_, addr, ok := strings.Cut(l, "://")
		if h, _, err := net.SplitHostPort(addr); ok && err == nil && h == host {
			out = append(out, addr)
		}
	}
	return out
}

// deployParsePort parses a short-syntax port, "[IP:]HOST:CONTAINER[/proto]".
func deployParsePort(p string) (ip, host, container string, err error) {
	p, _, _ = strings.Cut(p, "/")
	parts := strings.Split(p, ":")
	switch len(parts) {
	case 3:
		return parts[0], parts[1], parts[2], nil
	case 2:
		return "", parts[0], parts[1], nil
	case 1:
		return "", "", parts[0], nil
	}
	return "", "", "", fmt.Errorf("cannot parse port %q", p)
}

func deployTokenPrincipals(tokens string) ([]string, error) {
	var names []string
	for _, pair := range app.SplitList(tokens) {
		name, tok, ok := strings.Cut(pair, "=")
		if !ok || name == "" || tok == "" {
			return nil, fmt.Errorf("%q is not name=token", pair)
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return nil, errors.New("no tokens: run refuses to start an API without them")
	}
	return names, nil
}

// deployDecodeWhsec decodes a Standard Webhooks secret, "whsec_" + base64.
func deployDecodeWhsec(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
	if err != nil {
		return nil, errors.New(`not a signing secret: want "whsec_" followed by base64`)
	}
	return b, nil
}

// deployCheckSecretValue reports a credential that is not a placeholder: the
// password of a URL, whatever the variable is called, or the value of a
// secret-sounding name. A Standard Webhooks secret may carry the placeholder
// inside its base64, so that a dev value still parses.
func deployCheckSecretValue(name, value string) error {
	if value == "" {
		return nil
	}
	if u, err := url.Parse(value); err == nil && u.Scheme != "" && u.Host != "" {
		if pass, ok := u.User.Password(); ok && !strings.Contains(pass, deployPlaceholder) {
			return fmt.Errorf("%s holds a URL with an inline password; only %s placeholders belong in deployment files", name, deployPlaceholder)
		}
		return nil
	}
	if !deploySecretName.MatchString(name) {
		return nil
	}
	if name == envAPITokens {
		// Every token, not just one of them.
		for _, pair := range app.SplitList(value) {
			if _, tok, _ := strings.Cut(pair, "="); !strings.Contains(tok, deployPlaceholder) {
				return fmt.Errorf("%s holds a token that is not a %s placeholder", name, deployPlaceholder)
			}
		}
		return nil
	}
	if strings.Contains(value, deployPlaceholder) {
		return nil
	}
	if strings.HasPrefix(value, "whsec_") {
		if b, err := deployDecodeWhsec(value); err == nil && strings.Contains(string(b), deployPlaceholder) {
			return nil
		}
	}
	return fmt.Errorf("%s holds an inline secret; only %s placeholders belong in deployment files", name, deployPlaceholder)
}

// ---- deploy/kubernetes ----------------------------------------------------

type deployK8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string            `yaml:"name"`
		Namespace string            `yaml:"namespace"`
		Labels    map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Spec       yaml.Node         `yaml:"spec"`

	file string
}

type deployPodTemplate struct {
	Metadata struct {
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec struct {
		RestartPolicy   string                   `yaml:"restartPolicy"`
		SecurityContext deployK8sSecurityContext `yaml:"securityContext"`
		Containers      []deployK8sContainer     `yaml:"containers"`
		Volumes         []struct {
			Name      string `yaml:"name"`
			ConfigMap *struct {
				Name  string `yaml:"name"`
				Items []struct {
					Key  string `yaml:"key"`
					Path string `yaml:"path"`
				} `yaml:"items"`
			} `yaml:"configMap"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

type deployK8sSecurityContext struct {
	RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
	RunAsUser                *int  `yaml:"runAsUser"`
	ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	Capabilities             struct {
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
	SeccompProfile struct {
		Type string `yaml:"type"`
	} `yaml:"seccompProfile"`
}

type deployK8sKeyRef struct {
	Name string `yaml:"name"`
	Key  string `yaml:"key"`
}

type deployK8sContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Env []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef    *deployK8sKeyRef `yaml:"secretKeyRef"`
			ConfigMapKeyRef *deployK8sKeyRef `yaml:"configMapKeyRef"`
			FieldRef        any              `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	LivenessProbe  *deployK8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *deployK8sProbe `yaml:"readinessProbe"`
	StartupProbe   *deployK8sProbe `yaml:"startupProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext deployK8sSecurityContext `yaml:"securityContext"`
	VolumeMounts    []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
}

type deployK8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"` // int or name
	} `yaml:"httpGet"`
}

// deployK8s is the parsed manifest directory.
type deployK8s struct {
	objects    []deployK8sObject
	resources  []string // kustomization.yaml resources
	namespace  string   // kustomization.yaml namespace
	configMaps map[string]map[string]string
	secrets    map[string]map[string]string // from secret-example.yaml
}

func deployLoadK8s(t *testing.T) deployK8s {
	t.Helper()
	k := deployK8s{configMaps: map[string]map[string]string{}, secrets: map[string]map[string]string{}}
	var kust struct {
		Namespace string   `yaml:"namespace"`
		Resources []string `yaml:"resources"`
	}
	if err := yaml.Unmarshal(deployRead(t, deployK8sDir+"/kustomization.yaml"), &kust); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	k.resources, k.namespace = kust.Resources, kust.Namespace

	entries, err := os.ReadDir(filepath.Join(deployRootDir, deployK8sDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".yaml") || e.Name() == "kustomization.yaml" {
			continue
		}
		dec := yaml.NewDecoder(strings.NewReader(string(deployRead(t, deployK8sDir+"/"+e.Name()))))
		for {
			var o deployK8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", e.Name(), err)
			}
			if o.Kind == "" {
				continue // an empty document
			}
			o.file = e.Name()
			k.objects = append(k.objects, o)
			switch o.Kind {
			case "ConfigMap":
				k.configMaps[o.Metadata.Name] = o.Data
			case "Secret":
				if e.Name() != deploySecretExample {
					t.Errorf("%s: Secret %s: Secrets belong only in %s, as placeholders", e.Name(), o.Metadata.Name, deploySecretExample)
				}
				data := map[string]string{}
				for key, v := range o.StringData {
					data[key] = v
				}
				for key, v := range o.Data {
					b, err := base64.StdEncoding.DecodeString(v)
					if err != nil {
						t.Errorf("%s: Secret %s: data.%s is not base64", e.Name(), o.Metadata.Name, key)
					}
					data[key] = string(b)
				}
				k.secrets[o.Metadata.Name] = data
			}
		}
	}
	return k
}

func (k deployK8s) ofKind(kind string) []deployK8sObject {
	var out []deployK8sObject
	for _, o := range k.objects {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

func TestDeployKubernetes(t *testing.T) {
	t.Parallel()
	k := deployLoadK8s(t)
	toolsData := deployRead(t, deployToolsPath)
	tools := deployLoadTools(t, toolsData)

	// kustomization.yaml lists every manifest but the example Secret.
	entries, err := os.ReadDir(filepath.Join(deployRootDir, deployK8sDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		n := e.Name()
		switch {
		case !strings.HasSuffix(n, ".yaml") || n == "kustomization.yaml":
		case n == deploySecretExample:
			if slices.Contains(k.resources, n) {
				t.Errorf("kustomization.yaml lists %s: an apply would overwrite the real Secret with placeholders", n)
			}
		case !slices.Contains(k.resources, n):
			t.Errorf("kustomization.yaml does not list %s", n)
		}
	}
	for _, r := range k.resources {
		if _, err := os.Stat(filepath.Join(deployRootDir, deployK8sDir, r)); err != nil {
			t.Errorf("kustomization.yaml lists %s: %v", r, err)
		}
	}

	// One namespace, and every object in it.
	namespaces := k.ofKind("Namespace")
	if len(namespaces) != 1 {
		t.Fatalf("want one Namespace, found %d", len(namespaces))
	}
	ns := namespaces[0].Metadata.Name
	if k.namespace != ns {
		t.Errorf("kustomization.yaml namespace %q, want %q", k.namespace, ns)
	}
	for _, o := range k.objects {
		if o.Kind != "Namespace" && o.Metadata.Namespace != ns {
			t.Errorf("%s: %s %s is in namespace %q, want %q", o.file, o.Kind, o.Metadata.Name, o.Metadata.Namespace, ns)
		}
	}

	// Credentials: placeholders in the example Secret, none anywhere else.
	if len(k.secrets) == 0 {
		t.Errorf("%s defines no Secret", deploySecretExample)
	}
	for name, data := range k.secrets {
		for key, v := range data {
			if err := deployCheckSecretValue(key, v); err != nil || !strings.Contains(v, deployPlaceholder) {
				t.Errorf("Secret %s: %s is not a %s placeholder", name, key, deployPlaceholder)
			}
		}
	}
	for name, data := range k.configMaps {
		for key, v := range data {
			if deploySecretName.MatchString(key) {
				t.Errorf("ConfigMap %s: %s looks like a credential; put it in the Secret", name, key)
			}
			if err := deployCheckSecretValue(key, v); err != nil {
				t.Errorf("ConfigMap %s: %v", name, err)
			}
		}
	}

	// The tools ConfigMap carries deploy/tools.example.yaml.
	var want any
	if err := yaml.Unmarshal(toolsData, &want); err != nil {
		t.Fatal(err)
	}
	toolsMaps := 0
	for name, data := range k.configMaps {
		if v, ok := data["tools.yaml"]; ok {
			toolsMaps++
			var got any
			if err := yaml.Unmarshal([]byte(v), &got); err != nil {
				t.Errorf("ConfigMap %s: tools.yaml: %v", name, err)
			} else if !reflect.DeepEqual(got, want) {
				t.Errorf("ConfigMap %s: tools.yaml differs from %s; keep them in step", name, deployToolsPath)
			}
		}
	}
	if toolsMaps == 0 {
		t.Error("no ConfigMap carries tools.yaml")
	}

	// One Deployment per component, each running exactly that component.
	deployments := map[string]deployK8sObject{}
	templates := map[string]deployPodTemplate{}
	for _, o := range k.ofKind("Deployment") {
		var spec struct {
			Replicas *int `yaml:"replicas"`
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			Template deployPodTemplate `yaml:"template"`
		}
		if err := o.Spec.Decode(&spec); err != nil {
			t.Fatalf("%s: %v", o.file, err)
		}
		if len(spec.Template.Spec.Containers) != 1 {
			t.Errorf("%s: want one container, found %d", o.file, len(spec.Template.Spec.Containers))
			continue
		}
		ctr := spec.Template.Spec.Containers[0]
		comp, ok := deployRunsComponent(ctr.Args)
		if !ok || (len(ctr.Command) > 0 && !reflect.DeepEqual(ctr.Command, []string{deployBinary})) {
			t.Errorf("%s: command %q args %q, want args [run --components <one component>] with a component of %v", o.file, ctr.Command, ctr.Args, app.Components)
			continue
		}
		if prev, dup := deployments[comp]; dup {
			t.Errorf("component %s runs in two Deployments, %s and %s", comp, prev.file, o.file)
		}
		deployments[comp], templates[comp] = o, spec.Template
		if !deploySubset(spec.Selector.MatchLabels, spec.Template.Metadata.Labels) || len(spec.Selector.MatchLabels) == 0 {
			t.Errorf("%s: selector %v does not select the pod template's labels %v", o.file, spec.Selector.MatchLabels, spec.Template.Metadata.Labels)
		}

		t.Run(comp, func(t *testing.T) {
			env := deployCheckPod(t, k, o.file, spec.Template)
			deployCheckComponentPod(t, k, o.file, comp, spec.Template, env, tools)
			replicas := 1
			if spec.Replicas != nil {
				replicas = *spec.Replicas
			}
			if replicas < 1 {
				t.Errorf("%s: replicas %d", o.file, replicas)
			}
			if slices.Contains(deployPartitionBound, comp) {
				parts, err := strconv.Atoi(env[envKafkaPartitions].value)
				if err != nil {
					t.Errorf("%s: set %s so the replica bound is explicit: %v", o.file, envKafkaPartitions, err)
				} else if replicas > parts {
					t.Errorf("%s: %d replicas > %d partitions: the extra consumers would sit idle", o.file, replicas, parts)
				}
			}
		})
	}
	for _, comp := range app.Components {
		if _, ok := deployments[comp]; !ok {
			t.Errorf("component %s has no Deployment running `run --components %s`", comp, comp)
		}
	}

	// The migrate Job.
	jobs := k.ofKind("Job")
	migrates := 0
	for _, o := range jobs {
		var spec struct {
			Template deployPodTemplate `yaml:"template"`
		}
		if err := o.Spec.Decode(&spec); err != nil {
			t.Fatalf("%s: %v", o.file, err)
		}
		env := deployCheckPod(t, k, o.file, spec.Template)
		if c := spec.Template.Spec.Containers; len(c) == 1 && reflect.DeepEqual(c[0].Args, []string{"migrate"}) {
			migrates++
			if _, ok := env[envDatabaseURL]; !ok {
				t.Errorf("%s: no %s", o.file, envDatabaseURL)
			}
		}
		if p := spec.Template.Spec.RestartPolicy; p != "Never" && p != "OnFailure" {
			t.Errorf("%s: restartPolicy %q, want Never or OnFailure", o.file, p)
		}
	}
	if migrates != 1 {
		t.Errorf("want one Job running `migrate`, found %d", migrates)
	}

	// A Service in front of the api, and only the api.
	services := k.ofKind("Service")
	if len(services) == 0 {
		t.Error("no Service for the api")
	}
	for _, o := range services {
		var spec struct {
			Selector map[string]string `yaml:"selector"`
			Ports    []struct {
				TargetPort string `yaml:"targetPort"`
			} `yaml:"ports"`
		}
		if err := o.Spec.Decode(&spec); err != nil {
			t.Fatalf("%s: %v", o.file, err)
		}
		for comp, tmpl := range templates {
			if selects := len(spec.Selector) > 0 && deploySubset(spec.Selector, tmpl.Metadata.Labels); selects != (comp == app.API) {
				t.Errorf("%s: Service %s selects %s pods: %v, want only the api's", o.file, o.Metadata.Name, comp, selects)
			}
		}
		for _, p := range spec.Ports {
			if !deployIsHTTPPort(p.TargetPort, templates[app.API]) {
				t.Errorf("%s: targetPort %q is not the api container's HTTP port", o.file, p.TargetPort)
			}
		}
	}

	// The executor's PodDisruptionBudget.
	covered := false
	for _, o := range k.ofKind("PodDisruptionBudget") {
		var spec struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
		}
		if err := o.Spec.Decode(&spec); err != nil {
			t.Fatalf("%s: %v", o.file, err)
		}
		if len(spec.Selector.MatchLabels) > 0 && deploySubset(spec.Selector.MatchLabels, templates[app.Executor].Metadata.Labels) {
			covered = true
		}
	}
	if !covered {
		t.Error("no PodDisruptionBudget selects the executor's pods")
	}
}

// deployEnvValue is one variable of a container's environment: a literal,
// or where it comes from.
type deployEnvValue struct {
	value     string
	secretRef *deployK8sKeyRef
}

// deployCheckPod checks what every effectline pod needs: the image, a locked
// down security context, resources, references that resolve, and credentials
// only from the Secret. It returns the container's environment, with the
// values of envFrom ConfigMaps resolved.
func deployCheckPod(t *testing.T, k deployK8s, file string, tmpl deployPodTemplate) map[string]deployEnvValue {
	t.Helper()
	env := map[string]deployEnvValue{}
	if len(tmpl.Spec.Containers) != 1 {
		t.Errorf("%s: want one container, found %d", file, len(tmpl.Spec.Containers))
		return env
	}
	ctr := tmpl.Spec.Containers[0]
	pod := tmpl.Spec.SecurityContext

	// The image is effectline's (kustomization.yaml's images: rewrites it).
	img := ctr.Image
	img, _, _ = strings.Cut(img, "@")
	if i := strings.LastIndex(img, ":"); i > strings.LastIndex(img, "/") {
		img = img[:i]
	}
	if path.Base(img) != "effectline" {
		t.Errorf("%s: image %q is not effectline's", file, ctr.Image)
	}

	// Security: non-root, read-only root, no privilege escalation, no
	// capabilities, the runtime's seccomp profile.
	sc := ctr.SecurityContext
	if !deployTrue(sc.RunAsNonRoot) && !deployTrue(pod.RunAsNonRoot) {
		t.Errorf("%s: want runAsNonRoot: true", file)
	}
	for _, u := range []*int{sc.RunAsUser, pod.RunAsUser} {
		if u != nil && *u == 0 {
			t.Errorf("%s: runAsUser 0", file)
		}
	}
	if !deployTrue(sc.ReadOnlyRootFilesystem) {
		t.Errorf("%s: want readOnlyRootFilesystem: true", file)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: want allowPrivilegeEscalation: false", file)
	}
	if !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("%s: want capabilities.drop [ALL]", file)
	}
	if sc.SeccompProfile.Type != "RuntimeDefault" && pod.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("%s: want seccompProfile RuntimeDefault", file)
	}

	for _, r := range []string{"cpu", "memory"} {
		if ctr.Resources.Requests[r] == "" {
			t.Errorf("%s: no %s request", file, r)
		}
	}
	if ctr.Resources.Limits["memory"] == "" {
		t.Errorf("%s: no memory limit", file)
	}

	for _, ef := range ctr.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			data, ok := k.configMaps[ef.ConfigMapRef.Name]
			if !ok {
				t.Errorf("%s: envFrom ConfigMap %s does not exist", file, ef.ConfigMapRef.Name)
			}
			for key, v := range data {
				env[key] = deployEnvValue{value: v}
			}
		case ef.SecretRef != nil:
			// Whole-Secret envFrom would hand every credential to every
			// container; name each one with secretKeyRef instead.
			t.Errorf("%s: envFrom Secret %s: use secretKeyRef per variable", file, ef.SecretRef.Name)
		}
	}
	for _, e := range ctr.Env {
		v := deployEnvValue{value: e.Value}
		if vf := e.ValueFrom; vf != nil {
			switch {
			case vf.SecretKeyRef != nil:
				ref := vf.SecretKeyRef
				if _, ok := k.secrets[ref.Name][ref.Key]; !ok {
					t.Errorf("%s: %s refers to Secret %s key %s, which %s does not define", file, e.Name, ref.Name, ref.Key, deploySecretExample)
				}
				v = deployEnvValue{secretRef: ref}
			case vf.ConfigMapKeyRef != nil:
				ref := vf.ConfigMapKeyRef
				data, ok := k.configMaps[ref.Name][ref.Key]
				if !ok {
					t.Errorf("%s: %s refers to ConfigMap %s key %s, which does not exist", file, e.Name, ref.Name, ref.Key)
				}
				v = deployEnvValue{value: data}
			}
		} else if deploySecretName.MatchString(e.Name) {
			t.Errorf("%s: %s is a credential; take it from the Secret with secretKeyRef", file, e.Name)
		}
		if err := deployCheckSecretValue(e.Name, e.Value); err != nil {
			t.Errorf("%s: %v", file, err)
		}
		env[e.Name] = v
	}
	if v, ok := env[envDatabaseURL]; !ok || v.secretRef == nil {
		t.Errorf("%s: %s must come from the Secret (secretKeyRef)", file, envDatabaseURL)
	}
	return env
}

// deployCheckComponentPod checks a component's pod: its HTTP port and probes,
// its service name, the tools file and the API's credentials.
func deployCheckComponentPod(t *testing.T, k deployK8s, file, comp string, tmpl deployPodTemplate, env map[string]deployEnvValue, tools deployToolsFile) {
	ctr := tmpl.Spec.Containers[0]

	host, port, err := net.SplitHostPort(env[envHTTPAddr].value)
	if err != nil || host != "0.0.0.0" {
		t.Errorf("%s: %s=%q, want 0.0.0.0:PORT inside a pod (the binary's default is loopback)", file, envHTTPAddr, env[envHTTPAddr].value)
	}
	exposed := false
	for _, p := range ctr.Ports {
		exposed = exposed || strconv.Itoa(p.ContainerPort) == port
	}
	if !exposed {
		t.Errorf("%s: no containerPort %s (the port of %s)", file, port, envHTTPAddr)
	}
	for _, pr := range []struct {
		name     string
		probe    *deployK8sProbe
		path     string
		required bool
	}{
		{"livenessProbe", ctr.LivenessProbe, "/healthz", true},
		{"readinessProbe", ctr.ReadinessProbe, "/readyz", true},
		{"startupProbe", ctr.StartupProbe, "/healthz", false},
	} {
		switch {
		case pr.probe == nil && !pr.required:
		case pr.probe == nil || pr.probe.HTTPGet == nil:
			t.Errorf("%s: want an httpGet %s on %s", file, pr.name, pr.path)
		case pr.probe.HTTPGet.Path != pr.path:
			t.Errorf("%s: %s path %q, want %q", file, pr.name, pr.probe.HTTPGet.Path, pr.path)
		case pr.probe.HTTPGet.Port != port && !deployNamedPort(ctr, pr.probe.HTTPGet.Port, port):
			t.Errorf("%s: %s port %q is not the container's HTTP port %s", file, pr.name, pr.probe.HTTPGet.Port, port)
		}
	}

	if got, want := env["OTEL_SERVICE_NAME"].value, "effectline-"+comp; got != want {
		t.Errorf("%s: OTEL_SERVICE_NAME=%q, want %q", file, got, want)
	}

	toolsPath, hasTools := env[envTools]
	if slices.Contains(deployToolUsers, comp) && !hasTools {
		t.Errorf("%s: component %s loads the tools file; set %s", file, comp, envTools)
	}
	if hasTools {
		if !deployMountsTools(k, tmpl, toolsPath.value) {
			t.Errorf("%s: %s=%s, but no ConfigMap with tools.yaml is mounted there", file, envTools, toolsPath.value)
		}
		for _, name := range deploySigningEnvs(tools) {
			if v, ok := env[name]; !ok || v.secretRef == nil {
				t.Errorf("%s: the tools file names signing_secret_env %s; take it from the Secret with secretKeyRef", file, name)
			}
		}
	}

	if comp == app.API {
		if v, ok := env[envAPITokens]; !ok || v.secretRef == nil {
			t.Errorf("%s: %s must come from the Secret (secretKeyRef)", file, envAPITokens)
		}
		if len(app.SplitList(env[envApprovers].value)) == 0 {
			t.Errorf("%s: %s is empty: nobody could decide an escalation", file, envApprovers)
		}
	}
}

// deployMountsTools reports whether the file at p comes from a ConfigMap's
// tools.yaml key.
func deployMountsTools(k deployK8s, tmpl deployPodTemplate, p string) bool {
	ctr := tmpl.Spec.Containers[0]
	for _, m := range ctr.VolumeMounts {
		var file string
		switch {
		case m.SubPath != "" && m.MountPath == p:
			file = m.SubPath
		case m.SubPath == "" && path.Dir(p) == path.Clean(m.MountPath):
			file = path.Base(p)
		default:
			continue
		}
		for _, v := range tmpl.Spec.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			key := file
			if len(v.ConfigMap.Items) > 0 {
				key = ""
				for _, it := range v.ConfigMap.Items {
					if it.Path == file {
						key = it.Key
					}
				}
			}
			if _, ok := k.configMaps[v.ConfigMap.Name][key]; ok && key == "tools.yaml" {
				return true
			}
		}
	}
	return false
}

// deployIsHTTPPort reports whether port (a number or a name) is one of the
// pod's container ports.
func deployIsHTTPPort(port string, tmpl deployPodTemplate) bool {
	for _, c := range tmpl.Spec.Containers {
		for _, p := range c.Ports {
			if port == p.Name || port == strconv.Itoa(p.ContainerPort) {
				return true
			}
		}
	}
	return false
}

func deployNamedPort(ctr deployK8sContainer, name, port string) bool {
	for _, p := range ctr.Ports {
		if p.Name == name && strconv.Itoa(p.ContainerPort) == port {
			return true
		}
	}
	return false
}

func deploySubset(sub, of map[string]string) bool {
	for k, v := range sub {
		if of[k] != v {
			return false
		}
	}
	return true
}

func deployTrue(b *bool) bool { return b != nil && *b }

// ---- deploy/Dockerfile ------------------------------------------------------

// deployInstruction is one Dockerfile instruction, continuation lines joined.
type deployInstruction struct {
	cmd  string // upper case
	args string
	line int
}

func deployParseDockerfile(data string) [][]deployInstruction {
	var stages [][]deployInstruction
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() > 0 && strings.HasPrefix(trimmed, "#") {
			continue // a comment inside a continued instruction
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		cur.Reset()
		in := deployInstruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start}
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) > 0 {
			stages[len(stages)-1] = append(stages[len(stages)-1], in)
		}
	}
	return stages
}

func TestDeployDockerfile(t *testing.T) {
	t.Parallel()
	stages := deployParseDockerfile(string(deployRead(t, deployDockerfile)))
	if len(stages) < 2 {
		t.Fatalf("%s: want a multi-stage build, found %d stages", deployDockerfile, len(stages))
	}

	// The build stage compiles ./cmd/effectline statically; the final stage
	// copies that output.
	var builtTo string
	stageNames := map[string]bool{}
	for _, st := range stages[:len(stages)-1] {
		if f := strings.Fields(st[0].args); len(f) >= 3 && strings.EqualFold(f[len(f)-2], "AS") {
			stageNames[f[len(f)-1]] = true
		}
		for _, in := range st {
			if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
				continue
			}
			f := strings.Fields(in.args)
			if !slices.Contains(f, "./cmd/effectline") {
				t.Errorf("%s:%d: go build does not build ./cmd/effectline", deployDockerfile, in.line)
			}
			if !slices.Contains(f, "CGO_ENABLED=0") {
				t.Errorf("%s:%d: want CGO_ENABLED=0: distroless/static has no libc", deployDockerfile, in.line)
			}
			if i := slices.Index(f, "-o"); i >= 0 && i+1 < len(f) {
				builtTo = f[i+1]
			}
		}
	}
	if builtTo == "" {
		t.Fatalf("%s: no build stage runs `go build -o … ./cmd/effectline`", deployDockerfile)
	}

	final := stages[len(stages)-1]
	from := strings.Fields(final[0].args)
	base := from[len(from)-1]
	if len(from) >= 3 && strings.EqualFold(from[len(from)-2], "AS") {
		base = from[len(from)-3]
	}
	if !strings.HasPrefix(base, "gcr.io/distroless/static") {
		t.Errorf("%s: final stage FROM %s, want gcr.io/distroless/static…", deployDockerfile, base)
	}
	user := ""
	var entrypoint, cmd []string
	var exposed []string
	copied := false
	envs := map[string]string{}
	for _, in := range final {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entrypoint = deployExecForm(t, in)
		case "CMD":
			cmd = deployExecForm(t, in)
		case "EXPOSE":
			for _, p := range strings.Fields(in.args) {
				p, _, _ = strings.Cut(p, "/")
				exposed = append(exposed, p)
			}
		case "ENV":
			if k, v, ok := strings.Cut(in.args, "="); ok && !strings.Contains(k, " ") {
				envs[k] = strings.Trim(v, `"`)
			}
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) >= 3 && strings.HasPrefix(f[0], "--from=") && stageNames[strings.TrimPrefix(f[0], "--from=")] &&
				f[len(f)-2] == builtTo && f[len(f)-1] == deployBinary {
				copied = true
			}
		}
	}
	if user == "" && !strings.HasSuffix(base, ":nonroot") {
		t.Errorf("%s: the final stage runs as root: set USER or use a :nonroot base", deployDockerfile)
	}
	if u, _, _ := strings.Cut(user, ":"); u == "0" || u == "root" {
		t.Errorf("%s: USER %s: want a non-root user (65532)", deployDockerfile, user)
	}
	if !copied {
		t.Errorf("%s: the final stage does not COPY --from=<build stage> %s %s", deployDockerfile, builtTo, deployBinary)
	}
	if !reflect.DeepEqual(entrypoint, []string{deployBinary}) {
		t.Errorf("%s: ENTRYPOINT %q, want [%q]", deployDockerfile, entrypoint, deployBinary)
	}
	if want := []string{"run", "--components", strings.Join(app.Components, ",")}; !reflect.DeepEqual(cmd, want) {
		t.Errorf("%s: CMD %q, want %q (every component)", deployDockerfile, cmd, want)
	}
	for k := range envs {
		if strings.HasPrefix(k, "EFFECTLINE_") && !slices.Contains(app.EnvVars, k) {
			t.Errorf("%s: ENV %s is not a variable the binary reads", deployDockerfile, k)
		}
	}
	port := "8080"
	if addr, ok := envs[envHTTPAddr]; ok {
		h, p, err := net.SplitHostPort(addr)
		if err != nil || h != "0.0.0.0" {
			t.Errorf("%s: ENV %s=%s, want 0.0.0.0:PORT", deployDockerfile, envHTTPAddr, addr)
		}
		port = p
	}
	if !slices.Contains(exposed, port) {
		t.Errorf("%s: EXPOSE %v does not include the HTTP port %s", deployDockerfile, exposed, port)
	}
}

// deployExecForm parses an instruction's JSON-array (exec) form. The shell
// form needs a shell, which distroless does not have.
func deployExecForm(t *testing.T, in deployInstruction) []string {
	t.Helper()
	var out []string
	if err := yaml.Unmarshal([]byte(in.args), &out); err != nil || !strings.HasPrefix(in.args, "[") {
		t.Errorf("%s:%d: %s %s: want the exec form [\"…\"] (distroless has no shell)", deployDockerfile, in.line, in.cmd, in.args)
	}
	return out
}
