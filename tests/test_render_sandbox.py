"""The render sandbox (docs/safety.md, threat model): a render has a bounded memory, no network,
and reads nothing but the checkout -- whatever a commit puts in a kustomization or a chart."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config.types import HelmSettings
from agent.errors import RenderError, RenderLimit
from agent.model import DecryptFault
from agent.render.binaries import tool
from agent.render.kustomize import Graph, check_kustomization, kustomize_build
from agent.render.limits import ChildBudget, bounded_runner
from agent.render.process import RunResult, run_subprocess
from agent.render.renderer import RenderCache, RenderSpec, render
from agent.render.sops import AgeKeys
from agent.render.sops_guard import foreign_key_services
from tests.leakkit import SECRET, SecretServer
from tests.sopskit import age_key, encrypt

MiB = 1 << 20
LIMIT = 512 * MiB
#: Each level holds nine of the one before: the last expands to 9**9 strings.
ALIAS_BOMB = "\n".join(
    [
        "apiVersion: v1",
        "kind: ConfigMap",
        "metadata: {name: bomb}",
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{n}: &{n} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]"
            for p, n in zip("abcdefgh", "bcdefghi", strict=True)
        ),
        "data: {x: *i}",
        "",
    ]
)


class Spy:
    """The real bounded runner, keeping what each child did."""

    def __init__(self, memory: int = LIMIT) -> None:
        self.inner = bounded_runner(memory)
        self.results: list[RunResult] = []

    def __call__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        timeout: float,
        max_output: int,
        stdin: bytes | None = None,
        then: Sequence[str] | None = None,
    ) -> RunResult:
        res = self.inner(
            argv, cwd=cwd, env=env, timeout=timeout, max_output=max_output, stdin=stdin, then=then
        )
        self.results.append(res)
        return res


@pytest.fixture
def secret_server() -> Iterator[SecretServer]:
    server = SecretServer()
    yield server
    server.close()


def write(root: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


# -- memory -------------------------------------------------------------------------------------


def test_the_subprocess_runner_stops_a_child_at_its_memory_limit_and_says_so(tmp_path: Path) -> None:
    hog = "b = bytearray(1 << 30); print(len(b))"
    res = run_subprocess(
        [sys.executable, "-c", hog], cwd=tmp_path, env={}, timeout=30, max_output=1024, memory=256 * MiB
    )
    assert res.out_of_memory and res.returncode != 0
    assert 0 < res.peak_rss <= 256 * MiB
    # A child within its limit is not out of memory: the flag is the limit's, not the program's.
    small = run_subprocess(
        [sys.executable, "-c", "print(1)"],
        cwd=tmp_path,
        env={},
        timeout=30,
        max_output=1024,
        memory=256 * MiB,
    )
    assert not small.out_of_memory and small.returncode == 0 and 0 < small.peak_rss < 256 * MiB


def test_a_limited_child_starts_at_once_and_runs_under_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``preexec_fn`` (CPython forks for one, copying the agent's page tables) and no launcher
    program: the limit is set with prlimit(2) as the child starts, on both commands of a pipe."""
    started: list[tuple[list[str], object]] = []
    popen = subprocess.Popen

    def spy(args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        started.append((args, kw.get("preexec_fn")))
        return popen(args, **kw)

    monkeypatch.setattr(subprocess, "Popen", spy)
    show = "import resource as r, sys; sys.stdout.write(sys.stdin.read() + str(r.getrlimit(r.RLIMIT_DATA)))"
    first = [sys.executable, "-c", show]
    res = run_subprocess(
        first, cwd=tmp_path, env={}, timeout=30, max_output=1024, memory=256 * MiB, then=first
    )
    limit = f"({256 * MiB}, {256 * MiB})"
    assert res.returncode == 0 and res.stdout.decode() == limit * 2  # the second read the first's output
    assert started == [(first, None), (first, None)]


def test_a_limited_child_runs_gos_collector_for_a_short_run_under_its_bound(tmp_path: Path) -> None:
    show = "import os; print(os.environ.get('GOGC'), os.environ.get('GOMEMLIMIT'), os.environ.get('X'))"
    argv = [sys.executable, "-c", show]
    bounded = {"cwd": tmp_path, "timeout": 30, "max_output": 1024, "memory": 256 * MiB}
    limited = run_subprocess(argv, env={"X": "1"}, **bounded)
    assert limited.stdout.decode().split() == ["400", str(int(256 * MiB * 0.8)), "1"]
    own = run_subprocess(argv, env={"GOGC": "50"}, **bounded)
    assert own.stdout.decode().split()[0] == "50"  # what the caller sets is kept
    unlimited = run_subprocess(argv, cwd=tmp_path, env={}, timeout=30, max_output=1024)
    assert unlimited.stdout.decode().split() == ["None", "None", "None"]


@pytest.mark.parametrize(
    ("stderr", "out_of_memory"),
    [
        ("SIGSEGV: segmentation violation PC=0x43725d m=3 sigcode=1 addr=0x0\n", True),
        (
            "panic: runtime error: invalid memory address or nil pointer dereference\n"
            "[signal SIGSEGV: segmentation violation code=0x1 addr=0x0 pc=0x1]\n",
            False,
        ),
    ],
    ids=["a fault in Go's runtime", "the program's own nil dereference"],
)
def test_a_limited_go_child_faulting_in_its_runtime_ran_out_of_memory(
    tmp_path: Path, stderr: str, out_of_memory: bool
) -> None:
    """Go's runtime faults when the kernel refuses one large allocation (Helm's ``repeat``)."""
    crash = [sys.executable, "-c", f"import sys; sys.stderr.write({stderr!r}); sys.exit(2)"]
    res = run_subprocess(crash, cwd=tmp_path, env={}, timeout=30, max_output=1024, memory=256 * MiB)
    assert (res.returncode, res.out_of_memory) == (2, out_of_memory)


def test_a_pipe_fails_with_its_first_command_and_stops_both_at_the_deadline(tmp_path: Path) -> None:
    fail = [sys.executable, "-c", "import sys; print('partial'); sys.exit('first broke')"]
    res = run_subprocess(fail, cwd=tmp_path, env={}, timeout=30, max_output=1024, then=["cat"])
    assert (res.returncode, res.stdout) == (1, b"partial\n") and b"first broke" in res.stderr
    hang = [sys.executable, "-c", "import time; time.sleep(60)"]
    start = time.monotonic()
    res = run_subprocess(hang, cwd=tmp_path, env={}, timeout=0.5, max_output=1024, then=hang)
    assert res.timed_out and time.monotonic() - start < 10


#: How Go maps a large allocation: a writable mapping laid over a reserved range, which the kernel
#: does not count against RLIMIT_DATA; then every page touched.
MAP_OVER_RESERVED = """
import ctypes as c
libc = c.CDLL(None, use_errno=True)
libc.mmap.restype = c.c_void_p
libc.mmap.argtypes = [c.c_void_p, c.c_size_t, c.c_int, c.c_int, c.c_int, c.c_long]
n = 900 << 20
reserved = libc.mmap(None, n, 0, 0x22 | 0x4000, -1, 0)
mapped = libc.mmap(reserved, n, 3, 0x22 | 0x10, -1, 0)
assert mapped == reserved, c.get_errno()
c.memset(mapped, 1, n)
print("filled")
"""


def test_a_child_passing_its_limit_through_a_mapping_the_kernel_does_not_count_is_killed(
    tmp_path: Path,
) -> None:
    res = run_subprocess(
        [sys.executable, "-c", MAP_OVER_RESERVED],
        cwd=tmp_path,
        env={},
        timeout=30,
        max_output=1024,
        memory=LIMIT,
    )
    assert res.out_of_memory and res.stdout == b"" and res.returncode == -9
    assert 0 < res.peak_rss <= LIMIT


def test_a_yaml_alias_bomb_through_a_kustomization_fails_the_render_within_the_memory_limit(
    tmp_path: Path,
) -> None:
    tool("krender")
    write(tmp_path, {"app/kustomization.yaml": "resources:\n  - bomb.yaml\n", "app/bomb.yaml": ALIAS_BOMB})
    spy = Spy()
    with pytest.raises(RenderError) as caught:
        render(tmp_path, RenderSpec("c", ("app",)), runner=spy)
    ((problem,),) = [caught.value.problems]
    assert problem.limit is RenderLimit.MEMORY and problem.file == "app"
    assert "kustomize build app ran out of memory at the render limit (render_memory)" in problem.message
    (res,) = spy.results
    print(f"alias bomb: peak {res.peak_rss / MiB:.0f} MiB under a limit of {LIMIT / MiB:.0f} MiB")
    assert 0 < res.peak_rss <= LIMIT


def test_a_helm_template_with_repeat_fails_the_render_within_the_memory_limit(tmp_path: Path) -> None:
    tool("helm")
    write(
        tmp_path,
        {
            "chart/Chart.yaml": "apiVersion: v2\nname: big\nversion: 0.1.0\n",
            "chart/templates/cm.yaml": (
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\n"
                'data:\n  x: {{ repeat 900000000 "a" | quote }}\n'
            ),
        },
    )
    spy = Spy()
    with pytest.raises(RenderError) as caught:
        render(tmp_path, RenderSpec("c", ("chart",)), runner=spy)
    (problem,) = caught.value.problems
    assert problem.limit is RenderLimit.MEMORY and problem.file == "chart/Chart.yaml"
    (res,) = spy.results
    print(f"helm repeat: peak {res.peak_rss / MiB:.0f} MiB under a limit of {LIMIT / MiB:.0f} MiB")
    assert 0 < res.peak_rss <= LIMIT


@pytest.mark.parametrize(
    ("limits", "message", "file"),
    [
        ({"max_file_bytes": 1000}, "file is 2000 bytes, over the limit of 1000", "chart/templates/big.yaml"),
        ({"max_output_bytes": 3000}, "files this render reads exceed the limit of 3000", "values/prod.yaml"),
    ],
)
def test_what_helm_would_read_is_bounded_like_plain_files(
    tmp_path: Path, limits: dict[str, int], message: str, file: str
) -> None:
    pad = "#" * 1999 + "\n"
    write(
        tmp_path,
        {
            "chart/Chart.yaml": "apiVersion: v2\nname: c\nversion: 0.1.0\n",
            "chart/templates/big.yaml": pad,
            "values/prod.yaml": pad,
        },
    )
    helm = HelmSettings(chart="chart", values_files=("values/prod.yaml",))
    spec = RenderSpec("c", ("chart",), helm=helm)
    with pytest.raises(RenderError) as caught:
        render(tmp_path, replace(spec, **limits), runner=Spy())
    (problem,) = caught.value.problems
    assert message in problem.message and problem.file == file


def test_a_revision_that_ran_out_of_memory_is_not_rendered_again_but_other_errors_are(tmp_path: Path) -> None:
    tool("krender")
    write(tmp_path, {"app/kustomization.yaml": "resources:\n  - bomb.yaml\n", "app/bomb.yaml": ALIAS_BOMB})
    write(tmp_path, {"broken/kustomization.yaml": "resources:\n  - missing-in-output.yaml\n"})
    write(tmp_path, {"broken/missing-in-output.yaml": "kind: [\n"})
    cache, spy = RenderCache(), Spy()
    for _ in range(2):
        with pytest.raises(RenderError, match="ran out of memory"):
            cache.render(tmp_path, RenderSpec("c", ("app",)), revision="r1", runner=spy)
    assert len(spy.results) == 1
    for _ in range(2):
        with pytest.raises(RenderError) as caught:
            cache.render(tmp_path, RenderSpec("c", ("broken",)), revision="r1", runner=spy)
        assert all(p.limit is None for p in caught.value.problems)
    assert len(spy.results) == 3


def test_render_children_wait_while_their_limits_and_the_agent_would_pass_the_container_limit() -> None:
    budget = ChildBudget(limit=1000, rss=lambda: 300)
    assert budget.fits(5000)  # alone, one child always runs: a render must be possible at all
    started = threading.Event()

    def second_child() -> None:
        with budget.hold(600):
            started.set()

    with budget.hold(600):
        # 300 (the agent) + 600 + 600 > 1000: a second such child waits; a smaller one fits.
        assert not budget.fits(600) and budget.fits(100)
        waiting = threading.Thread(target=second_child)
        waiting.start()
        assert not started.is_set()
    assert started.wait(10)  # the first one ended: the waiting child starts
    waiting.join()
    assert budget.fits(5000)


# -- network ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field",
    [
        "resources:\n  - {url}/status\n",
        "configMapGenerator:\n  - name: leak\n    files:\n      - {url}/status\n",
        "configMapGenerator:\n  - name: leak\n    files:\n      - token={url}/status\n",
        "configMapGenerator:\n  - name: leak\n    envs:\n      - {url}/status\n",
        "secretGenerator:\n  - name: leak\n    env: {url}/status\n",
        "patchesStrategicMerge:\n  - {url}/status\n",
        "patches:\n  - path: {url}/status\n",
        "patchesJson6902:\n  - path: {url}/status\n    target: {{kind: ConfigMap, name: x}}\n",
        "replacements:\n  - path: {url}/status\n",
        "openapi:\n  path: {url}/status\n",
        "configurations:\n  - {url}/status\n",
        "crds:\n  - {url}/status\n",
        "transformers:\n  - {url}/status\n",
        "generators:\n  - {url}/status\n",
        "validators:\n  - {url}/status\n",
        "components:\n  - {url}/status\n",
    ],
)
def test_every_kustomization_field_naming_a_url_is_refused_before_kustomize_runs(
    tmp_path: Path, secret_server: SecretServer, field: str
) -> None:
    write(tmp_path, {"app/kustomization.yaml": field.format(url=secret_server.url)})
    with pytest.raises(RenderError) as caught:
        render(tmp_path, RenderSpec("c", ("app",)))
    (problem,) = caught.value.problems
    assert "remote reference" in problem.message and "is refused" in problem.message
    assert problem.file == "app/kustomization.yaml" and problem.line is not None
    assert secret_server.requests == []


