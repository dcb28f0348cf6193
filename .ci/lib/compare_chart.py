"""Compare a chart's rendering with a kustomize overlay's, object by object (.ci/helm-chart.sh).

Usage: compare_chart.py KUSTOMIZE.yaml CHART.yaml

Objects are matched by (kind, namespace, name) and must be the same set. Then every field must
be equal, except for these normalisations, each of which is printed when it applied:
  * kustomize's configMapGenerator appends a hash of the content to the ConfigMap's name (and to
    the Deployment's reference to it) so that a change rolls the pods; the chart keeps a fixed name
    and rolls the pods with the pod annotation checksum/config instead. The hash suffix is
    removed, and checksum/config is ignored.
  * Helm's own labels, helm.sh/chart, app.kubernetes.io/managed-by (Helm / kustomize),
    app.kubernetes.io/instance and app.kubernetes.io/version, say who rendered the object and
    from which release and chart version: ignored on both sides.
  * The chart labels every object with app.kubernetes.io/name, component and part-of; kustomize's
    generated ConfigMap and Secret lack some of them (generators do not get the base's labels).
    Those three labels are ignored where the chart adds them and kustomize has none. Selectors and
    pod-template labels are compared exactly.
  * data["config.yaml"] of the ConfigMap is compared as parsed YAML (the overlay's file has
    comments and its own key order; the chart's is toYaml of the values).
Anything else that differs is printed as a diff and fails.
"""
import difflib
import re
import sys

import yaml

IGNORED_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
                  "app.kubernetes.io/version"}
ADDED_LABELS_ALLOWED = {"app.kubernetes.io/name", "app.kubernetes.io/component", "app.kubernetes.io/part-of"}
IGNORED_POD_ANNOTATIONS = {"checksum/config"}
# kustomize's name hash: 10 characters of its alphabet (no vowels, no 0/1/3/l...).
HASH_SUFFIX = re.compile(r"^(.*)-[bcdfghkmt-z2-9]{10}$")

notes = set()


def load(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]


def rename(obj, renames):
    if isinstance(obj, dict):
        return {k: rename(v, renames) for k, v in obj.items()}
    if isinstance(obj, list):
        return [rename(v, renames) for v in obj]
    if isinstance(obj, str) and obj in renames:
        return renames[obj]
    return obj


def key(d):
    md = d.get("metadata", {})
    return (d.get("kind"), md.get("namespace", ""), md.get("name"))


def strip_labels(labels):
    return {k: v for k, v in (labels or {}).items() if k not in IGNORED_LABELS}


def normalise(docs, side):
    renames = {}
    if side == "kustomize":
        for d in docs:
            m = HASH_SUFFIX.match(d["metadata"]["name"])
            if d["kind"] in ("ConfigMap", "Secret") and m:
                renames[d["metadata"]["name"]] = m.group(1)
                notes.add(f"kustomize's name hash removed: {d['kind']}/{d['metadata']['name']} -> {m.group(1)}")
        docs = [rename(d, renames) for d in docs]
    out = {}
    for d in docs:
        md = d["metadata"]
        if "labels" in md:
            md["labels"] = strip_labels(md["labels"])
            if not md["labels"]:
                del md["labels"]
        if d["kind"] == "Deployment":
            ann = d["spec"]["template"]["metadata"].get("annotations", {})
            for a in IGNORED_POD_ANNOTATIONS & set(ann):
                del ann[a]
                notes.add(f"pod annotation {a} ignored (the chart's rollout trigger)")
        if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {}):
            d["data"]["config.yaml"] = yaml.safe_load(d["data"]["config.yaml"])
        k = key(d)
        if k in out:
            print(f"FAIL {side}: {k} rendered twice")
            sys.exit(1)
        out[k] = d
    return out


def main():
    kz = normalise(load(sys.argv[1]), "kustomize")
    ch = normalise(load(sys.argv[2]), "chart")
    failed = False
    for k in sorted(set(kz) | set(ch), key=str):
        if k not in ch:
            print(f"FAIL {k[0]}/{k[2]}: in the overlay, not rendered by the chart")
            failed = True
            continue
        if k not in kz:
            print(f"FAIL {k[0]}/{k[2]}: rendered by the chart, not in the overlay")
            failed = True
            continue
        a, b = kz[k], ch[k]
        la, lb = a["metadata"].get("labels", {}), b["metadata"].get("labels", {})
        added = {x for x in set(lb) - set(la) if x in ADDED_LABELS_ALLOWED}
        if added:
            for x in added:
                del lb[x]
            if not lb:
                b["metadata"].pop("labels", None)
            notes.add(f"{k[0]}: the chart's labels {', '.join(sorted(added))} ignored (kustomize's generator sets none)")
        if a != b:
            failed = True
            da = yaml.safe_dump(a, sort_keys=True).splitlines()
            db = yaml.safe_dump(b, sort_keys=True).splitlines()
            print(f"FAIL {k[0]}/{k[2]} differs (- overlay, + chart):")
            print("\n".join(difflib.unified_diff(da, db, "overlay", "chart", lineterm="", n=2)))
    for n in sorted(notes):
        print(f"note: {n}")
    if failed:
        sys.exit(1)
    kinds = ", ".join(f"{k[0]}/{k[2]}" for k in sorted(kz, key=str))
    print(f"{len(kz)} objects equal: {kinds}")


if __name__ == "__main__":
    main()
