{{/* The chart's name. */}}
{{- define "vmss-capacity-controller.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: the release name when it contains the chart's name (so a release named
vmss-capacity-controller names its objects exactly as deploy/ does), else <release>-<name>. */}}
{{- define "vmss-capacity-controller.fullname" -}}
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

{{/* The pods' selector: the same two labels as deploy/base. */}}
{{- define "vmss-capacity-controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vmss-capacity-controller.name" . }}
app.kubernetes.io/component: controller
{{- end }}

{{/* Every object's labels: the selector's, deploy/base's part-of, and Helm's own. */}}
{{- define "vmss-capacity-controller.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "vmss-capacity-controller.selectorLabels" . }}
app.kubernetes.io/part-of: vmss-capacity-controller
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "vmss-capacity-controller.serviceAccountName" -}}
{{- if .Values.rbac.serviceAccount.create }}
{{- default (include "vmss-capacity-controller.fullname" .) .Values.rbac.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.rbac.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "vmss-capacity-controller.secretName" -}}
{{- default (printf "%s-azure" (include "vmss-capacity-controller.fullname" .)) .Values.secretKeyRefNameOverride }}
{{- end }}

{{/* Where the service principal's secret is mounted, and the file the config points at. */}}
{{- define "vmss-capacity-controller.secretDir" -}}/var/run/secrets/azure{{- end }}

{{/* The controller's config.yaml: .Values.config with the CA-named values set in. */}}
{{- define "vmss-capacity-controller.config" -}}
{{- $mode := .Values.azureIdentityMode }}
{{- $cfg := deepCopy .Values.config }}
{{- $azure := deepCopy (.Values.config.azure | default dict) }}
{{- $_ := set $azure "tenantId" (required "azureTenantID is required" .Values.azureTenantID) }}
{{- $_ := set $azure "subscriptionId" (required "azureSubscriptionID is required" .Values.azureSubscriptionID) }}
{{- $_ := set $azure "resourceGroup" (required "azureResourceGroup is required" .Values.azureResourceGroup) }}
{{- if eq $mode "workloadIdentity" }}
{{- $_ := set $azure "auth" (dict "method" "workloadIdentity") }}
{{- else if eq $mode "managedIdentity" }}
{{- $_ := set $azure "auth" (dict "method" "managedIdentity") }}
{{- else if eq $mode "servicePrincipal" }}
{{- $_ := set $azure "auth" (dict "method" "clientSecret" "clientId" (required "azureClientID is required with azureIdentityMode servicePrincipal" .Values.azureClientID) "clientSecretFile" (printf "%s/client-secret" (include "vmss-capacity-controller.secretDir" .))) }}
{{- else }}
{{- fail (printf "azureIdentityMode %q: use workloadIdentity, managedIdentity or servicePrincipal" $mode) }}
{{- end }}
{{- $_ := set $cfg "azure" $azure }}
{{- $_ := set $cfg "enableVMSSEtag" .Values.azureEnableVMSSEtag }}
{{- $_ := set $cfg "metricsListen" (printf "0.0.0.0:%d" (int .Values.metricsPort)) }}
{{- if .Values.autoscalingGroups }}
{{- $_ := set $cfg "nodeGroups" .Values.autoscalingGroups }}
{{- end }}
{{- with .Values.autoDiscovery }}
{{- if .clusterName }}
{{- $ad := dict "clusterName" .clusterName "defaultMin" .defaultMin "defaultMax" .defaultMax }}
{{- if .aksCluster }}{{ $_ := set $ad "aksCluster" .aksCluster }}{{ end }}
{{- if .aksResourceGroup }}{{ $_ := set $ad "aksResourceGroup" .aksResourceGroup }}{{ end }}
{{- $_ := set $cfg "autoDiscovery" $ad }}
{{- end }}
{{- end }}
{{- if not (or .Values.autoscalingGroups .Values.autoDiscovery.clusterName) }}
{{- fail "set autoscalingGroups (the node groups) or autoDiscovery.clusterName" }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}
