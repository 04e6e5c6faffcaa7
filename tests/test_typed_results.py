"""Results are typed from end to end: nothing classifies a failure by reading its message.

A pass's failure carries a ``FailureReason`` (the metric label) and a ``PassState``
(``/status``), decided where the failure happened: from the network error's type, the HTTP
status and the server's ``Status`` reason, details and causes. The syntax tree of ``agent/``
is searched for any ``in``/``startswith``/``endswith`` on message text; real passes against
a cluster that refuses the credentials, presents another CA, is frozen or stopped get the
right label and state; and what the server says about one object (a quota's 403, a 422 that
is not about an immutable field) fails that object alone.
"""

from __future__ import annotations

import ast
import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.dev.pki import ensure_pki
from agent.dev.process import LocalCluster
from agent.kube.client import KubeClient
from agent.model import (
    ApplyResult,
    ClusterResult,
    FailureReason,
    Note,
    ObjectKey,
    Outcome,
    PassState,
    SkipReason,
)
from agent.report.events import events_for, reason_of, reportable
from agent.run.fleet import Fleet
from tests.agentkit import Agent, make_repo, unique, write_config
from tests.clusters import ClusterControl, ClusterPool, kubectl
from tests.daemonkit import configmaps, tune

AGENT = Path(__file__).resolve().parents[1] / "agent"
#: Attributes that hold text meant for people.
TEXT_ATTRIBUTES = frozenset({"message", "error", "api_message", "prune_refused"})
#: libgit2 errors carry no codes: its messages are the only evidence there is.
EXCEPTED = frozenset({("source/remote.py", "classify")})


# -- no classification by message text ------------------------------------------------------


def _is_str_of(node: ast.AST, exceptions: set[str]) -> bool:
    """``str(e)`` of an exception ``e`` (a name an ``except ... as e`` bound)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "str"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id in exceptions
    )


def _holds_text(node: ast.AST, tainted: set[str], exceptions: set[str]) -> bool:
    """Whether ``node`` is (or is built from) a message: ``x.message``, ``str(e)``, a name bound to one."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in TEXT_ATTRIBUTES:
            return True
        if _is_str_of(sub, exceptions) or (isinstance(sub, ast.Name) and sub.id in tainted):
            return True
    return False


def _scopes(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """The module and every function in it, each with its name (``<module>`` for the module)."""
    yield "<module>", tree
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a scope, without those of the functions nested in it (their own scopes)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def text_classifications(source: str) -> list[tuple[str, int, str]]:
    """(function, line, code) of every ``in``/``not in``/``startswith``/``endswith`` on message text.

    A parameter named like one (``message``) and a local name bound to message text
    (``text = str(e)``) count as message text too.
    """
    found: list[tuple[str, int, str]] = []
    tree = ast.parse(source)
    for name, scope in _scopes(tree):
        nodes = list(_own_nodes(scope))
        exceptions = {n.name for n in nodes if isinstance(n, ast.ExceptHandler) and n.name}
        tainted: set[str] = set()
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in (*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs):
                hint = ast.unparse(arg.annotation) if arg.annotation else ""
                if "Exception" in hint or "Error" in hint:
                    exceptions.add(arg.arg)  # ``str(e)`` of a parameter ``e: BaseException``
                if arg.arg in TEXT_ATTRIBUTES:
                    tainted.add(arg.arg)  # a parameter ``message: str``
        changed = True
        while changed:
            changed = False
            for node in nodes:
                targets: list[ast.expr] = []
                value: ast.expr | None = None
                if isinstance(node, ast.Assign):
                    targets, value = node.targets, node.value
                elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
                    targets, value = [node.target], node.value
                if value is None or not _holds_text(value, tainted, exceptions):
                    continue
                for t in targets:
                    if isinstance(t, ast.Name) and t.id not in tainted:
                        tainted.add(t.id)
                        changed = True
        for node in nodes:
            hit = False
            if isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
                hit = any(_holds_text(part, tainted, exceptions) for part in (node.left, *node.comparators))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("startswith", "endswith")
            ):
                hit = _holds_text(node.func.value, tainted, exceptions)
            if hit:
                found.append((name, getattr(node, "lineno", 0), ast.unparse(node)))
    return found


