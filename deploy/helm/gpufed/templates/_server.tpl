{{/* One Deployment of `gpufed serve`: all the servers (`scheduler.separate: false`), or the API
     servers or the leader candidates of a split (deployment.yaml). Called with a dict: `root` (the
     chart's context), `name`, `component` (the pods' label: server, or scheduler), `role` (the
     `--role` flag; empty: none, gpufed's default `all`), `replicas` and `resources`. */}}
{{- define "gpufed.serverDeployment" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $sqlite := eq $v.history.backend "sqlite" -}}
{{- $tls := $v.tls.secretName -}}
{{- $name := .name -}}
{{- $component := .component -}}
{{- if eq .role "api" -}}
# The API servers: `gpufed serve --role api` on the release's etcd, behind the Services. They never
# stand for leader and are ready without one (docs/deploy.md, "Splitting the API from the scheduler").
{{ else if eq .role "scheduler" -}}
# The leader candidates: `gpufed serve --role scheduler`. One leads (an etcd lease) and runs the
# scheduling cycle and the reconcilers, the others take over when it dies; no Service sends clients.
{{ else -}}
# The servers: `gpufed serve` on the release's etcd. One leads (an etcd lease), the others serve the
# API and take over when it dies (docs/architecture.md, "Crashes and none runs twice").
{{ end -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpufed.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $component }}
  # checkov's waivers (`make chart-policy`; docs/deploy.md, "Policy check"), each with its reason.
  annotations:
    checkov.io/skip1: CKV_K8S_43=The chart cannot know the digest of an image the platform team builds; image.digest pins it
    checkov.io/skip2: CKV_K8S_15=IfNotPresent is right for an image pinned by digest or immutable tag; image.pullPolicy sets Always
    checkov.io/skip3: CKV_K8S_35=gpufed reads the history DSN and object store keys from variables by design (history.dsnEnv, accessKeyIdEnv), fed by secretKeyRef, never literal
