"""The deployment files agree with each other, with docs/reference.md §3/§10 and with the code.

Static checks, no services: compose and the Kubernetes manifests use one image
and one set of environment variables, start in order, stop gracefully; every
metric an alert or a dashboard panel names is one the code registers.
"""

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
KUBERNETES_DIR = ROOT / "deploy" / "kubernetes"
SOURCES_EXAMPLE = ROOT / "deploy" / "sources.example.toml"
ALERTS_FILE = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD_FILE = ROOT / "deploy" / "grafana" / "webhook-ingest.json"

IMAGE = "webhook-ingest:latest"
SPEC_VARIABLES = {
    "AMQP_URL",
    "REDIS_URLS",
    "DATABASE_URL",
    "WEBHOOK_INGEST_NAMESPACE",
    "WEBHOOK_INGEST_SOURCES",
    "WEBHOOK_INGEST_ADMIN_TOKEN",
    "LOG_FORMAT",
}
PROVIDER_SECRETS = {
    "STRIPE_WEBHOOK_SECRET",
    "GITHUB_WEBHOOK_SECRET",
    "SHOPIFY_WEBHOOK_SECRET",
    "PAYSTACK_SECRET_KEY",
    "STANDARD_WEBHOOKS_SECRET",
    "HMAC_WEBHOOK_SECRET",
}
SCHEMES = {"stripe", "github", "shopify", "paystack", "standard-webhooks", "hmac-sha256"}


# --- loading -------------------------------------------------------------


def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def kubernetes_documents() -> list[dict]:
    documents = []
    for path in sorted(KUBERNETES_DIR.glob("*.yaml")):
        documents += [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return documents


def manifests(kind: str) -> list[dict]:
    return [doc for doc in kubernetes_documents() if doc.get("kind") == kind]


def manifest(kind: str, name: str) -> dict:
    (found,) = [doc for doc in manifests(kind) if doc["metadata"]["name"] == name]
    return found


def pod_spec(workload: dict) -> dict:
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


def containers(workload: dict) -> list[dict]:
    spec = pod_spec(workload)
    return spec.get("initContainers", []) + spec["containers"]


def sources_example() -> dict:
    return tomllib.loads(SOURCES_EXAMPLE.read_text())["sources"]


# --- compose -------------------------------------------------------------


def test_compose_has_every_service():
    services = compose()["services"]
    expected = {"rabbitmq", "redis-1", "redis-2", "redis-3", "postgres", "migrate", "ingress", "worker"}
    assert expected <= set(services)


def test_compose_services_have_healthchecks_except_migrate():
    for name, service in compose()["services"].items():
        if name == "migrate":
            assert "healthcheck" not in service
            assert service["restart"] == "no"
        else:
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_compose_starts_in_order():
    services = compose()["services"]
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in ("ingress", "worker"):
        depends_on = services[name]["depends_on"]
        assert depends_on.pop("migrate") == {"condition": "service_completed_successfully"}
        assert depends_on, name
        for dependency, condition in depends_on.items():
            assert condition == {"condition": "service_healthy"}, f"{name} -> {dependency}"
            assert "healthcheck" in services[dependency]
    worker_needs = set(services["worker"]["depends_on"])
    assert {"rabbitmq", "redis-1", "redis-2", "redis-3", "postgres"} <= worker_needs


def test_compose_runs_the_spec_commands():
    services = compose()["services"]
    assert services["migrate"]["command"] == ["migrate"]
    assert services["ingress"]["command"] == ["ingress", "--host", "0.0.0.0", "--port", "8080", "--processes", "auto"]
    worker = services["worker"]
    assert worker["command"][0] == "worker"
    assert worker["deploy"]["replicas"] >= 2
    assert parse_duration(worker["stop_grace_period"]) > grace_seconds(worker["command"])


def test_compose_builds_one_image():
    services = compose()["services"]
    for name in ("migrate", "ingress", "worker"):
        assert services[name]["image"] == IMAGE
        assert services[name]["build"] == "."


def test_compose_redis_urls_name_the_three_masters():
    environment = compose()["services"]["worker"]["environment"]
    hosts = [url.split("//")[1].split(":")[0] for url in environment["REDIS_URLS"].split(",")]
    assert hosts == ["redis-1", "redis-2", "redis-3"]


def test_compose_mounts_the_example_sources_file_read_only():
    for name in ("ingress", "worker"):
        service = compose()["services"][name]
        target = service["environment"]["WEBHOOK_INGEST_SOURCES"]
        assert f"./deploy/sources.example.toml:{target}:ro" in service["volumes"]


def test_docker_compose_config_is_valid(tmp_path):
    try:
        version = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"docker compose plugin not installed: {exc}")
    if version.returncode != 0:
        pytest.skip(
            f"docker compose plugin not installed: {(version.stderr or version.stdout).strip().splitlines()[0]}"
        )
    result = subprocess.run(
        ["docker", "compose", "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "WEBHOOK_INGEST_ADMIN_TOKEN": "test-token-of-the-deploy-files-0123456789",
        },
    )
    assert result.returncode == 0, result.stderr