@pytest.mark.parametrize(
    "kustomization",
    [
        "configMapGenerator:\n  - name: leak\n    files:\n      - {url}/status\n",
        "resources:\n  - {url}/status\n",
        "resources:\n  - {url}/repo.git//app?ref=main\n",
    ],
)
def test_the_kustomize_sandbox_itself_sends_no_request_to_a_loopback_service(
    tmp_path: Path, secret_server: SecretServer, kustomization: str
) -> None:
    """Second wall: krender run without the field check (as if a kustomize release added a field)."""
    app = write(tmp_path, {"app/kustomization.yaml": kustomization.format(url=secret_server.url)}) / "app"
    graph = Graph(mounted_dirs={app})
    out = kustomize_build(
        tool("krender"), app, tmp_path, graph, timeout=30, max_output=MiB, max_file=MiB, runner=run_subprocess
    )
    (problem,) = out.problems
    assert "failed (exit 1)" in problem.message and SECRET not in problem.message and out.text == ""
    assert secret_server.requests == []


# -- the checkout, and nothing else -------------------------------------------------------------


def test_kustomize_reads_files_anywhere_in_the_checkout(tmp_path: Path) -> None:
    tool("krender")
    write(
        tmp_path,
        {
            "dashboards/x.json": '{"panels": []}\n',
            "base/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\n",
            "apps/web/kustomization.yaml": (
                "resources:\n  - ../../base/cm.yaml\n"
                "configMapGenerator:\n  - name: dashboards\n    files:\n      - ../../dashboards/x.json\n"
                "generatorOptions:\n  disableNameSuffixHash: true\n"
            ),
        },
    )
    objects = {o.key.name: o.manifest for o in render(tmp_path, RenderSpec("c", ("apps/web",))).objects}
    assert objects["dashboards"]["data"] == {"x.json": '{"panels": []}\n'}
    assert set(objects) == {"dashboards", "shared"}