spec:
  replicas: {{ .replicas }}
  revisionHistoryLimit: 5
  {{- if $sqlite }}
  # One server owns the SQLite file on a ReadWriteOnce volume: the old pod goes before the new starts.
  strategy:
    type: Recreate
  {{- else }}
  # A new server is ready (it sees the leader, or leads and has run a first pass; an API server once
  # its caches are listed) before an old one goes.
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 1
      maxUnavailable: 0
  {{- end }}
  selector:
    matchLabels:
      {{- include "gpufed.componentSelector" (dict "root" $root "component" $component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "gpufed.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ $component }}
        {{- with $v.server.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        # A changed config restarts the servers, which bootstrap it into etcd.
        checksum/config: {{ include "gpufed.federationConfig" $root | sha256sum }}
        {{- with $v.server.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "gpufed.serviceAccountName" $root }}
      automountServiceAccountToken: {{ $v.serviceAccount.automountToken }}
      enableServiceLinks: false
      terminationGracePeriodSeconds: {{ $v.server.terminationGracePeriodSeconds }}
      {{- with $v.server.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        runAsUser: {{ $v.server.runAsUser }}
        runAsGroup: {{ $v.server.runAsGroup }}
        # Mounted Secrets (mode 0440) and the state volume are readable by this group.
        fsGroup: {{ $v.server.runAsGroup }}
        fsGroupChangePolicy: OnRootMismatch
        seccompProfile:
          type: RuntimeDefault
      containers:
        - name: gpufed
          image: {{ include "gpufed.imageRef" (dict "image" $v.image "appVersion" $root.Chart.AppVersion) }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          command: [gpufed]
          args:
            - --state-dir={{ $v.server.stateDir }}
            - serve
            - --etcd={{ include "gpufed.etcdEndpoints" $root }}
            - --host=0.0.0.0
            - --port={{ $v.server.grpcPort }}
            - --metrics-port={{ $v.server.httpPort }}
            - --bootstrap=/etc/gpufed/config/federation.yaml
            # The pod's name in the leader key: `gpufed` and the logs say which pod leads.
            - --identity=$(POD_NAME)
            {{- with .role }}
            # docs/deploy.md, "Splitting the API from the scheduler".
            - --role={{ . }}
            {{- end }}
            {{- /* null: gpufed's own default; 0 is a value (no limit), so test for null, not falsy. */}}
            {{- range $flag, $key := dict "read-rate-per-s" "readRatePerS" "lease-ttl-s" "leaseTtlS" "lease-stall-limit-s" "leaseStallLimitS" "etcd-timeout-s" "etcdTimeoutS" }}
            {{- $value := get $v.server $key }}
            {{- if not (kindIs "invalid" $value) }}
            - --{{ $flag }}={{ $value }}
            {{- end }}
            {{- end }}
            {{- if and $v.server.apiWorkers (ne .role "scheduler") }}
            # docs/deploy.md, "Several API processes in one server": a core for each.
            - --api-workers={{ $v.server.apiWorkers }}
            {{- end }}
            {{- if $v.server.compressWaitReasons }}
            # docs/deploy.md: once no server of an earlier release is left.
            - --compress-wait-reasons
            {{- end }}
            {{- if $tls }}
            - --tls-cert=/etc/gpufed/tls/tls.crt
            - --tls-key=/etc/gpufed/tls/tls.key
            {{- with $v.tls.clientCaKey }}
            - --tls-client-ca=/etc/gpufed/tls/{{ . }}
            {{- end }}
            {{- end }}
            {{- if and (eq $v.etcd.mode "external") $v.etcd.external.tlsSecret }}
            - --etcd-cacert=/etc/gpufed/etcd-tls/ca.crt
            - --etcd-cert=/etc/gpufed/etcd-tls/tls.crt
            - --etcd-key=/etc/gpufed/etcd-tls/tls.key
            {{- end }}
          env:
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            {{- if $v.secrets.keySecret.name }}
            - name: GPUFED_SECRETS_KEY_FILE
              value: /etc/gpufed/secrets-key/{{ $v.secrets.keySecret.key }}
            {{- end }}
            {{- if not $sqlite }}
            - name: {{ $v.history.postgresql.dsnEnv }}
              valueFrom:
                secretKeyRef:
                  name: {{ $v.history.postgresql.dsnSecret.name }}
                  key: {{ $v.history.postgresql.dsnSecret.key }}
            {{- end }}
          {{- with $v.cloudCredentials.envSecrets }}
          envFrom:
            {{- range . }}
            - secretRef:
                name: {{ . }}
            {{- end }}
          {{- end }}
          ports:
            - name: grpc
              containerPort: {{ $v.server.grpcPort }}
              protocol: TCP
            - name: http
              containerPort: {{ $v.server.httpPort }}
              protocol: TCP
          # gRPC health says SERVING once the port is bound (federation/runtime/server.py): the
          # process is alive. The kubelet's gRPC probe has no TLS, so with TLS it checks the port.
          startupProbe:
            {{- if $tls }}
            tcpSocket:
              port: grpc
            {{- else }}
            grpc:
              port: {{ $v.server.grpcPort }}
            {{- end }}
            periodSeconds: 2
            failureThreshold: 60
          livenessProbe:
            {{- if $tls }}
            tcpSocket:
              port: grpc
            {{- else }}
            grpc:
              port: {{ $v.server.grpcPort }}
            {{- end }}
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 3
          # /readyz (federation/runtime/readiness.py): caches listed and following etcd, and the
          # server leads with its first pass done, or sees another leader.
          readinessProbe:
            httpGet:
              path: /readyz
              port: http
              scheme: {{ if $tls }}HTTPS{{ else }}HTTP{{ end }}
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 2
          resources:
            {{- toYaml .resources | nindent 12 }}
          securityContext:
            runAsNonRoot: true
            runAsUser: {{ $v.server.runAsUser }}
            runAsGroup: {{ $v.server.runAsGroup }}
            allowPrivilegeEscalation: false
            privileged: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: [ALL]
            seccompProfile:
              type: RuntimeDefault
          volumeMounts:
            - name: config
              mountPath: /etc/gpufed/config
              readOnly: true
            - name: state
              mountPath: {{ $v.server.stateDir }}
            - name: tmp
              mountPath: /tmp
            {{- if $tls }}
            - name: tls
              mountPath: /etc/gpufed/tls
              readOnly: true
            {{- end }}
            {{- if and (eq $v.etcd.mode "external") $v.etcd.external.tlsSecret }}
            - name: etcd-tls
              mountPath: /etc/gpufed/etcd-tls
              readOnly: true
            {{- end }}
            {{- if $v.secrets.keySecret.name }}
            - name: secrets-key
              mountPath: /etc/gpufed/secrets-key
              readOnly: true
            {{- end }}
            {{- if $v.members.kubeconfigSecret }}
            - name: kubeconfigs
              mountPath: {{ include "gpufed.kubeconfigDir" $root }}
              readOnly: true
            {{- end }}
            {{- if $v.cloudCredentials.fileSecret }}
            - name: cloud
              mountPath: {{ include "gpufed.cloudDir" $root }}
              readOnly: true
            {{- end }}
      volumes:
        - name: config
          configMap:
            name: {{ include "gpufed.fullname" $root }}-config
        - name: state
          {{- if $sqlite }}
          persistentVolumeClaim:
            claimName: {{ include "gpufed.fullname" $root }}-state
          {{- else }}
          emptyDir:
            sizeLimit: 1Gi
          {{- end }}
        # The finance report's plots and Ray's temporary files (docs/deploy.md, "Image").
        - name: tmp
          emptyDir:
            sizeLimit: 1Gi
        {{- if $tls }}
        - name: tls
          secret:
            secretName: {{ $tls }}
            defaultMode: 0440
        {{- end }}
        {{- if and (eq $v.etcd.mode "external") $v.etcd.external.tlsSecret }}
        - name: etcd-tls
          secret:
            secretName: {{ $v.etcd.external.tlsSecret }}
            defaultMode: 0440
        {{- end }}
        {{- with $v.secrets.keySecret.name }}
        # Owned by root, group server.runAsGroup, 0440: the key file check allows a root-owned file
        # its group may read (as PostgreSQL does), and nothing more.
        - name: secrets-key
          secret:
            secretName: {{ . }}
            defaultMode: 0440
        {{- end }}
        {{- with $v.members.kubeconfigSecret }}
        - name: kubeconfigs
          secret:
            secretName: {{ . }}
            defaultMode: 0440
        {{- end }}
        {{- with $v.cloudCredentials.fileSecret }}
        - name: cloud
          secret:
            secretName: {{ . }}
            defaultMode: 0440
        {{- end }}
      {{- with $v.server.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.server.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        {{- if $v.server.affinity }}
        {{- toYaml $v.server.affinity | nindent 8 }}
        {{- else }}
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- include "gpufed.componentSelector" (dict "root" $root "component" $component) | nindent 20 }}
        {{- end }}
{{- end -}}
