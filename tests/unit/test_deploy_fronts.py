"""What stands in front of the service and what scrapes it (config/kubernetes/overlays/{gke,
ingress-nginx,servicemonitor}, components/): each overlay renders with kubectl's kustomize to
the base plus its own objects, every object passes a strict schema offline (kubernetes-validate
for Kubernetes' kinds, tests/data/crd_schemas for BackendConfig and ServiceMonitor), and the
numbers agree with the service's: the balancers' timeouts above its stream timeouts, draining
matched to the pod's grace period, the admin port (MLPA_ADMIN_PORT) scraped and not exposed,
the job label the alert rules select, the NetworkPolicy's ports those the settings use.
Not covered: applying them to a cluster (admission, the controllers' own checks).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate.utils as kubernetes_validate
import pytest
import yaml

from mlpa_aiohttp.settings import DEFAULT_SECRETS, Settings

from .test_deploy_config import (
    MANIFEST_DIR,
    MANIFESTS,
    OVERLOAD_DIR,
    by_identity,
    kubectl,
    load_gunicorn_conf,
    main_container,
    manifest_env,
    operator_env,
    pod_spec,
    rendered,
)

ROOT = MANIFEST_DIR.parents[1]
OVERLAYS = MANIFEST_DIR / "overlays"
GKE_DIR, NGINX_DIR, SERVICEMONITOR_DIR = OVERLAYS / "gke", OVERLAYS / "ingress-nginx", OVERLAYS / "servicemonitor"
COMPONENTS = MANIFEST_DIR / "components"
CRD_SCHEMAS = ROOT / "tests" / "data" / "crd_schemas"
ALERT_RULES = ROOT / "config" / "prometheus" / "mlpa-alerts.yml"
ADMIN_PATHS = ("/metrics", "/admin", "/user", "/api/docs", "/openapi.json")

# What each overlay adds to the base, and the one base object it may change.
ADDED = {
    GKE_DIR: {("BackendConfig", "mlpa"), ("Ingress", "mlpa"), ("NetworkPolicy", "mlpa")},
    NGINX_DIR: {("Ingress", "mlpa"), ("NetworkPolicy", "mlpa")},
    SERVICEMONITOR_DIR: {("Service", "mlpa-metrics"), ("ServiceMonitor", "mlpa")},
}
OVERLAY_IDS = ["gke", "ingress-nginx", "servicemonitor"]


def settings() -> Settings:
    return Settings.from_environ(operator_env())


def one(objects: tuple[dict[str, Any], ...], kind: str, name: str = "mlpa") -> dict[str, Any]:
    [found] = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"] == name]
    return found


def container_ports() -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in main_container()["ports"]}


def pod_labels() -> dict[str, str]:
    return MANIFESTS_BY_ID[("Deployment", "mlpa")]["spec"]["template"]["metadata"]["labels"]


MANIFESTS_BY_ID = by_identity(MANIFESTS)


# --- rendering and schemas ------------------------------------------------------------------


@cache
def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
    path = CRD_SCHEMAS / f"{api_version.replace('/', '_')}_{kind}.json"
    if not path.exists():
        return None
    schema = json.loads(path.read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def validate_strictly(obj: dict[str, Any]) -> None:
    """Raises unless a strict schema, Kubernetes' own or one of ours, accepts `obj`."""
    validator = crd_validator(obj["apiVersion"], obj["kind"])
    if validator is not None:
        validator.validate(obj)
        return
    version = kubernetes_validate.latest_version()
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        pytest.fail(f"no schema covers {obj['apiVersion']} {obj['kind']}: add one to {CRD_SCHEMAS}")


@pytest.mark.parametrize("directory", [GKE_DIR, NGINX_DIR, SERVICEMONITOR_DIR], ids=OVERLAY_IDS)
def test_each_overlay_is_the_base_and_its_own_objects_all_passing_strict_schemas(directory: Path) -> None:
    base, overlay = by_identity(MANIFESTS), by_identity(rendered(directory))
    assert set(overlay) == set(base) | ADDED[directory]
    changed = {identity for identity in base if overlay[identity] != base[identity]}
    if directory == GKE_DIR:
        # The Service only gains the annotations that hand it to the load balancer.
        assert changed == {("Service", "mlpa")}
        service = copy.deepcopy(overlay[("Service", "mlpa")])
        assert set(service["metadata"].pop("annotations")) == {"cloud.google.com/neg", "cloud.google.com/backend-config"}
        assert service == base[("Service", "mlpa")]
    else:
        assert changed == set()
    for obj in overlay.values():
        validate_strictly(obj)


