// Package validate checks the files under deploy/ against the types of the
// systems that read them, without those systems: the Kubernetes manifests
// against the Kubernetes API's Go types (k8s.io/api) and the Prometheus
// Operator's (ServiceMonitor), decoded strictly, and the flags they pass
// against the broker and lockctl binaries built from this repository.
//
// It is a module of its own so that the broker's module does not depend on
// Kubernetes; `make test-deploy` runs it.
package validate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// repoRoot is the repository's root, two levels above this module.
const repoRoot = "../.."

// manifests are the objects of deploy/kubernetes/lockbroker.yaml.
type manifests struct {
	services []*corev1.Service
	sts      *appsv1.StatefulSet
	pdb      *policyv1.PodDisruptionBudget
	sm       *monitoringv1.ServiceMonitor
}

// newObject returns an empty object of the type apiVersion and kind name.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "v1 Service":
		return &corev1.Service{}, nil
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, nil
	}
	return nil, fmt.Errorf("no type for %s %s", apiVersion, kind)
}

// decodeStrict decodes one YAML document into its API type: duplicate keys
// and fields the type does not have are errors (as `kubectl apply
// --validate=strict` refuses them).
func decodeStrict(doc []byte) (any, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, err
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return nil, err
	}
	obj, err := newObject(tm.APIVersion, tm.Kind)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

// docSep splits a YAML stream into documents.
var docSep = regexp.MustCompile(`(?m)^---\s*$`)

func loadManifests(t *testing.T) manifests {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(repoRoot, "deploy/kubernetes/lockbroker.yaml"))
	require.NoError(t, err)
	var m manifests
	for i, doc := range docSep.Split(string(text), -1) {
		obj, err := decodeStrict([]byte(doc))
		require.NoError(t, err, "document %d", i)
		switch o := obj.(type) {
		case *corev1.Service:
			m.services = append(m.services, o)
		case *appsv1.StatefulSet:
			require.Nil(t, m.sts, "one StatefulSet")
			m.sts = o
		case *policyv1.PodDisruptionBudget:
			m.pdb = o
		case *monitoringv1.ServiceMonitor:
			m.sm = o
		}
	}
	require.NotNil(t, m.sts, "a StatefulSet")
	require.NotNil(t, m.pdb, "a PodDisruptionBudget")
	require.NotNil(t, m.sm, "a ServiceMonitor")
	require.Len(t, m.sts.Spec.Template.Spec.Containers, 1)
	return m
}

func TestDecodeStrictRefusesUnknownFields(t *testing.T) {
	_, err := decodeStrict([]byte("apiVersion: v1\nkind: Service\nspec:\n  selectr: {}\n"))
	assert.ErrorContains(t, err, "selectr")
	_, err = decodeStrict([]byte("apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nspec:\n  endpoints:\n    - prot: http\n"))
	assert.ErrorContains(t, err, "prot")
	_, err = decodeStrict([]byte("apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  name: b\n"))
	assert.Error(t, err, "duplicate key")
}

// flagValue returns the value of --name=value in args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// drainExit is how long the broker may take to exit after --drain-timeout
// (cmd/broker drain), rounded up; test/compose uses the same bound.
const drainExit = 3 * time.Second

