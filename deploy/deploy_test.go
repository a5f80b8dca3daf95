// Package deploy_test checks the deployment files under deploy/: the Kubernetes manifests in
// deploy/kubernetes (kustomize) and deploy/Dockerfile. No cluster is needed: every YAML document is
// parsed with go.yaml.in/yaml/v3 into the API's own field names (types_test.go, unknown fields refused)
// and checked for what the Kubernetes and KEDA schemas require, for the references between objects,
// and for the campaignctl command lines against the CLI's contract.
//
// What is checked (TestManifests; TestChecksCatchBreakage breaks the files on purpose, one way per row
// or more, and expects each break to be reported):
//
//	| object                | checks                                                                                  |
//	|-----------------------|-----------------------------------------------------------------------------------------|
//	| every document        | parses; no unknown or misplaced field; string fields are YAML strings (quoted 100,      |
//	|                       | "true"); apiVersion matches kind; metadata.name a DNS-1123 label; (kind, name) unique;  |
//	|                       | label and annotation keys/values valid; no namespace other than the kustomization's     |
//	| Deployment            | selector.matchLabels non-empty and contained in the pod template labels; at least one   |
//	|                       | container, each with a unique DNS-label name and an image; ports 1-65535 with unique    |
//	|                       | names (IANA service names); readiness and liveness probes with one handler on a port    |
//	|                       | the container declares; restartPolicy Always                                           |
//	| Job                   | restartPolicy Never or OnFailure; backoffLimit and ttlSecondsAfterFinished set          |
//	| every pod             | image ghcr.io/campaignctl/campaignctl with a tag; non-root, no privilege escalation,      |
//	|                       | read-only root fs, capabilities drop ALL, seccomp RuntimeDefault; cpu/memory requests,  |
//	|                       | memory limit >= request; env names valid, unique and read by campaignctl (README        |
//	|                       | "Configuration" table); secret settings only from secretKeyRef; every secretKeyRef,     |
//	|                       | configMapKeyRef, envFrom and secret volume names an existing Secret/ConfigMap and a     |
//	|                       | key it holds; every volumeMount names a volume                                          |
//	| campaignctl commands  | subcommand and every flag exist (table `commands`, from README/design.md) and are       |
//	|                       | documented in README.md or docs/operations.md; flag values well formed (addresses,      |
//	|                       | durations, URLs, numbers); no stray arguments                                           |
//	| Service               | selector matches the pod labels of exactly one Deployment; ports valid; targetPort a    |
//	|                       | port of that Deployment's containers                                                    |
//	| PodDisruptionBudget   | exactly one of minAvailable/maxUnavailable; selector matches a Deployment               |
//	| worker Deployment     | runs `worker`; no spec.replicas (the ScaledObject owns it); a PDB; terminationGrace >=  |
//	|                       | --shutdown-timeout + 15s; probes GET /healthz on the --metrics-addr port; prometheus.io |
//	|                       | scrape/port/path annotations on that port; memory limit 128Mi-512Mi (target <= 100 MB   |
//	|                       | RSS) and GOMEMLIMIT below it; GOOGLE_APPLICATION_CREDENTIALS names a mounted Secret file |
//	| ui Deployment         | runs `ui --read-only`; a non-loopback --addr has credentials (CAMPAIGNCTL_UI_AUTH from  |
//	|                       | the Secret, or --basic-auth-file); a Service reaches its --addr port                    |
//	| webhooks Deployment   | a Service reaches its --addr port; TWILIO_STATUS_CALLBACK = --public-url + /twilio/status; |
//	|                       | probes GET /healthz                                                                     |
//	| migrate Job           | runs `migrate`                                                                          |
//	| ScaledObject          | scaleTargetRef names an existing Deployment (apps/v1); 1 <= minReplicaCount <= max       |
//	|                       | (with no worker running nothing moves scheduled/retry batches to pending); cooldownPeriod |
//	|                       | set; triggers have type and metadata; a `redis` trigger on asynq:{campaigns}:pending (the |
//	|                       | queue name read from the worker package) with 1 <= listLength <= --concurrency; an     |
//	|                       | active-list trigger, if any, with listLength = --concurrency and summed with the pending |
//	|                       | one by scalingModifiers (formula pending + active, target --concurrency, AverageValue); |
//	|                       | trigger names unique; databaseIndex and enableTLS agree with REDIS_URL;                 |
//	|                       | authenticationRef names a TriggerAuthentication; the commented redis-cluster and        |
//	|                       | redis-sentinel alternatives are there                                                   |
//	| TriggerAuthentication | secretTargetRef parameters known to KEDA's redis scalers; Secret and key exist; address |
//	|                       | and password equal REDIS_URL's                                                          |
//	| example Secret        | every value a placeholder (REPLACE_ME), except values derived from others and checked   |
//	|                       | against them (REDIS_ADDRESS, GOOGLE_APPLICATION_CREDENTIALS); keys valid                |
//	| ConfigMap             | keys valid; *_RATE values non-negative numbers                                          |
//	| kustomization.yaml    | lists every manifest file exactly once and nothing else; `images` names the image       |
//	| Dockerfile            | golang:<go.mod's go version> build stage; `go build` with CGO_ENABLED=0 of ./cmd/campaignctl |
//	|                       | (a package main in the repository); distroless/static runtime as a non-root user;        |
//	|                       | ENTRYPOINT the binary copied from the build stage                                       |
package deploy_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const (
	// imageRepo is the image every container runs (deploy/Dockerfile builds it).
	imageRepo = "ghcr.io/campaignctl/campaignctl"
	// mainPackage is the package the Dockerfile must build.
	mainPackage = "./cmd/campaignctl"
	// gracefulMargin is what terminationGracePeriodSeconds must leave beyond the worker's
	// --shutdown-timeout: the last provider call and the outcome writes.
	gracefulMargin = 15 * time.Second
	// placeholder marks every value of the example Secret.
	placeholder = "REPLACE_ME"
)

// flagSpec is one flag of the CLI: whether it takes a value, and how to check the value.
type flagSpec struct {
	value bool
	check func(string) error
}

// commandSpec is one subcommand: its flags and how many positional arguments it takes.
type commandSpec struct {
	flags   map[string]flagSpec
	maxArgs int
}

// commands is the CLI contract (README.md "Commands", each command's --help, docs/operations.md for
// --shutdown-timeout): a manifest may run only these.
var commands = map[string]commandSpec{
	"migrate": {},
	"worker": {flags: map[string]flagSpec{
		"--concurrency":      {true, intIn(1, 1000)},
		"--provider-timeout": {true, durationIn(100*time.Millisecond, 5*time.Minute)},
		"--shutdown-timeout": {true, durationIn(time.Second, time.Hour)},
		"--metrics-addr":     {true, listenAddr},
	}},
	"workers": {flags: map[string]flagSpec{
		"--min": {true, intIn(0, 1000)},
		"--max": {true, intIn(1, 1000)},
	}},
	"ui": {flags: map[string]flagSpec{
		"--addr":            {true, listenAddr},
		"--read-only":       {false, nil},
		"--basic-auth-file": {true, nonEmpty},
		"--prometheus-addr": {true, httpURL},
	}},
	"webhooks": {flags: map[string]flagSpec{
		"--addr":       {true, listenAddr},
		"--public-url": {true, httpURL},
		"--spool-dir":  {true, absPath},
	}},
	"status":   {flags: map[string]flagSpec{"--watch": {false, nil}, "--json": {false, nil}}, maxArgs: 1},
	"resume":   {flags: map[string]flagSpec{"--resend-unknown": {false, nil}}, maxArgs: 1},
	"dlq list": {flags: map[string]flagSpec{"--campaign": {true, intIn(1, 1<<62)}, "--json": {false, nil}}},
	"iys sync": {flags: map[string]flagSpec{"--reverify": {false, nil}, "--json": {false, nil}}},
	"iys push": {flags: map[string]flagSpec{"--wait": {true, durationIn(0, time.Hour)}, "--result-after": {true, durationIn(0, time.Hour)},
		"--batch-from": {true, intIn(0, 1000000)}, "--json": {false, nil}}},
}

// globalFlags are the root command's persistent flags, valid after any subcommand.
var globalFlags = map[string]flagSpec{
	"--log-level":             {true, oneOf("debug", "info", "warn", "error")},
	"--database-url":          {true, nonEmpty},
	"--redis-url":             {true, nonEmpty},
	"--audience-database-url": {true, nonEmpty},
}

// extraEnv are environment variables a container may set beyond README's "Configuration" table.
var extraEnv = map[string]string{
	"CAMPAIGNCTL_UI_AUTH":   "campaignctl ui: user:password for HTTP basic auth off loopback",
	"IYS_BASE_URL":          "design.md: İYS API",
	"IYS_USERNAME":          "design.md: İYS API",
	"IYS_PASSWORD":          "design.md: İYS API",
	"IYS_CODE":              "design.md: İYS API",
	"IYS_BRAND_CODE":        "design.md: İYS API",
	"GOMEMLIMIT":            "Go runtime: soft memory limit",
	"GOMAXPROCS":            "Go runtime",
	"AUDIENCE_DATABASE_URL": "README: the audience database",
	"SSL_CERT_FILE":         "Go crypto/x509: a CA bundle (a private CA for rediss:// or Postgres TLS)",
}

// secretEnv are settings that carry credentials: a manifest takes them from a Secret, never as a value.
var secretEnv = []string{"DATABASE_URL", "AUDIENCE_DATABASE_URL", "REDIS_URL", "TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN",
	"SENDGRID_API_KEY", "SENDGRID_WEBHOOK_PUBLIC_KEY", "WEBHOOK_SECRET", "IYS_PASSWORD", "CAMPAIGNCTL_UI_AUTH", "UNSUBSCRIBE_SECRET"}

// derivedSecretKeys are the example Secret's values that are not placeholders of their own: each is
// checked against what it derives from.
var derivedSecretKeys = map[string]string{
	"REDIS_ADDRESS":                  "host:port of REDIS_URL (checked)",
	"GOOGLE_APPLICATION_CREDENTIALS": "the path of the mounted service-account file (checked)",
}

// redisAuthParams are the TriggerAuthentication parameters KEDA's redis, redis-cluster and redis-sentinel
// scalers read (keda pkg/scalers/redis_scaler.go, redisConnectionInfo and redisMetadata).
var redisAuthParams = []string{"address", "addresses", "host", "hosts", "port", "ports", "username", "password",
	"sentinelUsername", "sentinelPassword", "sentinelMaster", "tls", "ca", "cert", "key", "keyPassword"}

// apiVersions is the apiVersion of each kind the manifests may hold.
var apiVersions = map[string]string{
	"Namespace":             "v1",
	"ConfigMap":             "v1",
	"Secret":                "v1",
	"Service":               "v1",
	"Deployment":            "apps/v1",
	"Job":                   "batch/v1",
	"CronJob":               "batch/v1",
	"PodDisruptionBudget":   "policy/v1",
	"ScaledObject":          "keda.sh/v1alpha1",
	"TriggerAuthentication": "keda.sh/v1alpha1",
}

