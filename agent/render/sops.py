"""SOPS-encrypted manifests, decrypted in memory with the pinned ``sops`` and age identities.

Called by ``agent.render.renderer`` for every plain file and every kustomize/helm output
that carries SOPS metadata (a top-level ``sops`` key). Why it works the way it does:

* **Plaintext only in memory.** The ciphertext goes to ``sops decrypt`` on its standard
  input and the plaintext comes back on its standard output; the identities go in its
  environment (``SOPS_AGE_KEY``), never on its command line, and nothing is written to disk.
  sops runs in the sandbox kustomize runs in (empty ``PATH``, a throw-away ``HOME`` without
  the host's keys, a dead proxy), so it can only use the identities it is given.
* **The MAC is checked on the file as committed.** sops's MAC covers every value of a file,
  and kustomize rewrites objects (labels, names, key order), so rendered output is never
  handed to sops. Each encrypted file is decrypted whole, and every ``ENC[...]`` value of a
  rendered object -- which substitution, kustomize and helm pass through unchanged -- is
  replaced by its plaintext from the file it came from (found by the MAC the object still
  carries). Ciphertext that no decrypted file explains fails the render.
* **Fail closed.** A file that does not decrypt is a ``RenderProblem`` naming the file, its
  cause typed (``DecryptFault``, from sops's exit code) and said in words; the app's render
  fails, so nothing of it is applied or pruned.
* **Masked downstream.** A decrypted object is annotated ``gitops-agent.io/decrypted-fields``
  with the JSON pointers of its decrypted values, which ``agent.plan.masking`` masks in every
  report, on any kind.

``SopsMode.SEAL`` (``diff --offline``, which has no private key) leaves the ciphertext in
place, marked the same way, and only records which files are encrypted to whom.
"""

from __future__ import annotations

import base64
import binascii
import copy
import enum
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.errors import LocalClusterError, RenderProblem
from agent.model import DECRYPTED_FIELDS, DecryptFault, EncryptedSource
from agent.render.binaries import tool
from agent.render.jsonmanifest import parse_json
from agent.render.manifests import Document, Origin, parse_yaml
from agent.render.process import Runner
from agent.render.sops_guard import DOTENV_PREFIX, foreign_key_services, without_forged_marks
from agent.render.tools import memory_problem, sandbox_env

SOPS_KEY = "sops"
#: How sops writes an encrypted value (AES-GCM is its only cipher).
ENC_PREFIX = "ENC[AES256_GCM,"
_IDENTITY_PATHS = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")}


class SopsMode(enum.StrEnum):
    """What a render does with encrypted files."""

    DECRYPT = "decrypt"
    #: Keep the ciphertext (no key needed): for reports that compare Git with Git.
    SEAL = "seal"


@dataclass(frozen=True)
class AgeKeys:
    """Age identities in memory and where they came from; the identities are never printed."""

    identities: str = field(repr=False)
    #: Their sources in words, for messages: ``age_key_file /etc/...``, ``Secret ns/name``.
    sources: tuple[str, ...] = ()

    @property
    def fingerprint(self) -> str:
        """Tells key sets apart in cache keys without holding the keys there."""
        return hashlib.sha256(self.identities.encode()).hexdigest()[:16]


#: sops's exit codes (``cmd/sops/codes``) → what they mean for the file.
_EXIT_FAULTS = {
    128: DecryptFault.NO_MATCHING_KEY,  # CouldNotRetrieveKey
    51: DecryptFault.MAC_MISMATCH,  # MacMismatch
    24: DecryptFault.MAC_MISMATCH,  # ErrorDecryptingMac
    25: DecryptFault.TAMPERED,  # ErrorDecryptingTree
}


def fault_of(exit_code: int) -> DecryptFault:
    return _EXIT_FAULTS.get(exit_code, DecryptFault.MALFORMED)


def encrypted(value: Any) -> bool:
    """An object (or document) that carries SOPS metadata."""
    return isinstance(value, dict) and SOPS_KEY in value


def recipients_of(meta: Any) -> tuple[str, ...]:
    """The age recipients SOPS metadata names (its own list and its key groups')."""
    if not isinstance(meta, dict):
        return ()
    groups = [meta, *(g for g in meta.get("key_groups") or () if isinstance(g, dict))]
    found = [
        str(a["recipient"])
        for g in groups
        for a in (g.get("age") or ())
        if isinstance(a, dict) and a.get("recipient")
    ]
    return tuple(dict.fromkeys(found))