func TestStatefulSet(t *testing.T) {
	m := loadManifests(t)
	pod := m.sts.Spec.Template.Spec
	c := pod.Containers[0]

	require.NotNil(t, m.sts.Spec.Replicas)
	assert.GreaterOrEqual(t, *m.sts.Spec.Replicas, int32(3), "one replica drains while two serve")
	sel, err := metav1.LabelSelectorAsSelector(m.sts.Spec.Selector)
	require.NoError(t, err)
	assert.True(t, sel.Matches(labels.Set(m.sts.Spec.Template.Labels)), "the selector selects the pods")

	// Termination: the preStop sleep, then SIGTERM and the drain, then the
	// exit, all before the kill.
	drainFlag, ok := flagValue(c.Args, "drain-timeout")
	require.True(t, ok, "--drain-timeout is set explicitly")
	drain, err := time.ParseDuration(drainFlag)
	require.NoError(t, err)
	require.NotNil(t, c.Lifecycle, "a preStop hook")
	require.NotNil(t, c.Lifecycle.PreStop)
	require.NotNil(t, c.Lifecycle.PreStop.Sleep, "the image has no shell: preStop sleeps with Kubernetes' own sleep action")
	preStop := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	require.NotNil(t, pod.TerminationGracePeriodSeconds)
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	assert.GreaterOrEqual(t, grace, preStop+drain+drainExit,
		"terminationGracePeriodSeconds %v must outlast preStop %v + --drain-timeout %v + exit %v", grace, preStop, drain, drainExit)

	// Readiness on the gRPC health service, through lockctl in the image.
	require.NotNil(t, c.ReadinessProbe)
	require.NotNil(t, c.ReadinessProbe.Exec, "readiness asks gRPC health (lockctl health), not /healthz")
	probe := c.ReadinessProbe.Exec.Command
	require.GreaterOrEqual(t, len(probe), 2)
	assert.Equal(t, []string{"/usr/local/bin/lockctl", "health"}, probe[:2])
	_, http := flagValue(probe, "http")
	assert.False(t, http, "the probe asks gRPC health, not HTTP")
	assert.Nil(t, c.LivenessProbe, "no liveness probe: NOT_SERVING means Consul is out of reach, a restart does not help")

	// Resources: requests for scheduling, a memory limit, no CPU limit.
	assert.False(t, c.Resources.Requests.Cpu().IsZero(), "CPU request")
	assert.False(t, c.Resources.Requests.Memory().IsZero(), "memory request")
	assert.False(t, c.Resources.Limits.Memory().IsZero(), "memory limit")
	_, cpuLimit := c.Resources.Limits[corev1.ResourceCPU]
	assert.False(t, cpuLimit, "no CPU limit: throttling delays renewals")

	// Ports, security.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	assert.Equal(t, map[string]int32{"grpc": 8700, "http": 8701}, ports)
	require.NotNil(t, pod.SecurityContext)
	require.NotNil(t, pod.SecurityContext.RunAsNonRoot)
	assert.True(t, *pod.SecurityContext.RunAsNonRoot)
	require.NotNil(t, c.SecurityContext)
	require.NotNil(t, c.SecurityContext.ReadOnlyRootFilesystem)
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)

	// Every file a flag or the probe names lies in a mounted secret.
	volumes := map[string]string{} // volume -> secret
	for _, v := range pod.Volumes {
		require.NotNil(t, v.Secret, "volume %s is a secret", v.Name)
		volumes[v.Name] = v.Secret.SecretName
	}
	mounts := map[string]string{} // mount path -> volume
	for _, vm := range c.VolumeMounts {
		assert.Contains(t, volumes, vm.Name)
		mounts[vm.MountPath] = vm.Name
	}
	for _, name := range []string{"tls-cert", "tls-key", "tls-client-ca", "tenants"} {
		path, ok := flagValue(c.Args, name)
		require.True(t, ok, "--%s is set", name)
		assert.Contains(t, mounts, filepath.Dir(path), "--%s=%s is not in a mounted volume", name, path)
	}
	for _, name := range []string{"cacert", "cert", "key"} {
		path, ok := flagValue(probe, name)
		require.True(t, ok, "the probe passes --%s", name)
		assert.Contains(t, mounts, filepath.Dir(path), "probe --%s=%s is not in a mounted volume", name, path)
	}
	var tokenFile string
	for _, e := range c.Env {
		if e.Name == "CONSUL_HTTP_TOKEN_FILE" {
			tokenFile = e.Value
		}
	}
	assert.Contains(t, mounts, filepath.Dir(tokenFile), "CONSUL_HTTP_TOKEN_FILE is in a mounted secret")
	assert.ElementsMatch(t, []string{"lockbroker-tls", "lockbroker-tenants", "lockbroker-consul"},
		mapValues(volumes), "the secrets README.md tells to create")
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// TestArgsAreFlags runs the broker and lockctl built from this repository
// with the manifest's arguments and -h: a flag either does not know fails
// before -h.
func TestArgsAreFlags(t *testing.T) {
	m := loadManifests(t)
	c := m.sts.Spec.Template.Spec.Containers[0]
	dir := t.TempDir()
	for _, cmd := range []string{"broker", "lockctl"} {
		// As the Makefile builds them, so that the build cache serves it.
		build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, cmd), "./cmd/"+cmd)
		build.Dir = repoRoot
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		require.NoError(t, err, "go build ./cmd/%s:\n%s", cmd, out)
	}
	run := func(bin string, args ...string) {
		cmd := exec.Command(filepath.Join(dir, bin), append(args, "-h")...)
		cmd.Env = []string{}
		out, err := cmd.CombinedOutput()
		assert.NoError(t, err, "%s %s -h:\n%s", bin, strings.Join(args, " "), out)
	}
	run("broker", c.Args...)
	run("lockctl", c.ReadinessProbe.Exec.Command[1:]...)
	for _, a := range c.Args {
		assert.NotContains(t, a, "--shutdown-timeout", "deprecated: --drain-timeout")
	}
	// The negative case, so that the check above means something.
	cmd := exec.Command(filepath.Join(dir, "broker"), "--no-such-flag", "-h")
	assert.Error(t, cmd.Run(), "the broker refuses an unknown flag before -h")
}