# --- Kubernetes ----------------------------------------------------------


def test_every_manifest_is_listed_in_the_kustomization():
    (kustomization,) = yaml.safe_load_all((KUBERNETES_DIR / "kustomization.yaml").read_text())
    files = {path.name for path in KUBERNETES_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)


def test_every_manifest_names_api_version_kind_and_name():
    documents = kubernetes_documents()
    assert len(documents) >= 9
    for document in documents:
        assert document.get("apiVersion"), document
        assert document.get("kind"), document
        assert document.get("metadata", {}).get("name"), document
        assert "namespace" not in document["metadata"], "manifests are namespace-agnostic"


def test_every_container_runs_the_compose_image():
    workloads = [doc for doc in kubernetes_documents() if doc["kind"] in {"Deployment", "Job", "CronJob"}]
    assert {doc["metadata"]["name"] for doc in workloads} >= {
        "webhook-ingest-ingress",
        "webhook-ingest-worker",
        "webhook-ingest-migrate",
    }
    for workload in workloads:
        for container in containers(workload):
            assert container["image"] == IMAGE == compose()["services"]["worker"]["image"]


def test_deployments_run_the_same_commands_as_compose():
    services = compose()["services"]
    (ingress,) = containers(manifest("Deployment", "webhook-ingest-ingress"))
    (worker,) = containers(manifest("Deployment", "webhook-ingest-worker"))
    (migrate,) = containers(manifest("Job", "webhook-ingest-migrate"))
    assert ingress["args"] == services["ingress"]["command"]
    assert worker["args"] == services["worker"]["command"]
    assert migrate["args"] == services["migrate"]["command"]


def test_worker_termination_grace_exceeds_its_grace_seconds():
    deployment = manifest("Deployment", "webhook-ingest-worker")
    (worker,) = containers(deployment)
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] > grace_seconds(worker["args"])


def test_probes_use_the_health_endpoints():
    (ingress,) = containers(manifest("Deployment", "webhook-ingest-ingress"))
    (worker,) = containers(manifest("Deployment", "webhook-ingest-worker"))
    assert worker["args"][worker["args"].index("--metrics-port") + 1] == "9100"
    for container, port in ((ingress, 8080), (worker, 9100)):
        assert probe_target(container, "readinessProbe") == ("/readyz", port)
        assert probe_target(container, "livenessProbe") == ("/healthz", port)
    assert worker["resources"]["requests"] and worker["resources"]["limits"]


def test_services_and_budgets_select_the_ingress_pods():
    pod_labels = manifest("Deployment", "webhook-ingest-ingress")["spec"]["template"]["metadata"]["labels"]
    service = manifest("Service", "webhook-ingest")
    budget = manifest("PodDisruptionBudget", "webhook-ingest-ingress")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_scaled_object_targets_the_worker_and_the_main_queue():
    scaled = manifest("ScaledObject", "webhook-ingest-worker")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "webhook-ingest-worker"
    (trigger,) = scaled["spec"]["triggers"]
    namespace = compose()["services"]["worker"]["environment"]["WEBHOOK_INGEST_NAMESPACE"]
    assert trigger["type"] == "rabbitmq"
    assert trigger["metadata"]["queueName"] == f"{namespace}.events"
    authentication = manifest("TriggerAuthentication", trigger["authenticationRef"]["name"])
    (reference,) = authentication["spec"]["secretTargetRef"]
    assert reference["key"] in secret_keys(reference["name"])


def test_configmap_carries_the_example_sources_file():
    data = manifest("ConfigMap", "webhook-ingest-sources")["data"]
    assert tomllib.loads(data["sources.toml"]) == tomllib.loads(SOURCES_EXAMPLE.read_text())


def test_workloads_refer_to_existing_configmaps_and_secrets():
    for workload in manifests("Deployment") + manifests("Job"):
        for container in containers(workload):
            for source in container.get("envFrom", []):
                assert secret_keys(source["secretRef"]["name"])
        for volume in pod_spec(workload).get("volumes", []):
            if "configMap" in volume:
                assert manifest("ConfigMap", volume["configMap"]["name"])


# --- environment variables -----------------------------------------------


def test_compose_and_kubernetes_use_the_same_environment_variables():
    services = compose()["services"]
    compose_sets = {name: set(services[name]["environment"]) for name in ("ingress", "worker")}
    kubernetes_sets = {
        name: container_variables(manifest("Deployment", name))
        for name in ("webhook-ingest-ingress", "webhook-ingest-worker")
    }
    expected = compose_sets["worker"]
    assert all(names == expected for names in compose_sets.values()), compose_sets
    assert all(names == expected for names in kubernetes_sets.values()), kubernetes_sets
    assert SPEC_VARIABLES <= expected


def test_every_environment_variable_is_a_spec_variable_or_a_provider_secret():
    names = set(compose()["services"]["worker"]["environment"])
    for workload in manifests("Deployment") + manifests("Job"):
        names |= container_variables(workload)
    assert names <= SPEC_VARIABLES | PROVIDER_SECRETS, names - SPEC_VARIABLES - PROVIDER_SECRETS


