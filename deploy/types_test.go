package deploy_test

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The subset of the Kubernetes (core/v1, apps/v1, batch/v1, policy/v1), KEDA (keda.sh/v1alpha1) and
// kustomize schemas that the manifests under kubernetes/ use, field names as the API spells them. The
// manifests are decoded into these types with unknown fields refused, so a misspelt or misplaced field
// (readinessprobe, a probe under the pod instead of the container) fails the test instead of being
// dropped silently by the API server. A field these types lack fails too: add it here after checking it
// in the API reference (kubectl explain, keda.sh/docs).

type objectMeta struct {
	Name        string `yaml:"name"`
	Namespace   string `yaml:"namespace"`
	Labels      strMap `yaml:"labels"`
	Annotations strMap `yaml:"annotations"`
}

type typeMeta struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
}

type namespace struct {
	typeMeta `yaml:",inline"`
}

type configMap struct {
	typeMeta `yaml:",inline"`
	Data     strMap `yaml:"data"`
}

type secret struct {
	typeMeta   `yaml:",inline"`
	Type       string `yaml:"type"`
	Data       strMap `yaml:"data"`
	StringData strMap `yaml:"stringData"`
}

type labelSelector struct {
	MatchLabels      strMap `yaml:"matchLabels"`
	MatchExpressions []struct {
		Key      string   `yaml:"key"`
		Operator string   `yaml:"operator"`
		Values   []string `yaml:"values"`
	} `yaml:"matchExpressions"`
}

type deployment struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		Replicas             *int32         `yaml:"replicas"`
		RevisionHistoryLimit *int32         `yaml:"revisionHistoryLimit"`
		Selector             *labelSelector `yaml:"selector"`
		Strategy             *struct {
			Type          string `yaml:"type"`
			RollingUpdate *struct {
				MaxSurge       intOrString `yaml:"maxSurge"`
				MaxUnavailable intOrString `yaml:"maxUnavailable"`
			} `yaml:"rollingUpdate"`
		} `yaml:"strategy"`
		Template podTemplate `yaml:"template"`
	} `yaml:"spec"`
}

type job struct {
	typeMeta `yaml:",inline"`
	Spec     jobSpec `yaml:"spec"`
}

type jobSpec struct {
	BackoffLimit            *int32      `yaml:"backoffLimit"`
	ActiveDeadlineSeconds   *int64      `yaml:"activeDeadlineSeconds"`
	TTLSecondsAfterFinished *int32      `yaml:"ttlSecondsAfterFinished"`
	Template                podTemplate `yaml:"template"`
}

type cronJob struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		Schedule                   string `yaml:"schedule"`
		TimeZone                   string `yaml:"timeZone"`
		ConcurrencyPolicy          string `yaml:"concurrencyPolicy"`
		StartingDeadlineSeconds    *int64 `yaml:"startingDeadlineSeconds"`
		Suspend                    *bool  `yaml:"suspend"`
		SuccessfulJobsHistoryLimit *int32 `yaml:"successfulJobsHistoryLimit"`
		FailedJobsHistoryLimit     *int32 `yaml:"failedJobsHistoryLimit"`
		JobTemplate                struct {
			Metadata objectMeta `yaml:"metadata"`
			Spec     jobSpec    `yaml:"spec"`
		} `yaml:"jobTemplate"`
	} `yaml:"spec"`
}

type podTemplate struct {
	Metadata objectMeta `yaml:"metadata"`
	Spec     podSpec    `yaml:"spec"`
}

type podSpec struct {
	RestartPolicy                 string              `yaml:"restartPolicy"`
	TerminationGracePeriodSeconds *int64              `yaml:"terminationGracePeriodSeconds"`
	AutomountServiceAccountToken  *bool               `yaml:"automountServiceAccountToken"`
	EnableServiceLinks            *bool               `yaml:"enableServiceLinks"`
	ServiceAccountName            string              `yaml:"serviceAccountName"`
	SecurityContext               *podSecurityContext `yaml:"securityContext"`
	TopologySpreadConstraints     []struct {
		MaxSkew           int32          `yaml:"maxSkew"`
		TopologyKey       string         `yaml:"topologyKey"`
		WhenUnsatisfiable string         `yaml:"whenUnsatisfiable"`
		LabelSelector     *labelSelector `yaml:"labelSelector"`
	} `yaml:"topologySpreadConstraints"`
	InitContainers []container `yaml:"initContainers"`
	Containers     []container `yaml:"containers"`
	Volumes        []volume    `yaml:"volumes"`
}