func TestManifests(t *testing.T) {
	facts := loadFacts(t)
	problems := check(loadFiles(t), facts)
	for _, p := range problems {
		t.Error(p)
	}
}

// TestChecksCatchBreakage breaks the files in ways a careless edit would, and expects check to say so:
// the checks above are not vacuous.
func TestChecksCatchBreakage(t *testing.T) {
	facts := loadFacts(t)
	files := loadFiles(t)
	workerEnv := func(name, key string) string {
		return "            - name: " + name + "\n              valueFrom:\n                secretKeyRef:\n                  name: campaignctl-secrets\n                  key: " + key + "\n"
	}
	cases := []struct {
		name, file, old, new, want string
	}{
		{"pending list misnamed", "kubernetes/worker-scaledobject.yaml", `listName: "asynq:{campaigns}:pending"`, `listName: "asynq:campaigns:pending"`, "asynq:{campaigns}:pending"},
		{"scale target missing", "kubernetes/worker-scaledobject.yaml", "    name: campaignctl-worker\n  minReplicaCount", "    name: campaignctl-workers\n  minReplicaCount", "scaleTargetRef"},
		{"larger of the lists, not their sum", "kubernetes/worker-scaledobject.yaml", `formula: "pending + active"`, `formula: "max(pending, active)"`, "formula"},
		{"active list without a formula", "kubernetes/worker-scaledobject.yaml", "    scalingModifiers:\n      formula: \"pending + active\"\n      target: \"16\"\n      metricType: AverageValue\n", "", "scalingModifiers"},
		{"formula target off concurrency", "kubernetes/worker-scaledobject.yaml", `target: "16"`, `target: "10"`, "target"},
		{"scale to zero", "kubernetes/worker-scaledobject.yaml", "minReplicaCount: 1", "minReplicaCount: 0", "minReplicaCount"},
		{"listLength above concurrency", "kubernetes/worker-scaledobject.yaml", `listLength: "16"`, `listLength: "64"`, "listLength"},
		{"listLength not a string", "kubernetes/worker-scaledobject.yaml", `listLength: "16"`, `listLength: 16`, "quote it"},
		{"auth key missing", "kubernetes/worker-scaledobject.yaml", "key: REDIS_PASSWORD", "key: REDIS_PASS", "REDIS_PASS"},
		{"auth ref missing", "kubernetes/worker-scaledobject.yaml", "        name: campaignctl-redis\n", "        name: campaignctl-redis-auth\n", "TriggerAuthentication"},
		{"unknown KEDA auth parameter", "kubernetes/worker-scaledobject.yaml", "parameter: password", "parameter: passwd", "passwd"},
		{"cluster alternative dropped", "kubernetes/worker-scaledobject.yaml", "type: redis-cluster", "type: redis-clustr", "redis-cluster"},
		{"Redis DB differs", "kubernetes/secret.example.yaml", "redis.example.internal:6379/0", "redis.example.internal:6379/1", "databaseIndex"},
		{"Redis TLS differs", "kubernetes/secret.example.yaml", `REDIS_URL: "redis://`, `REDIS_URL: "rediss://`, "enableTLS"},
		{"Redis address differs", "kubernetes/secret.example.yaml", `REDIS_ADDRESS: "redis.example.internal:6379"`, `REDIS_ADDRESS: "redis.example.internal:6380"`, "REDIS_ADDRESS"},
		{"a real-looking secret", "kubernetes/secret.example.yaml", `TWILIO_AUTH_TOKEN: "REPLACE_ME"`, `TWILIO_AUTH_TOKEN: "0123456789abcdef"`, "placeholder"},
		{"misspelt field", "kubernetes/worker-deployment.yaml", "readinessProbe:", "readinessprobe:", "readinessprobe"},
		{"probe on a missing port", "kubernetes/worker-deployment.yaml", "port: metrics", "port: metricz", "metricz"},
		{"configMapKeyRef to a missing key", "kubernetes/worker-deployment.yaml", "key: TWILIO_RATE", "key: TWILIO_RATES", "TWILIO_RATES"},
		{"secretKeyRef to a missing Secret", "kubernetes/worker-deployment.yaml", workerEnv("DATABASE_URL", "DATABASE_URL"), strings.Replace(workerEnv("DATABASE_URL", "DATABASE_URL"), "campaignctl-secrets", "campaignctl-secret", 1), "campaignctl-secret"},
		{"unknown env variable", "kubernetes/worker-deployment.yaml", "- name: TWILIO_RATE", "- name: TWILLIO_RATE", "TWILLIO_RATE"},
		{"secret as a literal", "kubernetes/worker-deployment.yaml", workerEnv("REDIS_URL", "REDIS_URL"), "            - name: REDIS_URL\n              value: redis://:pw@redis:6379/0\n", "REDIS_URL"},
		{"unknown worker flag", "kubernetes/worker-deployment.yaml", "- --concurrency", "- --concurency", "--concurency"},
		{"bad concurrency", "kubernetes/worker-deployment.yaml", "- --concurrency\n            - \"16\"", "- --concurrency\n            - \"0\"", "--concurrency"},
		{"replicas fight KEDA", "kubernetes/worker-deployment.yaml", "spec:\n  revisionHistoryLimit: 5", "spec:\n  replicas: 3\n  revisionHistoryLimit: 5", "replicas"},
		{"grace shorter than shutdown", "kubernetes/worker-deployment.yaml", "terminationGracePeriodSeconds: 60", "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds"},
		{"scrape port differs", "kubernetes/worker-deployment.yaml", `prometheus.io/port: "9090"`, `prometheus.io/port: "9091"`, "prometheus.io/port"},
		{"writable root fs", "kubernetes/worker-deployment.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "readOnlyRootFilesystem"},
		{"selector off the template", "kubernetes/worker-deployment.yaml", "  selector:\n    matchLabels:\n      app.kubernetes.io/name: campaignctl\n      app.kubernetes.io/component: worker\n  strategy", "  selector:\n    matchLabels:\n      app.kubernetes.io/name: campaignctl\n      app.kubernetes.io/component: workers\n  strategy", "matchLabels"},
		{"memory limit far above target", "kubernetes/worker-deployment.yaml", "memory: 256Mi", "memory: 2Gi", "memory limit"},
		{"FCM file not mounted", "kubernetes/worker-deployment.yaml", "path: service-account.json", "path: sa.json", "GOOGLE_APPLICATION_CREDENTIALS"},
		{"UI without credentials", "kubernetes/ui.yaml", "            - name: CAMPAIGNCTL_UI_AUTH\n              valueFrom:\n                secretKeyRef:\n                  name: campaignctl-secrets\n                  key: CAMPAIGNCTL_UI_AUTH\n", "", "credentials"},
		{"UI flag misspelt", "kubernetes/ui.yaml", `"--read-only"`, `"--readonly"`, "--readonly"},
		{"UI port not exposed", "kubernetes/ui.yaml", `"0.0.0.0:8080"`, `"0.0.0.0:8081"`, "8081"},
		{"Service selects nothing", "kubernetes/webhooks.yaml", "  selector:\n    app.kubernetes.io/name: campaignctl\n    app.kubernetes.io/component: webhooks\n  ports:", "  selector:\n    app.kubernetes.io/name: campaignctl\n    app.kubernetes.io/component: webhook\n  ports:", "selector"},
		{"webhooks spool without Redis", "kubernetes/webhooks.yaml", "            - name: REDIS_URL\n              valueFrom:\n                secretKeyRef:\n                  name: campaignctl-secrets\n                  key: REDIS_URL\n", "", "REDIS_URL"},
		{"webhooks probed on /stats", "kubernetes/webhooks.yaml", "path: /healthz\n              port: http\n            periodSeconds: 10", "path: /stats\n              port: http\n            periodSeconds: 10", "/healthz"},
		{"status callback elsewhere", "kubernetes/configmap.yaml", "https://hooks.example.com/twilio/status", "https://hooks.example.org/twilio/status", "TWILIO_STATUS_CALLBACK"},
		{"rate not a string", "kubernetes/configmap.yaml", `TWILIO_RATE: "100"`, `TWILIO_RATE: 100`, "quote it"},
		{"Job restarts forever", "kubernetes/migrate-job.yaml", "restartPolicy: Never", "restartPolicy: Always", "restartPolicy"},
		{"wrong apiVersion", "kubernetes/migrate-job.yaml", "apiVersion: batch/v1", "apiVersion: batch/v1beta1", "apiVersion"},
		{"file left out of kustomization", "kubernetes/kustomization.yaml", "  - ui.yaml\n", "", "ui.yaml"},
		{"Dockerfile builds another package", "Dockerfile", "./cmd/campaignctl", "./cmd/campaign", "./cmd/campaignctl"},
		{"Dockerfile with cgo", "Dockerfile", "CGO_ENABLED=0 ", "", "CGO_ENABLED=0"},
		{"Dockerfile runs as root", "Dockerfile", "USER 65532:65532", "USER root", "USER"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			orig, ok := files[c.file]
			if !ok {
				t.Fatalf("no file %s", c.file)
			}
			if !bytes.Contains(orig, []byte(c.old)) {
				t.Fatalf("%s does not contain %q: update this case", c.file, c.old)
			}
			broken := maps.Clone(files)
			broken[c.file] = bytes.Replace(orig, []byte(c.old), []byte(c.new), 1)
			problems := check(broken, facts)
			if len(problems) == 0 {
				t.Fatalf("check found nothing wrong after %s: %q -> %q", c.file, c.old, c.new)
			}
			for _, p := range problems {
				if strings.Contains(p, c.want) {
					return
				}
			}
			t.Errorf("no problem mentions %q; got:\n  %s", c.want, strings.Join(problems, "\n  "))
		})
	}
}

// ---- inputs ----

// facts are what the manifests are checked against from the rest of the repository.
type facts struct {
	envNames  map[string]bool // README "Configuration" table, plus extraEnv
	docs      string          // README.md and docs/operations.md: every subcommand and flag used is documented there
	queue     string          // worker.Queue, read from the worker package's source
	goVersion string          // major.minor of go.mod's go directive
	mainPkgs  map[string]bool // ./cmd/<name> directories holding a package main with func main
}

