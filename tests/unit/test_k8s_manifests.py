"""deploy/k8s validates against the Kubernetes API schemas (kubernetes-validate, strict: an
unknown or misspelt field fails), and asks for no volume every replica would share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate  # the test extra
import pytest
import yaml

MANIFESTS = sorted((Path(__file__).resolve().parents[2] / "deploy" / "k8s").glob("*.yaml"))
#: kinds of other projects' APIs (no schema in kubernetes-validate): checked by hand below
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "PodMonitor")}


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{path.name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}", doc)
            for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def kubernetes_documents() -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name, doc in documents()
            if (doc.get("apiVersion"), doc.get("kind")) not in CUSTOM_KINDS]


def test_there_are_manifests() -> None:
    kinds = {doc["kind"] for _, doc in documents()}
    assert {"StatefulSet", "ConfigMap", "Service"} <= kinds, kinds


@pytest.mark.parametrize(("name", "doc"), kubernetes_documents(),
                         ids=[n for n, _ in kubernetes_documents()])
def test_every_manifest_validates_strictly(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_a_misspelt_field_fails_validation() -> None:
    """The check can fail: a planted typo in the StatefulSet is refused."""
    doc = next(doc for _, doc in documents() if doc["kind"] == "StatefulSet")
    planted = {**doc, "spec": {**doc["spec"], "replicaz": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(planted, kubernetes_validate.latest_version(), strict=True)


def test_no_volume_is_shared_between_replicas() -> None:
    for name, doc in documents():
        for claim in doc.get("spec", {}).get("volumeClaimTemplates", []):
            modes = claim["spec"]["accessModes"]
            assert "ReadWriteMany" not in modes, f"{name} asks for a shared volume: {modes}"
        assert doc["kind"] != "PersistentVolumeClaim" or \
            "ReadWriteMany" not in doc["spec"]["accessModes"], name


def test_the_pod_monitor_selects_the_pods() -> None:
    docs = {doc["kind"]: doc for _, doc in documents()}
    monitor, pods = docs["PodMonitor"], docs["StatefulSet"]["spec"]["template"]
    labels = pods["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for c in pods["spec"]["containers"] for p in c.get("ports", [])}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= ports


def test_replicas_with_volumes_of_their_own_keep_their_state_on_kafka() -> None:
    """More than one replica, each with a ReadWriteOnce volume: the partitions' state must
    move through the changelog topic (a replica taking a partition finds nothing of it on its
    own volume), and each pod is a static member named after itself."""
    import tomllib

    docs = {doc["kind"]: doc for _, doc in documents()}
    config = tomllib.loads(docs["ConfigMap"]["data"]["streamlearn.toml"])
    stateful = docs["StatefulSet"]
    assert stateful["spec"]["replicas"] > 1
    assert config["kafka"]["membership"] == "group"
    assert config["checkpoint"]["changelog"] is True
    env = {e["name"]: e for c in stateful["spec"]["template"]["spec"]["containers"]
           for e in c.get("env", [])}
    member = env["STREAMLEARN_KAFKA_GROUP_INSTANCE_ID"]
    assert member["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