def test_nothing_in_the_agent_classifies_a_failure_by_the_text_of_its_message() -> None:
    offences = []
    excepted_seen = set()
    for path in sorted(AGENT.rglob("*.py")):
        rel = path.relative_to(AGENT).as_posix()
        for function, line, code in text_classifications(path.read_text()):
            if (rel, function) in EXCEPTED:
                excepted_seen.add((rel, function))
                continue
            offences.append(f"agent/{rel}:{line} in {function}(): {code}")
    assert not offences, "classified from message text:\n" + "\n".join(offences)
    for rel, function in EXCEPTED:  # the exception names code that exists
        tree = ast.parse((AGENT / rel).read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == function for n in ast.walk(tree)), rel


@pytest.mark.parametrize(
    "code",
    [
        'def f(r):\n    return "yielded" in r.message',
        'def f(r):\n    return (r.prune_refused or "").startswith("cluster suspended")',
        'def f(e):\n    return e.status == 403 and "cannot" not in e.api_message',
        "def f():\n    try:\n        g()\n    except OSError as e:\n"
        '        text = str(e)\n        return "timed out" in text',
        'def f(result):\n    return [n for n in ("HTTP 401",) if n in result.error]',
    ],
)
def test_the_search_finds_each_shape_of_classification_by_text(code: str) -> None:
    assert text_classifications(code), code


def test_the_search_leaves_typed_reads_and_printing_alone() -> None:
    code = (
        "def f(r, e, d):\n"
        '    print(f"failed: {r.error}")\n'
        "    return r.note is Note.YIELDED or e.status in (0, 401) or r.key in d.kept\n"
    )
    assert text_classifications(code) == []


# -- the metric label of real passes ----------------------------------------------------------


