{{/* Names, labels, and the values every template shares. */}}

{{- define "gpufed.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name; objects are named <fullname>-<part>, so it stays under 40 characters. */}}
{{- define "gpufed.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpufed.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpufed.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpufed.serverSelector" -}}
app.kubernetes.io/name: {{ include "gpufed.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{/* The pods of one component (server, or with `scheduler.separate` the scheduler's): a dict of
     `root` and `component`. The two Deployments' selectors must not overlap. */}}
{{- define "gpufed.componentSelector" -}}
app.kubernetes.io/name: {{ include "gpufed.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpufed.etcdSelector" -}}
app.kubernetes.io/name: {{ include "gpufed.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: etcd
{{- end -}}

{{- define "gpufed.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpufed.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An image reference: repository@digest when a digest is given, else repository:tag. */}}
{{- define "gpufed.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .appVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "gpufed.etcdHeadless" -}}
{{- printf "%s-etcd" (include "gpufed.fullname" .) -}}
{{- end -}}

{{/* `gpufed serve --etcd`: every member's client URL, comma-separated. */}}
{{- define "gpufed.etcdEndpoints" -}}
{{- if eq .Values.etcd.mode "external" -}}
{{- join "," .Values.etcd.external.endpoints -}}
{{- else -}}
{{- $headless := include "gpufed.etcdHeadless" . -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.etcd.statefulset.replicas) -}}
{{- $urls = append $urls (printf "http://%s-%d.%s.%s.svc:2379" $headless $i $headless $.Release.Namespace) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}
{{- end -}}

{{/* Kubeconfigs and cloud files are mounted here; the config's paths must point inside. */}}
{{- define "gpufed.kubeconfigDir" -}}/etc/gpufed/kubeconfigs{{- end -}}
{{- define "gpufed.cloudDir" -}}/etc/gpufed/cloud{{- end -}}

{{/* The federation config as `gpufed serve --bootstrap` reads it: the values' `config`, with
     `history.dsnEnv` set by the chart when the history is PostgreSQL, and `policy.maxQueuedJobs`
     from `server.maxQueuedJobs` when the config does not set it (sized with the memory limit). */}}
{{- define "gpufed.federationConfig" -}}
{{- $config := deepCopy .Values.config -}}
{{- $policy := deepCopy (default (dict) (get $config "policy")) -}}
{{- if and (not (hasKey $policy "maxQueuedJobs")) (not (kindIs "invalid" .Values.server.maxQueuedJobs)) -}}
{{- $_ := set $policy "maxQueuedJobs" (int64 .Values.server.maxQueuedJobs) -}}
{{- $_ := set $config "policy" $policy -}}
{{- end -}}
{{- $history := deepCopy (default (dict) (get $config "history")) -}}
{{- if eq .Values.history.backend "postgresql" -}}
{{- $_ := set $history "dsnEnv" .Values.history.postgresql.dsnEnv -}}
{{- end -}}
{{- if $history -}}
{{- $_ := set $config "history" $history -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}
