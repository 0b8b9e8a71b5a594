#!/usr/bin/env python3
"""Validates one `helm template` render (multi-document YAML on stdin or in a file).

Every object is checked strictly against the Kubernetes OpenAPI schemas of
KUBERNETES_VERSION (PyPI package kubernetes-validate), plus this project's invariants:
namespaces, labels, hardened containers (DaemonSets: no Secret volumes; Deployments:
non-root, no capabilities), CRDs kube-apiserver would accept (structural schemas,
list-map keys, defaults that validate, approval annotations). Custom objects (Istio's
security.istio.io, the Gateway API) have no upstream schema and are checked against
the CRDs in the render or given with --crds-from, as the API server applies them.

Expectations about one render come as arguments (see EXPECT below), e.g.
  'ConfigMap/istio-cni-config:data.CHAINED_CNI_PLUGIN=false'
  '!CustomResourceDefinition/authorizationpolicies.security.istio.io'
  'DaemonSet/ztunnel:spec.template.spec.containers[name=istio-proxy].env[name=LOCAL_XDS_PATH]'

Exit status 0 when everything holds; otherwise every problem is printed, one a line.
"""

import argparse
import re
import sys

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate import utils as kv_utils

KUBERNETES_VERSION = "1.33"

# Cluster-scoped kinds this project renders; everything else must sit in the release
# namespace.
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PriorityClass", "Namespace"}

# API groups served only through CRDs (no upstream schema): objects of these groups,
# or of any kind a known CRD defines, are checked against that CRD.
CRD_GROUPS = {"security.istio.io", "gateway.networking.k8s.io"}

# Groups whose CRDs kube-apiserver accepts only with api-approved.kubernetes.io.
PROTECTED_GROUP_SUFFIXES = ("k8s.io", "kubernetes.io")

REQUIRED_LABELS = {"app.kubernetes.io/part-of": "istio"}

EXPECT = """Expectation forms:
  Kind/name               the object is rendered
  !Kind/name              the object is not rendered
  Kind/name:path          the path exists in it
  !Kind/name:path         the path does not exist in it
  Kind/name:path=value    the path holds that scalar (booleans as true/false)
  Kind/name:path~=text    the path's scalar contains text
A path is dot-separated; `\\.` is a literal dot; `list[key=value]` picks the list item
whose key equals value; a number indexes a list."""


def load(stream):
    return [doc for doc in yaml.safe_load_all(stream) if doc]


def ref(obj):
    return f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"


def group_of(api_version):
    return api_version.split("/")[0] if "/" in api_version else ""


# ---------------------------------------------------------------- path expressions

SEGMENT = re.compile(r"^(?P<key>[^\[\]]*)(\[(?P<sk>[^=\]]+)=(?P<sv>[^\]]*)\])?$")


def split_path(path):
    parts, cur, i = [], "", 0
    while i < len(path):
        if path[i] == "\\" and i + 1 < len(path) and path[i + 1] == ".":
            cur += "."
            i += 2
            continue
        if path[i] == ".":
            parts.append(cur)
            cur = ""
        else:
            cur += path[i]
        i += 1
    parts.append(cur)
    return parts


MISSING = object()


def resolve(obj, path):
    node = obj
    for part in split_path(path):
        m = SEGMENT.match(part)
        if not m:
            raise ValueError(f"bad path segment {part!r}")
        key = m.group("key")
        if key:
            if isinstance(node, list) and key.isdigit():
                idx = int(key)
                node = node[idx] if idx < len(node) else MISSING
            elif isinstance(node, dict):
                node = node.get(key, MISSING)
            else:
                node = MISSING
        if node is MISSING:
            return MISSING
        if m.group("sk"):
            if not isinstance(node, list):
                return MISSING
            sk, sv = m.group("sk"), m.group("sv")
            node = next((item for item in node
                         if isinstance(item, dict) and scalar(item.get(sk)) == sv), MISSING)
            if node is MISSING:
                return MISSING
    return node