@pytest.mark.parametrize(
    "field",
    [
        "resources:\n  - ../../outside.yaml\n",
        "configMapGenerator:\n  - name: leak\n    files:\n      - ../../outside.yaml\n",
        "configMapGenerator:\n  - name: leak\n    files:\n      - k=/etc/passwd\n",
        "secretGenerator:\n  - name: leak\n    envs:\n      - ../../outside.yaml\n",
        "patches:\n  - path: ../../outside.yaml\n",
        "openapi:\n  path: /etc/passwd\n",
        "replacements:\n  - path: ../../outside.yaml\n",
    ],
)
def test_a_path_leaving_the_checkout_is_refused_with_its_line(tmp_path: Path, field: str) -> None:
    (tmp_path / "outside.yaml").write_text(f"token: {SECRET}\n")
    repo = write(tmp_path / "repo", {"app/kustomization.yaml": "# an app\n" + field})
    with pytest.raises(RenderError) as caught:
        render(repo, RenderSpec("c", ("app",)))
    (problem,) = caught.value.problems
    assert "leaves the repository" in problem.message and SECRET not in str(caught.value)
    assert (problem.file, problem.line) == ("app/kustomization.yaml", 1 + field.count("\n"))


def test_the_kustomize_sandbox_cannot_read_a_file_outside_the_checkout_even_when_asked(
    tmp_path: Path,
) -> None:
    (tmp_path / "outside.txt").write_text(SECRET)
    repo = tmp_path / "repo"
    generator = "configMapGenerator:\n  - name: leak\n    files:\n      - ../../outside.txt\n"
    app = write(repo, {"app/kustomization.yaml": generator}) / "app"
    graph = Graph(mounted_dirs={app}, mounted_files={tmp_path / "outside.txt"})
    out = kustomize_build(
        tool("krender"), app, repo, graph, timeout=30, max_output=MiB, max_file=MiB, runner=run_subprocess
    )
    (problem,) = out.problems
    assert "failed (exit 1)" in problem.message and SECRET not in problem.message and out.text == ""


