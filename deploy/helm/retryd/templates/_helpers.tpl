{{/*
Chart name, truncated to 63 characters (the DNS label limit).
*/}}
{{- define "retryd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's resources: <release>-<chart>, or the release name
alone when it already contains the chart name. Truncated to 63 characters.
*/}}
{{- define "retryd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "retryd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels every resource of the release carries, whatever its component.
*/}}
{{- define "retryd.commonLabels" -}}
helm.sh/chart: {{ include "retryd.chart" . }}
app.kubernetes.io/name: {{ include "retryd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "retryd.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/part-of: retryd
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Standard labels of the server's resources.
*/}}
{{- define "retryd.labels" -}}
{{ include "retryd.commonLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{/*
Selector labels: the immutable subset of the labels that Services, the
workload and the PodDisruptionBudget select the server's pods by. The
component keeps the helm test pod out of the Services.
*/}}
{{- define "retryd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "retryd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{/*
Name of the ServiceAccount the pods run as.
*/}}
{{- define "retryd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "retryd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image tag: image.tag, or the chart's appVersion.
*/}}
{{- define "retryd.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/*
Full image reference of the retryd container: repository@digest when a digest
is set, repository:tag otherwise.
*/}}
{{- define "retryd.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "retryd.imageTag" .) }}
{{- end }}
{{- end }}

{{/*
Image of the helm test pod: tests.image, defaulting to the retryd image, which
carries /usr/local/bin/retryd-healthcheck.
*/}}
{{- define "retryd.testImage" -}}
{{- if or .Values.tests.image.repository .Values.tests.image.tag }}
{{- printf "%s:%s" (default .Values.image.repository .Values.tests.image.repository) (default (include "retryd.imageTag" .) .Values.tests.image.tag) }}
{{- else }}
{{- include "retryd.image" . }}
{{- end }}
{{- end }}

{{/*
Kind of the workload for the store: a Deployment for the in-memory and the
Redis store, a StatefulSet with a volumeClaimTemplate for the file store,
both built from the same pod template (retryd.podTemplate).
*/}}
{{- define "retryd.workloadKind" -}}
{{- if eq .Values.store.kind "file" }}StatefulSet{{ else }}Deployment{{ end }}
{{- end }}

{{/*
Whether the headless Service is rendered: when asked for, and always for the
file store, whose StatefulSet names it as its serviceName.
*/}}
{{- define "retryd.headlessServiceEnabled" -}}
{{- if or .Values.headlessService.enabled (eq .Values.store.kind "file") }}true{{ end }}
{{- end }}

{{/*
Name of the file store's volume: the volumeClaimTemplate, its mount, and
the prefix of the claims (<name>-<statefulset>-<ordinal>).
*/}}
{{- define "retryd.dataVolumeName" -}}
data
{{- end }}

{{/*
Pod securityContext: podSecurityContext, plus for the file store fsGroup
65532 (so the image's non-root user can write the volume) and
fsGroupChangePolicy OnRootMismatch (so the kubelet does not re-chown the
whole volume on every start), each unless set.
*/}}
{{- define "retryd.podSecurityContext" -}}
{{- $psc := deepCopy (default dict .Values.podSecurityContext) }}
{{- if eq .Values.store.kind "file" }}
{{- if not (hasKey $psc "fsGroup") }}
{{- $_ := set $psc "fsGroup" 65532 }}
{{- end }}
{{- if not (hasKey $psc "fsGroupChangePolicy") }}
{{- $_ := set $psc "fsGroupChangePolicy" "OnRootMismatch" }}
{{- end }}
{{- end }}
{{- with $psc }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
Seconds in a Go duration string (such as "10s", "1m30s", "500ms"), as a
float. values.schema.json only admits strings this parser understands.
*/}}
{{- define "retryd.durationSecondsFloat" -}}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" . -1 }}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . }}
{{- $unit := trimPrefix $number . }}
{{- $scale := get (dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0) $unit }}
{{- $total = addf $total (mulf (float64 $number) $scale) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
Seconds in a Go duration string, rounded up to a whole second.
*/}}
{{- define "retryd.durationSeconds" -}}
{{- include "retryd.durationSecondsFloat" . | float64 | ceil | int64 }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the value set, or server.shutdownTimeout
rounded up plus 5 seconds for the kubelet and the endpoint removal. A value
not longer than the shutdown timeout fails the render: the kubelet would kill
retryd before it drained.
*/}}
{{- define "retryd.terminationGracePeriodSeconds" -}}
{{- $shutdown := include "retryd.durationSeconds" .Values.server.shutdownTimeout | int64 }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $shutdown 5 }}
{{- else }}
{{- $grace := .Values.terminationGracePeriodSeconds | int64 }}
{{- if le $grace $shutdown }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be greater than server.shutdownTimeout (%s = %ds): the kubelet would kill retryd before it stops" $grace .Values.server.shutdownTimeout $shutdown) }}
{{- end }}
{{- $grace }}
{{- end }}
{{- end }}

{{/*
Directory of the TLS files (tls.crt, tls.key and, for mTLS, ca.crt) in the
container: a projected volume of tls.existingSecret and tls.clientCaSecret.
Not under /etc/retryd, the ConfigMap's read-only mount, which cannot hold
the mount point of another volume.
*/}}
{{- define "retryd.tlsDir" -}}
/etc/retryd-tls
{{- end }}

{{/*
Directory of the credentials file (credentials.yaml) in the container: a
volume of auth.existingSecret's one key auth.key. Not under /etc/retryd,
for the reason retryd.tlsDir gives.
*/}}
{{- define "retryd.authDir" -}}
/etc/retryd-auth
{{- end }}

{{/*
Port the gRPC probes and the helm test pod ask grpc.health.v1 on: the
plaintext tls.healthPort when the gRPC port speaks TLS (the kubelet's gRPC
probes cannot), server.port otherwise.
*/}}
{{- define "retryd.healthPort" -}}
{{- if .Values.tls.enabled }}
{{- .Values.tls.healthPort }}
{{- else }}
{{- .Values.server.port }}
{{- end }}
{{- end }}

{{/*
Checks that need more than one value, so values.schema.json cannot express
them. Included by every workload template; renders nothing.
*/}}
{{- define "retryd.validate" -}}
{{- $kind := .Values.store.kind }}
{{- if eq $kind "file" }}
{{- if .Values.autoscaling.enabled }}
{{- fail "autoscaling.enabled must be false with store.kind \"file\": one pod owns the store's volume, so there is nothing to scale; set the replica count with replicaCount (0 or 1)" }}
{{- end }}
{{- $path := clean .Values.store.file.path }}
{{- range $reserved := list "/tmp" "/etc/retryd" (include "retryd.tlsDir" $) (include "retryd.authDir" $) }}
{{- if or (eq $path $reserved) (hasPrefix (printf "%s/" $reserved) $path) }}
{{- fail (printf "store.file.path %q must not be %s or inside it: the chart mounts a volume of its own there" $.Values.store.file.path $reserved) }}
{{- end }}
{{- end }}
{{- end }}
{{- if eq $kind "redis" }}
{{- if not .Values.store.redis.existingSecret }}
{{- fail "store.kind \"redis\" needs store.redis.existingSecret: the name of a Secret whose key store.redis.urlKey holds the full Redis URL (redis://[user:password@]host:port/db), passed to retryd as RETRYD_STORE" }}
{{- end }}
{{- range .Values.extraEnv }}
{{- if eq .name "RETRYD_STORE" }}
{{- fail "extraEnv must not set RETRYD_STORE with store.kind \"redis\": the chart sets it from store.redis.existingSecret" }}
{{- end }}
{{- end }}
{{- end }}
{{- if has $kind (list "memory" "file") }}
{{- if gt (int .Values.replicaCount) 1 }}
{{- $where := get (dict "memory" "in one pod" "file" "on one pod's volume (each further pod would get a volume, and chains, of its own)") $kind }}
{{- fail (printf "replicaCount is %d but store.kind %q keeps retry chains %s: use replicaCount 1" (int .Values.replicaCount) $kind $where) }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.maxReplicas) 1) }}
{{- fail (printf "autoscaling.maxReplicas is %d but store.kind %q keeps retry chains in one pod: use maxReplicas 1" (int .Values.autoscaling.maxReplicas) $kind) }}
{{- end }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail (printf "autoscaling.minReplicas (%d) is greater than autoscaling.maxReplicas (%d)" (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- end }}
{{- if and .Values.podDisruptionBudget.enabled (kindIs "invalid" .Values.podDisruptionBudget.minAvailable) (kindIs "invalid" .Values.podDisruptionBudget.maxUnavailable) }}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable" }}
{{- end }}
{{- with .Values.server.metricsPort }}
{{- if eq (int .) (int $.Values.server.port) }}
{{- fail (printf "server.metricsPort (%d) must differ from server.port: the gRPC and metrics listeners cannot share a port" (int .)) }}
{{- end }}
{{- if eq (int .) (int $.Values.service.port) }}
{{- fail (printf "server.metricsPort (%d) must differ from service.port: the Service exposes both" (int .)) }}
{{- end }}
{{- end }}
{{- if and .Values.server.pprof (not .Values.server.metricsPort) }}
{{- fail "server.pprof needs server.metricsPort: the profiles are served on the metrics listener" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.server.metricsPort) }}
{{- fail "serviceMonitor.enabled needs server.metricsPort: with 0 retryd serves no /metrics to scrape" }}
{{- end }}
{{- if and .Values.otel.enabled (not .Values.otel.endpoint) }}
{{- fail "otel.endpoint must be set when otel.enabled is true" }}
{{- end }}
{{- if lt (include "retryd.durationSecondsFloat" .Values.server.chainTtl | float64) 1.0 }}
{{- fail (printf "server.chainTtl %q must be at least 1s" .Values.server.chainTtl) }}
{{- end }}
{{- range $key := list "abandonGrace" "shutdownTimeout" }}
{{- if le (include "retryd.durationSecondsFloat" (get $.Values.server $key) | float64) 0.0 }}
{{- fail (printf "server.%s %q must be positive" $key (get $.Values.server $key)) }}
{{- end }}
{{- end }}
{{- range $key := list "keepaliveMinTime" "unaryTimeout" }}
{{- if le (include "retryd.durationSecondsFloat" (get $.Values.server.limits $key) | float64) 0.0 }}
{{- fail (printf "server.limits.%s %q must be positive" $key (get $.Values.server.limits $key)) }}
{{- end }}
{{- end }}
{{- if lt (include "retryd.durationSecondsFloat" .Values.server.configReloadInterval | float64) 0.1 }}
{{- fail (printf "server.configReloadInterval %q must be at least 100ms" .Values.server.configReloadInterval) }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- if not .Values.tls.existingSecret }}
{{- fail "tls.enabled needs tls.existingSecret: the name of a kubernetes.io/tls Secret with tls.crt and tls.key (e.g. one cert-manager issues)" }}
{{- end }}
{{- if lt (include "retryd.durationSecondsFloat" .Values.tls.reloadInterval | float64) 0.1 }}
{{- fail (printf "tls.reloadInterval %q must be at least 100ms" .Values.tls.reloadInterval) }}
{{- end }}
{{- $health := int .Values.tls.healthPort }}
{{- range $what, $port := dict "server.port" .Values.server.port "server.metricsPort" .Values.server.metricsPort "service.port" .Values.service.port }}
{{- if eq $health (int $port) }}
{{- fail (printf "tls.healthPort (%d) must differ from %s: the plaintext health port needs a port of its own" $health $what) }}
{{- end }}
{{- end }}
{{- else if .Values.tls.clientCaSecret }}
{{- fail "tls.clientCaSecret needs tls.enabled: client certificates are only asked for over TLS" }}
{{- end }}
{{- if .Values.auth.enabled }}
{{- if not .Values.auth.existingSecret }}
{{- fail "auth.enabled needs auth.existingSecret: the name of a Secret whose key auth.key (default credentials.yaml) holds the credentials file (tenants and token hashes; check it with retryd check-credentials)" }}
{{- end }}
{{- if lt (include "retryd.durationSecondsFloat" .Values.auth.reloadInterval | float64) 0.1 }}
{{- fail (printf "auth.reloadInterval %q must be at least 100ms" .Values.auth.reloadInterval) }}
{{- end }}
{{- end }}
{{- $_ := include "retryd.terminationGracePeriodSeconds" . }}
{{- end }}