type seccompProfile struct {
	Type string `yaml:"type"`
}

type podSecurityContext struct {
	RunAsNonRoot   *bool           `yaml:"runAsNonRoot"`
	RunAsUser      *int64          `yaml:"runAsUser"`
	RunAsGroup     *int64          `yaml:"runAsGroup"`
	FSGroup        *int64          `yaml:"fsGroup"`
	SeccompProfile *seccompProfile `yaml:"seccompProfile"`
}

type securityContext struct {
	RunAsNonRoot             *bool           `yaml:"runAsNonRoot"`
	RunAsUser                *int64          `yaml:"runAsUser"`
	RunAsGroup               *int64          `yaml:"runAsGroup"`
	AllowPrivilegeEscalation *bool           `yaml:"allowPrivilegeEscalation"`
	ReadOnlyRootFilesystem   *bool           `yaml:"readOnlyRootFilesystem"`
	Privileged               *bool           `yaml:"privileged"`
	SeccompProfile           *seccompProfile `yaml:"seccompProfile"`
	Capabilities             *struct {
		Add  []string `yaml:"add"`
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
}

type container struct {
	Name            string           `yaml:"name"`
	Image           string           `yaml:"image"`
	ImagePullPolicy string           `yaml:"imagePullPolicy"`
	Command         strList          `yaml:"command"`
	Args            strList          `yaml:"args"`
	Ports           []containerPort  `yaml:"ports"`
	Env             []envVar         `yaml:"env"`
	EnvFrom         []envFromSource  `yaml:"envFrom"`
	Resources       resources        `yaml:"resources"`
	ReadinessProbe  *probe           `yaml:"readinessProbe"`
	LivenessProbe   *probe           `yaml:"livenessProbe"`
	StartupProbe    *probe           `yaml:"startupProbe"`
	SecurityContext *securityContext `yaml:"securityContext"`
	VolumeMounts    []volumeMount    `yaml:"volumeMounts"`
}

type containerPort struct {
	Name          string `yaml:"name"`
	ContainerPort int32  `yaml:"containerPort"`
	Protocol      string `yaml:"protocol"`
}

type keyRef struct {
	Name     string `yaml:"name"`
	Key      string `yaml:"key"`
	Optional *bool  `yaml:"optional"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     str    `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef    *keyRef `yaml:"secretKeyRef"`
		ConfigMapKeyRef *keyRef `yaml:"configMapKeyRef"`
		FieldRef        *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

type envFromSource struct {
	Prefix       string  `yaml:"prefix"`
	SecretRef    *keyRef `yaml:"secretRef"`
	ConfigMapRef *keyRef `yaml:"configMapRef"`
}

type resources struct {
	Requests map[string]string `yaml:"requests"`
	Limits   map[string]string `yaml:"limits"`
}

type probe struct {
	HTTPGet *struct {
		Path   string      `yaml:"path"`
		Port   intOrString `yaml:"port"`
		Scheme string      `yaml:"scheme"`
	} `yaml:"httpGet"`
	TCPSocket *struct {
		Port intOrString `yaml:"port"`
	} `yaml:"tcpSocket"`
	Exec *struct {
		Command []string `yaml:"command"`
	} `yaml:"exec"`
	InitialDelaySeconds int32 `yaml:"initialDelaySeconds"`
	PeriodSeconds       int32 `yaml:"periodSeconds"`
	TimeoutSeconds      int32 `yaml:"timeoutSeconds"`
	FailureThreshold    int32 `yaml:"failureThreshold"`
	SuccessThreshold    int32 `yaml:"successThreshold"`
}

type volumeMount struct {
	Name      string `yaml:"name"`
	MountPath string `yaml:"mountPath"`
	SubPath   string `yaml:"subPath"`
	ReadOnly  bool   `yaml:"readOnly"`
}

type keyToPath struct {
	Key  string `yaml:"key"`
	Path string `yaml:"path"`
	Mode *int32 `yaml:"mode"`
}

type volume struct {
	Name   string `yaml:"name"`
	Secret *struct {
		SecretName  string      `yaml:"secretName"`
		Optional    *bool       `yaml:"optional"`
		DefaultMode *int32      `yaml:"defaultMode"`
		Items       []keyToPath `yaml:"items"`
	} `yaml:"secret"`
	ConfigMap *struct {
		Name        string      `yaml:"name"`
		Optional    *bool       `yaml:"optional"`
		DefaultMode *int32      `yaml:"defaultMode"`
		Items       []keyToPath `yaml:"items"`
	} `yaml:"configMap"`
	EmptyDir *struct {
		Medium    string `yaml:"medium"`
		SizeLimit string `yaml:"sizeLimit"`
	} `yaml:"emptyDir"`
}

type service struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		Type     string `yaml:"type"`
		Selector strMap `yaml:"selector"`
		Ports    []struct {
			Name       string      `yaml:"name"`
			Port       int32       `yaml:"port"`
			TargetPort intOrString `yaml:"targetPort"`
			Protocol   string      `yaml:"protocol"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type podDisruptionBudget struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		MinAvailable   *intOrString   `yaml:"minAvailable"`
		MaxUnavailable *intOrString   `yaml:"maxUnavailable"`
		Selector       *labelSelector `yaml:"selector"`
	} `yaml:"spec"`
}

type scaledObject struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		ScaleTargetRef *struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
			Name       string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		PollingInterval  *int32 `yaml:"pollingInterval"`
		CooldownPeriod   *int32 `yaml:"cooldownPeriod"`
		MinReplicaCount  *int32 `yaml:"minReplicaCount"`
		MaxReplicaCount  *int32 `yaml:"maxReplicaCount"`
		IdleReplicaCount *int32 `yaml:"idleReplicaCount"`
		Advanced         *struct {
			RestoreToOriginalReplicaCount bool              `yaml:"restoreToOriginalReplicaCount"`
			ScalingModifiers              *scalingModifiers `yaml:"scalingModifiers"`
			HorizontalPodAutoscalerConfig *struct {
				Name     string `yaml:"name"`
				Behavior *struct {
					ScaleUp   *hpaScalingRules `yaml:"scaleUp"`
					ScaleDown *hpaScalingRules `yaml:"scaleDown"`
				} `yaml:"behavior"`
			} `yaml:"horizontalPodAutoscalerConfig"`
		} `yaml:"advanced"`
		Triggers []kedaTrigger `yaml:"triggers"`
	} `yaml:"spec"`
}

// scalingModifiers combines the triggers' metrics into one (KEDA 2.12+).
type scalingModifiers struct {
	Formula          string `yaml:"formula"`
	Target           str    `yaml:"target"`
	ActivationTarget str    `yaml:"activationTarget"`
	MetricType       string `yaml:"metricType"`
}

type hpaScalingRules struct {
	StabilizationWindowSeconds *int32 `yaml:"stabilizationWindowSeconds"`
	SelectPolicy               string `yaml:"selectPolicy"`
	Policies                   []struct {
		Type          string `yaml:"type"`
		Value         int32  `yaml:"value"`
		PeriodSeconds int32  `yaml:"periodSeconds"`
	} `yaml:"policies"`
}

type kedaTrigger struct {
	Type              string `yaml:"type"`
	Name              string `yaml:"name"`
	MetricType        string `yaml:"metricType"`
	UseCachedMetrics  bool   `yaml:"useCachedMetrics"`
	Metadata          strMap `yaml:"metadata"`
	AuthenticationRef *struct {
		Name string `yaml:"name"`
		Kind string `yaml:"kind"`
	} `yaml:"authenticationRef"`
}

type triggerAuthentication struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		SecretTargetRef []struct {
			Parameter string `yaml:"parameter"`
			Name      string `yaml:"name"`
			Key       string `yaml:"key"`
		} `yaml:"secretTargetRef"`
		Env []struct {
			Parameter     string `yaml:"parameter"`
			Name          string `yaml:"name"`
			ContainerName string `yaml:"containerName"`
		} `yaml:"env"`
	} `yaml:"spec"`
}

type kustomization struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Namespace  string   `yaml:"namespace"`
	Resources  []string `yaml:"resources"`
	Labels     []struct {
		Pairs            strMap `yaml:"pairs"`
		IncludeSelectors bool   `yaml:"includeSelectors"`
		IncludeTemplates bool   `yaml:"includeTemplates"`
	} `yaml:"labels"`
	Images []struct {
		Name    string `yaml:"name"`
		NewName string `yaml:"newName"`
		NewTag  string `yaml:"newTag"`
		Digest  string `yaml:"digest"`
	} `yaml:"images"`
}

// str is a field the API declares as a string. Kubernetes decodes YAML 1.1 (sigs.k8s.io/yaml), where an
// unquoted 100, true, on or yes is a number or a boolean, and then refuses it for a string field
// ("cannot unmarshal number into Go struct field ... of type string"); yaml.v3 would quietly turn it into
// a string. So a string field must be a YAML string that YAML 1.1 reads as a string too.
type str string

func (s *str) UnmarshalYAML(n *yaml.Node) error {
	v, err := yamlString(n)
	*s = str(v)
	return err
}

// strMap is a map[string]string of the API (labels, annotations, ConfigMap data, KEDA trigger metadata).
type strMap map[string]string

func (m *strMap) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: want a mapping of strings", n.Line)
	}
	out := strMap{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if _, dup := out[k.Value]; dup {
			return fmt.Errorf("line %d: key %q given twice", k.Line, k.Value)
		}
		s, err := yamlString(v)
		if err != nil {
			return fmt.Errorf("%s: %w", k.Value, err)
		}
		out[k.Value] = s
	}
	*m = out
	return nil
}

// strList is a []string of the API (command, args).
type strList []string

func (l *strList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.SequenceNode {
		return fmt.Errorf("line %d: want a list of strings", n.Line)
	}
	out := strList{}
	for _, e := range n.Content {
		s, err := yamlString(e)
		if err != nil {
			return err
		}
		out = append(out, s)
	}
	*l = out
	return nil
}

func yamlString(n *yaml.Node) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", fmt.Errorf("line %d: want a string, not a collection", n.Line)
	}
	quoted := n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0
	if n.ShortTag() != "!!str" || (!quoted && yaml11Bool(n.Value)) {
		return "", fmt.Errorf("line %d: %s is not a string to Kubernetes (a YAML number, boolean or null): quote it", n.Line, n.Value)
	}
	return n.Value, nil
}

// yaml11Bool tells the plain scalars YAML 1.1 reads as booleans although YAML 1.2 reads them as strings.
func yaml11Bool(s string) bool {
	switch strings.ToLower(s) {
	case "y", "yes", "n", "no", "on", "off", "true", "false":
		return true
	}
	return false
}

// intOrString is the API's IntOrString (ports, maxSurge, minAvailable).
type intOrString struct {
	IsInt bool
	Int   int64
	Str   string
}

func (v *intOrString) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a number or a string", n.Line)
	}
	switch n.ShortTag() {
	case "!!int":
		i, err := strconv.ParseInt(n.Value, 0, 32)
		if err != nil {
			return fmt.Errorf("line %d: %v", n.Line, err)
		}
		*v = intOrString{IsInt: true, Int: i}
	case "!!str":
		*v = intOrString{Str: n.Value}
	default:
		return fmt.Errorf("line %d: %s is neither a number nor a string", n.Line, n.Value)
	}
	return nil
}

func (v intOrString) String() string {
	if v.IsInt {
		return strconv.FormatInt(v.Int, 10)
	}
	return v.Str
}
