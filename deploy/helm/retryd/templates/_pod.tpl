{{/*
Pod template of the retryd workload, shared by every workload kind (see
retryd.workloadKind) so that a StatefulSet for a volume-backed store differs
from the Deployment only in its own fields.
*/}}
{{- define "retryd.podTemplate" -}}
metadata:
  annotations:
    {{- /* The policy file is reloaded in place (--config is polled), so a
    policy change does not roll the pods; fleet protection is set at start,
    so a change of a fleet block does. */}}
    checksum/fleet: {{ include "retryd.fleetSettings" . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  labels:
    {{- include "retryd.labels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  serviceAccountName: {{ include "retryd.serviceAccountName" . }}
  automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ include "retryd.terminationGracePeriodSeconds" . }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with include "retryd.podSecurityContext" . }}
  securityContext:
    {{- . | nindent 4 }}
  {{- end }}
  containers:
    - name: retryd
      image: {{ include "retryd.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - serve
        - --listen=0.0.0.0:{{ .Values.server.port }}
        - --config=/etc/retryd/config.yaml
        - --config-reload-interval={{ .Values.server.configReloadInterval }}
        - --chain-ttl={{ .Values.server.chainTtl }}
        - --abandon-grace={{ .Values.server.abandonGrace }}
        - --shutdown-timeout={{ .Values.server.shutdownTimeout }}
        - --log-level={{ .Values.server.logLevel }}
        - --log-format={{ .Values.server.logFormat }}
        - --event-log-size={{ int64 .Values.server.eventLogSize }}
        - --memory-limit-ratio={{ .Values.server.memoryLimitRatio }}
        {{- if .Values.server.pprof }}
        - --pprof=true
        {{- end }}
        {{- if .Values.server.metricsPort }}
        - --metrics-listen=0.0.0.0:{{ .Values.server.metricsPort }}
        {{- end }}
        {{- if eq .Values.store.kind "file" }}
        - --store=file:{{ .Values.store.file.path }}
        {{- end }}
        {{- with .Values.server.limits }}
        - --max-recv-msg-bytes={{ int64 .maxRecvMsgBytes }}
        - --max-concurrent-streams={{ int64 .maxConcurrentStreams }}
        - --keepalive-min-time={{ .keepaliveMinTime }}
        - --max-connection-idle={{ .maxConnectionIdle }}
        - --max-connection-age={{ .maxConnectionAge }}
        - --max-connection-age-grace={{ .maxConnectionAgeGrace }}
        - --unary-timeout={{ .unaryTimeout }}
        - --max-pending-retries-per-tenant={{ int64 .maxPendingRetriesPerTenant }}
        - --max-pending-retries={{ int64 .maxPendingRetries }}
        - --max-open-chains-per-tenant={{ int64 .maxOpenChainsPerTenant }}
        - --max-open-chains={{ int64 .maxOpenChains }}
        - --max-active-sessions-per-tenant={{ int64 .maxActiveSessionsPerTenant }}
        - --max-awaiters-per-retry={{ int64 .maxAwaitersPerRetry }}
        - --max-awaiters={{ int64 .maxAwaiters }}
        {{- end }}
        {{- if .Values.tls.enabled }}
        - --tls-cert={{ include "retryd.tlsDir" . }}/tls.crt
        - --tls-key={{ include "retryd.tlsDir" . }}/tls.key
        {{- if .Values.tls.clientCaSecret }}
        - --tls-client-ca={{ include "retryd.tlsDir" . }}/ca.crt
        {{- end }}
        - --tls-reload-interval={{ .Values.tls.reloadInterval }}
        - --health-listen=0.0.0.0:{{ .Values.tls.healthPort }}
        {{- end }}
        {{- if .Values.auth.enabled }}
        - --auth-credentials={{ include "retryd.authDir" . }}/credentials.yaml
        - --auth-reload-interval={{ .Values.auth.reloadInterval }}
        {{- end }}
      {{- if or .Values.otel.enabled .Values.extraEnv (eq .Values.store.kind "redis") }}
      env:
        {{- if eq .Values.store.kind "redis" }}
        # --store for the Redis store: the URL, password included, comes
        # from the Secret, never from the args or the ConfigMap.
        - name: RETRYD_STORE
          valueFrom:
            secretKeyRef:
              name: {{ .Values.store.redis.existingSecret }}
              key: {{ .Values.store.redis.urlKey | quote }}
        {{- end }}
        {{- if .Values.otel.enabled }}
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        - name: OTEL_SERVICE_NAME
          value: {{ default (include "retryd.fullname" .) .Values.otel.serviceName | quote }}
        - name: OTEL_EXPORTER_OTLP_ENDPOINT
          value: {{ .Values.otel.endpoint | quote }}
        - name: OTEL_EXPORTER_OTLP_PROTOCOL
          value: {{ .Values.otel.protocol | quote }}
        - name: OTEL_TRACES_EXPORTER
          value: {{ ternary "otlp" "none" .Values.otel.traces.enabled }}
        {{- if .Values.otel.metrics.enabled }}
        # Metrics pushed over OTLP beside the /metrics endpoint.
        - name: OTEL_METRICS_EXPORTER
          value: otlp
        - name: OTEL_METRIC_EXPORT_INTERVAL
          value: {{ int64 .Values.otel.metrics.intervalMs | quote }}
        {{- end }}
        - name: OTEL_TRACES_SAMPLER
          value: {{ .Values.otel.sampler | quote }}
        - name: OTEL_TRACES_SAMPLER_ARG
          value: {{ .Values.otel.samplerArg | quote }}
        - name: OTEL_RESOURCE_ATTRIBUTES
          value: {{ include "retryd.otelResourceAttributes" . | quote }}
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      {{- with .Values.extraEnvFrom }}
      envFrom:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        - name: grpc
          containerPort: {{ .Values.server.port }}
          protocol: TCP
        {{- if .Values.server.metricsPort }}
        - name: metrics
          containerPort: {{ .Values.server.metricsPort }}
          protocol: TCP
        {{- end }}
        {{- if .Values.tls.enabled }}
        - name: health
          containerPort: {{ .Values.tls.healthPort }}
          protocol: TCP
        {{- end }}
      {{- with .Values.probes.startup }}
      {{- if .enabled }}
      startupProbe:
        grpc:
          port: {{ include "retryd.healthPort" $ }}
          service: {{ .service | quote }}
        initialDelaySeconds: {{ .initialDelaySeconds }}
        periodSeconds: {{ .periodSeconds }}
        timeoutSeconds: {{ .timeoutSeconds }}
        failureThreshold: {{ .failureThreshold }}
      {{- end }}
      {{- end }}
      {{- with .Values.probes.liveness }}
      {{- if .enabled }}
      livenessProbe:
        grpc:
          port: {{ include "retryd.healthPort" $ }}
          service: {{ .service | quote }}
        initialDelaySeconds: {{ .initialDelaySeconds }}
        periodSeconds: {{ .periodSeconds }}
        timeoutSeconds: {{ .timeoutSeconds }}
        failureThreshold: {{ .failureThreshold }}
      {{- end }}
      {{- end }}
      {{- with .Values.probes.readiness }}
      {{- if .enabled }}
      readinessProbe:
        grpc:
          port: {{ include "retryd.healthPort" $ }}
          service: {{ .service | quote }}
        initialDelaySeconds: {{ .initialDelaySeconds }}
        periodSeconds: {{ .periodSeconds }}
        timeoutSeconds: {{ .timeoutSeconds }}
        failureThreshold: {{ .failureThreshold }}
      {{- end }}
      {{- end }}
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.securityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: config
          mountPath: /etc/retryd
          readOnly: true
        - name: tmp
          mountPath: /tmp
        {{- if eq .Values.store.kind "file" }}
        - name: {{ include "retryd.dataVolumeName" . }}
          mountPath: {{ .Values.store.file.path }}
        {{- end }}
        {{- if .Values.tls.enabled }}
        - name: tls
          mountPath: {{ include "retryd.tlsDir" . }}
          readOnly: true
        {{- end }}
        {{- if .Values.auth.enabled }}
        # The whole volume, never a subPath: a subPath mount is bound to
        # the file the kubelet had projected when the container started,
        # and the kubelet's later updates (it writes a new directory and
        # swaps the ..data symlink) never reach it, so a token added to or
        # removed from the Secret would not take effect until a restart.
        # Mounted as a directory, the path follows the swap and retryd's
        # reload (every auth.reloadInterval) sees the new content.
        - name: auth
          mountPath: {{ include "retryd.authDir" . }}
          readOnly: true
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "retryd.fullname" . }}
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
    {{- if .Values.tls.enabled }}
    # The server certificate and key and, for mTLS, the client CAs; a
    # projected volume (not subPath) so that the kubelet updates the files
    # when a Secret is rotated and retryd reloads them.
    - name: tls
      projected:
        # Readable by the non-root user whatever podSecurityContext.fsGroup
        # is; the container runs nothing but retryd.
        defaultMode: 0444
        sources:
          - secret:
              name: {{ .Values.tls.existingSecret }}
              items:
                - key: tls.crt
                  path: tls.crt
                - key: tls.key
                  path: tls.key
          {{- with .Values.tls.clientCaSecret }}
          - secret:
              name: {{ . }}
              items:
                - key: ca.crt
                  path: ca.crt
          {{- end }}
    {{- end }}
    {{- if .Values.auth.enabled }}
    # The credentials file (tenants and token hashes): only the one key of
    # the Secret, as credentials.yaml; a missing key keeps the pod from
    # starting rather than starting it without authentication.
    - name: auth
      secret:
        secretName: {{ .Values.auth.existingSecret }}
        # Readable by the non-root user whatever podSecurityContext.fsGroup
        # is; the container runs nothing but retryd.
        defaultMode: 0444
        items:
          - key: {{ .Values.auth.key | quote }}
            path: credentials.yaml
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.topologySpreadConstraints }}
  {{- $constraints := list }}
  {{- range . }}
  {{- $constraint := deepCopy . }}
  {{- if not (hasKey $constraint "labelSelector") }}
  {{- $_ := set $constraint "labelSelector" (dict "matchLabels" (include "retryd.selectorLabels" $ | fromYaml)) }}
  {{- end }}
  {{- $constraints = append $constraints $constraint }}
  {{- end }}
  topologySpreadConstraints:
    {{- toYaml $constraints | nindent 4 }}
  {{- end }}
{{- end }}
