"""The deployment files in docs/deploy/ hold to contend itself: their command lines parse with
contend's own CLI parser, each stop timeout outlasts the ``--grace`` its command gives, the
nginx location and upstream are the dashboard's ``--root-path`` and port, and every excerpt
docs/how-to.md shows of them is in them."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from contend.cli.main import build_parser
from contend.dashboard import check_root_path

DOCS = Path(__file__).parents[2] / "docs"
DEPLOY = DOCS / "deploy"
HOWTO = DOCS / "how-to.md"


def unit_file(name: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit: section -> key -> its values, in order (a key may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate((DEPLOY / name).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, eq, value = line.partition("=")
        assert eq and current is not None, f"{name}:{number}: not a key=value line: {raw!r}"
        assert not raw.endswith("\\"), f"{name}:{number}: keep the command on one line"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def contend_args(argv: list[str], what: str) -> argparse.Namespace:
    """*argv* (``…/contend`` then its arguments), parsed by contend's own parser."""
    assert argv and Path(argv[0]).name == "contend", f"{what} does not run contend: {argv}"
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"contend's parser refuses {what}: {argv[1:]}")


def seconds(value: str) -> float:
    """A systemd time span: ``60``, ``90s``, ``2min``, ``1min 30s``."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    assert parts and "".join(n + u for n, u in parts) == value.replace(" ", ""), value
    return sum(float(n) * units[u] for n, u in parts)


def test_the_unit_runs_supervise_and_outlasts_its_grace() -> None:
    unit = unit_file("contend.service")
    service = unit["Service"]
    (exec_start,) = service["ExecStart"]
    args = contend_args(shlex.split(exec_start), "ExecStart")
    assert args.command == "supervise" and args.experts >= 1
    assert args.grace is not None and args.grace > 0
    (stop,) = service["TimeoutStopSec"]
    assert seconds(stop) > args.grace + 10, (stop, args.grace)
    assert service["KillSignal"] == ["SIGTERM"]
    # only the supervisor gets the SIGTERM: an expert signalled by systemd too gets two, and a
    # second one skips the grace
    assert service["KillMode"] == ["mixed"]
    assert service["Restart"] == ["on-failure"]
    (user,) = service["User"]
    assert user not in ("root", "0")
    (env_file,) = service["EnvironmentFile"]
    assert env_file.startswith("/etc/")
    assert args.store is None, "the store's URL belongs in the EnvironmentFile (CONTEND_STORE)"
    (pre,) = service["ExecStartPre"]
    assert contend_args(shlex.split(pre), "ExecStartPre").command == "migrate"
    # hardening that would break the stores is absent, what keeps them working is there
    assert "MemoryDenyWriteExecute" not in service
    assert service["ProtectSystem"] == ["strict"]
    assert "/var/lib/contend" in service["ReadWritePaths"][0].split()
    families = service["RestrictAddressFamilies"][0].split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def dashboard_args() -> argparse.Namespace:
    (exec_start,) = unit_file("contend-dashboard.service")["Service"]["ExecStart"]
    args = contend_args(shlex.split(exec_start), "the dashboard's ExecStart")
    assert args.command == "dashboard"
    return args


def test_the_dashboard_unit_keeps_its_token_out_of_the_command_line() -> None:
    args = dashboard_args()
    assert args.token is None and args.host == "127.0.0.1"
    assert unit_file("contend-dashboard.service")["Service"]["EnvironmentFile"]


def k8s() -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all((DEPLOY / "k8s.yaml").read_text()))
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs) == 2, [d["kind"] for d in docs]
    return by_kind


def test_the_deployment_runs_one_supervisor_per_pod_and_outlasts_its_grace() -> None:
    deployment = k8s()["Deployment"]
    assert deployment["apiVersion"] == "apps/v1"
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = contend_args(container["command"], "the container's command")
    assert args.command == "supervise" and args.grace is not None
    assert pod["terminationGracePeriodSeconds"] > args.grace + 10
    hook = container.get("lifecycle", {}).get("preStop")
    assert hook is None, "a preStop hook's time counts against the grace period: say why it is"
    env = {e["name"]: e for e in container["env"]}
    assert env["CONTEND_STORE"]["valueFrom"]["secretKeyRef"] == {
        "name": "contend-store",
        "key": "url",
    }
    assert args.store is None, "the store's URL comes from the Secret"
    if args.name is not None and "$(" in args.name:  # Kubernetes expands $(VAR) from env
        assert args.name.removeprefix("$(").removesuffix(")") in env
    requests = container["resources"]["requests"]
    assert requests.get("cpu") and requests.get("memory")
    (init,) = pod["initContainers"]
    assert contend_args(init["command"], "the init container's command").command == "migrate"
    assert init["image"] == container["image"]
    assert init["env"][0] == env["CONTEND_STORE"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_disruption_budget_covers_the_deployment_s_pods() -> None:
    by_kind = k8s()
    pdb, deployment = by_kind["PodDisruptionBudget"], by_kind["Deployment"]
    assert pdb["apiVersion"] == "policy/v1"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"].get("maxUnavailable", 0) >= 1 or (
        pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    )


def test_nginx_serves_the_dashboard_s_root_path_from_its_port() -> None:
    args = dashboard_args()
    root = check_root_path(args.root_path, "--root-path")
    assert root, "the dashboard unit gives no --root-path"
    text = re.sub(r"#.*", "", (DEPLOY / "nginx.conf").read_text())
    locations = re.findall(r"location\s+(\S+)\s*\{([^}]*)\}", text)
    assert [loc for loc, _ in locations] == [root + "/"]
    body = locations[0][1]
    # with a URI part, nginx replaces the location's prefix with it: /contend/tasks -> /tasks
    assert re.findall(r"proxy_pass\s+(\S+);", body) == [f"http://{args.host}:{args.port}/"]
    assert re.search(r"proxy_set_header\s+Host\s+\$(host|http_host);", body)
    # every --root-path the docs give is this one
    for doc in (HOWTO, DOCS / "dashboard.md", *DEPLOY.iterdir()):
        for given in re.findall(r"--root-path[ =](\S+)", doc.read_text()):
            given = given.strip("`\"',)")
            if given != "PREFIX":
                assert check_root_path(given) == root, f"{doc.name} uses --root-path {given}"


def excerpts() -> list[tuple[str, list[str]]]:
    """The how-to's code blocks whose first line is ``# from deploy/NAME``: (NAME, lines)."""
    blocks = re.findall(r"```\w*\n# from deploy/(\S+)\n(.*?)```", HOWTO.read_text(), re.S)
    return [(name, body.splitlines()) for name, body in blocks]


def bare(line: str) -> str:
    """A line without its indentation and trailing comment."""
    return re.sub(r"\s+#\s.*$", "", line).strip()


def test_the_how_to_s_excerpts_are_in_the_files() -> None:
    found = excerpts()
    assert {name for name, _ in found} >= {
        "contend.service",
        "k8s.yaml",
        "nginx.conf",
        "contend-dashboard.service",
    }
    for name, lines in found:
        real = {bare(line) for line in (DEPLOY / name).read_text().splitlines()}
        missing = [line for line in lines if bare(line) and bare(line) not in real]
        assert not missing, f"docs/how-to.md shows lines that deploy/{name} lacks: {missing}"


def test_the_how_to_links_the_files_and_pgbouncer() -> None:
    text = HOWTO.read_text()
    for name in ("contend.service", "contend-dashboard.service", "k8s.yaml", "nginx.conf"):
        assert f"(deploy/{name})" in text, name
    assert "(postgres.md#behind-pgbouncer)" in text
    assert "## Behind PgBouncer" in (DOCS / "postgres.md").read_text()