def scalar(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def split_assignment(text):
    """path=value, with '=' inside [key=value] selectors left alone."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "=" and depth == 0:
            if i > 0 and text[i - 1] == "~":
                return text[:i - 1], "~=", text[i + 1:]
            return text[:i], "=", text[i + 1:]
    return text, "", ""


def check_expectation(objects, spec):
    negate = spec.startswith("!")
    body = spec[1:] if negate else spec
    target, _, rest = body.partition(":")
    path, eq, want = split_assignment(rest)
    obj = next((o for o in objects if ref(o) == target), None)
    if not rest:
        if negate and obj is not None:
            return f"expected {target} not to be rendered"
        if not negate and obj is None:
            return f"expected {target} to be rendered"
        return None
    if obj is None:
        return f"expected {target} to be rendered (for {spec!r})"
    got = resolve(obj, path)
    if negate:
        if eq:
            return f"bad expectation {spec!r}: '!' takes no value"
        return None if got is MISSING else f"{target}: expected no {path}, found {got!r}"
    if got is MISSING:
        return f"{target}: expected {path} to exist"
    if eq == "=" and scalar(got) != want:
        return f"{target}: {path} is {scalar(got)!r}, expected {want!r}"
    if eq == "~=" and want not in scalar(got):
        return f"{target}: {path} does not contain {want!r}"
    return None


# ---------------------------------------------------------------- invariants

def check_metadata(obj, namespace):
    problems = []
    meta = obj.get("metadata") or {}
    kind = obj.get("kind")
    if kind in CLUSTER_SCOPED:
        if "namespace" in meta:
            problems.append(f"{ref(obj)}: cluster-scoped kind has a namespace")
    elif meta.get("namespace") != namespace:
        problems.append(f"{ref(obj)}: namespace is {meta.get('namespace')!r}, "
                        f"expected the release namespace {namespace!r}")
    labels = meta.get("labels") or {}
    for key, value in REQUIRED_LABELS.items():
        if labels.get(key) != value:
            problems.append(f"{ref(obj)}: label {key}={value} missing")
    if "app.kubernetes.io/name" not in labels:
        problems.append(f"{ref(obj)}: label app.kubernetes.io/name missing")
    if any(k.startswith("istio.io/rev") for k in labels):
        problems.append(f"{ref(obj)}: carries istio.io/rev (this data plane is revision-free)")
    return problems


def check_containers(obj, spec):
    """Container hardening every pod template must keep, DaemonSet or Deployment."""
    problems = []
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        name = f"{ref(obj)} container {c.get('name')}"
        sc = c.get("securityContext") or {}
        if sc.get("privileged") is not False:
            problems.append(f"{name}: privileged must be false")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: readOnlyRootFilesystem must be true")
        caps = sc.get("capabilities") or {}
        if caps.get("drop") != ["ALL"]:
            problems.append(f"{name}: capabilities.drop must be [ALL]")
        added = caps.get("add") or []
        if len(added) != len(set(added)):
            problems.append(f"{name}: capabilities.add has duplicates: {added}")
        if "SYS_ADMIN" in added and sc.get("allowPrivilegeEscalation") is False:
            problems.append(f"{name}: allowPrivilegeEscalation false with SYS_ADMIN is rejected by the API")
        if not (c.get("resources") or {}).get("requests"):
            problems.append(f"{name}: no resource requests")
        mounts = {m["name"] for m in c.get("volumeMounts", [])}
        volumes = {v["name"] for v in spec.get("volumes", [])}
        for missing in sorted(mounts - volumes):
            problems.append(f"{name}: mounts undefined volume {missing}")
        env = [e["name"] for e in c.get("env", [])]
        dupes = sorted({e for e in env if env.count(e) > 1})
        if dupes:
            problems.append(f"{name}: duplicate env {dupes}")
    volumes = [v["name"] for v in spec.get("volumes", [])]
    used = {m["name"] for c in spec.get("containers", []) + spec.get("initContainers", [])
            for m in c.get("volumeMounts", [])}
    for unused in sorted(set(volumes) - used):
        problems.append(f"{ref(obj)}: volume {unused} is never mounted")
    return problems


def secret_volumes(spec):
    """Names of the Secrets a pod spec mounts (plain or projected)."""
    names = []
    for v in spec.get("volumes", []):
        if "secret" in v:
            names.append(v["secret"].get("secretName"))
        for source in (v.get("projected") or {}).get("sources", []):
            if "secret" in source:
                names.append(source["secret"].get("name"))
    return names


def check_pod_template(obj):
    """Hardening every DaemonSet must keep, whatever the values."""
    problems = []
    template = obj["spec"]["template"]
    labels = template["metadata"].get("labels") or {}
    if labels.get("sidecar.istio.io/inject") != "false":
        problems.append(f"{ref(obj)}: pod label sidecar.istio.io/inject=\"false\" missing")
    if labels.get("istio.io/dataplane-mode") != "none":
        problems.append(f"{ref(obj)}: pod label istio.io/dataplane-mode=none missing")
    spec = template["spec"]
    if spec.get("priorityClassName") != "system-node-critical":
        problems.append(f"{ref(obj)}: priorityClassName is not system-node-critical")
    # Trust model: no node holds a Secret (the CA key lives only in istiod-lite's
    # Deployment); node proxies authenticate with projected tokens.
    for name in secret_volumes(spec):
        problems.append(f"{ref(obj)}: mounts Secret {name} (node-level pods hold no Secrets)")
    problems += check_containers(obj, spec)
    return problems


def check_deployment(obj):
    """Hardening every Deployment (the control plane) must keep: nothing of the node,
    no root, no capabilities, no privilege escalation."""
    problems = []
    template = obj["spec"]["template"]
    labels = template["metadata"].get("labels") or {}
    if labels.get("sidecar.istio.io/inject") != "false":
        problems.append(f"{ref(obj)}: pod label sidecar.istio.io/inject=\"false\" missing")
    if labels.get("istio.io/dataplane-mode") != "none":
        problems.append(f"{ref(obj)}: pod label istio.io/dataplane-mode=none missing")
    selector = obj["spec"]["selector"].get("matchLabels") or {}
    for key, value in selector.items():
        if labels.get(key) != value:
            problems.append(f"{ref(obj)}: pod labels do not match selector {key}={value}")
    spec = template["spec"]
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            problems.append(f"{ref(obj)}: {field} must not be set")
    for v in spec.get("volumes", []):
        if "hostPath" in v:
            problems.append(f"{ref(obj)}: hostPath volume {v['name']}")
    pod_sc = spec.get("securityContext") or {}
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        name = f"{ref(obj)} container {c.get('name')}"
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation must be false")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            problems.append(f"{name}: runAsNonRoot must be true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) in (None, 0):
            problems.append(f"{name}: runAsUser must be a non-zero uid")
        if (sc.get("capabilities") or {}).get("add"):
            problems.append(f"{name}: adds capabilities {sc['capabilities']['add']}")
    problems += check_containers(obj, spec)
    return problems


STRUCTURAL_FORBIDDEN = {"$ref", "definitions", "dependencies", "patternProperties",
                        "additionalItems", "id", "$schema"}
# Inside allOf/anyOf/oneOf/not only value validations may appear.
JUNCTORS = ("allOf", "anyOf", "oneOf")
JUNCTOR_FORBIDDEN = {"type", "default", "description", "nullable", "additionalProperties",
                     "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
                     "x-kubernetes-int-or-string", "x-kubernetes-validations"}
SCALARS = {"string", "integer", "number", "boolean"}


def check_structural(schema, where, at_root=True, in_junctor=False):
    """Kubernetes' structural-schema rules for a CRD version's openAPIV3Schema (the
    parts a static check can see): every node has a type unless it preserves unknown
    fields or is int-or-string, no forbidden keywords, properties and
    additionalProperties never together, items is one schema, junctors hold value
    validations only, metadata names nothing but name and generateName, patterns
    compile, list-map keys are required (or defaulted) scalars, set items are scalars,
    every default validates against its own schema, every CEL rule is a string."""
    problems = []
    if not isinstance(schema, dict):
        return [f"{where}: not a schema object"]
    for key in STRUCTURAL_FORBIDDEN & schema.keys():
        problems.append(f"{where}: keyword {key} is not allowed in a structural schema")
    if in_junctor:
        for key in sorted(JUNCTOR_FORBIDDEN & schema.keys()):
            problems.append(f"{where}: {key} is not allowed inside allOf/anyOf/oneOf/not")
    else:
        untyped_ok = schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-kubernetes-int-or-string")
        if "type" not in schema and not untyped_ok:
            problems.append(f"{where}: no type")
        if schema.get("type") == "array" and "items" not in schema:
            problems.append(f"{where}: array without items")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{where}: properties and additionalProperties together")
    if at_root:
        if schema.get("type") != "object":
            problems.append(f"{where}: root must be type object")
        meta = (schema.get("properties") or {}).get("metadata")
        if isinstance(meta, dict) and (set(meta) - {"type", "properties", "description"} or
                                       set(meta.get("properties") or {}) - {"name", "generateName"}):
            problems.append(f"{where}.metadata: may only restrict name and generateName")
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except re.error as e:
            problems.append(f"{where}: pattern {schema['pattern']!r} does not compile: {e}")
    list_type = schema.get("x-kubernetes-list-type")
    items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
    if list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys") or []
        if not keys:
            problems.append(f"{where}: list-type map without x-kubernetes-list-map-keys")
        for k in keys:
            prop = (items.get("properties") or {}).get(k)
            if prop is None:
                problems.append(f"{where}: list-map key {k} is not a property of the items")
            elif prop.get("type") not in SCALARS:
                problems.append(f"{where}: list-map key {k} is not a scalar")
            elif k not in (items.get("required") or []) and "default" not in prop:
                problems.append(f"{where}: list-map key {k} must be required or defaulted")
    elif list_type == "set" and items.get("type") not in SCALARS:
        problems.append(f"{where}: list-type set needs scalar items")
    for i, rule in enumerate(schema.get("x-kubernetes-validations") or []):
        if not isinstance(rule, dict) or not isinstance(rule.get("rule"), str):
            problems.append(f"{where}: x-kubernetes-validations[{i}] has no rule")
    if "default" in schema and not in_junctor:
        bare = {k: v for k, v in schema.items() if k != "default"}
        for err in jsonschema.Draft4Validator(closed(bare)).iter_errors(schema["default"]):
            path = ".".join(str(p) for p in err.path)
            problems.append(f"{where}: default {path + ': ' if path else ''}{err.message}")
    for name, sub in (schema.get("properties") or {}).items():
        problems += check_structural(sub, f"{where}.{name}", False, in_junctor)
    if isinstance(schema.get("additionalProperties"), dict):
        problems += check_structural(schema["additionalProperties"], f"{where}.*", False, in_junctor)
    if "items" in schema:
        if isinstance(schema["items"], list):
            problems.append(f"{where}: items must be a single schema")
        else:
            problems += check_structural(schema["items"], f"{where}[]", False, in_junctor)
    for junctor in JUNCTORS:
        for i, sub in enumerate(schema.get(junctor) or []):
            problems += check_structural(sub, f"{where}.{junctor}[{i}]", False, True)
    if "not" in schema:
        problems += check_structural(schema["not"], f"{where}.not", False, True)
    return problems


PRINTER_TYPES = {"integer", "number", "string", "boolean", "date"}


def check_crd(obj):
    problems = []
    spec = obj["spec"]
    names = spec["names"]
    expected = f"{names['plural']}.{spec['group']}"
    if obj["metadata"]["name"] != expected:
        problems.append(f"{ref(obj)}: name must be {expected}")
    annotations = obj["metadata"].get("annotations") or {}
    if annotations.get("helm.sh/resource-policy") != "keep":
        problems.append(f"{ref(obj)}: missing helm.sh/resource-policy: keep")
    group = spec["group"]
    if any(group == d or group.endswith("." + d) for d in PROTECTED_GROUP_SUFFIXES) and \
            not annotations.get("api-approved.kubernetes.io"):
        problems.append(f"{ref(obj)}: group {group} needs annotation api-approved.kubernetes.io")
    if group == "gateway.networking.k8s.io":
        for key in ("gateway.networking.k8s.io/bundle-version", "gateway.networking.k8s.io/channel"):
            if not annotations.get(key):
                problems.append(f"{ref(obj)}: Gateway API CRD without annotation {key}")
    versions = spec["versions"]
    if sum(1 for v in versions if v.get("storage")) != 1:
        problems.append(f"{ref(obj)}: exactly one version must be the storage version")
    if not any(v.get("served") for v in versions):
        problems.append(f"{ref(obj)}: no version is served")
    seen = set()
    for v in versions:
        if v["name"] in seen:
            problems.append(f"{ref(obj)}: version {v['name']} twice")
        seen.add(v["name"])
        where = f"{ref(obj)} {v['name']}"
        if "schema" not in v:
            problems.append(f"{where}: no schema")
            continue
        problems += check_structural(v["schema"]["openAPIV3Schema"], where)
        columns = v.get("additionalPrinterColumns") or []
        if len({c.get("name") for c in columns}) != len(columns):
            problems.append(f"{where}: printer column names repeat")
        for c in columns:
            if c.get("type") not in PRINTER_TYPES:
                problems.append(f"{where}: printer column {c.get('name')} has type {c.get('type')!r}")
            if not str(c.get("jsonPath", "")).startswith("."):
                problems.append(f"{where}: printer column {c.get('name')} jsonPath must start with .")
    return problems


def crd_validators(objects):
    """(group, version, kind) -> jsonschema validator, from CRDs in the render."""
    out = {}
    for obj in objects:
        if obj.get("kind") != "CustomResourceDefinition":
            continue
        spec = obj["spec"]
        for v in spec["versions"]:
            schema = closed(v["schema"]["openAPIV3Schema"])
            out[(spec["group"], v["name"], spec["names"]["kind"])] = \
                jsonschema.Draft4Validator(schema)
    return out


def closed(schema):
    """The schema as the API server applies it with strict field validation (kubectl's
    default): an object with declared properties accepts no others, unless it preserves
    unknown fields."""
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) if k in ("items", "additionalProperties") else v
           for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {k: closed(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and \
                not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


def custom_key(obj):
    api = obj.get("apiVersion", "")
    return (group_of(api), api.split("/")[-1], obj.get("kind"))


def is_custom(obj, validators, extra_crds):
    key = custom_key(obj)
    return key[0] in CRD_GROUPS or key in validators or key in extra_crds


def validate_custom(obj, validators, extra_crds):
    key = custom_key(obj)
    validator = validators.get(key) or extra_crds.get(key)
    if validator is None:
        return []  # skipped: no CRD known for it here
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    return [f"{ref(obj)}: {'.'.join(map(str, e.path)) or '<root>'}: {e.message}"
            for e in validator.iter_errors(body)]


def upstream_validator(obj):
    """The strict schema kubernetes-validate would use for obj, as a validator that can
    report every error (its validate() stops at the first). None when that package's
    layout is not the one expected."""
    try:
        from referencing import Registry, Resource
        version = [v for v in kv_utils.all_versions()
                   if kv_utils.major_minor(v) <= KUBERNETES_VERSION][-1]
        api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", obj["apiVersion"])
        folder = f"kubernetes-json-schema/v{version}-local-strict"
        schema = kv_utils.schema_contents(f"{folder}/{obj['kind'].lower()}-{api}.json", version)
        defs = kv_utils.schema_contents(f"{folder}/_definitions.json", version)
    except (AttributeError, ImportError, KeyError, IndexError, OSError):
        return None
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def validate_upstream(obj):
    problems = []
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        return []
    except kubernetes_validate.ValidationError as e:
        validator = upstream_validator(obj)
        errors = list(validator.iter_errors(obj)) if validator else [e]
        for err in errors or [e]:
            path = ".".join(str(p) for p in err.path) or "<root>"
            problems.append(f"{ref(obj)}: {path}: {err.message}")
    except kv_utils.SchemaNotFoundError as e:
        problems.append(f"{ref(obj)}: {e.message} (no schema: unknown kind or apiVersion)")
    except kv_utils.VersionNotSupportedError as e:
        problems.append(f"kubernetes-validate cannot check Kubernetes {e.version}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=EXPECT)
    parser.add_argument("render", nargs="?", default="-", help="YAML file, - for stdin")
    parser.add_argument("--namespace", default="istio-system")
    parser.add_argument("--expect", action="append", default=[], metavar="EXPR")
    parser.add_argument("--crds-from", action="append", default=[], metavar="FILE",
                        help="render holding CRDs to check custom objects against")
    parser.add_argument("--expect-invalid", action="store_true",
                        help="every object must FAIL validation (negative samples)")
    args = parser.parse_args()

    with (sys.stdin if args.render == "-" else open(args.render)) as f:
        objects = load(f)
    extra = {}
    for path in args.crds_from:
        with open(path) as f:
            extra.update(crd_validators(load(f)))
    validators = crd_validators(objects)

    if args.expect_invalid:
        problems = []
        for obj in objects:
            if not validate_custom(obj, validators, extra):
                problems.append(f"{ref(obj)}: expected to be rejected, but it validates")
        for p in problems:
            print(f"  {p}")
        return 1 if problems else 0

    problems = []
    if not objects:
        problems.append("the render holds no objects")
    seen = set()
    for obj in objects:
        key = (obj.get("apiVersion"), ref(obj), (obj.get("metadata") or {}).get("namespace"))
        if key in seen:
            problems.append(f"{ref(obj)}: rendered twice")
        seen.add(key)
        if is_custom(obj, validators, extra):
            key = custom_key(obj)
            if key not in validators and key not in extra:
                problems.append(f"{ref(obj)}: no CRD serves {key[0]}/{key[1]} {key[2]} here")
            problems += validate_custom(obj, validators, extra)
            continue
        problems += validate_upstream(obj)
        problems += check_metadata(obj, args.namespace)
        if obj.get("kind") == "DaemonSet":
            problems += check_pod_template(obj)
        if obj.get("kind") == "Deployment":
            problems += check_deployment(obj)
        if obj.get("kind") == "CustomResourceDefinition":
            problems += check_crd(obj)
    for spec in args.expect:
        try:
            problem = check_expectation(objects, spec.strip())
        except ValueError as e:
            problem = f"bad expectation {spec!r}: {e}"
        if problem:
            problems.append(problem)
    for p in problems:
        print(f"  {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
