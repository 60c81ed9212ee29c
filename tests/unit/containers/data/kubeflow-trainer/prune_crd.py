"""The parts of a CRD's openAPIV3Schema that manifests use, for tests/unit/containers/test_kubeflow_trainjob.py.

A CRD of kubeflow/trainer holds the whole JobSet, Job and Pod schema (0.9 MB for TrainingRuntime):
this keeps, along every path the manifests use, each node's validation keywords and the names of all
its properties, the unused ones as {"vendored": false} (a field a manifest starts to use needs the
schema vendored again, and the test says so), and drops the descriptions.

    python prune_crd.py CRD.yaml MANIFEST.yaml... > KIND.schema.json

The CRDs: kubeflow/trainer, tag v2.3.0, manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml
and trainer.kubeflow.org_trainjobs.yaml (https://github.com/kubeflow/trainer/tree/v2.3.0/manifests/base/crds).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

KEYWORDS = ("type", "required", "enum", "format", "pattern", "minimum", "maximum", "minItems", "maxItems",
            "minLength", "maxLength", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields")


def prune(schema: dict, instances: list) -> dict:
    """schema's validation keywords at this node, and its children pruned to what instances use."""
    kept = {key: schema[key] for key in KEYWORDS if key in schema}
    if "properties" in schema:
        used = {key for value in instances if isinstance(value, dict) for key in value}
        kept["properties"] = {
            name: prune(child, [value[name] for value in instances if isinstance(value, dict) and name in value])
            if name in used else {"vendored": False}
            for name, child in schema["properties"].items()}
    if isinstance(schema.get("additionalProperties"), dict):
        values = [item for value in instances if isinstance(value, dict) for item in value.values()]
        kept["additionalProperties"] = prune(schema["additionalProperties"], values)
    if isinstance(schema.get("items"), dict):
        items = [item for value in instances if isinstance(value, list) for item in value]
        kept["items"] = prune(schema["items"], items)
    return kept


def main(crd_path: str, *manifests: str) -> None:
    crd = yaml.safe_load(Path(crd_path).read_text())
    (version,) = crd["spec"]["versions"]
    kind = crd["spec"]["names"]["kind"]
    instances = [document for path in manifests for document in yaml.safe_load_all(Path(path).read_text())
                 if document and document.get("kind") == kind]
    pruned = prune(version["schema"]["openAPIV3Schema"], instances)
    plural, group = crd["metadata"]["name"].split(".", 1)
    source = f"kubeflow/trainer v2.3.0 manifests/base/crds/{group}_{plural}.yaml"
    json.dump({"source": source, "group": crd["spec"]["group"],
               "version": version["name"], "kind": kind, "schema": pruned}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