def test_the_check_records_what_the_build_may_read(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "base/kustomization.yaml": "resources:\n  - cm.yaml\n",
            "base/cm.yaml": "kind: ConfigMap\n",
            "env/app.env": "A=1\n",
            "app/kustomization.yaml": (
                "resources:\n  - ../base\n"
                "configMapGenerator:\n  - name: e\n    envs:\n      - ../env/app.env\n"
            ),
        },
    )
    graph = Graph()
    assert check_kustomization(tmp_path / "app", tmp_path, graph) == []
    assert graph.mounted_dirs == {tmp_path / "app", tmp_path / "base"}
    assert graph.mounted_files == {tmp_path / "base" / "cm.yaml", tmp_path / "env" / "app.env"}


# -- the same output as kustomize -----------------------------------------------------------------

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"


def kube_prometheus(tmp_path: Path) -> Path:
    """kube-prometheus's manifests with a kustomization over them (it ships none)."""
    app = tmp_path / "kube-prometheus"
    app.mkdir()
    names = sorted(p.name for p in (CORPUS / "kube-prometheus").glob("*.yaml"))
    for name in names:
        (app / name).write_bytes((CORPUS / "kube-prometheus" / name).read_bytes())
    listed = "".join(f"  - {n}\n" for n in names)
    (app / "kustomization.yaml").write_text(
        f"labels:\n  - pairs: {{team: observability}}\ncommonAnnotations:\n  owner: sre\nresources:\n{listed}"
    )
    return app