func TestServicesAndMonitor(t *testing.T) {
	m := loadManifests(t)
	podLabels := labels.Set(m.sts.Spec.Template.Labels)
	containerPorts := map[string]bool{}
	for _, p := range m.sts.Spec.Template.Spec.Containers[0].Ports {
		containerPorts[p.Name] = true
	}
	byName := map[string]*corev1.Service{}
	for _, s := range m.services {
		byName[s.Name] = s
		assert.True(t, labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels), "Service %s selects the pods", s.Name)
		for _, p := range s.Spec.Ports {
			assert.Equal(t, intstr.String, p.TargetPort.Type, "Service %s targets ports by name", s.Name)
			assert.True(t, containerPorts[p.TargetPort.StrVal], "Service %s targets port %q the container has", s.Name, p.TargetPort.StrVal)
		}
	}
	headless := byName[m.sts.Spec.ServiceName]
	require.NotNil(t, headless, "the StatefulSet's serviceName %q is a Service here", m.sts.Spec.ServiceName)
	assert.Equal(t, corev1.ClusterIPNone, headless.Spec.ClusterIP, "one DNS name per replica: a headless Service")
	assert.False(t, headless.Spec.PublishNotReadyAddresses, "a draining replica leaves DNS")
	require.Contains(t, byName, "lockbroker", "the Service clients dial first")

	// PDB: one replica at a time, of these pods.
	require.NotNil(t, m.pdb.Spec.MaxUnavailable)
	assert.Equal(t, intstr.FromInt32(1), *m.pdb.Spec.MaxUnavailable)
	sel, err := metav1.LabelSelectorAsSelector(m.pdb.Spec.Selector)
	require.NoError(t, err)
	assert.True(t, sel.Matches(podLabels), "the PDB selects the pods")

	// The ServiceMonitor finds exactly the headless Service, and its port.
	sel, err = metav1.LabelSelectorAsSelector(&m.sm.Spec.Selector)
	require.NoError(t, err)
	var found []string
	for _, s := range m.services {
		if sel.Matches(labels.Set(s.Labels)) {
			found = append(found, s.Name)
		}
	}
	assert.Equal(t, []string{headless.Name}, found, "the ServiceMonitor scrapes each replica once")
	require.Len(t, m.sm.Spec.Endpoints, 1)
	ep := m.sm.Spec.Endpoints[0]
	assert.Equal(t, "/metrics", ep.Path)
	var portOK bool
	for _, p := range headless.Spec.Ports {
		portOK = portOK || (p.Name == ep.Port && p.TargetPort.StrVal == "http")
	}
	assert.True(t, portOK, "the ServiceMonitor's port %q is the Service's http port", ep.Port)
}