def _pointer(path: tuple[str, ...]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


def _reveal(
    value: Any, plain: dict[str, Any] | None, path: tuple[str, ...], found: set[str], missing: list[str]
) -> Any:
    """``value`` with its ciphertext replaced from ``plain`` (``None``: kept, only recorded).

    Pointers stop at a list: a value inside one masks the whole list (its items have no stable name).
    """
    if isinstance(value, str) and value.startswith(ENC_PREFIX):
        if path not in _IDENTITY_PATHS:
            found.add(_pointer(path))
        if plain is None:
            return value
        if value not in plain:
            missing.append(_pointer(path) or "/")
            return value
        return plain[value]
    if isinstance(value, dict):
        return {k: _reveal(v, plain, (*path, str(k)), found, missing) for k, v in value.items()}
    if isinstance(value, list):
        return [_reveal(v, plain, path, found, missing) for v in value]
    return value


def _pairs(cipher: Any, plain: Any, out: dict[str, Any]) -> None:
    """Each ``ENC[...]`` string of ``cipher`` → the value at the same place in ``plain``."""
    if isinstance(cipher, str) and cipher.startswith(ENC_PREFIX):
        out[cipher] = plain
    elif isinstance(cipher, dict) and isinstance(plain, dict):
        for k, v in cipher.items():
            if k in plain:
                _pairs(v, plain[k], out)
    elif isinstance(cipher, list) and isinstance(plain, list) and len(cipher) == len(plain):
        for c, p in zip(cipher, plain, strict=True):
            _pairs(c, p, out)


def mark(obj: dict[str, Any], pointers: Iterable[str]) -> dict[str, Any]:
    """``obj`` annotated with the pointers of its encrypted values (replacing any it had)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return obj  # not an object: validation reports it
    annotations = meta.get("annotations")
    annotations = dict(annotations) if isinstance(annotations, dict) else {}
    listed = sorted(pointers)
    if listed:
        annotations[DECRYPTED_FIELDS] = json.dumps(listed, separators=(",", ":"))
    else:
        annotations.pop(DECRYPTED_FIELDS, None)
    obj["metadata"] = {**meta, "annotations": annotations} if annotations or "annotations" in meta else meta
    return obj


class Sops:
    """The encrypted files of one render: each decrypted once, every problem collected."""

    def __init__(
        self,
        tree: Path,
        keys: AgeKeys | None,
        mode: SopsMode,
        *,
        runner: Runner,
        timeout: float,
        max_output: int,
        max_file: int,
        problems: list[RenderProblem],
    ) -> None:
        self.tree = tree
        self.keys = keys
        self.mode = mode
        self.runner = runner
        self.timeout = timeout
        self.max_output = max_output
        self.max_file = max_file
        self.problems = problems
        #: Repository-relative file → ciphertext → plaintext (``None``: it did not decrypt).
        self._plain: dict[str, dict[str, Any] | None] = {}
        #: Every encrypted file met, in the order met.
        self.sources: dict[str, EncryptedSource] = {}
        self._texts: dict[Path, str] = {}

    def rel(self, path: Path) -> str:
        return path.relative_to(self.tree).as_posix()

    # -- plain files ----------------------------------------------------------------

    def file_docs(self, raw: bytes, docs: list[Document], origin: Origin, kind: str) -> list[Document]:
        """A plain file's documents, decrypted; [] (and a problem) when it does not decrypt."""
        docs = without_forged_marks(docs, origin, self.problems)
        metas = [d.value[SOPS_KEY] for d in docs if encrypted(d.value)]
        if not metas:
            return docs
        file = origin.file
        if len(metas) != sum(1 for d in docs if d.value is not None) or any(m != metas[0] for m in metas):
            self._problem(
                file,
                DecryptFault.MALFORMED,
                "mixes encrypted and plain documents (or documents encrypted apart): sops encrypts "
                "a file as a whole, so keep such documents in files of their own",
            )
            return []
        self.sources.setdefault(file, EncryptedSource(file, recipients_of(metas[0])))
        plain = self._decrypt(file, raw, kind, metas[0], [d.value for d in docs if d.value is not None])
        if plain is None and self.mode is SopsMode.DECRYPT:
            return []
        out = []
        for d in docs:
            obj = self._object(d.value, plain, file) if d.value is not None else None
            if obj is not None or d.value is None:
                out.append(Document(obj, d.index, d.line))
        return out

    # -- tool output ----------------------------------------------------------------

    def output_docs(self, docs: list[Document], origin: Origin, roots: Iterable[Path]) -> list[Document]:
        """Kustomize/helm output: ciphertext replaced from the files under ``roots`` it came from."""
        roots = list(roots)
        out: list[Document] = []
        for d in without_forged_marks(docs, origin, self.problems):
            value = d.value
            if encrypted(value):
                value = self._output_object(value, origin.locate(d.line)[0], roots)
            elif isinstance(value, dict) and value.get("apiVersion") == "v1":
                value = self._generated(value, origin.locate(d.line)[0], roots)
            if value is not None:  # a value that is still the tool's own is still plain JSON
                out.append(Document(value, d.index, d.line, json=d.json and value is d.value))
        return out

    def _output_object(self, obj: dict[str, Any], where: str, roots: list[Path]) -> dict[str, Any] | None:
        meta = obj[SOPS_KEY]
        mac = meta.get("mac") if isinstance(meta, dict) else None
        if not isinstance(mac, str) or not mac:
            self._problem(where, DecryptFault.MALFORMED, "carries sops metadata without a MAC")
            return None
        source = self._find(mac, roots)
        if source is None:
            self._unresolved(where, roots, "carries sops metadata")
            return None
        return self._object(obj, self._source_plain(source, "yaml"), self.rel(source), output=True)

    def _generated(self, obj: dict[str, Any], where: str, roots: list[Path]) -> dict[str, Any] | None:
        """A Secret or ConfigMap a kustomize generator filled from encrypted files (``envs``, ``files``)."""
        secret = obj.get("kind") == "Secret"
        if not secret and obj.get("kind") != "ConfigMap":
            return obj
        data = obj.get("data")
        if not isinstance(data, dict):
            return obj
        values = {k: _decoded(v) if secret else v for k, v in data.items()}
        texts = {k: v for k, v in values.items() if isinstance(v, str)}
        if not any(ENC_PREFIX in v for v in texts.values()):
            return obj
        new: dict[str, Any] = {}
        pointers: set[str] = set()
        mac = texts.get(f"{DOTENV_PREFIX}mac")
        env_plain: dict[str, str] | None = None
        if mac is not None:  # an `envs` entry: one key per line of an encrypted dotenv file
            source = self._find(f"{DOTENV_PREFIX}mac={mac}", roots)
            if source is None:
                self._unresolved(where, roots, "holds a dotenv file's sops metadata")
                return None
            env_plain = self._dotenv_plain(source)
            if env_plain is None:
                return None
        for k, v in data.items():
            text = texts.get(k)
            if mac is not None and k.startswith(DOTENV_PREFIX):
                continue
            if text is None or ENC_PREFIX not in text:
                new[k] = v
                continue
            pointers.add(_pointer(("data", k)))
            plain: str | bytes | None
            if env_plain is not None and text.startswith(ENC_PREFIX):
                plain = env_plain.get(k)
                if plain is None and self.mode is SopsMode.DECRYPT:
                    self._unresolved(where, roots, f"data.{k} holds ciphertext that")
                    return None
            else:  # a `files` entry: the whole encrypted file is the value
                plain = self._whole_file(text, where, roots)
            if self.mode is SopsMode.SEAL:
                new[k] = v
                continue
            if plain is None:
                return None
            new[k] = _encoded(plain) if secret else _as_text(plain)
            if new[k] is None:
                self._problem(where, DecryptFault.MALFORMED, f"data.{k}: decrypted content is not UTF-8 text")
                return None
        return mark({**obj, "data": new}, pointers)

    def _whole_file(self, text: str, where: str, roots: list[Path]) -> bytes | None:
        kind, meta = _sniff(text)
        mac = meta.get("mac") if isinstance(meta, dict) else None
        if kind is None or not isinstance(mac, str):
            self._problem(where, DecryptFault.MALFORMED, "holds ciphertext that is not a whole sops file")
            return None
        source = self._find(mac, roots)
        name = self.rel(source) if source is not None else where
        self.sources.setdefault(name, EncryptedSource(name, recipients_of(meta)))
        return self._run(name, text.encode(), kind, meta)

    # -- decryption -----------------------------------------------------------------

    def _object(
        self, value: Any, plain: dict[str, Any] | None, file: str, *, output: bool = False
    ) -> dict[str, Any] | None:
        """One object with its ciphertext replaced (or, sealed, kept) and its pointers marked."""
        if not isinstance(value, dict):
            return value  # type: ignore[no-any-return]  # not an object: validation reports it
        body = {k: v for k, v in value.items() if k != SOPS_KEY}
        found: set[str] = set()
        missing: list[str] = []
        revealed = _reveal(body, None if self.mode is SopsMode.SEAL else plain, (), found, missing)
        if missing:
            at = ", ".join(missing[:5])
            what = f"{_describe(value)} holds ciphertext at {at} that this file does not hold"
            if output:
                what += " (kustomize merged several encrypted documents, e.g. a patch: encrypt the result)"
            self._problem(file, DecryptFault.UNRESOLVED, what)
            return None
        return mark(copy.copy(revealed), found)

    def _source_plain(self, source: Path, kind: str) -> dict[str, Any] | None:
        """A repository file's ciphertext → plaintext, decrypting it on first use."""
        file = self.rel(source)
        if file in self._plain:
            return self._plain[file]
        text = self._text(source)
        parse = parse_json if kind == "json" or source.suffix == ".json" else parse_yaml
        docs, problems = parse(text, Origin(file), None)
        values = [d.value for d in docs if d.value is not None]
        meta = next((v[SOPS_KEY] for v in values if encrypted(v)), None)
        self.sources.setdefault(file, EncryptedSource(file, recipients_of(meta)))
        if problems or meta is None:
            self._problem(
                file, DecryptFault.MALFORMED, "is not a file sops can decrypt (not valid YAML/JSON)"
            )
            self._plain[file] = None
            return None
        kind = "json" if parse is parse_json else "yaml"
        return self._decrypt(file, text.encode(), kind, meta, values)

    def _decrypt(
        self, file: str, raw: bytes, kind: str, meta: Any, cipher: list[Any]
    ) -> dict[str, Any] | None:
        """Ciphertext → plaintext of one file (``None`` when sealed or when it did not decrypt)."""
        if self.mode is SopsMode.SEAL:
            return None
        if file in self._plain:
            return self._plain[file]
        self._plain[file] = None
        out = self._run(file, raw, kind, meta)
        if out is None:
            return None
        parse = parse_json if kind == "json" else parse_yaml
        try:
            docs, problems = parse(out.decode("utf-8"), Origin(file), None)
        except UnicodeDecodeError:
            docs, problems = [], [RenderProblem(file, "not UTF-8")]
        if problems:
            # The parser's message could quote decrypted text: say where, not what.
            self._problem(file, DecryptFault.MALFORMED, "decrypts to content that is not valid YAML/JSON")
            return None
        plain: dict[str, Any] = {}
        values = [d.value for d in docs if d.value is not None]
        for c, p in zip(cipher, values, strict=False):
            _pairs({k: v for k, v in c.items() if k != SOPS_KEY} if isinstance(c, dict) else c, p, plain)
        self._plain[file] = plain
        return plain

    def _dotenv_plain(self, source: Path) -> dict[str, str] | None:
        file = self.rel(source)
        text = self._text(source)
        meta = {
            k.removeprefix(DOTENV_PREFIX): v for k, v in _dotenv(text).items() if k.startswith(DOTENV_PREFIX)
        }
        age = [v for k, v in meta.items() if k.startswith("age__") and k.endswith("__map_recipient")]
        self.sources.setdefault(file, EncryptedSource(file, tuple(age)))
        if self.mode is SopsMode.SEAL:
            return {}
        out = self._run(file, text.encode(), "dotenv", None)
        if out is None:
            return None
        return {k: v.replace("\\n", "\n") for k, v in _dotenv(out.decode("utf-8", "replace")).items()}

    def _run(self, file: str, raw: bytes, kind: str, meta: Any = None) -> bytes | None:
        """``sops decrypt`` of ``raw`` from stdin to stdout; ``None`` (and a problem) on failure."""
        if self.mode is SopsMode.SEAL:
            return None
        dotenv = _dotenv(raw.decode("utf-8", "replace")) if kind == "dotenv" else None
        foreign = foreign_key_services(dotenv, meta)
        if foreign:
            self._problem(
                file,
                DecryptFault.KEY_SERVICE,
                f"names key services other than age ({', '.join(foreign)}): a render decrypts with "
                "the app's age identities only and reaches no network; remove them "
                "(sops updatekeys with an age-only .sops.yaml rule)",
            )
            return None
        if self.keys is None:
            self._problem(
                file,
                DecryptFault.NO_KEYS,
                "is encrypted with sops, and the app has no decryption keys: give it a "
                "`decryption` table (age_key_file, age_key_env or secret_name; docs/secrets.md)",
            )
            return None
        try:
            sops = tool("sops")
        except LocalClusterError as e:
            self._problem(file, DecryptFault.TOOL, f"cannot be decrypted: {e}")
            return None
        with tempfile.TemporaryDirectory(prefix="gitops-agent-sops-") as home:
            env = sandbox_env(Path(home))
            env["SOPS_AGE_KEY"] = self.keys.identities
            argv = [str(sops), "decrypt", "--input-type", kind, "--output-type", kind]
            try:
                res = self.runner(
                    argv, cwd=Path(home), env=env, timeout=self.timeout, max_output=self.max_output, stdin=raw
                )
            except OSError as e:
                self._problem(file, DecryptFault.TOOL, f"sops could not be started: {e.strerror or e}")
                return None
        if res.timed_out:
            self._problem(file, DecryptFault.TOOL, f"sops decrypt timed out after {self.timeout:g}s")
        elif res.out_of_memory:
            self.problems.append(replace(memory_problem(file, "sops decrypt", res), fault=DecryptFault.TOOL))
        elif res.truncated:
            self._problem(file, DecryptFault.TOOL, f"decrypts to more than {self.max_output} bytes")
        elif res.returncode != 0:
            self._failed(file, res.returncode, res.stderr, meta)
        else:
            return res.stdout
        return None

    def _failed(self, file: str, code: int, stderr: bytes, meta: Any) -> None:
        fault = fault_of(code)
        assert self.keys is not None
        if fault is DecryptFault.NO_MATCHING_KEY:
            to = ", ".join(recipients_of(meta)) or "no age recipient"
            message = (
                f"cannot be decrypted: none of the app's age identities ({', '.join(self.keys.sources)}) "
                f"opens it; it is encrypted to {to}"
            )
        elif fault is DecryptFault.MAC_MISMATCH:
            message = (
                "was changed after it was encrypted (MAC mismatch): edit it with sops, never by hand, "
                "and re-encrypt"
            )
        elif fault is DecryptFault.TAMPERED:
            message = "holds an encrypted value that does not authenticate (altered ciphertext)"
        else:
            lines = [ln for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
            message = f"is not a file sops can decrypt (sops exit {code}): {' | '.join(lines[-3:])}"
        self._problem(file, fault, message)

    # -- finding the files ciphertext came from ------------------------------------------

    def _find(self, needle: str, roots: list[Path]) -> Path | None:
        """The first file under ``roots`` whose text holds ``needle`` (a MAC: unique per file)."""
        for root in roots:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for name in sorted(filenames):
                    path = Path(dirpath) / name
                    if needle in self._text(path):
                        return path
        return None

    def _text(self, path: Path) -> str:
        if path not in self._texts:
            try:
                small = path.is_file() and path.stat().st_size <= self.max_file
                self._texts[path] = path.read_text("utf-8") if small else ""
            except (OSError, UnicodeDecodeError):
                self._texts[path] = ""
        return self._texts[path]

    def _unresolved(self, where: str, roots: list[Path], what: str) -> None:
        dirs = ", ".join(self.rel(r) for r in roots) or "the repository"
        self._problem(
            where,
            DecryptFault.UNRESOLVED,
            f"an object {what} that no encrypted file under {dirs} explains (kustomize merged it "
            "with another encrypted document, or the file lies outside)",
        )

    def _problem(self, file: str, fault: DecryptFault, message: str) -> None:
        self.problems.append(RenderProblem(file, message, fault=fault))


def _describe(value: dict[str, Any]) -> str:
    meta = value.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{value.get('kind', 'object')}/{name}" if name else str(value.get("kind", "the object"))


def _decoded(value: Any) -> str | None:
    try:
        # kustomize folds long values over lines: the whitespace is not part of the base64.
        return base64.b64decode("".join(str(value).split()), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def _encoded(value: str | bytes) -> str:
    return base64.b64encode(value.encode() if isinstance(value, str) else value).decode()


def _as_text(value: str | bytes) -> str | None:
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _dotenv(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            out[k.strip()] = v
    return out


def _sniff(text: str) -> tuple[str | None, Any]:
    """(sops input type, metadata) of a whole encrypted file's text, or (None, None)."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        docs, problems = parse_json(text, Origin(""), None)  # bounded depth, unlike json.loads
        if problems or not docs:
            return None, None
        value = docs[0].value
        if encrypted(value):
            return ("binary" if set(value) == {"data", SOPS_KEY} else "json"), value[SOPS_KEY]
        return None, None
    if f"\n{DOTENV_PREFIX}mac=" in f"\n{text}":
        env = _dotenv(text)
        return "dotenv", {"mac": env.get(f"{DOTENV_PREFIX}mac")}
    docs, problems = parse_yaml(text, Origin(""), None)
    values = [d.value for d in docs if d.value is not None]
    if not problems and values and encrypted(values[0]):
        return "yaml", values[0][SOPS_KEY]
    return None, None
