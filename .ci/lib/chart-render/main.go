// chart-render: renders, lints and schema-checks a Helm chart with the libraries Helm v3 itself
// renders with, for machines that cannot build `helm` (see .ci/helm-chart.sh for why).
//
// Helm v3's engine is Go's text/template with sprig v3's TxtFuncMap (less env and expandenv),
// values read and toYaml written by sigs.k8s.io/yaml, and values.schema.json checked by
// xeipuuv/gojsonschema. This program uses those libraries as Debian bookworm packages them
// (sprig 3.2.3, where recent helm 3 releases pin 3.3.0, which only adds functions; gojsonschema
// 1.2.0 and sigs.k8s.io/yaml 1.3.0, the versions helm 3 pins or pinned)
// and re-implements the few functions Helm adds (include, tpl, required, toYaml, fromYaml,
// toJson, fromJson, lookup) and its value coalescing, after helm's pkg/engine and pkg/chartutil.
// It is not helm: no releases, no repositories, no --set. Only what the chart's CI needs.
//
// Usage:
//
//	chart-render template CHART [--release NAME] [--namespace NS] [--kube-version V] [--strict] [-f VALUES]...
//	chart-render lint CHART [--strict] [--kube-version V] [-f VALUES]...
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/template"

	sprig "github.com/Masterminds/sprig/v3"
	"github.com/Masterminds/semver/v3"
	"github.com/xeipuuv/gojsonschema"
	"sigs.k8s.io/yaml"
)

type options struct {
	chartDir    string
	release     string
	namespace   string
	kubeVersion string
	strict      bool
	valueFiles  []string
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: chart-render (template|lint) CHART [--release NAME] [--namespace NS] [--kube-version V] [--strict] [-f VALUES]...")
		os.Exit(2)
	}
	cmd := os.Args[1]
	o := options{chartDir: os.Args[2], release: "release-name", namespace: "default", kubeVersion: "v1.20.0"}
	args := os.Args[3:]
	for i := 0; i < len(args); i++ {
		next := func() string {
			if i+1 >= len(args) {
				fmt.Fprintf(os.Stderr, "Error: %s needs a value\n", args[i])
				os.Exit(2)
			}
			i++
			return args[i]
		}
		switch args[i] {
		case "--release":
			o.release = next()
		case "--namespace", "-n":
			o.namespace = next()
		case "--kube-version":
			o.kubeVersion = next()
		case "--strict":
			o.strict = true
		case "-f", "--values":
			o.valueFiles = append(o.valueFiles, next())
		default:
			fmt.Fprintf(os.Stderr, "Error: unknown flag %s\n", args[i])
			os.Exit(2)
		}
	}
	var err error
	switch cmd {
	case "template":
		var out string
		out, err = templateCmd(o)
		if err == nil {
			fmt.Print(out)
		}
	case "lint":
		err = lintCmd(o)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
}

// ---- chart loading ----------------------------------------------------------------------------

type chart struct {
	meta      map[string]interface{} // Chart.yaml as read
	defaults  map[string]interface{} // values.yaml
	schema    []byte                 // values.schema.json, if any
	templates map[string]string      // "templates/x.yaml" -> text
	files     map[string][]byte      // every other file, for .Files
}

func loadChart(dir string) (*chart, error) {
	c := &chart{templates: map[string]string{}, files: map[string][]byte{}}
	raw, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, fmt.Errorf("Chart.yaml file is missing: %v", err)
	}
	if err := yaml.Unmarshal(raw, &c.meta); err != nil {
		return nil, fmt.Errorf("cannot load Chart.yaml: %v", err)
	}
	if raw, err = os.ReadFile(filepath.Join(dir, "values.yaml")); err == nil {
		if err := yaml.Unmarshal(raw, &c.defaults); err != nil {
			return nil, fmt.Errorf("cannot load values.yaml: %v", err)
		}
	}
	if c.defaults == nil {
		c.defaults = map[string]interface{}{}
	}
	if raw, err = os.ReadFile(filepath.Join(dir, "values.schema.json")); err == nil {
		c.schema = raw
	}
	err = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.HasPrefix(rel, "templates/") {
			c.templates[rel] = string(data)
		} else {
			c.files[rel] = data
		}
		return nil
	})
	return c, err
}