func loadFacts(t *testing.T) facts {
	t.Helper()
	readme := readRepoFile(t, "README.md")
	ops := readRepoFile(t, "docs/operations.md")
	f := facts{envNames: map[string]bool{}, docs: readme + "\n" + ops, mainPkgs: map[string]bool{}}

	// README's Configuration table: every `NAME` in its rows.
	_, conf, ok := strings.Cut(readme, "## Configuration")
	if !ok {
		t.Fatal(`README.md has no "## Configuration" section to read the environment variables from`)
	}
	if i := strings.Index(conf, "\n## "); i >= 0 {
		conf = conf[:i]
	}
	envRe := regexp.MustCompile("`([A-Z][A-Z0-9_]+)`")
	for _, line := range strings.Split(conf, "\n") {
		if strings.HasPrefix(line, "|") {
			for _, m := range envRe.FindAllStringSubmatch(line, -1) {
				f.envNames[m[1]] = true
			}
		}
	}
	if len(f.envNames) < 10 || !f.envNames["REDIS_URL"] || !f.envNames["DATABASE_URL"] {
		t.Fatalf("read only %d variables from README.md's Configuration table: has its format changed?", len(f.envNames))
	}
	for n := range extraEnv {
		f.envNames[n] = true
	}

	f.queue = goConst(t, filepath.Join("..", "worker"), "Queue")

	gomod := readRepoFile(t, "go.mod")
	if m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(gomod); m != nil {
		f.goVersion = m[1]
	} else {
		t.Fatal("go.mod has no go directive")
	}

	dirs, err := os.ReadDir(filepath.Join("..", "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if d.IsDir() && isMainPackage(t, filepath.Join("..", "cmd", d.Name())) {
			f.mainPkgs["./cmd/"+d.Name()] = true
		}
	}
	return f
}

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// goConst reads a string constant from the non-test sources of a package directory, without building it.
func goConst(t *testing.T, dir, name string) string {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if id.Name != name || i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, err := strconv.Unquote(lit.Value)
						if err != nil {
							t.Fatal(err)
						}
						return v
					}
				}
			}
		}
	}
	t.Fatalf("no string constant %s in %s: the queue name the ScaledObject watches is read from it", name, dir)
	return ""
}

func isMainPackage(t *testing.T, dir string) bool {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		if file.Name.Name != "main" {
			return false
		}
		for _, d := range file.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == "main" {
				return true
			}
		}
	}
	return false
}

// loadFiles reads deploy/Dockerfile and every YAML file under deploy/kubernetes, keyed by their path
// relative to deploy/.
func loadFiles(t *testing.T) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	files["Dockerfile"] = b
	err = filepath.WalkDir("kubernetes", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ext := filepath.Ext(p); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		b, err := os.ReadFile(p)
		files[filepath.ToSlash(p)] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("found only %v under deploy/", slices.Sorted(maps.Keys(files)))
	}
	return files
}

// ---- the checks ----

type obj[T any] struct {
	where string // file#document Kind name
	file  string
	v     T
}

// pod is one pod template (a Deployment's or a Job's) with what check learnt about its containers.
type pod struct {
	where  string
	spec   *podSpec
	labels map[string]string
	cmds   map[string]*cmdline // by container name: the campaignctl command it runs
}

type checker struct {
	facts    facts
	files    map[string][]byte
	problems []string

	namespaces  []obj[namespace]
	configMaps  []obj[configMap]
	secrets     []obj[secret]
	deployments []obj[deployment]
	jobs        []obj[job]
	cronJobs    []obj[cronJob]
	services    []obj[service]
	pdbs        []obj[podDisruptionBudget]
	scaled      []obj[scaledObject]
	triggerAuth []obj[triggerAuthentication]
	kustomize   *kustomization
	seen        map[string]string // kind/name -> where

	secretData map[string]map[string]string // Secret name -> key -> value
	configData map[string]map[string]string // ConfigMap name -> key -> value
	pods       map[string]*pod              // Deployment or Job where -> pod
}

// check returns every problem found in the deploy files; none means they pass.
func check(files map[string][]byte, f facts) []string {
	c := &checker{facts: f, files: files, seen: map[string]string{}, secretData: map[string]map[string]string{},
		configData: map[string]map[string]string{}, pods: map[string]*pod{}}
	if _, ok := files["kubernetes/kustomization.yaml"]; ok {
		c.parseKustomization("kubernetes/kustomization.yaml")
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if strings.HasPrefix(name, "kubernetes/") && name != "kubernetes/kustomization.yaml" {
			c.parseManifests(name)
		}
	}
	c.checkSecretsAndConfigMaps()
	for _, d := range c.deployments {
		c.checkDeployment(d)
	}
	for _, j := range c.jobs {
		c.checkJob(j)
	}
	for _, j := range c.cronJobs {
		c.checkCronJob(j)
	}
	for _, s := range c.services {
		c.checkService(s)
	}
	for _, p := range c.pdbs {
		c.checkPDB(p)
	}
	for _, ta := range c.triggerAuth {
		c.checkTriggerAuth(ta)
	}
	for _, so := range c.scaled {
		c.checkScaledObject(so)
	}
	c.checkRoles()
	c.checkKustomization()
	c.checkDockerfile()
	return c.problems
}

func (c *checker) addf(where, format string, args ...any) {
	c.problems = append(c.problems, where+": "+fmt.Sprintf(format, args...))
}

// parseManifests decodes every document of one file: once loosely to learn its kind, then strictly into
// that kind's type, so that line numbers in errors are the file's.
func (c *checker) parseManifests(name string) {
	data := c.files[name]
	var kinds []typeMetaLoose
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			c.addf(name, "YAML: %v", err)
			return
		}
		var tm typeMetaLoose
		if len(n.Content) > 0 && n.Content[0].Kind == yaml.MappingNode {
			if err := n.Decode(&tm); err != nil {
				c.addf(name, "YAML: %v", err)
				return
			}
			tm.present = true
		}
		kinds = append(kinds, tm)
	}
	if len(kinds) == 0 {
		c.addf(name, "no YAML document")
		return
	}
	dec = yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	for i, tm := range kinds {
		where := fmt.Sprintf("%s#%d %s %s", name, i+1, tm.Kind, tm.Metadata.Name)
		var err error
		switch tm.Kind {
		case "Namespace":
			err = decodeInto(dec, &c.namespaces, where, name)
		case "ConfigMap":
			err = decodeInto(dec, &c.configMaps, where, name)
		case "Secret":
			err = decodeInto(dec, &c.secrets, where, name)
		case "Deployment":
			err = decodeInto(dec, &c.deployments, where, name)
		case "Job":
			err = decodeInto(dec, &c.jobs, where, name)
		case "CronJob":
			err = decodeInto(dec, &c.cronJobs, where, name)
		case "Service":
			err = decodeInto(dec, &c.services, where, name)
		case "PodDisruptionBudget":
			err = decodeInto(dec, &c.pdbs, where, name)
		case "ScaledObject":
			err = decodeInto(dec, &c.scaled, where, name)
		case "TriggerAuthentication":
			err = decodeInto(dec, &c.triggerAuth, where, name)
		default:
			var skip yaml.Node
			err = dec.Decode(&skip)
			if tm.present {
				c.addf(where, "kind %q is not one these manifests may hold (%v)", tm.Kind, slices.Sorted(maps.Keys(apiVersions)))
			}
		}
		if err != nil {
			c.addf(where, "does not fit the %s schema: %v", tm.Kind, err)
			continue
		}
		if !tm.present {
			continue
		}
		if want := apiVersions[tm.Kind]; want != "" && tm.APIVersion != want {
			c.addf(where, "apiVersion %q, want %q for kind %s", tm.APIVersion, want, tm.Kind)
		}
		c.checkMeta(where, tm.Kind, tm.Metadata)
	}
}

// typeMetaLoose reads apiVersion, kind and metadata of any document, whatever else it holds.
type typeMetaLoose struct {
	APIVersion string    `yaml:"apiVersion"`
	Kind       string    `yaml:"kind"`
	Metadata   looseMeta `yaml:"metadata"`
	present    bool
}

type looseMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func decodeInto[T any](dec *yaml.Decoder, list *[]obj[T], where, file string) error {
	var v T
	if err := dec.Decode(&v); err != nil {
		return err
	}
	*list = append(*list, obj[T]{where: where, file: file, v: v})
	return nil
}

var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	labelValue   = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	qualName     = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
	ianaSvcName  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
	envName      = regexp.MustCompile(`^[-._a-zA-Z][-._a-zA-Z0-9]*$`)
	configKey    = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)
)

func (c *checker) checkMeta(where, kind string, m looseMeta) {
	if m.Name == "" {
		c.addf(where, "metadata.name is missing")
	} else if len(m.Name) > 63 || !dnsLabel.MatchString(m.Name) {
		c.addf(where, "metadata.name %q is not a DNS-1123 label (lowercase letters, digits, '-', at most 63)", m.Name)
	}
	key := kind + "/" + m.Name
	if prev, dup := c.seen[key]; dup {
		c.addf(where, "%s is defined twice (also at %s)", key, prev)
	}
	c.seen[key] = where
	if m.Namespace != "" && c.kustomize != nil && c.kustomize.Namespace != "" && m.Namespace != c.kustomize.Namespace {
		c.addf(where, "metadata.namespace %q differs from the kustomization's %q", m.Namespace, c.kustomize.Namespace)
	}
	c.checkLabels(where+" metadata.labels", m.Labels)
	for k := range m.Annotations {
		if !validQualifiedName(k) {
			c.addf(where, "annotation key %q is not a qualified name", k)
		}
	}
}

func validQualifiedName(k string) bool {
	prefix, name, found := strings.Cut(k, "/")
	if !found {
		name, prefix = prefix, ""
	} else if prefix == "" || len(prefix) > 253 || !dnsSubdomain.MatchString(prefix) {
		return false
	}
	return len(name) <= 63 && qualName.MatchString(name)
}

func (c *checker) checkLabels(where string, labels map[string]string) {
	for k, v := range labels {
		if !validQualifiedName(k) {
			c.addf(where, "label key %q is not a qualified name", k)
		}
		if len(v) > 63 || !labelValue.MatchString(v) {
			c.addf(where, "label %s=%q: not a valid label value", k, v)
		}
	}
}

func (c *checker) checkSecretsAndConfigMaps() {
	for _, s := range c.secrets {
		data := map[string]string{}
		for k, v := range s.v.Data {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				c.addf(s.where, "data.%s is not base64: %v", k, err)
			}
			data[k] = string(b)
		}
		for k, v := range s.v.StringData {
			if _, dup := data[k]; dup {
				c.addf(s.where, "key %s is in both data and stringData", k)
			}
			data[k] = v
		}
		if len(data) == 0 {
			c.addf(s.where, "the Secret holds no key")
		}
		for _, k := range slices.Sorted(maps.Keys(data)) {
			if !configKey.MatchString(k) {
				c.addf(s.where, "key %q: keys are letters, digits, '-', '_' and '.'", k)
			}
			if _, derived := derivedSecretKeys[k]; !derived && !strings.Contains(data[k], placeholder) {
				c.addf(s.where, "%s holds no %s placeholder: the example Secret must carry no real value", k, placeholder)
			}
		}
		c.secretData[s.v.Metadata.Name] = data
	}
	for _, cm := range c.configMaps {
		for k, v := range cm.v.Data {
			if !configKey.MatchString(k) {
				c.addf(cm.where, "key %q: keys are letters, digits, '-', '_' and '.'", k)
			}
			if strings.HasSuffix(k, "_RATE") {
				if r, err := strconv.ParseFloat(v, 64); err != nil || r < 0 {
					c.addf(cm.where, "%s=%q: a rate is a non-negative number of messages per second", k, v)
				}
			}
		}
		c.configData[cm.v.Metadata.Name] = cm.v.Data
	}
	if len(c.secretData) == 0 {
		c.addf("kubernetes/", "no Secret: the example Secret documents the keys the manifests reference")
	}
	if len(c.configData) == 0 {
		c.addf("kubernetes/", "no ConfigMap")
	}
}