def _errors_label(fleet: Fleet, cluster: str) -> set[str]:
    text = fleet.metrics.render().decode()
    return {
        s.labels["reason"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "gitops_agent_reconcile_errors_total" and s.labels.get("cluster") == cluster
    }


def _expect(agent: Agent, result: ClusterResult, reason: FailureReason, state: PassState, said: str) -> None:
    name = result.cluster
    assert result.failure is not None, name
    assert (result.reason, result.state) == (reason, state), (name, result.failure)
    assert said in result.failure.message, (name, result.failure.message)
    assert _errors_label(agent.fleet, name) == {reason.value}
    shown = agent.fleet.status[name].to_json()
    assert (shown["state"], shown["error"]) == (state.value, result.failure.message)
    json.dumps(shown)  # /status serialises the enums as their plain strings


def _other_ca(tmp_path: Path, cluster: LocalCluster) -> Path:
    """``cluster``'s admin kubeconfig trusting a CA that did not sign its serving certificate."""
    ca = ensure_pki(tmp_path / "other-pki", cluster_name="other").ca_cert
    kc = yaml.safe_load(cluster.kubeconfig.read_text())
    kc["clusters"][0]["cluster"].pop("certificate-authority", None)
    kc["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
    path = tmp_path / "other-ca.kubeconfig"
    path.write_text(yaml.safe_dump(kc))
    return path


def test_each_cluster_alone_a_revoked_token_a_wrong_ca_a_frozen_and_a_stopped_cluster_get_their_label(
    tmp_path: Path, cluster_ctl: ClusterControl, fresh_cluster: Callable[[], LocalCluster]
) -> None:
    c = fresh_cluster()
    sa = f"default/{unique('agent')}"
    token = cluster_ctl.token(c, sa)
    cluster_ctl.revoke(c, sa)
    names = ("revoked", "wrong-ca", "slow", "deadline")
    repo = make_repo(tmp_path, {f"clusters/{n}/app.yaml": configmaps(unique("typed"), "hi") for n in names})

    refused = Agent(write_config(tmp_path, repo, {"revoked": token, "wrong-ca": _other_ca(tmp_path, c)}))
    try:
        results = refused.reconcile()
        _expect(refused, results["revoked"], FailureReason.UNAUTHORIZED, PassState.FAILED, "HTTP 401")
        _expect(
            refused,
            results["wrong-ca"],
            FailureReason.TLS,
            PassState.FAILED,
            "TLS certificate verification failed (wrong CA?)",
        )
    finally:
        refused.close()

    # A request that times out inside a pass fails it (timeout, failed); a pass that outlives its
    # deadline is abandoned (timeout, timed-out).
    slow = Agent(
        tune(
            write_config(tmp_path, repo, {"slow": c}),
            listen=False,
            defaults={"connect_timeout": "1s", "request_timeout": "1s", "pass_deadline": "60s"},
        )
    )
    late = Agent(
        tune(
            write_config(tmp_path, repo, {"deadline": c}),
            listen=False,
            defaults={"connect_timeout": "30s", "request_timeout": "30s", "pass_deadline": "2s"},
        )
    )
    try:
        revision = slow.revision()
        with cluster_ctl.frozen(c):
            timed = slow.fleet.run_pass("slow", revision)
            _expect(slow, timed, FailureReason.TIMEOUT, PassState.FAILED, "request timed out")
            abandoned = late.fleet.run_pass("deadline", revision)
            _expect(late, abandoned, FailureReason.TIMEOUT, PassState.TIMED_OUT, "pass did not finish")
        cluster_ctl.stop(c)
        slow.fleet.metrics.errors.clear()
        stopped = slow.fleet.run_pass("slow", revision)
        _expect(slow, stopped, FailureReason.UNREACHABLE, PassState.FAILED, "connection refused")
    finally:
        slow.close()
        late.close()


# -- what the server says about one object ---------------------------------------------------


def _quota(kubeconfig: Path, ns: str, *, hard: int, used: int) -> None:
    """A ConfigMap quota, counted as the resource-quota controller would (the test clusters run none)."""
    kubectl(kubeconfig, "create", "namespace", ns)
    kubectl(kubeconfig, "create", "quota", "cms", "-n", ns, f"--hard=count/configmaps={hard}")
    status = {"hard": {"count/configmaps": str(hard)}, "used": {"count/configmaps": str(used)}}
    kubectl(
        kubeconfig,
        "patch",
        "resourcequota",
        "cms",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "--field-manager=kube-controller-manager",
        "-p",
        json.dumps({"status": status}),
    )


def test_each_cluster_alone_an_object_a_quota_forbids_fails_alone_and_the_others_apply(
    tmp_path: Path, cluster_pool: ClusterPool
) -> None:
    """A quota's 403 is the API server's own ``Status`` naming the object: one object fails, not the
    pass (only a 403 that is no such ``Status``, a proxy's, says something about the whole cluster)."""
    a = cluster_pool["pool-a"]
    ns = unique("quota")
    _quota(a.kubeconfig, ns, hard=2, used=1)  # kube-root-ca.crt takes one
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "hi", "one", "two", "three")})
    agent = Agent(write_config(tmp_path, repo, {"pool-a": a}))
    try:
        r = agent.reconcile()["pool-a"]
        assert r.failure is None, r.failure
        assert r.count(Outcome.CREATED) == 1 and r.failed == 2, r.results
        assert {x.status for x in r.results if x.outcome is Outcome.FAILED} == {403}
        assert (r.reason, r.state) == (FailureReason.OBJECTS, PassState.FAILED)
        assert _errors_label(agent.fleet, "pool-a") == {"objects"}
    finally:
        agent.close()
        kubectl(a.kubeconfig, "delete", "namespace", ns, "--wait=false", check=False)


def _cm(ns: str, name: str, *, label: str, extra: str = "") -> str:
    return (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\n"
        f"  labels:\n    tier: {label!r}\n"
        "  annotations:\n    gitops-agent.io/recreate: on-immutable-change\n"
        f"{extra}data:\n  k: {label!r}\n"
    )


