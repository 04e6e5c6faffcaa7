"""`verify = true` on a `[[helm_repositories]]` entry, with charts signed by the real
`helm package --sign` and a key made with gpg: a chart is used only if its `.prov` is signed by
a key of `keyring_file` and lists the archive's digest; unsigned, signed by another key, altered
or listing another archive is refused (problem `signature`) before anything is unpacked; on a real
API server, an app whose newly published chart is unsigned fails with reason `chart`, the signed
one it had staying applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config.types import HelmRepository, HelmSettings
from agent.errors import ChartError, ChartProblem
from agent.model import FailureReason
from agent.render.tools import load_chart_yaml
from agent.source.charts import ChartFetcher
from agent.source.provenance import signed_digest
from tests.agentkit import E2E, make_repo
from tests.chartrepo import ChartRepo
from tests.chartsign import SigningKey, signing_key
from tests.clusters import ClusterPool, kubectl
from tests.test_charts_repository import Pass, config, configmap


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[SigningKey, SigningKey]:
    out = tmp_path_factory.mktemp("keys")
    return signing_key(out, "Chart Signer"), signing_key(out, "Someone Else")


def fetcher(tmp_path: Path, repo: ChartRepo, key: SigningKey) -> ChartFetcher:
    entry = HelmRepository(url=repo.url, verify=True, keyring_file=str(key.public))
    return ChartFetcher((entry,), tmp_path / "cache", load_index=load_chart_yaml, timeout=5)


def refused(f: ChartFetcher, repo: ChartRepo, version: str) -> str:
    with pytest.raises(ChartError) as e:
        f.fetch(HelmSettings(chart="web", repository=repo.url, version=version))
    assert e.value.problem is ChartProblem.SIGNATURE and e.value.failure().reason == "chart"
    return str(e.value)


def test_a_signed_chart_is_used_and_its_signature_is_checked_once(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey]
) -> None:
    signer, _ = keys
    repo = ChartRepo(tmp_path / "repo")
    repo.publish("web", "1.0.0", sign=signer.args)
    with repo.serve():
        f = fetcher(tmp_path, repo, signer)
        pin = f.fetch(HelmSettings(chart="web", repository=repo.url))
        assert pin.version == "1.0.0" and (pin.directory / "Chart.yaml").is_file()
        assert [p for _, p, _, _ in repo.log] == ["/index.yaml", "/web-1.0.0.tgz.prov", "/web-1.0.0.tgz"]
        repo.log.clear()
        assert f.fetch(HelmSettings(chart="web", repository=repo.url)) == pin
        assert [(p, s) for _, p, s, _ in repo.log] == [("/index.yaml", 304)]
        # A kept copy is checked again by another process (a restart) before it is used.
        again = fetcher(tmp_path, repo, signer)
        repo.log.clear()
        assert again.fetch(HelmSettings(chart="web", repository=repo.url)) == pin
        assert [p for _, p, _, _ in repo.log] == ["/index.yaml", "/web-1.0.0.tgz.prov"]


def test_unsigned_foreign_altered_and_mismatching_charts_are_refused_before_unpacking(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey]
) -> None:
    signer, other = keys
    repo = ChartRepo(tmp_path / "repo")
    repo.publish("web", "1.0.0")
    repo.publish("web", "1.1.0", sign=other.args)
    signed = repo.publish("web", "1.2.0", sign=signer.args)
    # The archive is replaced (and indexed again: the index's digest is the new archive's), the
    # provenance file still lists the signed one.
    ChartRepo(tmp_path / "evil").publish("web", "1.2.0", data="evil")
    signed.write_bytes((tmp_path / "evil" / "web-1.2.0.tgz").read_bytes())
    repo.index()
    repo.publish("web", "1.3.0", sign=signer.args)
    prov = repo.root / "web-1.3.0.tgz.prov"
    prov.write_text(prov.read_text().replace("name: web", "name: web\ndescription: altered"))
    with repo.serve():
        f = fetcher(tmp_path, repo, signer)
        unsigned = refused(f, repo, "1.0.0")
        assert "web-1.0.0.tgz: no provenance file" in unsigned and repo.url in unsigned
        assert "signed by a key that is not in keyring_file" in refused(f, repo, "1.1.0")
        assert "its signed provenance lists sha256" in refused(f, repo, "1.2.0")
        assert "the provenance file was altered" in refused(f, repo, "1.3.0")
    assert list((tmp_path / "cache" / "charts").glob("*")) == []
    assert not [p for _, p, _, _ in repo.log if p.endswith(".tgz")]  # no archive even downloaded


def test_the_signed_text_lists_the_archive_as_helm_writes_it() -> None:
    text = "apiVersion: v2\nname: web\nversion: 1.0.0\n\n...\nfiles:\n  web-1.0.0.tgz: sha256:ABC\n"
    assert signed_digest(text, "web-1.0.0.tgz", load_chart_yaml) == "abc"
    assert signed_digest(text, "other.tgz", load_chart_yaml) == ""
    assert signed_digest("files:\n  web-1.0.0.tgz: sha256:abc\n", "web-1.0.0.tgz", load_chart_yaml) == ""


def test_an_app_whose_new_chart_is_unsigned_fails_closed_on_a_real_api_server(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, keys: tuple[SigningKey, SigningKey]
) -> None:
    signer, _ = keys
    cluster = cluster_pool["pool-a"]
    ns = e2e.namespace("signed")
    kubectl(cluster.kubeconfig, "create", "namespace", ns)
    git = make_repo(tmp_path, {"values/web.yaml": "greeting: signed\n"})
    charts = ChartRepo(tmp_path / "charts")
    charts.publish("web", "1.0.0", sign=signer.args)
    with charts.serve():
        trust = (
            f'[[helm_repositories]]\nurl = "{charts.url}"\nverify = true\nkeyring_file = "{signer.public}"\n'
        )
        agent = Pass(config(tmp_path, git, cluster.kubeconfig, ns, charts.url, "1.x", trust), e2e)
        assert agent.run(agent.poll()).ok  # type: ignore[attr-defined]
        assert configmap(cluster.kubeconfig, ns) == {
            "version": "1.0.0",
            "greeting": "signed",
            "replicas": "3",
        }
        charts.publish("web", "1.1.0")  # unsigned
        refused = agent.run(agent.poll())
    assert refused.reason is FailureReason.CHART and "signature" in refused.error  # type: ignore[attr-defined]
    assert "web-1.1.0.tgz: no provenance file" in refused.error  # type: ignore[attr-defined]
    assert configmap(cluster.kubeconfig, ns) == {"version": "1.0.0", "greeting": "signed", "replicas": "3"}