func selectorMatches(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func (c *checker) checkDeployment(d obj[deployment]) {
	spec := &d.v.Spec
	if spec.Selector == nil || len(spec.Selector.MatchLabels) == 0 {
		c.addf(d.where, "spec.selector.matchLabels is missing")
	} else {
		if len(spec.Selector.MatchExpressions) > 0 {
			c.addf(d.where, "spec.selector.matchExpressions: these checks only understand matchLabels")
		}
		c.checkLabels(d.where+" spec.selector", spec.Selector.MatchLabels)
		if !selectorMatches(spec.Selector.MatchLabels, spec.Template.Metadata.Labels) {
			c.addf(d.where, "spec.selector.matchLabels %v do not match the pod template labels %v", spec.Selector.MatchLabels, spec.Template.Metadata.Labels)
		}
	}
	if spec.Replicas != nil && *spec.Replicas < 0 {
		c.addf(d.where, "spec.replicas is negative")
	}
	if rp := spec.Template.Spec.RestartPolicy; rp != "" && rp != "Always" {
		c.addf(d.where, "restartPolicy %q: a Deployment's pods must be Always", rp)
	}
	c.checkPod(d.where, &spec.Template, true)
}

func (c *checker) checkJob(j obj[job]) { c.checkJobSpec(j.where, &j.v.Spec) }

// checkCronJob checks a CronJob: a schedule cron can read, one run at a time (the commands scheduled are
// singletons: a second run beside the first only waits for it), a deadline for a missed start, bounded
// histories, and its Job template as a Job.
func (c *checker) checkCronJob(j obj[cronJob]) {
	spec := &j.v.Spec
	if f := strings.Fields(spec.Schedule); len(f) != 5 && !strings.HasPrefix(spec.Schedule, "@") {
		c.addf(j.where, "spec.schedule %q: want five cron fields (or an @-macro)", spec.Schedule)
	}
	if spec.ConcurrencyPolicy != "Forbid" {
		c.addf(j.where, "spec.concurrencyPolicy %q: want Forbid (a run of a scheduled campaignctl command beside another would only wait for it, and runs would pile up)", spec.ConcurrencyPolicy)
	}
	if spec.StartingDeadlineSeconds == nil || *spec.StartingDeadlineSeconds <= 0 {
		c.addf(j.where, "spec.startingDeadlineSeconds is missing: after 100 missed starts (a controller outage) Kubernetes stops scheduling the CronJob")
	}
	if spec.Suspend != nil && *spec.Suspend {
		c.addf(j.where, "spec.suspend is true: the schedule never runs")
	}
	for name, n := range map[string]*int32{"successfulJobsHistoryLimit": spec.SuccessfulJobsHistoryLimit, "failedJobsHistoryLimit": spec.FailedJobsHistoryLimit} {
		if n != nil && (*n < 0 || *n > 10) {
			c.addf(j.where, "spec.%s %d: want 0-10", name, *n)
		}
	}
	c.checkJobSpec(j.where, &spec.JobTemplate.Spec)
}

func (c *checker) checkJobSpec(where string, spec *jobSpec) {
	if rp := spec.Template.Spec.RestartPolicy; rp != "Never" && rp != "OnFailure" {
		c.addf(where, "spec.template.spec.restartPolicy %q: a Job needs Never or OnFailure", rp)
	}
	if spec.BackoffLimit == nil || *spec.BackoffLimit < 0 {
		c.addf(where, "spec.backoffLimit is missing or negative")
	}
	if spec.TTLSecondsAfterFinished == nil || *spec.TTLSecondsAfterFinished < 0 {
		c.addf(where, "spec.ttlSecondsAfterFinished is missing: a finished Job's template cannot be changed, so the next apply would fail")
	}
	c.checkPod(where, &spec.Template, false)
}

func (c *checker) checkPod(where string, tpl *podTemplate, longRunning bool) {
	p := &pod{where: where, spec: &tpl.Spec, labels: tpl.Metadata.Labels, cmds: map[string]*cmdline{}}
	c.pods[where] = p
	c.checkLabels(where+" pod template labels", tpl.Metadata.Labels)
	ps := &tpl.Spec
	if len(ps.Containers) == 0 {
		c.addf(where, "no container")
	}
	if ps.TerminationGracePeriodSeconds != nil && *ps.TerminationGracePeriodSeconds < 0 {
		c.addf(where, "terminationGracePeriodSeconds is negative")
	}
	volumes := map[string]*volume{}
	for i := range ps.Volumes {
		v := &ps.Volumes[i]
		if !dnsLabel.MatchString(v.Name) {
			c.addf(where, "volume name %q is not a DNS-1123 label", v.Name)
		}
		if _, dup := volumes[v.Name]; dup {
			c.addf(where, "volume %s is defined twice", v.Name)
		}
		volumes[v.Name] = v
		sources := 0
		if v.Secret != nil {
			sources++
			c.checkKeys(where+" volume "+v.Name, "Secret", v.Secret.SecretName, c.secretData, itemKeys(v.Secret.Items))
			c.checkMode(where+" volume "+v.Name, v.Secret.DefaultMode, v.Secret.Items)
		}
		if v.ConfigMap != nil {
			sources++
			c.checkKeys(where+" volume "+v.Name, "ConfigMap", v.ConfigMap.Name, c.configData, itemKeys(v.ConfigMap.Items))
			c.checkMode(where+" volume "+v.Name, v.ConfigMap.DefaultMode, v.ConfigMap.Items)
		}
		if v.EmptyDir != nil {
			sources++
			if v.EmptyDir.SizeLimit != "" {
				if _, err := parseQuantity(v.EmptyDir.SizeLimit); err != nil {
					c.addf(where, "volume %s sizeLimit: %v", v.Name, err)
				}
			}
		}
		if sources != 1 {
			c.addf(where, "volume %s needs exactly one source (secret, configMap or emptyDir), has %d", v.Name, sources)
		}
	}
	c.checkPodSecurity(where, ps)

	names := map[string]bool{}
	all := append(slices.Clone(ps.InitContainers), ps.Containers...)
	for i := range all {
		ct := &all[i]
		cw := where + " container " + ct.Name
		if ct.Name == "" || !dnsLabel.MatchString(ct.Name) {
			c.addf(where, "container name %q is not a DNS-1123 label", ct.Name)
		}
		if names[ct.Name] {
			c.addf(where, "container %s is defined twice", ct.Name)
		}
		names[ct.Name] = true
		c.checkImage(cw, ct.Image)
		ports := c.checkPorts(cw, ct.Ports)
		isInit := i < len(ps.InitContainers)
		if longRunning && !isInit {
			if ct.ReadinessProbe == nil {
				c.addf(cw, "no readinessProbe")
			}
			if ct.LivenessProbe == nil {
				c.addf(cw, "no livenessProbe")
			}
		}
		for kind, pr := range map[string]*probe{"readinessProbe": ct.ReadinessProbe, "livenessProbe": ct.LivenessProbe, "startupProbe": ct.StartupProbe} {
			if pr != nil {
				c.checkProbe(cw+" "+kind, pr, ports)
			}
		}
		c.checkEnv(cw, ct, ps, volumes)
		mounts := map[string]bool{}
		for _, m := range ct.VolumeMounts {
			if volumes[m.Name] == nil {
				c.addf(cw, "volumeMount %s names no volume of the pod", m.Name)
			}
			if !strings.HasPrefix(m.MountPath, "/") {
				c.addf(cw, "volumeMount %s: mountPath %q is not absolute", m.Name, m.MountPath)
			}
			if mounts[m.MountPath] {
				c.addf(cw, "two volumes mounted at %s", m.MountPath)
			}
			mounts[m.MountPath] = true
			if v := volumes[m.Name]; v != nil && (v.Secret != nil || v.ConfigMap != nil) && !m.ReadOnly {
				c.addf(cw, "volumeMount %s of a Secret or ConfigMap should be readOnly", m.Name)
			}
		}
		c.checkResources(cw, ct.Resources)
		c.checkContainerSecurity(cw, ct.SecurityContext, ps.SecurityContext)
		if repo, _, _ := strings.Cut(ct.Image, ":"); repo == imageRepo {
			if cmd := c.parseCommand(cw, ct); cmd != nil {
				p.cmds[ct.Name] = cmd
			}
		}
	}
}

func itemKeys(items []keyToPath) []string {
	var keys []string
	for _, it := range items {
		keys = append(keys, it.Key)
	}
	return keys
}

func (c *checker) checkMode(where string, defaultMode *int32, items []keyToPath) {
	modes := []*int32{defaultMode}
	for _, it := range items {
		modes = append(modes, it.Mode)
		if it.Path == "" || strings.HasPrefix(it.Path, "/") || strings.Contains(it.Path, "..") {
			c.addf(where, "item %s: path %q must be relative, without '..'", it.Key, it.Path)
		}
	}
	for _, m := range modes {
		if m != nil && (*m < 0 || *m > 0o777) {
			c.addf(where, "file mode %o is outside 0000-0777", *m)
		}
	}
}

// checkKeys checks that a Secret or ConfigMap of that name exists and holds the keys.
func (c *checker) checkKeys(where, kind, name string, store map[string]map[string]string, keys []string) {
	data, ok := store[name]
	if !ok {
		c.addf(where, "%s %q does not exist in the manifests", kind, name)
		return
	}
	for _, k := range keys {
		if _, ok := data[k]; !ok {
			c.addf(where, "key %s is not in %s %s", k, kind, name)
		}
	}
}

func (c *checker) checkImage(where, image string) {
	if image == "" {
		c.addf(where, "no image")
		return
	}
	repo, tag, ok := strings.Cut(image, ":")
	if repo != imageRepo {
		c.addf(where, "image %q, want %s (deploy/Dockerfile)", image, imageRepo)
	}
	if !ok || tag == "" {
		c.addf(where, "image %q has no tag", image)
	}
}

// checkPorts checks the container's ports and returns them by name and by number.
func (c *checker) checkPorts(where string, ports []containerPort) map[string]int32 {
	out := map[string]int32{}
	numbers := map[int32]bool{}
	for _, p := range ports {
		if p.ContainerPort < 1 || p.ContainerPort > 65535 {
			c.addf(where, "containerPort %d is outside 1-65535", p.ContainerPort)
		}
		if numbers[p.ContainerPort] {
			c.addf(where, "containerPort %d is declared twice", p.ContainerPort)
		}
		numbers[p.ContainerPort] = true
		out[strconv.Itoa(int(p.ContainerPort))] = p.ContainerPort
		if p.Name != "" {
			if len(p.Name) > 15 || !ianaSvcName.MatchString(p.Name) || !strings.ContainsAny(p.Name, "abcdefghijklmnopqrstuvwxyz") || strings.Contains(p.Name, "--") {
				c.addf(where, "port name %q is not an IANA service name (at most 15 lowercase letters, digits, '-')", p.Name)
			}
			if _, dup := out[p.Name]; dup {
				c.addf(where, "port name %s is used twice", p.Name)
			}
			out[p.Name] = p.ContainerPort
		}
		if p.Protocol != "" && p.Protocol != "TCP" && p.Protocol != "UDP" && p.Protocol != "SCTP" {
			c.addf(where, "port protocol %q", p.Protocol)
		}
	}
	return out
}

func (c *checker) checkProbe(where string, p *probe, ports map[string]int32) {
	handlers := 0
	var port *intOrString
	if p.HTTPGet != nil {
		handlers++
		port = &p.HTTPGet.Port
		if !strings.HasPrefix(p.HTTPGet.Path, "/") {
			c.addf(where, "httpGet.path %q does not start with /", p.HTTPGet.Path)
		}
	}
	if p.TCPSocket != nil {
		handlers++
		port = &p.TCPSocket.Port
	}
	if p.Exec != nil {
		handlers++
		if len(p.Exec.Command) == 0 {
			c.addf(where, "exec.command is empty")
		}
	}
	if handlers != 1 {
		c.addf(where, "needs exactly one of httpGet, tcpSocket, exec; has %d", handlers)
	}
	if port != nil {
		if _, ok := ports[port.String()]; !ok {
			c.addf(where, "port %s is not a port the container declares (%v)", port, slices.Sorted(maps.Keys(ports)))
		}
	}
	for name, v := range map[string]int32{"initialDelaySeconds": p.InitialDelaySeconds, "periodSeconds": p.PeriodSeconds,
		"timeoutSeconds": p.TimeoutSeconds, "failureThreshold": p.FailureThreshold, "successThreshold": p.SuccessThreshold} {
		if v < 0 {
			c.addf(where, "%s is negative", name)
		}
	}
}

func (c *checker) checkEnv(where string, ct *container, ps *podSpec, volumes map[string]*volume) {
	seen := map[string]bool{}
	for _, e := range ct.Env {
		if !envName.MatchString(e.Name) {
			c.addf(where, "env name %q is not valid", e.Name)
		}
		if seen[e.Name] {
			c.addf(where, "env %s is set twice", e.Name)
		}
		seen[e.Name] = true
		if !c.facts.envNames[e.Name] {
			c.addf(where, "env %s is not a variable campaignctl reads (README.md Configuration; extraEnv in this test)", e.Name)
		}
		if e.ValueFrom == nil {
			if slices.Contains(secretEnv, e.Name) {
				c.addf(where, "env %s carries credentials: take it from a Secret (secretKeyRef), not a literal value", e.Name)
			}
			continue
		}
		if e.Value != "" {
			c.addf(where, "env %s has both value and valueFrom", e.Name)
		}
		refs := 0
		if r := e.ValueFrom.SecretKeyRef; r != nil {
			refs++
			c.checkKeys(where+" env "+e.Name, "Secret", r.Name, c.secretData, []string{r.Key})
		}
		if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
			refs++
			c.checkKeys(where+" env "+e.Name, "ConfigMap", r.Name, c.configData, []string{r.Key})
			if slices.Contains(secretEnv, e.Name) {
				c.addf(where, "env %s carries credentials: take it from a Secret, not a ConfigMap", e.Name)
			}
		}
		if e.ValueFrom.FieldRef != nil {
			refs++
		}
		if refs != 1 {
			c.addf(where, "env %s: valueFrom needs exactly one source", e.Name)
		}
	}
	for _, ef := range ct.EnvFrom {
		switch {
		case ef.SecretRef != nil && ef.ConfigMapRef == nil:
			c.checkKeys(where+" envFrom", "Secret", ef.SecretRef.Name, c.secretData, nil)
		case ef.ConfigMapRef != nil && ef.SecretRef == nil:
			c.checkKeys(where+" envFrom", "ConfigMap", ef.ConfigMapRef.Name, c.configData, nil)
		default:
			c.addf(where, "envFrom needs exactly one of secretRef, configMapRef")
		}
	}
	// A credentials file named by an env variable from the Secret must be a file the pod mounts.
	for _, e := range ct.Env {
		if e.Name != "GOOGLE_APPLICATION_CREDENTIALS" {
			continue
		}
		file := string(e.Value)
		if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
			file = c.secretData[r.SecretKeyRef.Name][r.SecretKeyRef.Key]
		}
		if !mountsFile(ct, volumes, file) {
			c.addf(where, "GOOGLE_APPLICATION_CREDENTIALS=%q is not a file of a Secret volume mounted in this container", file)
		}
	}
}

