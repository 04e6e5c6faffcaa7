"""Charts fetched from a real OCI registry on loopback (the CNCF distribution registry, charts
pushed with `helm push`): resolved from the tags, the manifest and chart layer checked, stored
once per digest; an unchanged tag list is one request; credentials, TLS and the registry being
down typed as for an HTTP repository."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from agent.config.types import HelmRepository, HelmSettings
from agent.dev.pki import ensure_pki
from agent.errors import ChartError, ChartProblem
from agent.render.tools import load_chart_yaml
from agent.source import oci
from agent.source.charts import ChartFetcher
from agent.source.oci import CHART_LAYER, HELM_CONFIG, OCI_MANIFEST
from tests.ociregistry import Registry, TokenGate


def fetcher(tmp_path: Path, *repos: HelmRepository) -> ChartFetcher:
    return ChartFetcher(repos, tmp_path / "cache", load_index=load_chart_yaml, timeout=5)


def plain(registry: Registry, **settings: object) -> HelmRepository:
    return HelmRepository(url=f"oci://{registry.host}", plain_http=True, **settings)  # type: ignore[arg-type]


def helm(registry: Registry, version: str = "", chart: str = "web") -> HelmSettings:
    return HelmSettings(chart=chart, repository=registry.url, version=version)


def failure(f: ChartFetcher, h: HelmSettings) -> ChartError:
    with pytest.raises(ChartError) as e:
        f.fetch(h)
    return e.value


def archive_digest(registry: Registry, name: str, version: str) -> str:
    return hashlib.sha256((registry.src / "packages" / f"{name}-{version}.tgz").read_bytes()).hexdigest()


def test_the_newest_matching_tag_is_fetched_once_and_an_unchanged_tag_list_is_one_request(
    tmp_path: Path,
) -> None:
    registry = Registry(tmp_path / "registry")
    with registry.serve():
        for v in ("1.2.0", "1.2.3", "1.3.0", "1.2.4-rc.1"):
            registry.push("web", v)
        f = fetcher(tmp_path, plain(registry))
        pin = f.fetch(helm(registry, "1.2.x"))
        assert (pin.version, pin.chart) == ("1.2.3", "web")
        assert pin.digest == archive_digest(registry, "web", "1.2.3")  # the chart layer is the archive
        assert (pin.directory / "Chart.yaml").read_text().endswith("version: 1.2.3\n")
        assert str(pin) == f"web@1.2.3 (sha256:{pin.digest[:12]})"
        f.requests.clear()
        assert f.fetch(helm(registry, "1.2.x")) == pin
        assert list(f.requests) == [f"GET http://{registry.host}/v2/charts/web/tags/list"]
        # A version the constraint does not allow changes nothing; one it allows is the new pin.
        registry.push("web", "1.4.0")
        assert f.fetch(helm(registry, "1.2.x")) == pin
        registry.push("web", "1.2.7")
        assert f.fetch(helm(registry, "1.2.x")).version == "1.2.7"
        assert f.fetch(helm(registry)).version == "1.4.0"
        assert f.fetch(helm(registry, ">=1.2.4-0, <1.2.5-0")).version == "1.2.4-rc.1"
        # Helm writes "+" as "_" in a tag; the version keeps its "+".
        registry.push("web", "1.5.0+build.7")
        assert f.fetch(helm(registry)).version == "1.5.0+build.7"


def test_an_exact_pin_asks_its_tag_with_one_head_and_follows_a_repush(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry")
    with registry.serve():
        registry.push("web", "1.0.0")
        f = fetcher(tmp_path, plain(registry))
        first = f.fetch(helm(registry, "1.0.0"))
        f.requests.clear()
        assert f.fetch(helm(registry, "1.0.0")) == first
        assert list(f.requests) == [f"HEAD http://{registry.host}/v2/charts/web/manifests/1.0.0"]
        registry.push("web", "1.0.0", data="again")  # the tag moved: read and stored again
        again = f.fetch(helm(registry, "1.0.0"))
        assert again.digest != first.digest and again.version == "1.0.0"
        assert failure(f, helm(registry, "9.9.9")).problem is ChartProblem.NO_MATCH


def test_no_such_chart_and_no_matching_tag_are_typed_and_name_the_repository(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry")
    with registry.serve():
        registry.push("web", "1.0.0")
        f = fetcher(tmp_path, plain(registry))
        e = failure(f, helm(registry, "2.x"))
        assert (e.problem, e.url) == (ChartProblem.NO_MATCH, registry.url)
        assert "'2.x'" in str(e) and "1.0.0" in str(e) and e.failure().reason == "chart"
        assert failure(f, helm(registry, chart="db")).problem is ChartProblem.INDEX


def test_a_registry_that_is_down_fails_with_its_url_and_the_last_good_pin_stays(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry")
    with registry.serve():
        registry.push("web", "1.0.0")
        f = fetcher(tmp_path, plain(registry))
        (good,) = f.pins([helm(registry, "1.x")])
    assert good.error == ""
    (kept,) = f.pins([helm(registry, "1.x")])
    assert kept.error and "unreachable" in kept.error and registry.url in kept.error
    assert (kept.version, kept.digest, kept.directory) == (good.version, good.digest, good.directory)


def test_credentials_are_required_refused_when_wrong_and_read_from_a_file_or_docker_config(
    tmp_path: Path,
) -> None:
    registry = Registry(tmp_path / "registry")
    secret = tmp_path / "password"
    with registry.serve(username="agent", password="s3cret"):
        registry.push("web", "1.0.0")
        anonymous = failure(fetcher(tmp_path, plain(registry)), helm(registry))
        assert anonymous.problem is ChartProblem.UNAUTHORIZED and "credentials required" in str(anonymous)
        secret.write_text("wrong\n")
        entry = plain(registry, username="agent", password_file=str(secret))
        wrong = failure(fetcher(tmp_path, entry), helm(registry))
        assert wrong.problem is ChartProblem.UNAUTHORIZED and "credentials refused" in str(wrong)
        assert "wrong" not in str(wrong)
        secret.write_text("s3cret\n")
        assert fetcher(tmp_path, entry).fetch(helm(registry)).version == "1.0.0"
        docker = tmp_path / "docker.json"
        auth = base64.b64encode(b"agent:s3cret").decode()
        docker.write_text(json.dumps({"auths": {registry.host: {"auth": auth}}}))
        entry = plain(registry, docker_config_file=str(docker))
        assert fetcher(tmp_path / "d", entry).fetch(helm(registry)).version == "1.0.0"
        docker.write_text(
            json.dumps({"auths": {f"https://{registry.host}": {"username": "agent", "password": "no"}}})
        )
        assert failure(fetcher(tmp_path / "e", entry), helm(registry)).problem is ChartProblem.UNAUTHORIZED


def test_tls_with_the_registrys_own_ca_and_refused_without_it(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki", cluster_name="registry")
    registry = Registry(tmp_path / "registry")
    with registry.serve(
        username="agent", password="s3cret", cert=(pki.ca_cert, pki.serving_cert, pki.serving_key)
    ):
        registry.push("web", "1.0.0")
        (tmp_path / "pw").write_text("s3cret")
        creds = {"username": "agent", "password_file": str(tmp_path / "pw")}
        untrusted = HelmRepository(url=f"oci://{registry.host}", **creds)  # type: ignore[arg-type]
        assert failure(fetcher(tmp_path, untrusted), helm(registry)).problem is ChartProblem.TLS
        trusted = HelmRepository(url=f"oci://{registry.host}", ca_file=str(pki.ca_cert), **creds)  # type: ignore[arg-type]
        assert fetcher(tmp_path, trusted).fetch(helm(registry)).version == "1.0.0"
        skip = HelmRepository(url=f"oci://{registry.host}", insecure_skip_tls_verify=True, **creds)  # type: ignore[arg-type]
        assert fetcher(tmp_path / "other", skip).fetch(helm(registry)).version == "1.0.0"


def test_a_chart_layer_over_max_chart_bytes_is_refused_from_its_manifest_before_any_download(
    tmp_path: Path,
) -> None:
    registry = Registry(tmp_path / "registry")
    with registry.serve():
        registry.push("web", "1.0.0", data=base64.b64encode(os.urandom(1300 << 10)).decode())
        f = fetcher(tmp_path, plain(registry, max_chart_bytes=1 << 20))
        e = failure(f, helm(registry))
    assert e.problem is ChartProblem.ARCHIVE and "more than the limit of 1048576 bytes" in str(e)
    assert not [r for r in f.requests if "/blobs/" in r]
    assert not list((tmp_path / "cache").glob("charts/*"))


def test_a_bearer_challenge_is_answered_with_a_token_for_the_credentials_and_the_token_kept(
    tmp_path: Path,
) -> None:
    registry = Registry(tmp_path / "registry")
    (tmp_path / "pw").write_text("s3cret")
    with registry.serve(), TokenGate(registry, "agent", "s3cret").serve() as gate:
        registry.push("web", "1.0.0")
        entry = HelmRepository(
            url=f"oci://{gate.host}", plain_http=True, username="agent", password_file=str(tmp_path / "pw")
        )
        f = fetcher(tmp_path, entry)
        h = HelmSettings(chart="web", repository=gate.url, version="1.x")
        assert f.fetch(h).version == "1.0.0"
        assert gate.log[:3] == [
            ("/v2/charts/web/tags/list", 401),
            ("/token", 200),
            ("/v2/charts/web/tags/list", 200),
        ]
        gate.log.clear()
        assert f.fetch(h).version == "1.0.0"
        assert gate.log == [("/v2/charts/web/tags/list", 200)]  # the token kept: one request
        (tmp_path / "pw").write_text("wrong")
        e = failure(fetcher(tmp_path / "other", entry), h)
        assert e.problem is ChartProblem.UNAUTHORIZED and "wrong" not in str(e)


def put_manifest(registry: Registry, name: str, tag: str, config_type: str, layer_type: str) -> None:
    """An artifact pushed by hand (blobs, then the manifest): what `helm push` never writes."""
    base = f"http://{registry.host}/v2/charts/{name}"
    blobs = []
    for body in (b"{}", b"not a chart"):
        start = urllib.request.Request(f"{base}/blobs/uploads/", method="POST")
        with urllib.request.urlopen(start) as resp:
            location = urllib.parse.urljoin(base, resp.headers["Location"])
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        sep = "&" if "?" in location else "?"
        put = urllib.request.Request(
            f"{location}{sep}digest={digest}",
            data=body,
            method="PUT",
            headers={"Content-Type": "application/octet-stream"},
        )
        urllib.request.urlopen(put).close()
        blobs.append({"digest": digest, "size": len(body)})
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": config_type, **blobs[0]},
        "layers": [{"mediaType": layer_type, **blobs[1]}],
    }
    req = urllib.request.Request(
        f"{base}/manifests/{tag}",
        data=json.dumps(manifest).encode(),
        method="PUT",
        headers={"Content-Type": OCI_MANIFEST},
    )
    urllib.request.urlopen(req).close()


def test_a_tag_that_is_not_a_helm_chart_is_refused_by_its_manifest(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry")
    with registry.serve():
        put_manifest(registry, "web", "1.0.0", "application/vnd.oci.image.config.v1+json", CHART_LAYER)
        put_manifest(registry, "db", "1.0.0", HELM_CONFIG, "application/vnd.oci.image.layer.v1.tar+gzip")
        f = fetcher(tmp_path, plain(registry))
        image = failure(f, helm(registry))
        assert image.problem is ChartProblem.MANIFEST and "not a Helm chart" in str(image)
        layerless = failure(f, helm(registry, chart="db"))
        assert layerless.problem is ChartProblem.MANIFEST and "0 chart layers" in str(layerless)


def test_every_page_of_the_tag_list_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oci, "TAGS_PAGE", 2)
    registry = Registry(tmp_path / "registry")
    with registry.serve():
        for v in ("1.0.0", "1.4.0", "1.1.0", "1.3.0", "0.9.0"):
            registry.push("web", v)
        f = fetcher(tmp_path, plain(registry))
        assert f.fetch(helm(registry, "1.x")).version == "1.4.0"
    tag_pages = [r for r in f.requests if r.endswith("/tags/list")]
    assert len(tag_pages) == 3  # 2 + 2 + 1 tags, each page named by the previous one's Link