def composed(tmp_path: Path, resource: Path, components: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """`kubectl kustomize` of an overlay of one's own (kustomize wants relative paths)."""
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(resource, tmp_path)],
        "components": [os.path.relpath(COMPONENTS / name, tmp_path) for name in components],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    done = subprocess.run(
        [kubectl(), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return by_identity(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def test_the_documented_combination_renders(tmp_path: Path) -> None:
    """docs/operations.md's example: overload protection behind GKE, scraped by the operator;
    the components add their objects to the overload overlay and change nothing else of it."""
    objects = composed(tmp_path, OVERLOAD_DIR, ["gke", "network-policy", "servicemonitor"])
    overload = by_identity(rendered(OVERLOAD_DIR))
    assert set(objects) == set(overload) | ADDED[GKE_DIR] | ADDED[SERVICEMONITOR_DIR]
    assert objects[("Deployment", "mlpa")] == overload[("Deployment", "mlpa")]
    assert objects[("BackendConfig", "mlpa")] == one(rendered(GKE_DIR), "BackendConfig")
    for obj in objects.values():
        validate_strictly(obj)


def test_a_front_overlay_and_the_servicemonitor_compose(tmp_path: Path) -> None:
    objects = composed(tmp_path, GKE_DIR, ["servicemonitor"])
    assert set(objects) == set(by_identity(MANIFESTS)) | ADDED[GKE_DIR] | ADDED[SERVICEMONITOR_DIR]


@pytest.mark.parametrize(
    ("kind", "break_it"),
    [
        ("BackendConfig", lambda obj: obj["spec"].__setitem__("timeoutSecs", 3600)),
        ("BackendConfig", lambda obj: obj["spec"].__setitem__("timeoutSec", "3600")),
        ("BackendConfig", lambda obj: obj["spec"]["connectionDraining"].__setitem__("drainingTimeout", 75)),
        ("ServiceMonitor", lambda obj: obj["spec"]["endpoints"][0].__setitem__("interval", "30 seconds")),
        ("ServiceMonitor", lambda obj: obj["spec"]["endpoints"][0]["relabelings"][0].__setitem__("target_label", "job")),
        ("ServiceMonitor", lambda obj: obj["spec"].__setitem__("endpoint", [])),
    ],
)
def test_the_custom_resource_schemas_refuse_a_wrong_field(kind: str, break_it) -> None:
    """The check above can fail for the custom kinds too: a misspelled or mistyped field."""
    directory = GKE_DIR if kind == "BackendConfig" else SERVICEMONITOR_DIR
    obj = copy.deepcopy(one(rendered(directory), kind))
    validate_strictly(obj)
    break_it(obj)
    with pytest.raises(jsonschema.ValidationError):
        validate_strictly(obj)


# --- the admin port: scraped, never exposed -------------------------------------------------


def test_the_admin_port_is_the_containers_and_the_service_does_not_expose_it() -> None:
    env = manifest_env()
    assert int(env["MLPA_ADMIN_PORT"]) == container_ports()["admin"]
    assert settings().server.admin_port == container_ports()["admin"]
    for directory in (MANIFEST_DIR, GKE_DIR, NGINX_DIR, SERVICEMONITOR_DIR):
        service = one(rendered(directory), "Service")
        assert [port["targetPort"] for port in service["spec"]["ports"]] == ["http"]


def test_scrape_by_annotation_points_at_the_admin_ports_metrics() -> None:
    annotations = MANIFESTS_BY_ID[("Deployment", "mlpa")]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == container_ports()["admin"]
    assert annotations["prometheus.io/path"] == "/metrics"


def alert_rule_jobs() -> set[str]:
    return set(re.findall(r'\bjob="([^"]+)"', ALERT_RULES.read_text()))


def test_the_servicemonitor_scrapes_the_admin_port_as_the_job_the_rules_select() -> None:
    objects = rendered(SERVICEMONITOR_DIR)
    monitor, service = one(objects, "ServiceMonitor"), one(objects, "Service", "mlpa-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    # The public Service must not be selected too, or each pod would be scraped twice.
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= one(objects, "Service")["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod_labels().items()
    assert service["spec"]["clusterIP"] == "None"
    [endpoint] = monitor["spec"]["endpoints"]
    [port] = [port for port in service["spec"]["ports"] if port["name"] == endpoint["port"]]
    assert container_ports()[port["targetPort"]] == container_ports()["admin"]
    assert endpoint["path"] == "/metrics"
    job = [rule for rule in endpoint["relabelings"] if rule.get("targetLabel") == "job"]
    assert job == [{"action": "replace", "targetLabel": "job", "replacement": "mlpa"}]
    assert alert_rule_jobs() == {"mlpa"}


# --- the fronts: timeouts, draining, health checks, bodies ----------------------------------


def longest_silence_seconds() -> float:
    """The longest the service lets a response go without a byte: a stream before its first
    byte or between chunks, a non-streaming completion before its answer."""
    upstream = settings().upstream
    return max(upstream.streaming_timeout_seconds, upstream.read_timeout_seconds)


def test_the_gke_balancer_outlasts_every_stream_the_service_allows() -> None:
    objects = rendered(GKE_DIR)
    backend = one(objects, "BackendConfig")["spec"]
    # The balancer's timeout bounds the whole response: well above the service's silences.
    assert backend["timeoutSec"] >= 10 * longest_silence_seconds()
    service = one(objects, "Service")
    annotations = service["metadata"]["annotations"]
    assert json.loads(annotations["cloud.google.com/backend-config"]) == {"default": "mlpa"}
    assert json.loads(annotations["cloud.google.com/neg"]) == {"ingress": True}
    ingress = one(objects, "Ingress")
    assert ingress["metadata"]["annotations"]["kubernetes.io/ingress.class"] == "gce"
    assert ingress["spec"]["defaultBackend"]["service"] == {"name": "mlpa", "port": {"name": "http"}}


def test_gke_draining_matches_the_pods_grace_period(monkeypatch: pytest.MonkeyPatch) -> None:
    draining = one(rendered(GKE_DIR), "BackendConfig")["spec"]["connectionDraining"]["drainingTimeoutSec"]
    grace = pod_spec("Deployment")["terminationGracePeriodSeconds"]
    conf = load_gunicorn_conf(monkeypatch, manifest_env())
    pre_stop = float(main_container()["lifecycle"]["preStop"]["exec"]["command"][1])
    assert draining == grace
    assert draining > pre_stop + conf["graceful_timeout"] > settings().server.shutdown_drain_seconds


def test_the_gke_health_check_is_a_cheap_health_route_on_the_clients_port() -> None:
    check = one(rendered(GKE_DIR), "BackendConfig")["spec"]["healthCheck"]
    assert (check["type"], check["requestPath"], check["port"]) == ("HTTP", "/health/liveness", container_ports()["http"])
    assert check["timeoutSec"] <= check["checkIntervalSec"]


def nginx_annotations() -> dict[str, str]:
    return one(rendered(NGINX_DIR), "Ingress")["metadata"]["annotations"]


def size_in_bytes(text: str) -> int:
    """nginx's size syntax: a number with an optional k or m suffix."""
    match = re.fullmatch(r"(\d+)([kKmM]?)", text)
    assert match, text
    return int(match.group(1)) * {"": 1, "k": 1024, "m": 1024 * 1024}[match.group(2).lower()]


def test_ingress_nginx_streams_unbuffered_and_outlasts_every_stream() -> None:
    annotations = nginx_annotations()
    prefix = "nginx.ingress.kubernetes.io/"
    assert annotations[prefix + "proxy-buffering"] == "off"
    gke_timeout = one(rendered(GKE_DIR), "BackendConfig")["spec"]["timeoutSec"]
    for name in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(annotations[prefix + name]) == gke_timeout > longest_silence_seconds()
    # nginx's default of 1 MiB would refuse bodies the service accepts.
    assert size_in_bytes(annotations[prefix + "proxy-body-size"]) >= settings().server.max_request_size_bytes


def test_ingress_nginx_routes_everything_to_the_clients_port() -> None:
    ingress = one(rendered(NGINX_DIR), "Ingress")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    [rule] = ingress["spec"]["rules"]
    [path] = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/", "Prefix")
    assert path["backend"]["service"] == {"name": "mlpa", "port": {"name": "http"}}


# --- the NetworkPolicy ----------------------------------------------------------------------


def network_policy() -> dict[str, Any]:
    policies = [one(rendered(directory), "NetworkPolicy") for directory in (GKE_DIR, NGINX_DIR)]
    assert policies[0] == policies[1]
    return policies[0]


def test_the_network_policy_selects_the_service_pods_only() -> None:
    spec = network_policy()["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels().items()
    job_labels = MANIFESTS_BY_ID[("Job", "mlpa-migrate")]["spec"]["template"]["metadata"]["labels"]
    assert not spec["podSelector"]["matchLabels"].items() <= job_labels.items()
    assert spec["policyTypes"] == ["Ingress", "Egress"]


def test_the_admin_port_is_reachable_from_the_monitoring_namespace_only() -> None:
    rules = network_policy()["spec"]["ingress"]
    by_port = {port["port"]: rule for rule in rules for port in rule["ports"]}
    assert set(by_port) == {"http", "admin"} and set(by_port) <= set(container_ports())
    assert "from" not in by_port["http"]  # clients, balancers, their health checks
    assert by_port["admin"]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]


def egress_ports() -> dict[int, list[dict[str, Any]]]:
    """Each TCP or UDP port the policy lets out, with the `to` of each rule naming it."""
    found: dict[int, list[dict[str, Any]]] = {}
    for rule in network_policy()["spec"]["egress"]:
        for port in rule["ports"]:
            found.setdefault(port["port"], []).append({"protocol": port["protocol"], "to": rule.get("to")})
    return found


def url_port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or {"http": 80, "https": 443}[parts.scheme]


def test_egress_lets_out_what_the_settings_reach() -> None:
    current = settings()
    allowed = egress_ports()
    assert {rule["protocol"] for rule in allowed[53]} == {"UDP", "TCP"}
    litellm = allowed[url_port(current.upstream.api_base)]
    assert litellm == [{"protocol": "TCP", "to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "litellm"}}}]}]
    assert urlsplit(current.upstream.api_base).hostname == "litellm"
    for port in (current.postgres.port, url_port(current.fxa.base_url), 6379):
        assert {"protocol": "TCP", "to": None} in allowed[port], port


# --- scraping without the operator (config/prometheus/scrape-config.yml) --------------------

SCRAPE_CONFIG = ROOT / "config" / "prometheus" / "scrape-config.yml"


def pod_targets(pod_template: dict[str, Any], namespace: str = "mlpa") -> list[dict[str, str]]:
    """The targets Prometheus's Kubernetes pod discovery makes of a pod of this template: one
    per container port, with the `__meta_kubernetes_*` labels its documentation lists."""
    metadata, spec = pod_template["metadata"], pod_template["spec"]

    def label_name(name: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_]", "_", name)

    common = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": "mlpa-0",
        "__metrics_path__": "/metrics",
        **{f"__meta_kubernetes_pod_label_{label_name(k)}": v for k, v in metadata.get("labels", {}).items()},
        **{f"__meta_kubernetes_pod_annotation_{label_name(k)}": v for k, v in metadata.get("annotations", {}).items()},
    }
    return [
        {**common, "__address__": f"10.0.0.1:{port['containerPort']}", "__meta_kubernetes_pod_container_port_name": port.get("name", "")}
        for container in spec["containers"]
        for port in container.get("ports", [])
    ] or [{**common, "__address__": "10.0.0.1"}]


def relabel(target: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus's `keep` and `replace` relabelling (regexes anchored at both ends)."""
    for rule in rules:
        value = rule.get("separator", ";").join(target.get(name, "") for name in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep":
            if not match:
                return None
        elif action == "replace":
            if match:
                target = {**target, rule["target_label"]: match.expand(rule.get("replacement", r"\1").replace("$1", r"\1"))}
        else:
            pytest.fail(f"relabel action {action!r} not simulated here")
    return target


def test_the_scrape_job_finds_the_admin_port_of_the_service_pods_only() -> None:
    [job] = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
    assert {job["job_name"]} == alert_rule_jobs()
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    deployment = MANIFESTS_BY_ID[("Deployment", "mlpa")]["spec"]["template"]
    kept = [t for t in (relabel(t, job["relabel_configs"]) for t in pod_targets(deployment)) if t is not None]
    assert [(t["__address__"], t["__metrics_path__"]) for t in kept] == [(f"10.0.0.1:{container_ports()['admin']}", "/metrics")]
    assert (kept[0]["namespace"], kept[0]["pod"]) == ("mlpa", "mlpa-0")
    migration = MANIFESTS_BY_ID[("Job", "mlpa-migrate")]["spec"]["template"]
    assert [relabel(t, job["relabel_configs"]) for t in pod_targets(migration)] == [None]


def test_promtool_accepts_the_scrape_job(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: the prometheus package)")
    done = subprocess.run([promtool, "check", "config", str(SCRAPE_CONFIG)], capture_output=True, text=True, timeout=60, check=False)
    if "field kubernetes_sd_configs not found" in done.stdout + done.stderr:
        pytest.skip("this promtool is built without Kubernetes discovery (Debian's is)")
    assert done.returncode == 0, done.stdout + done.stderr