// mountsFile tells whether file is an item of a Secret volume mounted in the container.
func mountsFile(ct *container, volumes map[string]*volume, file string) bool {
	for _, m := range ct.VolumeMounts {
		v := volumes[m.Name]
		if v == nil || v.Secret == nil {
			continue
		}
		for _, it := range v.Secret.Items {
			if path.Join(m.MountPath, it.Path) == file {
				return true
			}
		}
	}
	return false
}

func (c *checker) checkResources(where string, r resources) {
	for _, k := range []string{"cpu", "memory"} {
		if r.Requests[k] == "" {
			c.addf(where, "resources.requests.%s is missing", k)
		}
	}
	if r.Limits["memory"] == "" {
		c.addf(where, "resources.limits.memory is missing")
	}
	for kind, m := range map[string]map[string]string{"requests": r.Requests, "limits": r.Limits} {
		for k, v := range m {
			if k != "cpu" && k != "memory" && k != "ephemeral-storage" {
				c.addf(where, "resources.%s.%s: unknown resource", kind, k)
			}
			if _, err := parseQuantity(v); err != nil {
				c.addf(where, "resources.%s.%s: %v", kind, k, err)
			}
		}
	}
	for _, k := range []string{"cpu", "memory"} {
		req, err1 := parseQuantity(r.Requests[k])
		lim, err2 := parseQuantity(r.Limits[k])
		if err1 == nil && err2 == nil && r.Limits[k] != "" && req > lim {
			c.addf(where, "resources: %s request %s is above its limit %s", k, r.Requests[k], r.Limits[k])
		}
	}
}

func (c *checker) checkPodSecurity(where string, ps *podSpec) {
	sc := ps.SecurityContext
	if sc == nil {
		c.addf(where, "no pod securityContext")
		return
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != "RuntimeDefault" {
		c.addf(where, "securityContext.seccompProfile.type should be RuntimeDefault")
	}
	if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
		c.addf(where, "securityContext.runAsUser is 0 (root)")
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		c.addf(where, "automountServiceAccountToken should be false: campaignctl does not call the Kubernetes API")
	}
}

func (c *checker) checkContainerSecurity(where string, sc *securityContext, pod *podSecurityContext) {
	if sc == nil {
		c.addf(where, "no securityContext")
		return
	}
	nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && pod != nil && pod.RunAsNonRoot != nil && *pod.RunAsNonRoot)
	if !nonRoot {
		c.addf(where, "runAsNonRoot is not true (container or pod securityContext)")
	}
	if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
		c.addf(where, "runAsUser is 0 (root)")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		c.addf(where, "securityContext.allowPrivilegeEscalation must be false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		c.addf(where, "securityContext.readOnlyRootFilesystem must be true")
	}
	if sc.Privileged != nil && *sc.Privileged {
		c.addf(where, "securityContext.privileged must not be true")
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
		c.addf(where, "securityContext.capabilities must drop ALL and add none")
	}
}

// ---- campaignctl command lines ----

type cmdline struct {
	name  string            // "worker", "dlq list"
	flags map[string]string // "--concurrency" -> "16"; a bool flag -> "true"
	args  []string
}

// parseCommand reads the campaignctl command a container runs: its args (the image's ENTRYPOINT is
// campaignctl), or command + args when command is given.
func (c *checker) parseCommand(where string, ct *container) *cmdline {
	argv := slices.Clone([]string(ct.Args))
	if len(ct.Command) > 0 {
		if path.Base(ct.Command[0]) != "campaignctl" {
			c.addf(where, "command %v does not run campaignctl", ct.Command)
			return nil
		}
		argv = append(slices.Clone([]string(ct.Command[1:])), argv...)
	}
	if len(argv) == 0 {
		c.addf(where, "no subcommand: the image would print help and exit")
		return nil
	}
	cmd := &cmdline{flags: map[string]string{}}
	var spec commandSpec
	if len(argv) > 1 {
		if s, ok := commands[argv[0]+" "+argv[1]]; ok {
			cmd.name, spec, argv = argv[0]+" "+argv[1], s, argv[2:]
		}
	}
	if cmd.name == "" {
		s, ok := commands[argv[0]]
		if !ok {
			c.addf(where, "campaignctl %s: no such subcommand (known: %v)", argv[0], slices.Sorted(maps.Keys(commands)))
			return nil
		}
		cmd.name, spec, argv = argv[0], s, argv[1:]
	}
	if !strings.Contains(c.facts.docs, "campaignctl "+cmd.name) {
		c.addf(where, "`campaignctl %s` is not documented in README.md or docs/operations.md", cmd.name)
	}
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		if !strings.HasPrefix(a, "-") {
			cmd.args = append(cmd.args, a)
			continue
		}
		name, val, hasVal := strings.Cut(a, "=")
		fs, ok := spec.flags[name]
		if !ok {
			fs, ok = globalFlags[name]
		}
		if !ok {
			c.addf(where, "campaignctl %s: unknown flag %s", cmd.name, name)
			continue
		}
		if _, dup := cmd.flags[name]; dup {
			c.addf(where, "campaignctl %s: flag %s given twice", cmd.name, name)
		}
		if !strings.Contains(c.facts.docs, name) {
			c.addf(where, "flag %s is not documented in README.md or docs/operations.md", name)
		}
		switch {
		case !fs.value && hasVal:
			if val != "true" && val != "false" {
				c.addf(where, "campaignctl %s: %s is a switch, not %q", cmd.name, name, val)
			}
		case !fs.value:
			val = "true"
		case !hasVal:
			if i+1 >= len(argv) || strings.HasPrefix(argv[i+1], "--") {
				c.addf(where, "campaignctl %s: %s needs a value", cmd.name, name)
				continue
			}
			i++
			val = argv[i]
		}
		if fs.check != nil {
			if err := fs.check(val); err != nil {
				c.addf(where, "campaignctl %s: %s %q: %v", cmd.name, name, val, err)
			}
		}
		cmd.flags[name] = val
	}
	if len(cmd.args) > spec.maxArgs {
		c.addf(where, "campaignctl %s takes at most %d arguments, got %v", cmd.name, spec.maxArgs, cmd.args)
	}
	return cmd
}

func intIn(lo, hi int64) func(string) error {
	return func(s string) error {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < lo || n > hi {
			return fmt.Errorf("want a whole number from %d to %d", lo, hi)
		}
		return nil
	}
}