func (c *chart) name() string { s, _ := c.meta["name"].(string); return s }

// ---- values: helm's chartutil.CoalesceValues and mergeMaps ------------------------------------

func readValues(files []string) (map[string]interface{}, error) {
	out := map[string]interface{}{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		m := map[string]interface{}{}
		if err := yaml.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("failed to parse %s: %v", f, err)
		}
		out = mergeMaps(out, m)
	}
	return out, nil
}

func mergeMaps(a, b map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if vm, ok := v.(map[string]interface{}); ok {
			if om, ok := out[k].(map[string]interface{}); ok {
				out[k] = mergeMaps(om, vm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// coalesce: user values win; a user null deletes the chart's default; maps merge recursively.
func coalesce(user, defaults map[string]interface{}) map[string]interface{} {
	for k, dv := range defaults {
		uv, ok := user[k]
		if !ok {
			user[k] = copyValue(dv)
		} else if uv == nil {
			delete(user, k)
		} else if um, ok := uv.(map[string]interface{}); ok {
			if dm, ok := dv.(map[string]interface{}); ok {
				coalesce(um, dm)
			}
		}
	}
	return user
}

func copyValue(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		m := make(map[string]interface{}, len(t))
		for k, x := range t {
			m[k] = copyValue(x)
		}
		return m
	case []interface{}:
		l := make([]interface{}, len(t))
		for i, x := range t {
			l[i] = copyValue(x)
		}
		return l
	}
	return v
}

// helm's chartutil.ValidateAgainstSingleSchema.
func validateSchema(c *chart, values map[string]interface{}) error {
	if c.schema == nil {
		return nil
	}
	data, err := yaml.Marshal(values)
	if err != nil {
		return err
	}
	valuesJSON, err := yaml.YAMLToJSON(data)
	if err != nil {
		return err
	}
	if bytes.Equal(valuesJSON, []byte("null")) {
		valuesJSON = []byte("{}")
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(c.schema), gojsonschema.NewBytesLoader(valuesJSON))
	if err != nil {
		return fmt.Errorf("values.schema.json: %v", err)
	}
	if !result.Valid() {
		var sb strings.Builder
		for _, d := range result.Errors() {
			sb.WriteString(fmt.Sprintf("- %s\n", d))
		}
		return fmt.Errorf("values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n%s", c.name(), sb.String())
	}
	return nil
}

// ---- the engine: helm's pkg/engine ------------------------------------------------------------

type apiVersions []string

func (a apiVersions) Has(v string) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

type kubeVersion struct{ Version, Major, Minor string }

func (k kubeVersion) String() string { return k.Version }

// GitVersion is the deprecated alias helm keeps.
func (k kubeVersion) GitVersion() string { return k.Version }

type capabilities struct {
	KubeVersion kubeVersion
	APIVersions apiVersions
	HelmVersion map[string]string
}

type files map[string][]byte

func (f files) Get(name string) string      { return string(f[name]) }
func (f files) GetBytes(name string) []byte { return f[name] }

func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

const recursionMaxNums = 1000

func render(c *chart, o options, values map[string]interface{}) (map[string]string, error) {
	kv, err := semver.NewVersion(o.kubeVersion)
	if err != nil {
		return nil, fmt.Errorf("invalid kube version %q: %v", o.kubeVersion, err)
	}
	caps := capabilities{
		KubeVersion: kubeVersion{Version: "v" + kv.String(), Major: fmt.Sprint(kv.Major()), Minor: fmt.Sprint(kv.Minor())},
		APIVersions: apiVersions{"v1", "apps/v1", "policy/v1", "policy/v1beta1", "networking.k8s.io/v1", "rbac.authorization.k8s.io/v1", "coordination.k8s.io/v1"},
		HelmVersion: map[string]string{"Version": "chart-render"},
	}
	chartMeta := map[string]interface{}{}
	for k, v := range c.meta {
		// helm exposes chart.Metadata's Go fields: name -> Name, appVersion -> AppVersion.
		chartMeta[strings.ToUpper(k[:1])+k[1:]] = v
	}
	if v, ok := c.meta["apiVersion"]; ok {
		chartMeta["APIVersion"] = v
	}
	top := map[string]interface{}{
		"Values":       values,
		"Release":      map[string]interface{}{"Name": o.release, "Namespace": o.namespace, "Service": "Helm", "IsInstall": true, "IsUpgrade": false, "Revision": 1},
		"Chart":        chartMeta,
		"Capabilities": caps,
		"Files":        files(c.files),
	}

	t := template.New("gotpl")
	if o.strict {
		t.Option("missingkey=error")
	} else {
		t.Option("missingkey=zero")
	}
	includedNames := map[string]int{}
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = fromYAML
	funcs["toJson"] = toJSON
	funcs["fromJson"] = fromJSON
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf strings.Builder
		if v, ok := includedNames[name]; ok {
			if v > recursionMaxNums {
				return "", fmt.Errorf("rendering template has a nested reference name: %s", name)
			}
			includedNames[name]++
		} else {
			includedNames[name] = 1
		}
		err := t.ExecuteTemplate(&buf, name, data)
		includedNames[name]--
		return buf.String(), err
	}
	funcs["tpl"] = func(tpl string, vals map[string]interface{}) (string, error) {
		clone, err := t.Clone()
		if err != nil {
			return "", err
		}
		nt, err := clone.New("tpl").Parse(tpl)
		if err != nil {
			return "", fmt.Errorf("cannot parse template %q: %v", tpl, err)
		}
		var buf strings.Builder
		if err := nt.Execute(&buf, vals); err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %v", tpl, err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	funcs["required"] = func(warn string, val interface{}) (interface{}, error) {
		if val == nil {
			return val, errors.New(warn)
		} else if s, ok := val.(string); ok && s == "" {
			return val, errors.New(warn)
		}
		return val, nil
	}
	funcs["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	t.Funcs(funcs)

	names := make([]string, 0, len(c.templates))
	for n := range c.templates {
		names = append(names, n)
	}
	sort.Strings(names)
	base := c.name() + "/templates"
	for _, n := range names {
		full := c.name() + "/" + n
		if _, err := t.New(full).Parse(c.templates[n]); err != nil {
			return nil, fmt.Errorf("parse error in %q: %v", full, err)
		}
	}
	out := map[string]string{}
	for _, n := range names {
		full := c.name() + "/" + n
		if strings.HasPrefix(path.Base(n), "_") || strings.HasSuffix(n, "NOTES.txt") {
			// Partials are not output; NOTES.txt is rendered only by install.
			if strings.HasSuffix(n, "NOTES.txt") {
				if err := t.ExecuteTemplate(&bytes.Buffer{}, full, withTemplate(top, full, base)); err != nil {
					return nil, fmt.Errorf("template: %v", err)
				}
			}
			continue
		}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, full, withTemplate(top, full, base)); err != nil {
			return nil, err
		}
		out[full] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return out, nil
}

func withTemplate(top map[string]interface{}, name, base string) map[string]interface{} {
	m := make(map[string]interface{}, len(top)+1)
	for k, v := range top {
		m[k] = v
	}
	m["Template"] = map[string]interface{}{"Name": name, "BasePath": base}
	return m
}

func finalValues(c *chart, o options) (map[string]interface{}, error) {
	user, err := readValues(o.valueFiles)
	if err != nil {
		return nil, err
	}
	values := coalesce(user, c.defaults)
	if err := validateSchema(c, values); err != nil {
		return nil, err
	}
	return values, nil
}

var sepRe = regexp.MustCompile(`(?m)^---\s*$`)

func templateCmd(o options) (string, error) {
	c, err := loadChart(o.chartDir)
	if err != nil {
		return "", err
	}
	values, err := finalValues(c, o)
	if err != nil {
		return "", err
	}
	rendered, err := render(c, o, values)
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(rendered))
	for n := range rendered {
		names = append(names, n)
	}
	sort.Strings(names)
	var sb strings.Builder
	for _, n := range names {
		for _, doc := range sepRe.Split(rendered[n], -1) {
			if strings.TrimSpace(doc) == "" || isOnlyComments(doc) {
				continue
			}
			fmt.Fprintf(&sb, "---\n# Source: %s\n%s\n", n, strings.TrimSpace(doc))
		}
	}
	return sb.String(), nil
}

func isOnlyComments(doc string) bool {
	for _, l := range strings.Split(doc, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// ---- lint: helm's pkg/lint rules (chartfile, values, templates), --strict fails on warnings ----

var (
	dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	chartNameRe      = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

func lintCmd(o options) error {
	var errs, warns, infos []string
	report := func() error {
		fmt.Printf("==> Linting %s\n", o.chartDir)
		for _, s := range infos {
			fmt.Printf("[INFO] %s\n", s)
		}
		for _, s := range warns {
			fmt.Printf("[WARNING] %s\n", s)
		}
		for _, s := range errs {
			fmt.Printf("[ERROR] %s\n", s)
		}
		failed := len(errs) > 0 || (o.strict && len(warns) > 0)
		n := 0
		if failed {
			n = 1
		}
		fmt.Printf("\n1 chart(s) linted, %d chart(s) failed\n", n)
		if failed {
			return errors.New("1 chart(s) linted, 1 chart(s) failed")
		}
		return nil
	}
	c, err := loadChart(o.chartDir)
	if err != nil {
		errs = append(errs, err.Error())
		return report()
	}
	// Chart.yaml
	str := func(k string) string { s, _ := c.meta[k].(string); return s }
	if str("apiVersion") != "v2" {
		errs = append(errs, "Chart.yaml: apiVersion must be v2 (Helm 3)")
	}
	if str("name") == "" {
		errs = append(errs, "Chart.yaml: name is required")
	} else if !chartNameRe.MatchString(str("name")) {
		errs = append(errs, fmt.Sprintf("Chart.yaml: chart name %q is not lowercase DNS-1123", str("name")))
	} else if filepath.Base(filepath.Clean(o.chartDir)) != str("name") {
		errs = append(errs, fmt.Sprintf("Chart.yaml: directory name (%s) and chart name (%s) must match", filepath.Base(o.chartDir), str("name")))
	}
	if _, err := semver.StrictNewVersion(str("version")); err != nil {
		errs = append(errs, fmt.Sprintf("Chart.yaml: version %q is not a valid SemVerV2", str("version")))
	}
	if str("appVersion") == "" {
		warns = append(warns, "Chart.yaml: appVersion is recommended")
	}
	if t := str("type"); t != "" && t != "application" && t != "library" {
		errs = append(errs, fmt.Sprintf("Chart.yaml: type %q is not application or library", t))
	}
	if str("icon") == "" {
		infos = append(infos, "Chart.yaml: icon is recommended")
	}
	if _, ok := c.files["values.yaml"]; !ok {
		infos = append(infos, "values.yaml: file does not exist")
	}
	if c.schema != nil {
		var s interface{}
		if err := json.Unmarshal(c.schema, &s); err != nil {
			errs = append(errs, fmt.Sprintf("values.schema.json: not JSON: %v", err))
		}
	}
	values, err := finalValues(c, o)
	if err != nil {
		errs = append(errs, "values.yaml: "+err.Error())
		return report()
	}
	// helm lint --strict renders with missingkey=error, as o.strict does here.
	rendered, err := render(c, o, values)
	if err != nil {
		errs = append(errs, "templates/: "+err.Error())
		return report()
	}
	seen := map[string]string{}
	for name, text := range rendered {
		for _, doc := range sepRe.Split(text, -1) {
			if strings.TrimSpace(doc) == "" || isOnlyComments(doc) {
				continue
			}
			var obj map[string]interface{}
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				errs = append(errs, fmt.Sprintf("%s: unable to parse YAML: %v", name, err))
				continue
			}
			api, _ := obj["apiVersion"].(string)
			kind, _ := obj["kind"].(string)
			if api == "" || kind == "" {
				errs = append(errs, fmt.Sprintf("%s: object has no apiVersion or kind", name))
				continue
			}
			md, _ := obj["metadata"].(map[string]interface{})
			n, _ := md["name"].(string)
			if n == "" || len(n) > 253 || !dns1123Subdomain.MatchString(n) {
				errs = append(errs, fmt.Sprintf("%s: %s: object name %q is invalid", name, kind, n))
			}
			key := kind + "/" + n
			if other, dup := seen[key]; dup {
				errs = append(errs, fmt.Sprintf("%s: %s rendered twice (also in %s)", name, key, other))
			}
			seen[key] = name
		}
	}
	if len(rendered) == 0 {
		warns = append(warns, "templates/: no templates rendered")
	}
	return report()
}