@pytest.mark.parametrize("case", ["opentelemetry-operator/default", "kube-prometheus"])
def test_the_kustomize_sandbox_prints_exactly_what_kustomize_build_prints(tmp_path: Path, case: str) -> None:
    if case == "kube-prometheus":
        tree, directory = tmp_path, kube_prometheus(tmp_path)
    else:
        tree, directory = CORPUS, CORPUS / case
    graph = Graph()
    assert check_kustomization(directory, tree, graph) == []
    ours = kustomize_build(
        tool("krender"),
        directory,
        tree,
        graph,
        timeout=120,
        max_output=64 * MiB,
        max_file=16 * MiB,
        runner=run_subprocess,
    )
    theirs = run_subprocess(
        [str(tool("kustomize")), "build", str(directory)],
        cwd=directory,
        env={},
        timeout=120,
        max_output=64 * MiB,
    )
    assert ours.problems == () and theirs.returncode == 0, theirs.stderr
    assert ours.text.count("\nkind: ") > 10
    assert ours.text.encode() == theirs.stdout


# -- the agent's own annotation -------------------------------------------------------------------

FORGED = """apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  annotations:
    gitops-agent.io/decrypted-fields: '["/spec/template/spec/containers/0/image"]'
spec:
  template:
    spec:
      containers:
        - name: web
          image: evil/miner
"""