func durationIn(lo, hi time.Duration) func(string) error {
	return func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil || d < lo || d > hi {
			return fmt.Errorf("want a duration from %v to %v", lo, hi)
		}
		return nil
	}
}

func listenAddr(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is outside 1-65535", port)
	}
	return nil
}

func absPath(s string) error {
	if !strings.HasPrefix(s, "/") {
		return errors.New("want an absolute path")
	}
	return nil
}

func httpURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("want scheme://host[:port]")
	}
	return nil
}

func nonEmpty(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	return nil
}

func oneOf(vals ...string) func(string) error {
	return func(s string) error {
		if !slices.Contains(vals, s) {
			return fmt.Errorf("want one of %v", vals)
		}
		return nil
	}
}

func addrPort(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// ---- references between objects ----

// deploymentsSelected returns the Deployments whose pod labels the selector matches.
func (c *checker) deploymentsSelected(sel map[string]string) []obj[deployment] {
	var out []obj[deployment]
	for _, d := range c.deployments {
		if selectorMatches(sel, d.v.Spec.Template.Metadata.Labels) {
			out = append(out, d)
		}
	}
	return out
}

func containerPorts(spec *podSpec) map[string]int32 {
	out := map[string]int32{}
	for _, ct := range spec.Containers {
		for _, p := range ct.Ports {
			out[strconv.Itoa(int(p.ContainerPort))] = p.ContainerPort
			if p.Name != "" {
				out[p.Name] = p.ContainerPort
			}
		}
	}
	return out
}

func (c *checker) checkService(s obj[service]) {
	spec := &s.v.Spec
	if spec.Type != "" && spec.Type != "ClusterIP" && spec.Type != "NodePort" && spec.Type != "LoadBalancer" {
		c.addf(s.where, "spec.type %q", spec.Type)
	}
	c.checkLabels(s.where+" spec.selector", spec.Selector)
	targets := c.deploymentsSelected(spec.Selector)
	if len(targets) != 1 {
		c.addf(s.where, "spec.selector %v matches %d Deployments' pods, want exactly 1", spec.Selector, len(targets))
	}
	if len(spec.Ports) == 0 {
		c.addf(s.where, "no ports")
	}
	names := map[string]bool{}
	for _, p := range spec.Ports {
		if p.Port < 1 || p.Port > 65535 {
			c.addf(s.where, "port %d is outside 1-65535", p.Port)
		}
		if len(spec.Ports) > 1 && p.Name == "" {
			c.addf(s.where, "port %d needs a name (the Service has several)", p.Port)
		}
		if names[p.Name] {
			c.addf(s.where, "port name %q used twice", p.Name)
		}
		names[p.Name] = true
		target := p.TargetPort.String()
		if target == "" {
			target = strconv.Itoa(int(p.Port))
		}
		for _, d := range targets {
			if _, ok := containerPorts(&d.v.Spec.Template.Spec)[target]; !ok {
				c.addf(s.where, "targetPort %s is not a container port of %s", target, d.v.Metadata.Name)
			}
		}
	}
}

// serviceReaches tells whether some Service sends traffic to port (a number) of the Deployment.
func (c *checker) serviceReaches(d obj[deployment], port string) bool {
	ports := containerPorts(&d.v.Spec.Template.Spec)
	for _, s := range c.services {
		if !selectorMatches(s.v.Spec.Selector, d.v.Spec.Template.Metadata.Labels) {
			continue
		}
		for _, p := range s.v.Spec.Ports {
			target := p.TargetPort.String()
			if target == "" {
				target = strconv.Itoa(int(p.Port))
			}
			if n, ok := ports[target]; ok && strconv.Itoa(int(n)) == port {
				return true
			}
		}
	}
	return false
}

func (c *checker) checkPDB(p obj[podDisruptionBudget]) {
	spec := &p.v.Spec
	if (spec.MinAvailable == nil) == (spec.MaxUnavailable == nil) {
		c.addf(p.where, "needs exactly one of minAvailable and maxUnavailable")
	}
	if spec.Selector == nil || len(spec.Selector.MatchLabels) == 0 {
		c.addf(p.where, "spec.selector.matchLabels is missing")
		return
	}
	if len(c.deploymentsSelected(spec.Selector.MatchLabels)) == 0 {
		c.addf(p.where, "spec.selector %v matches no Deployment's pods", spec.Selector.MatchLabels)
	}
}

// redisURL is REDIS_URL of the example Secret, taken apart the way KEDA needs it.
type redisURL struct {
	tls      bool
	hostPort string
	password string
	db       int
}

func (c *checker) redisURL(where string) (redisURL, bool) {
	for name, data := range c.secretData {
		raw, ok := data["REDIS_URL"]
		if !ok {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
			c.addf(where, "Secret %s: REDIS_URL is not redis://[:password@]host:port/db or rediss://...", name)
			return redisURL{}, false
		}
		r := redisURL{tls: u.Scheme == "rediss", hostPort: u.Host}
		if u.Port() == "" {
			r.hostPort = net.JoinHostPort(u.Hostname(), "6379")
		}
		r.password, _ = u.User.Password()
		if db := strings.TrimPrefix(u.Path, "/"); db != "" {
			if r.db, err = strconv.Atoi(db); err != nil {
				c.addf(where, "Secret %s: REDIS_URL's DB number %q is not a number", name, db)
				return redisURL{}, false
			}
		}
		return r, true
	}
	c.addf(where, "no Secret holds REDIS_URL")
	return redisURL{}, false
}

func (c *checker) checkTriggerAuth(ta obj[triggerAuthentication]) {
	refs := ta.v.Spec.SecretTargetRef
	if len(refs) == 0 && len(ta.v.Spec.Env) == 0 {
		c.addf(ta.where, "no secretTargetRef")
	}
	params := map[string]string{}
	for _, r := range refs {
		if !slices.Contains(redisAuthParams, r.Parameter) {
			c.addf(ta.where, "parameter %q is not one KEDA's redis scalers read (%v)", r.Parameter, redisAuthParams)
		}
		c.checkKeys(ta.where+" parameter "+r.Parameter, "Secret", r.Name, c.secretData, []string{r.Key})
		params[r.Parameter] = c.secretData[r.Name][r.Key]
	}
	ru, ok := c.redisURL(ta.where)
	if !ok {
		return
	}
	addr, hasAddr := params["address"]
	if !hasAddr && params["host"] != "" {
		addr, hasAddr = net.JoinHostPort(params["host"], params["port"]), true
	}
	if !hasAddr {
		c.addf(ta.where, "no address (or host and port) parameter")
	} else if addr != ru.hostPort {
		c.addf(ta.where, "address %q (REDIS_ADDRESS) is not the host:port of REDIS_URL (%q)", addr, ru.hostPort)
	}
	if pw, ok := params["password"]; ok && pw != ru.password {
		c.addf(ta.where, "password (REDIS_PASSWORD) differs from REDIS_URL's")
	} else if !ok && ru.password != "" {
		c.addf(ta.where, "REDIS_URL has a password but no password parameter gives it to KEDA")
	}
}

func (c *checker) checkScaledObject(so obj[scaledObject]) {
	spec := &so.v.Spec
	var target *obj[deployment]
	if ref := spec.ScaleTargetRef; ref == nil || ref.Name == "" {
		c.addf(so.where, "spec.scaleTargetRef.name is missing")
	} else {
		if (ref.Kind != "" && ref.Kind != "Deployment") || (ref.APIVersion != "" && ref.APIVersion != "apps/v1") {
			c.addf(so.where, "spec.scaleTargetRef %s %s: want a Deployment (apps/v1)", ref.APIVersion, ref.Kind)
		}
		for i := range c.deployments {
			if c.deployments[i].v.Metadata.Name == ref.Name {
				target = &c.deployments[i]
			}
		}
		if target == nil {
			c.addf(so.where, "spec.scaleTargetRef.name %q names no Deployment", ref.Name)
		}
	}
	if spec.MinReplicaCount == nil || *spec.MinReplicaCount < 1 {
		c.addf(so.where, "minReplicaCount must be at least 1: a running worker moves scheduled and retried batches to the pending list, so with none KEDA would never see work")
	}
	if spec.MaxReplicaCount == nil {
		c.addf(so.where, "maxReplicaCount is missing (KEDA's default is 100: size it to the rate caps and Postgres connections)")
	} else if spec.MinReplicaCount != nil && *spec.MaxReplicaCount < *spec.MinReplicaCount {
		c.addf(so.where, "maxReplicaCount %d is below minReplicaCount %d", *spec.MaxReplicaCount, *spec.MinReplicaCount)
	}
	if spec.CooldownPeriod == nil || *spec.CooldownPeriod < 0 {
		c.addf(so.where, "cooldownPeriod is missing")
	}
	if len(spec.Triggers) == 0 {
		c.addf(so.where, "no triggers")
	}

	concurrency := int64(16) // the worker's default
	if target != nil {
		if target.v.Spec.Replicas != nil {
			c.addf(target.where, "spec.replicas is set but ScaledObject %s owns the replica count: every apply would fight the autoscaler", so.v.Metadata.Name)
		}
		if cmd := c.workerCmd(target.where); cmd != nil {
			if v, ok := cmd.flags["--concurrency"]; ok {
				concurrency, _ = strconv.ParseInt(v, 10, 64)
			}
		} else {
			c.addf(so.where, "scaleTargetRef %s does not run `campaignctl worker`", target.v.Metadata.Name)
		}
	}
	pending := "asynq:{" + c.facts.queue + "}:pending"
	active := "asynq:{" + c.facts.queue + "}:active"
	var ru redisURL
	haveURL := false
	if len(spec.Triggers) > 0 {
		ru, haveURL = c.redisURL(so.where)
	}
	onPending := false
	var pendingName, activeName string
	names := map[string]bool{}
	for i, tr := range spec.Triggers {
		tw := fmt.Sprintf("%s trigger %d (%s)", so.where, i+1, tr.Type)
		if tr.Type == "" {
			c.addf(tw, "no type")
		}
		if tr.Name != "" {
			if names[tr.Name] {
				c.addf(tw, "trigger name %q is used twice", tr.Name)
			}
			names[tr.Name] = true
		}
		if len(tr.Metadata) == 0 {
			c.addf(tw, "no metadata")
		}
		if ar := tr.AuthenticationRef; ar != nil {
			found := false
			for _, ta := range c.triggerAuth {
				found = found || ta.v.Metadata.Name == ar.Name
			}
			if (ar.Kind != "" && ar.Kind != "TriggerAuthentication") || !found {
				c.addf(tw, "authenticationRef %q names no TriggerAuthentication", ar.Name)
			}
		}
		if tr.Type != "redis" && tr.Type != "redis-sentinel" && tr.Type != "redis-cluster" {
			continue
		}
		if tr.AuthenticationRef == nil {
			c.addf(tw, "no authenticationRef: KEDA needs the Redis address and password")
		}
		list := tr.Metadata["listName"]
		n, err := strconv.ParseInt(tr.Metadata["listLength"], 10, 64)
		if err != nil || n < 1 {
			c.addf(tw, "listLength %q: want a whole number of batches per replica, at least 1", tr.Metadata["listLength"])
		}
		switch list {
		case pending:
			onPending = onPending || tr.Type == "redis"
			pendingName = tr.Name
			if err == nil && n > concurrency {
				c.addf(tw, "listLength %d is above the worker's --concurrency %d: a replica's worth of waiting batches would not ask for a replica", n, concurrency)
			}
		case active:
			activeName = tr.Name
			if err == nil && n != concurrency {
				c.addf(tw, "listLength %d on the active list must be the worker's --concurrency %d (the batches one replica sends at once)", n, concurrency)
			}
		default:
			c.addf(tw, "listName %q is neither %s nor %s (Asynq's lists of queue %q)", list, pending, active, c.facts.queue)
		}
		if !haveURL {
			continue
		}
		db := int64(0)
		if v, ok := tr.Metadata["databaseIndex"]; ok {
			if db, err = strconv.ParseInt(v, 10, 64); err != nil {
				c.addf(tw, "databaseIndex %q is not a number", v)
			}
		}
		if db != int64(ru.db) {
			c.addf(tw, "databaseIndex %d differs from REDIS_URL's DB %d: KEDA would watch an empty list", db, ru.db)
		}
		tlsOn := false
		if v, ok := tr.Metadata["enableTLS"]; ok {
			if tlsOn, err = strconv.ParseBool(v); err != nil {
				c.addf(tw, "enableTLS %q is not true or false", v)
			}
		}
		if tlsOn != ru.tls {
			c.addf(tw, "enableTLS %v but REDIS_URL is %s", tlsOn, map[bool]string{true: "rediss:// (TLS)", false: "redis:// (no TLS)"}[ru.tls])
		}
	}
	if !onPending {
		c.addf(so.where, "no `redis` trigger on listName %s, the Asynq pending list of queue %q", pending, c.facts.queue)
	}
	c.checkScalingModifiers(so, pendingName, activeName, concurrency)
	text := string(c.files[so.file])
	for _, alt := range []string{"type: redis-cluster", "type: redis-sentinel"} {
		if !regexp.MustCompile(`(?m)^\s*#.*` + regexp.QuoteMeta(alt)).MatchString(text) {
			c.addf(so.file, "the commented alternative trigger %q is missing", alt)
		}
	}
}

// checkScalingModifiers checks how the pending and active lists combine. The HPA takes the largest of
// several metrics, so with a trigger on each list and no formula, replicas that are all busy (active =
// replicas × concurrency) hide any smaller backlog: the lists must be summed, and the sum divided by the
// worker's --concurrency, as `campaignctl workers` does.
func (c *checker) checkScalingModifiers(so obj[scaledObject], pendingName, activeName string, concurrency int64) {
	var sm *scalingModifiers
	if adv := so.v.Spec.Advanced; adv != nil {
		sm = adv.ScalingModifiers
	}
	if sm == nil {
		if activeName != "" || c.hasTriggerOn(so, "asynq:{"+c.facts.queue+"}:active") {
			c.addf(so.where, "a trigger on the active list without advanced.scalingModifiers summing it with the pending list: the HPA takes the larger, and busy replicas would hide the backlog")
		}
		return
	}
	if pendingName == "" || activeName == "" {
		c.addf(so.where, "advanced.scalingModifiers needs named triggers on both the pending and the active list")
		return
	}
	formula := strings.Join(strings.Fields(sm.Formula), "")
	if formula != pendingName+"+"+activeName && formula != activeName+"+"+pendingName {
		c.addf(so.where, "scalingModifiers.formula %q, want %q: the batches waiting plus the batches being sent", sm.Formula, pendingName+" + "+activeName)
	}
	if t, err := strconv.ParseInt(string(sm.Target), 10, 64); err != nil || t != concurrency {
		c.addf(so.where, "scalingModifiers.target %q, want the worker's --concurrency %d (batches per replica)", sm.Target, concurrency)
	}
	if sm.MetricType != "" && sm.MetricType != "AverageValue" {
		c.addf(so.where, "scalingModifiers.metricType %q, want AverageValue (batches per replica)", sm.MetricType)
	}
}

func (c *checker) hasTriggerOn(so obj[scaledObject], list string) bool {
	for _, tr := range so.v.Spec.Triggers {
		if tr.Metadata["listName"] == list {
			return true
		}
	}
	return false
}

// workerCmd returns the `campaignctl worker` command of the pod at where, if it runs one.
func (c *checker) workerCmd(where string) *cmdline {
	if p := c.pods[where]; p != nil {
		for _, cmd := range p.cmds {
			if cmd.name == "worker" {
				return cmd
			}
		}
	}
	return nil
}

// checkRoles checks what each part of campaignctl needs: the worker, the UI, the receipts endpoint and
// the migration Job, each of which must be there.
func (c *checker) checkRoles() {
	found := map[string]int{}
	for _, d := range c.deployments {
		p := c.pods[d.where]
		for _, ct := range p.spec.Containers {
			cmd := p.cmds[ct.Name]
			if cmd == nil {
				continue
			}
			found[cmd.name]++
			cw := d.where + " container " + ct.Name
			switch cmd.name {
			case "worker":
				c.checkWorker(d, &ct, cmd, cw)
			case "ui":
				c.checkUI(d, &ct, cmd, cw)
			case "webhooks":
				c.checkWebhooks(d, &ct, cmd, cw)
			case "migrate":
				c.addf(cw, "`migrate` runs once: put it in a Job, not a Deployment")
			}
		}
	}
	for _, j := range c.jobs {
		for _, cmd := range c.pods[j.where].cmds {
			if cmd.name == "migrate" {
				found["migrate job"]++
			}
		}
	}
	// İYS (law 6563): refusals received through the messages must reach İYS within three business days
	// (iys push), and RETs given in İYS must reach the send-time consent check (iys sync): each runs on a
	// schedule, with the İYS API's settings, its credentials from a Secret.
	for _, j := range c.cronJobs {
		p := c.pods[j.where]
		for i := range p.spec.Containers {
			ct := &p.spec.Containers[i]
			cmd := p.cmds[ct.Name]
			if cmd == nil || !strings.HasPrefix(cmd.name, "iys ") {
				continue
			}
			found[cmd.name+" cronjob"]++
			cw := j.where + " container " + ct.Name
			for _, k := range []string{"DATABASE_URL", "IYS_USERNAME", "IYS_PASSWORD"} {
				if !envFromSecret(ct, k) {
					c.addf(cw, "%s does not come from a Secret: campaignctl %s needs it", k, cmd.name)
				}
			}
			for _, k := range []string{"IYS_BASE_URL", "IYS_CODE", "IYS_BRAND_CODE"} {
				if !slices.ContainsFunc(ct.Env, func(e envVar) bool { return e.Name == k }) {
					c.addf(cw, "%s is not set: campaignctl %s needs it", k, cmd.name)
				}
			}
		}
	}
	for _, role := range []string{"worker", "ui", "webhooks", "migrate job", "iys sync cronjob", "iys push cronjob"} {
		if found[role] != 1 {
			c.addf("kubernetes/", "want exactly one %s, found %d", role, found[role])
		}
	}
	if len(c.scaled) == 0 {
		c.addf("kubernetes/", "no KEDA ScaledObject for the workers")
	}
}

func envFromSecret(ct *container, name string) bool {
	for _, e := range ct.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return true
		}
	}
	return false
}