{{/*
The policy file passed with --config, built from the policies, providers,
defaultPolicy and fleet values (defaultPolicy only when set, fleet only when
not null: an empty fleet block protects every provider with the defaults).
*/}}
{{/*
The fleet blocks of the policy file (the top-level fleet and every
provider's): what retryd reads only at start, so the pod template carries
their checksum and rolls when they change. Policies reload in place.
*/}}
{{- define "retryd.fleetSettings" -}}
{{- $providers := dict -}}
{{- range $name, $p := .Values.providers -}}
{{- if and (kindIs "map" $p) (hasKey $p "fleet") -}}
{{- $_ := set $providers $name $p.fleet -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "fleet" .Values.fleet "providers" $providers) -}}
{{- end }}

{{- define "retryd.policyFile" -}}
policies:
{{- if .Values.policies }}
{{ toYaml .Values.policies | indent 2 }}
{{- else }} {}
{{- end }}
providers:
{{- if .Values.providers }}
{{ toYaml .Values.providers | indent 2 }}
{{- else }} {}
{{- end }}
{{- with .Values.defaultPolicy }}
defaultPolicy:
{{ toYaml . | indent 2 }}
{{- end }}
{{- if kindIs "map" .Values.fleet }}
fleet:
{{- if .Values.fleet }}
{{ toYaml .Values.fleet | indent 2 }}
{{- else }} {}
{{- end }}
{{- end }}
{{- end }}

{{/*
OTEL_RESOURCE_ATTRIBUTES: the pod's name and namespace (from the downward API
variables POD_NAME and POD_NAMESPACE) and otel.resourceAttributes, sorted.
*/}}
{{- define "retryd.otelResourceAttributes" -}}
{{- $attrs := list "k8s.pod.name=$(POD_NAME)" "k8s.namespace.name=$(POD_NAMESPACE)" }}
{{- range $key := keys .Values.otel.resourceAttributes | sortAlpha }}
{{- $attrs = append $attrs (printf "%s=%v" $key (get $.Values.otel.resourceAttributes $key)) }}
{{- end }}
{{- join "," $attrs }}
{{- end }}