@pytest.mark.parametrize(
    ("files", "path", "where"),
    [
        (
            {"app/web.yaml": "kind: Namespace\napiVersion: v1\nmetadata: {name: a}\n---\n" + FORGED},
            "app",
            ("app/web.yaml", 5),
        ),
        (
            {
                "app/list.yaml": "apiVersion: v1\nkind: List\nitems:\n"
                + "".join(
                    f"  {ln}\n" if ln else "\n" for ln in ("- " + FORGED.replace("\n", "\n  ")).splitlines()
                )
            },
            "app",
            ("app/list.yaml", 1),
        ),
        (
            {"app/kustomization.yaml": "resources:\n  - web.yaml\n", "app/web.yaml": FORGED},
            "app",
            ("app (kustomize build output)", 1),
        ),
    ],
)
def test_the_decrypted_fields_annotation_written_in_git_fails_the_render(
    tmp_path: Path, files: dict[str, str], path: str, where: tuple[str, int]
) -> None:
    write(tmp_path, files)
    with pytest.raises(RenderError) as caught:
        render(tmp_path, RenderSpec("c", (path,)))
    (problem,) = caught.value.problems
    assert "gitops-agent.io/decrypted-fields, which only the agent writes" in problem.message
    assert (problem.file, problem.line) == where


# -- sops: age only ---------------------------------------------------------------------------------

SECRET_YAML = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n  password: hunter2\n"


def with_vault(encrypted: str, address: str, *, in_group: bool) -> str:
    """``encrypted`` with a Vault master key added to its metadata, as a hostile commit could."""
    doc = yaml.safe_load(encrypted)
    vault = [
        {
            "vault_address": address,
            "engine_path": "sops",
            "key_name": "k",
            "created_at": "2026-01-01T00:00:00Z",
            "enc": "vault:v1:AAAA",
        }
    ]
    if in_group:
        doc["sops"]["key_groups"] = [{"age": doc["sops"].pop("age"), "hc_vault": vault}]
    else:
        doc["sops"]["hc_vault"] = vault
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.mark.parametrize("in_group", [False, True])
def test_sops_reaches_no_key_service_but_age_even_when_a_file_names_a_loopback_vault(
    tmp_path: Path, secret_server: SecretServer, in_group: bool
) -> None:
    tool("sops")
    owner, app_key = age_key(), age_key()  # the app's key does not open the file: sops would try on
    text = with_vault(encrypt(SECRET_YAML, owner.recipient), secret_server.url, in_group=in_group)
    write(tmp_path, {"app/secret.yaml": text})
    keys = AgeKeys(app_key.identity + "\n", ("test key",))
    with pytest.raises(RenderError) as caught:
        render(tmp_path, RenderSpec("c", ("app",), keys=keys))
    (problem,) = caught.value.problems
    assert problem.fault is DecryptFault.KEY_SERVICE and problem.file == "app/secret.yaml"
    assert "names key services other than age (hc_vault)" in problem.message
    assert secret_server.requests == []


def test_the_key_services_of_a_dotenv_file_are_read_from_its_flattened_metadata() -> None:
    flat = ["A", "sops_age__list_0__map_recipient", "sops_hc_vault__list_0__map_vault_address"]
    grouped = [
        "sops_key_groups__list_0__map_kms__list_0__map_arn",
        "sops_key_groups__list_0__map_age__list_0__map_x",
    ]
    assert foreign_key_services(flat, None) == ["hc_vault"]
    assert foreign_key_services(grouped, None) == ["kms"]
    assert foreign_key_services(["sops_age__list_0__map_recipient", "sops_mac"], None) == []
    assert foreign_key_services(None, {"age": [{"recipient": "a"}], "pgp": [], "mac": "m"}) == []