func (c *checker) checkWorker(d obj[deployment], ct *container, cmd *cmdline, cw string) {
	ps := &d.v.Spec.Template.Spec
	shutdown := 30 * time.Second // the worker's default --shutdown-timeout
	if v, ok := cmd.flags["--shutdown-timeout"]; ok {
		shutdown, _ = time.ParseDuration(v)
	}
	grace := 30 * time.Second // Kubernetes' default
	if ps.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*ps.TerminationGracePeriodSeconds) * time.Second
	}
	if grace < shutdown+gracefulMargin {
		c.addf(d.where, "terminationGracePeriodSeconds %v is less than --shutdown-timeout %v + %v: the worker would be SIGKILLed while handing batches back", grace, shutdown, gracefulMargin)
	}
	pdb := false
	for _, p := range c.pdbs {
		pdb = pdb || (p.v.Spec.Selector != nil && selectorMatches(p.v.Spec.Selector.MatchLabels, d.v.Spec.Template.Metadata.Labels))
	}
	if !pdb {
		c.addf(d.where, "no PodDisruptionBudget covers the workers")
	}
	scaled := false
	for _, so := range c.scaled {
		scaled = scaled || (so.v.Spec.ScaleTargetRef != nil && so.v.Spec.ScaleTargetRef.Name == d.v.Metadata.Name)
	}
	if !scaled {
		c.addf(d.where, "no ScaledObject scales the workers")
	}

	metricsAddr, ok := cmd.flags["--metrics-addr"]
	if !ok {
		c.addf(cw, "no --metrics-addr: nothing to scrape and no /healthz to probe")
	} else {
		port := addrPort(metricsAddr)
		ports := map[string]int32{}
		for _, p := range ct.Ports {
			ports[strconv.Itoa(int(p.ContainerPort))] = p.ContainerPort
			ports[p.Name] = p.ContainerPort
		}
		if _, ok := ports[port]; !ok {
			c.addf(cw, "--metrics-addr port %s is not a container port", port)
		}
		for kind, pr := range map[string]*probe{"readinessProbe": ct.ReadinessProbe, "livenessProbe": ct.LivenessProbe} {
			if pr == nil {
				continue
			}
			if pr.HTTPGet == nil || pr.HTTPGet.Path != "/healthz" || strconv.Itoa(int(ports[pr.HTTPGet.Port.String()])) != port {
				c.addf(cw, "%s should GET /healthz on the --metrics-addr port %s", kind, port)
			}
		}
		ann := d.v.Spec.Template.Metadata.Annotations
		if ann["prometheus.io/scrape"] != "true" {
			c.addf(d.where, `pod annotation prometheus.io/scrape should be "true"`)
		}
		if ann["prometheus.io/port"] != port {
			c.addf(d.where, "pod annotation prometheus.io/port %q is not the --metrics-addr port %s", ann["prometheus.io/port"], port)
		}
		if ann["prometheus.io/path"] != "/metrics" {
			c.addf(d.where, "pod annotation prometheus.io/path %q, want /metrics", ann["prometheus.io/path"])
		}
	}

	limit, err := parseQuantity(ct.Resources.Limits["memory"])
	if err == nil && (limit < 128<<20 || limit > 512<<20) {
		c.addf(cw, "memory limit %s: the worker's target is at most 100 MB RSS, give 128Mi-512Mi", ct.Resources.Limits["memory"])
	}
	for _, e := range ct.Env {
		if e.Name == "GOMEMLIMIT" && e.ValueFrom == nil {
			gl, gerr := parseGoMemLimit(string(e.Value))
			if gerr != nil {
				c.addf(cw, "GOMEMLIMIT %q: %v", e.Value, gerr)
			} else if err == nil && gl >= limit {
				c.addf(cw, "GOMEMLIMIT %s is not below the memory limit %s", e.Value, ct.Resources.Limits["memory"])
			}
		}
	}
	if !envFromSecret(ct, "DATABASE_URL") || !envFromSecret(ct, "REDIS_URL") {
		c.addf(cw, "the worker needs DATABASE_URL and REDIS_URL from the Secret")
	}
}