def test_provider_secrets_are_the_ones_the_sources_file_reads():
    referenced = {
        secret.removeprefix("env:")
        for source in sources_example().values()
        for secret in source["secrets"]
        if secret.startswith("env:")
    }
    assert referenced == PROVIDER_SECRETS
    assert referenced <= set(compose()["services"]["worker"]["environment"])
    assert referenced <= secret_keys("webhook-ingest-secrets")


def container_variables(workload: dict) -> set[str]:
    names = set()
    for container in containers(workload):
        names |= {variable["name"] for variable in container.get("env", [])}
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                names |= secret_keys(source["secretRef"]["name"])
            if "configMapRef" in source:
                names |= set(manifest("ConfigMap", source["configMapRef"]["name"])["data"])
    return names


def secret_keys(name: str) -> set[str]:
    secret = manifest("Secret", name)
    return set(secret.get("stringData", {})) | set(secret.get("data", {}))


# --- sources file --------------------------------------------------------


def test_sources_example_has_one_source_per_scheme():
    sources = sources_example()
    for name, source in sources.items():
        assert source["scheme"] in SCHEMES, name
        assert isinstance(source["secrets"], list) and source["secrets"], name
        assert source["handler"], name
    assert {source["scheme"] for source in sources.values()} == SCHEMES


# --- metrics in alerts and dashboards ------------------------------------

PROMQL_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
}


def registered_metric_names() -> set[str]:
    """Every series name the code's registry can expose."""
    import prometheus_client

    import webhook_ingest.shared.observability.metrics  # noqa: F401  (registers the metrics)

    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("_sum", "_count", "_created"),
        "gauge": ("",),
    }
    names = set()
    for metric in prometheus_client.REGISTRY.collect():
        names.add(metric.name)
        names |= {metric.name + suffix for suffix in suffixes.get(metric.type, ())}
        names |= {sample.name for sample in metric.samples}
    return names


def metric_names_in(expression: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions,
    keywords, label names or durations."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expression)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    identifiers = re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", text)
    return {m.group(1) for m in identifiers if not m.group(2) and m.group(1).lower() not in PROMQL_KEYWORDS}


def test_metric_name_extraction():
    expression = (
        'histogram_quantile(0.99, sum by (le, source) (rate(x_bucket{status=~"5..", a="b(c)"}[5m])))'
        " / on (source) group_left y_total > bool 0.5 or vector(0)"
    )
    assert metric_names_in(expression) == {"x_bucket", "y_total"}


def alert_expressions() -> list[tuple[str, str]]:
    document = yaml.safe_load(ALERTS_FILE.read_text())
    return [(rule["alert"], rule["expr"]) for group in document["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    expressions = [
        (panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        match = re.match(r"label_values\((\w+)", query or "")
        if match:
            expressions.append((f"${variable['name']}", match.group(1)))
    return expressions


@pytest.mark.parametrize("where, expressions", [("alerts", alert_expressions), ("dashboard", dashboard_expressions)])
def test_every_referenced_metric_is_registered(where, expressions):
    registered = registered_metric_names()
    listed = expressions()
    assert listed, where
    for title, expression in listed:
        names = metric_names_in(expression)
        assert names, f"{where} {title}: no metric in {expression!r}"
        assert names <= registered, f"{where} {title}: unknown {sorted(names - registered)}"


def test_alerts_carry_for_severity_and_runbook():
    document = yaml.safe_load(ALERTS_FILE.read_text())
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    text = " ".join(rule["expr"] for rule in rules)
    for metric in (
        "webhook_ingress_requests_total",
        "webhook_dead_letters_open",
        "webhook_processing_duration_seconds_bucket",
        "webhook_idempotency_degraded",
    ):
        assert metric in text
    for rule in rules:
        assert rule["labels"]["severity"] in {"page", "ticket", "info"}, rule["alert"]
        assert "docs/oncall.md" in rule["annotations"]["runbook_url"], rule["alert"]
        assert rule["annotations"]["description"], rule["alert"]
        if rule["labels"]["severity"] != "info":
            assert parse_duration(rule["for"]) > 0, rule["alert"]


def test_dashboard_has_the_operator_panels():
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    every_expression = " ".join(expression for _, expression in dashboard_expressions())
    for metric in (
        "webhook_ingress_requests_total",
        "webhook_ingress_request_duration_seconds_bucket",
        "webhook_events_total",
        "webhook_processing_duration_seconds_bucket",
        "webhook_dead_letters_open",
        "webhook_idempotency_degraded",
        "webhook_idempotency_store_errors_total",
    ):
        assert metric in every_expression


# --- helpers -------------------------------------------------------------


def grace_seconds(arguments: list[str]) -> float:
    return float(arguments[arguments.index("--grace-seconds") + 1])


def parse_duration(text: str | int) -> float:
    """'45s', '1m30s', '5m', 45 -> seconds."""
    if isinstance(text, int | float):
        return float(text)
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"bad duration {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def probe_target(container: dict, probe: str) -> tuple[str, int]:
    get = container[probe]["httpGet"]
    port = get["port"]
    if isinstance(port, str):
        (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return get["path"], port