def test_an_immutable_field_is_what_the_servers_causes_name_never_a_word_in_the_objects_name(
    tmp_path: Path, cluster_pool: ClusterPool
) -> None:
    """A 422 whose causes say nothing is immutable is a plain rejection: the object (named
    ``immutable-…``, allowing re-creation) is neither deleted nor re-created. ``immutable: true``
    data is what the causes call immutable (``FieldValueForbidden``)."""
    a = cluster_pool["pool-a"]
    ns = unique("immut")
    doc = f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"

    def files(label: str, frozen: str) -> dict[str, str]:
        sealed = (
            f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: sealed\n  namespace: {ns}\n"
            f"immutable: true\ndata:\n  k: {frozen}\n"
        )
        return {
            "clusters/pool-a/app.yaml": "---\n".join(
                [doc, _cm(ns, "immutable-settings", label=label), sealed]
            )
        }

    repo = make_repo(tmp_path, files("good", "one"))
    agent = Agent(write_config(tmp_path, repo, {"pool-a": a}))
    try:
        assert agent.reconcile()["pool-a"].ok
        uid = json.loads(kubectl(a.kubeconfig, "get", "cm", "immutable-settings", "-n", ns, "-o", "json"))
        repo.commit(files("not valid!", "two"))
        r = agent.reconcile()["pool-a"]
        assert r.failure is None, r.failure
        by_name = {x.key.name: x for x in r.results}
        invalid, sealed = by_name["immutable-settings"], by_name["sealed"]
        assert (invalid.outcome, invalid.status, invalid.note) == (Outcome.FAILED, 422, None), invalid
        assert "metadata.labels" in invalid.message and "gitops-agent.io/recreate" not in invalid.message
        live = json.loads(kubectl(a.kubeconfig, "get", "cm", "immutable-settings", "-n", ns, "-o", "json"))
        assert live["metadata"]["uid"] == uid["metadata"]["uid"]
        assert (sealed.outcome, sealed.note) == (Outcome.FAILED, Note.IMMUTABLE), sealed
    finally:
        agent.close()
        kubectl(a.kubeconfig, "delete", "namespace", ns, "--wait=false", check=False)


_NO_DELETE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {name}
rules:
  - apiGroups: ["*"]
    resources: ["*"]
    verbs: [get, list, watch, create, update, patch]
  - nonResourceURLs: ["*"]
    verbs: [get]
"""


def test_unknown_is_not_absent_a_delete_the_server_refuses_is_a_prune_failed_event(
    tmp_path: Path, cluster_pool: ClusterPool, cluster_ctl: ClusterControl
) -> None:
    a = cluster_pool["pool-a"]
    ns = unique("nodelete")
    role = unique("no-delete")
    (tmp_path / "role.yaml").write_text(_NO_DELETE.format(name=role))
    kubectl(a.kubeconfig, "apply", "-f", str(tmp_path / "role.yaml"))
    token = cluster_ctl.token(a, f"default/{unique('agent')}", cluster_role=role)
    repo = make_repo(tmp_path, {"clusters/pool-a/app.yaml": configmaps(ns, "hi", "keep", "drop")})
    agent = Agent(write_config(tmp_path, repo, {"pool-a": token}))
    try:
        assert agent.reconcile()["pool-a"].ok
        repo.commit({"clusters/pool-a/app.yaml": configmaps(ns, "hi", "keep")})
        r = agent.reconcile()["pool-a"]
        assert r.failure is None and r.reason is FailureReason.OBJECTS, r.failure
        (drop,) = [x for x in r.results if x.key.name == "drop"]
        assert (drop.outcome, drop.status, drop.note) == (Outcome.FAILED, 403, Note.DELETE_REFUSED)
        client = KubeClient.from_config(agent.config.cluster("pool-a"))
        try:
            evs = list(events_for(client, agent.config.agent.namespace, agent.config.agent.name))
        finally:
            client.close()
        assert [e["reason"] for e in evs if f"ConfigMap/{ns}/drop" in e["message"]] == ["PruneFailed"], evs
    finally:
        agent.close()
        kubectl(a.kubeconfig, "delete", "namespace", ns, "--wait=false", check=False)
        kubectl(a.kubeconfig, "delete", "clusterrole", role, check=False)


def _skipped(name: str, skip: SkipReason) -> ApplyResult:
    return ApplyResult(ObjectKey("", "Namespace", "", name), Outcome.SKIPPED, 403, "forbidden", skip=skip)


def test_unknown_is_not_absent_an_object_whose_listing_was_refused_is_reported_as_unread() -> None:
    """Left alone because its kind could not be listed (namespaced RBAC, a cluster-scoped kind):
    a warning in the log and an Event. Skips the agent decided on are not news."""
    unread = _skipped("elsewhere", SkipReason.LIVE_UNKNOWN)
    decided = [
        _skipped(f"s{i}", skip) for i, skip in enumerate(SkipReason) if skip is not SkipReason.LIVE_UNKNOWN
    ]
    result = ClusterResult("c", "abc", results=[unread, *decided], app="c")
    assert reportable(result) == [unread]
    assert reason_of(unread) == ("Warning", "LiveUnknown")
