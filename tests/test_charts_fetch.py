"""Charts fetched from a real chart repository on loopback (`helm package` + `helm repo index`),
before any render: resolved, downloaded once, verified, unpacked within bounds; every failure
typed and naming the repository and the constraint."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from agent.config.types import HelmRepository, HelmSettings
from agent.dev.pki import ensure_pki
from agent.errors import ChartError, ChartProblem
from agent.render.tools import load_chart_yaml
from agent.source.charts import ChartFetcher, repository_for, unpack
from tests.chartrepo import ChartRepo


def fetcher(tmp_path: Path, *repos: HelmRepository) -> ChartFetcher:
    return ChartFetcher(repos, tmp_path / "cache", load_index=load_chart_yaml, timeout=5)


def helm(repo: ChartRepo, version: str = "", chart: str = "web") -> HelmSettings:
    return HelmSettings(chart=chart, repository=repo.url, version=version)


def failure(f: ChartFetcher, h: HelmSettings) -> ChartError:
    with pytest.raises(ChartError) as e:
        f.fetch(h)
    return e.value


def test_the_newest_matching_version_is_fetched_once_and_an_unchanged_index_downloads_nothing(
    tmp_path: Path,
) -> None:
    repo = ChartRepo(tmp_path / "repo")
    for v in ("1.2.0", "1.2.3", "1.3.0", "1.2.4-rc.1"):
        repo.publish("web", v)
    with repo.serve():
        f = fetcher(tmp_path)
        pin = f.fetch(helm(repo, "1.2.x"))
        assert (pin.version, pin.chart) == ("1.2.3", "web")
        assert pin.digest == repo.digest(repo.root / "web-1.2.3.tgz")
        assert (pin.directory / "Chart.yaml").read_text().endswith("version: 1.2.3\n")
        assert str(pin) == f"web@1.2.3 (sha256:{pin.digest[:12]})"
        repo.log.clear()
        assert f.fetch(helm(repo, "1.2.x")) == pin
        # One conditional request, answered 304; no archive asked for.
        assert [(p, s) for _, p, s, _ in repo.log] == [("/index.yaml", 304)]
        # A version the constraint does not allow changes nothing; one it allows is the new pin.
        repo.publish("web", "1.4.0")
        assert f.fetch(helm(repo, "1.2.x")) == pin
        repo.publish("web", "1.2.7")
        assert f.fetch(helm(repo, "1.2.x")).version == "1.2.7"
        # No constraint: the newest release; a prerelease only where the constraint names one.
        assert f.fetch(helm(repo)).version == "1.4.0"
        assert f.fetch(helm(repo, ">=1.2.4-0, <1.2.5-0")).version == "1.2.4-rc.1"
        assert f.fetch(helm(repo, "1.2.0")).version == "1.2.0"


def test_no_matching_version_and_no_such_chart_are_typed_and_name_the_repository_and_constraint(
    tmp_path: Path,
) -> None:
    repo = ChartRepo(tmp_path / "repo")
    repo.publish("web", "1.0.0")
    with repo.serve():
        f = fetcher(tmp_path)
        e = failure(f, helm(repo, "2.x"))
        assert (e.problem, e.url) == (ChartProblem.NO_MATCH, repo.url)
        assert "'2.x'" in str(e) and repo.url in str(e) and "1.0.0" in str(e)
        assert e.failure().reason == "chart"
        assert failure(f, helm(repo, chart="db")).problem is ChartProblem.INDEX
        (repo.root / "index.yaml").write_text("entries: [unclosed\n")
        assert failure(f, helm(repo)).problem is ChartProblem.INDEX


def test_a_repository_that_is_down_fails_with_its_url_and_the_last_good_pin_stays(tmp_path: Path) -> None:
    repo = ChartRepo(tmp_path / "repo")
    repo.publish("web", "1.0.0")
    f = fetcher(tmp_path)
    with repo.serve():
        (good,) = f.pins([helm(repo, "1.x")])
    assert good.error == ""
    (kept,) = f.pins([helm(repo, "1.x")])  # the server is gone: connection refused
    assert kept.error and "unreachable" in kept.error and repo.url in kept.error
    assert (kept.version, kept.digest, kept.directory) == (good.version, good.digest, good.directory)
    never = HelmSettings(chart="web", repository="http://127.0.0.1:1", version="1.x")
    (failed,) = f.pins([never])
    assert failed.error and failed.version == "" and failed.digest == ""


def test_credentials_are_required_refused_when_wrong_and_read_from_their_file(tmp_path: Path) -> None:
    repo = ChartRepo(tmp_path / "repo")
    repo.publish("web", "1.0.0")
    secret = tmp_path / "password"
    with repo.serve(username="agent", password="s3cret"):
        anonymous = failure(fetcher(tmp_path), helm(repo))
        assert anonymous.problem is ChartProblem.UNAUTHORIZED and "credentials required" in str(anonymous)
        secret.write_text("wrong\n")
        entry = HelmRepository(url=repo.url, username="agent", password_file=str(secret))
        wrong = failure(fetcher(tmp_path, entry), helm(repo))
        assert wrong.problem is ChartProblem.UNAUTHORIZED and "wrong" not in str(wrong)
        secret.write_text("s3cret\n")
        assert fetcher(tmp_path, entry).fetch(helm(repo)).version == "1.0.0"


def test_credentials_go_only_to_the_entrys_origin(tmp_path: Path) -> None:
    charts, mirror = ChartRepo(tmp_path / "charts"), ChartRepo(tmp_path / "mirror")
    archive = mirror.publish("web", "1.0.0")
    (tmp_path / "pw").write_text("s3cret")
    with mirror.serve(), charts.serve():
        # The index on one host points at the archive on another (as GitHub-release repositories do).
        index = (
            (mirror.root / "index.yaml").read_text().replace("web-1.0.0.tgz", f"{mirror.url}/web-1.0.0.tgz")
        )
        (charts.root / "index.yaml").write_text(index)
        entry = HelmRepository(url=charts.url, username="agent", password_file=str(tmp_path / "pw"))
        pin = fetcher(tmp_path, entry).fetch(helm(charts))
    assert pin.digest == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert [a for *_, a in charts.requests("index.yaml")] == [True]
    assert [a for *_, a in mirror.requests(".tgz")] == [False]


def test_tls_with_the_repositorys_own_ca_and_refused_without_it(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki", cluster_name="charts")
    repo = ChartRepo(tmp_path / "repo")
    repo.publish("web", "1.0.0")
    with repo.serve(cert=(pki.serving_cert, pki.serving_key)):
        assert failure(fetcher(tmp_path), helm(repo)).problem is ChartProblem.TLS
        trusted = HelmRepository(url=repo.url, ca_file=str(pki.ca_cert))
        assert fetcher(tmp_path, trusted).fetch(helm(repo)).version == "1.0.0"
        skip = HelmRepository(url=repo.url, insecure_skip_tls_verify=True)
        assert fetcher(tmp_path / "other", skip).fetch(helm(repo)).version == "1.0.0"


def test_a_tampered_chart_is_refused_and_nothing_is_unpacked(tmp_path: Path) -> None:
    repo = ChartRepo(tmp_path / "repo")
    archive = repo.publish("web", "1.0.0")
    ChartRepo(tmp_path / "evil").publish("web", "1.0.0", data="evil")
    archive.write_bytes((tmp_path / "evil" / "web-1.0.0.tgz").read_bytes())  # same name, index unchanged
    with repo.serve():
        e = failure(fetcher(tmp_path), helm(repo))
    assert e.problem is ChartProblem.DIGEST
    assert [p.name for p in (tmp_path / "cache" / "charts").glob("*")] == []


def tgz(entries: list[tarfile.TarInfo | tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for e in entries:
            if isinstance(e, tarfile.TarInfo):
                tar.addfile(e)
            else:
                info = tarfile.TarInfo(e[0])
                info.size = len(e[1])
                tar.addfile(info, io.BytesIO(e[1]))
    return out.getvalue()


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


CHART = ("web/Chart.yaml", b"apiVersion: v2\nname: web\nversion: 1.0.0\n")


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([CHART, ("web/../../escape", b"x")], "leaves"),
        ([CHART, ("/etc/passwd", b"x")], "leaves"),
        ([CHART, ("other/file", b"x")], "not under web/"),
        ([CHART, link("web/templates/x.yaml", "/etc/passwd")], "link"),
        ([CHART, link("web/hard", "web/Chart.yaml", tarfile.LNKTYPE)], "link"),
        ([CHART, link("web/dev", "", tarfile.CHRTYPE)], "special"),
        ([CHART, ("web/big", b"0" * 3000)], "more than 2048 bytes"),
        ([("web/values.yaml", b"{}")], "no web/Chart.yaml"),
    ],
)
def test_an_archive_out_of_bounds_is_refused(
    tmp_path: Path, entries: list[tarfile.TarInfo | tuple[str, bytes]], why: str
) -> None:
    assert why in unpack(tgz(entries), tmp_path, chart="web", limit=2048)
    assert not (tmp_path.parent / "escape").exists()
    assert "not a chart archive" in unpack(b"not gzip", tmp_path, chart="web", limit=2048)


def test_an_archive_over_max_chart_bytes_is_not_downloaded_whole(tmp_path: Path) -> None:
    repo = ChartRepo(tmp_path / "repo")
    archive = repo.publish("web", "1.0.0")
    archive.write_bytes(tgz([CHART, ("web/big", os.urandom((1 << 20) + 4096))]))  # incompressible
    repo.index()
    with repo.serve():
        entry = HelmRepository(url=repo.url, max_chart_bytes=1 << 20)
        e = failure(fetcher(tmp_path, entry), helm(repo))
    assert e.problem is ChartProblem.ARCHIVE and "more than the limit of 1048576 bytes" in str(e)
    assert [s for _, _, s, _ in repo.requests(".tgz")] == [200]


def test_the_longest_matching_url_prefix_names_the_entry() -> None:
    a = HelmRepository(url="https://charts.example.com")
    b = HelmRepository(url="https://charts.example.com/team", username="team")
    assert repository_for("https://charts.example.com/team/stable", (a, b)) is b
    assert repository_for("https://charts.example.com/teams", (a, b)) is a
    assert repository_for("https://other.example.com", (a, b)).url == ""


def test_a_poll_asks_a_repository_for_its_index_once_however_many_charts_come_from_it(tmp_path: Path) -> None:
    repo = ChartRepo(tmp_path / "repo")
    repo.publish("web", "1.0.0")
    repo.publish("api", "2.0.0")
    with repo.serve():
        f = fetcher(tmp_path)
        wanted = [helm(repo, "1.x"), helm(repo, "2.x", chart="api"), helm(repo, "*")]
        assert [p.version for p in f.pins(wanted)] == ["1.0.0", "2.0.0", "1.0.0"]
        assert len(repo.requests("/index.yaml")) == 1
        repo.log.clear()
        f.pins(wanted)  # unchanged: one conditional request for all three, no archive
        assert [(p, s) for _, p, s, _ in repo.log] == [("/index.yaml", 304)]
        # Outside a poll, each fetch asks (a version published meanwhile is seen).
        repo.publish("web", "1.1.0")
        assert f.fetch(helm(repo, "1.x")).version == "1.1.0"
        repo.log.clear()
    with repo.serve():  # down: every chart of the repository fails, after one request
        url = repo.url
    down = [HelmSettings(chart=c, repository=url, version="*") for c in ("web", "api")]
    pins = f.pins(down)
    assert all(p.error for p in pins) and f.requests.count(f"GET {url}/index.yaml") == 1


def test_charts_roll_forward_only_a_withdrawn_newest_release_keeps_the_one_in_force(tmp_path: Path) -> None:
    repo = ChartRepo(tmp_path / "repo")
    for v in ("1.0.0", "1.1.0"):
        repo.publish("web", v)
    with repo.serve():
        f = fetcher(tmp_path)
        (pin,) = f.pins([helm(repo, "1.x")])
        assert pin.version == "1.1.0"
        (repo.root / "web-1.1.0.tgz").unlink()  # withdrawn: the index lists 1.0.0 alone
        repo.index()
        repo.log.clear()
        assert f.pins([helm(repo, "1.x")]) == (pin,)
        assert not repo.requests(".tgz")  # the older archive is not even downloaded
        # Asking for the older release is another constraint: it is fetched.
        assert f.pins([helm(repo, "1.0.0")])[0].version == "1.0.0"
        repo.publish("web", "1.2.0")  # forward again
        assert f.pins([helm(repo, "1.x")])[0].version == "1.2.0"