func (c *checker) checkUI(d obj[deployment], ct *container, cmd *cmdline, cw string) {
	addr, ok := cmd.flags["--addr"]
	if !ok {
		addr = "127.0.0.1:8080" // the default: loopback, out of the Service's reach
	}
	host, port, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		c.addf(cw, "ui listens on loopback (%s): no Service can reach it; give --addr 0.0.0.0:PORT", addr)
	} else if !envFromSecret(ct, "CAMPAIGNCTL_UI_AUTH") && cmd.flags["--basic-auth-file"] == "" {
		c.addf(cw, "ui on %s needs credentials: CAMPAIGNCTL_UI_AUTH from the Secret or --basic-auth-file (asynqmon has no auth of its own)", addr)
	}
	if cmd.flags["--read-only"] != "true" {
		c.addf(cw, "the deployed UI runs --read-only (DLQ changes go through `campaignctl dlq`, with its checks)")
	}
	if !c.serviceReaches(d, port) {
		c.addf(cw, "no Service reaches the ui's --addr port %s", port)
	}
}

func (c *checker) checkWebhooks(d obj[deployment], ct *container, cmd *cmdline, cw string) {
	addr, ok := cmd.flags["--addr"]
	if !ok {
		addr = "127.0.0.1:8090"
	}
	host, port, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		c.addf(cw, "webhooks listens on loopback (%s): no Service can reach it", addr)
	}
	if !c.serviceReaches(d, port) {
		c.addf(cw, "no Service reaches the webhooks' --addr port %s", port)
	}
	public, ok := cmd.flags["--public-url"]
	if !ok {
		c.addf(cw, "no --public-url: Twilio signs the public URL it calls, not the pod's address")
		return
	}
	want := strings.TrimSuffix(public, "/") + "/twilio/status"
	for name, data := range c.configData {
		if cb, ok := data["TWILIO_STATUS_CALLBACK"]; ok && cb != want {
			c.addf("ConfigMap "+name, "TWILIO_STATUS_CALLBACK %q is not the webhooks' --public-url + /twilio/status (%q)", cb, want)
		}
	}
	if !envFromSecret(ct, "DATABASE_URL") {
		c.addf(cw, "webhooks needs DATABASE_URL from the Secret")
	}
	if dir := cmd.flags["--spool-dir"]; dir != "" && !envFromSecret(ct, "REDIS_URL") {
		c.addf(cw, "webhooks with a spool needs REDIS_URL from the Secret: the workers wait through it while refusals wait in the spool")
	}
	// The refusal spool must be writable under a read-only root: a volume mounted at --spool-dir or above.
	if dir, ok := cmd.flags["--spool-dir"]; !ok {
		c.addf(cw, "no --spool-dir: the default (under HOME) is not writable with a read-only root, and refusals Postgres cannot take would be held for --store-wait, then answered 500")
	} else if dir != "" && !slices.ContainsFunc(ct.VolumeMounts, func(m volumeMount) bool {
		return dir == m.MountPath || strings.HasPrefix(dir, strings.TrimSuffix(m.MountPath, "/")+"/")
	}) {
		c.addf(cw, "--spool-dir %s is on no volume: the root file system is read-only", dir)
	}
	for kind, pr := range map[string]*probe{"readinessProbe": ct.ReadinessProbe, "livenessProbe": ct.LivenessProbe} {
		if pr != nil && (pr.HTTPGet == nil || pr.HTTPGet.Path != "/healthz") {
			c.addf(cw, "%s should GET /healthz (/stats answers the kubelet 403: it is for loopback or credentials)", kind)
		}
	}
}

// ---- kustomization and Dockerfile ----

func (c *checker) parseKustomization(name string) {
	dec := yaml.NewDecoder(bytes.NewReader(c.files[name]))
	dec.KnownFields(true)
	var k kustomization
	if err := dec.Decode(&k); err != nil {
		c.addf(name, "does not fit the Kustomization schema: %v", err)
		return
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		c.addf(name, "apiVersion/kind %s %s, want kustomize.config.k8s.io/v1beta1 Kustomization", k.APIVersion, k.Kind)
	}
	c.kustomize = &k
}

func (c *checker) checkKustomization() {
	const name = "kubernetes/kustomization.yaml"
	if c.kustomize == nil {
		if _, ok := c.files[name]; !ok {
			c.addf(name, "missing")
		}
		return
	}
	listed := map[string]bool{}
	for _, r := range c.kustomize.Resources {
		if listed[r] {
			c.addf(name, "resource %s is listed twice", r)
		}
		listed[r] = true
		if _, ok := c.files["kubernetes/"+r]; !ok {
			c.addf(name, "resource %s does not exist", r)
		}
	}
	for f := range c.files {
		if rel, ok := strings.CutPrefix(f, "kubernetes/"); ok && f != name && !listed[rel] {
			c.addf(name, "%s is not listed in resources", rel)
		}
	}
	if c.kustomize.Namespace != "" && !dnsLabel.MatchString(c.kustomize.Namespace) {
		c.addf(name, "namespace %q is not a DNS-1123 label", c.kustomize.Namespace)
	}
	imageListed := false
	for _, im := range c.kustomize.Images {
		imageListed = imageListed || im.Name == imageRepo
	}
	if !imageListed {
		c.addf(name, "images has no entry for %s: overlays set the tag there", imageRepo)
	}
}

// dockerInstr is one Dockerfile instruction with its continuation lines joined.
type dockerInstr struct {
	line int
	op   string
	args string
}

func parseDockerfile(text string) []dockerInstr {
	var out []dockerInstr
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(text, "\n") {
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
		if s, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		op, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, dockerInstr{line: start, op: strings.ToUpper(op), args: strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

func (c *checker) checkDockerfile() {
	const name = "Dockerfile"
	text, ok := c.files[name]
	if !ok {
		c.addf(name, "missing")
		return
	}
	instrs := parseDockerfile(string(text))
	type stage struct {
		image, alias string
		instrs       []dockerInstr
	}
	var stages []*stage
	for _, in := range instrs {
		if in.op == "FROM" {
			f := strings.Fields(in.args)
			s := &stage{}
			for i := 0; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"):
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					s.alias = f[i+1]
					i++
				case s.image == "":
					s.image = f[i]
				}
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			if in.op != "ARG" {
				c.addf(name, "line %d: %s before the first FROM", in.line, in.op)
			}
			continue
		}
		stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
	}
	if len(stages) < 2 {
		c.addf(name, "want a multi-stage build (a golang build stage and a distroless runtime), found %d stages", len(stages))
		return
	}
	build, final := stages[0], stages[len(stages)-1]
	if want := "golang:" + c.facts.goVersion; build.image != want && !strings.HasPrefix(build.image, want+"-") && !strings.HasPrefix(build.image, want+".") {
		c.addf(name, "build stage FROM %s, want %s (go.mod's go %s)", build.image, want, c.facts.goVersion)
	}
	out := ""
	for _, in := range build.instrs {
		if in.op != "RUN" || !strings.Contains(in.args, "go build") {
			continue
		}
		if !regexp.MustCompile(`(^|\s)CGO_ENABLED=0\s`).MatchString(in.args) {
			c.addf(name, "line %d: go build without CGO_ENABLED=0: distroless/static has no libc", in.line)
		}
		f := strings.Fields(in.args)
		if !slices.Contains(f, mainPackage) {
			c.addf(name, "line %d: go build does not build %s", in.line, mainPackage)
		}
		for i, a := range f {
			if a == "-o" && i+1 < len(f) {
				out = f[i+1]
			}
		}
	}
	if out == "" {
		c.addf(name, "no `RUN ... go build -o FILE %s` in the build stage", mainPackage)
	}
	if !c.facts.mainPkgs[mainPackage] {
		c.addf(name, "%s is not a package main with func main in the repository (found %v)", mainPackage, slices.Sorted(maps.Keys(c.facts.mainPkgs)))
	}
	if !strings.HasPrefix(final.image, "gcr.io/distroless/static") {
		c.addf(name, "runtime stage FROM %s, want gcr.io/distroless/static...:nonroot", final.image)
	}
	user, dest, entry := "", "", ""
	if strings.HasSuffix(final.image, ":nonroot") {
		user = "nonroot"
	}
	for _, in := range final.instrs {
		switch in.op {
		case "USER":
			user = in.args
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) == 3 && (f[0] == "--from="+build.alias || f[0] == "--from=0") && f[1] == out {
				dest = f[2]
			}
		case "ENTRYPOINT":
			var argv []string
			if err := yaml.Unmarshal([]byte(in.args), &argv); err != nil || len(argv) == 0 {
				c.addf(name, "line %d: ENTRYPOINT should be the exec form [\"/path/campaignctl\"]", in.line)
			} else {
				entry = argv[0]
			}
		}
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "root" || u == "0" {
		c.addf(name, "the runtime stage runs as %q: want USER nonroot (65532)", user)
	}
	if dest == "" {
		c.addf(name, "the runtime stage does not COPY --from=%s %s", build.alias, out)
	} else if entry != dest && !(strings.HasSuffix(dest, "/") && entry == path.Join(dest, path.Base(out))) {
		c.addf(name, "ENTRYPOINT %q is not the binary copied from the build stage (%s)", entry, dest)
	}
}

// ---- quantities ----

// parseQuantity reads a Kubernetes quantity (128Mi, 1Gi, 500m, 1, 0.5) as a number of base units.
func parseQuantity(s string) (float64, error) {
	if s == "" {
		return 0, errors.New("empty quantity")
	}
	suffixes := []struct {
		s string
		f float64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"m", 1e-3}}
	mult := 1.0
	num := s
	for _, suf := range suffixes {
		if n, ok := strings.CutSuffix(s, suf.s); ok {
			num, mult = n, suf.f
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a quantity", s)
	}
	return v * mult, nil
}

// parseGoMemLimit reads GOMEMLIMIT's format (a byte count with an optional B, KiB, MiB, GiB or TiB).
func parseGoMemLimit(s string) (float64, error) {
	for _, suf := range []struct {
		s string
		f float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}} {
		if n, ok := strings.CutSuffix(s, suf.s); ok {
			v, err := strconv.ParseUint(n, 10, 64)
			if err != nil {
				return 0, errors.New("want a number of bytes with B, KiB, MiB, GiB or TiB")
			}
			return float64(v) * suf.f, nil
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, errors.New("want a number of bytes with B, KiB, MiB, GiB or TiB")
	}
	return float64(v), nil
}
