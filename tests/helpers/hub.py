"""A small Hugging Face Hub on 127.0.0.1, for tests that load models "from the Hub" with the
real `huggingface_hub` client (and transformers on top of it) over real sockets.

`HubServer` answers what the client asks of huggingface.co: `HEAD`/`GET
/{repo_id}/resolve/{revision}/{path}` (with `Range`), `GET /api/models/{repo_id}[/revision/{rev}]`
and `GET /api/models/{repo_id}/tree/{rev}[/{path}]` (paginated with a `Link` header), and the
errors the client turns into `RepositoryNotFoundError`, `GatedRepoError`,
`RevisionNotFoundError` and `RemoteEntryNotFoundError`. Large ("LFS") files are redirected,
as on the Hub, to a second origin (`cdn_url`, another port), which the client reaches without
its `Authorization` header.

The `hub` fixture (import it into the test module) starts a server and points the client,
already imported, at it with a fresh cache and no token (`use_hub`); `go_offline` switches
the client to offline mode halfway through a test; `serve_hf_model` serves a transformers
model saved with `save_pretrained`.

    def test_it_loads(hub):
        hub.add_files("org/name", {"config.json": b"{}"})
        path = huggingface_hub.hf_hub_download("org/name", "config.json")
        assert hub.fetched() == ["config.json"]

Only model repos exist here. The client reads its settings (`HF_ENDPOINT`, `HF_HUB_CACHE`,
`HF_HUB_OFFLINE`, ...) from the environment when it is imported: `use_hub` sets the
environment for subprocesses and patches the values the imported modules copied.
"""

import functools
import hashlib
import http.server
import json
import os
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# What the Hub's default .gitattributes stores with Git LFS (and anything from 10 MiB).
LFS_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".npy", ".npz",
    ".gguf", ".model", ".pkl", ".zip", ".tar", ".gz",
)  # fmt: skip
LFS_MIN_SIZE = 10 * 1024 * 1024
# The token `HubRepo` grants access with when it is gated or private and names none.
DEFAULT_TOKEN = "hf_hubserver_test_token"
# Every commit of this hub was made at this instant.
COMMIT_DATE = "2024-01-01T00:00:00.000Z"
# Sub-paths that follow a repo id in the Hub's URLs (so `gpt2/resolve/...` is repo `gpt2`).
_SUBPATHS = {"resolve", "revision", "tree", "blob", "raw", "refs", "commit", "paths-info"}


@dataclass(frozen=True)
class Blob:
    """One file's bytes and the names the Hub gives them: `oid` is the git object id (of the
    LFS pointer for an LFS file), `sha256` the content's, `lfs` whether LFS stores it."""

    content: bytes
    oid: str
    sha256: str
    lfs: bool
    pointer_size: int

    @property
    def etag(self) -> str:
        """The file's ETag on the Hub, unquoted: the sha256 for LFS files, else the git oid."""
        return self.sha256 if self.lfs else self.oid


def git_oid(content: bytes) -> str:
    """The git object id of a blob holding `content` (sha1 over a `blob <size>\\0` header)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@functools.lru_cache(maxsize=64)
def _blob(content: bytes, lfs: bool) -> Blob:
    sha256 = hashlib.sha256(content).hexdigest()
    if not lfs:
        return Blob(content, git_oid(content), sha256, False, 0)
    pointer = (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(content)}\n"
    )
    pointer_bytes = pointer.encode()
    return Blob(content, git_oid(pointer_bytes), sha256, True, len(pointer_bytes))


def blob(path: str, content: bytes) -> Blob:
    """`content` as the Hub stores it at `path` (LFS by suffix or size, as the Hub does)."""
    return _blob(content, path.endswith(LFS_SUFFIXES) or len(content) >= LFS_MIN_SIZE)


@dataclass(frozen=True)
class Snapshot:
    """A revision of a repo: the name it was asked by, its commit sha, its files."""

    name: str
    sha: str
    files: Mapping[str, Blob]


@dataclass
class HubRepo:
    """A model repo: `revisions` maps branch or tag names to `{path_in_repo: bytes}` (`main` is
    the default branch). Each revision's commit sha is derived from the repo id and its files,
    so it is the same on every run; asking for that sha is asking for the revision.

    `gated`: downloads need `Authorization: Bearer <token>` (401 without one, 403 with another);
    its model info and file listing stay public, as on the Hub. `private`: everything about the
    repo needs the token (answered as if the repo did not exist)."""

    repo_id: str
    revisions: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {}})
    gated: bool = False
    private: bool = False
    token: str = DEFAULT_TOKEN

    def snapshot(self, revision: str = "main") -> Snapshot | None:
        """The revision named `revision` (a branch, a tag or a commit sha), or None."""
        names = [revision] if revision in self.revisions else list(self.revisions)
        for name in names:
            files = {path: blob(path, content) for path, content in self.revisions[name].items()}
            listing = "".join(f"{path}\0{files[path].oid}\n" for path in sorted(files))
            sha = hashlib.sha1(f"{self.repo_id}\n{listing}".encode()).hexdigest()
            if name == revision or sha == revision.lower():
                return Snapshot(name, sha, files)
        return None

    def commit(self, revision: str = "main") -> str:
        """The commit sha of `revision`."""
        snapshot = self.snapshot(revision)
        if snapshot is None:
            raise KeyError(f"{self.repo_id} has no revision {revision!r}")
        return snapshot.sha

    def allows(self, authorization: str | None) -> bool:
        """Whether a request with this `Authorization` header may read a gated or private repo."""
        return authorization == f"Bearer {self.token}"


@dataclass
class HubRequest:
    """A request the server saw: its method, path (as sent, without the query), query
    (`{name: [values]}`), headers, the status answered, which listener took it (`hub` or `cdn`),
    and for a file the repo and path in repo it was for."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    origin: str
    status: int | None = None
    repo_id: str | None = None
    file: str | None = None

    def header(self, name: str) -> str | None:
        """The value of header `name` (any case), or None."""
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)


@dataclass
class _Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    cut_after: int | None = None


class _Listener(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: "HubServer", role: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub = hub
        self.role = role


class _Handler(http.server.BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so a stopped server has no connection left open.
    server: _Listener
    server_version = "hubserver/1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        split = urllib.parse.urlsplit(self.path)
        request = HubRequest(
            method=method,
            path=split.path,
            query=urllib.parse.parse_qs(split.query),
            headers=dict(self.headers.items()),
            origin=self.server.role,
        )
        try:
            response = self.server.hub._answer(request)
        except Exception as error:  # a bug here must reach the test as a 500, not a hang
            response = _error(500, "ServerError", f"{type(error).__name__}: {error}")
        request.status = response.status
        self.server.hub._record(request)
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        if method != "HEAD":
            body = response.body
            if response.cut_after is not None:
                body = body[: response.cut_after]
            self.wfile.write(body)
        self.close_connection = True


def _error(status: int, code: str, message: str, **headers: str) -> _Response:
    body = json.dumps({"error": message}).encode()
    return _Response(
        status,
        {
            "Content-Type": "application/json; charset=utf-8",
            "Content-Length": str(len(body)),
            "X-Error-Code": code,
            "X-Error-Message": message,
            **headers,
        },
        body,
    )


def _json(data: Any, **headers: str) -> _Response:
    body = json.dumps(data).encode()
    head = {"Content-Type": "application/json; charset=utf-8", "Content-Length": str(len(body))}
    return _Response(200, head | headers, body)


def _true(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, ["false"])[-1].lower() in ("1", "true")


class HubServer:
    """The hub, on 127.0.0.1 (any free port): a context manager, started on entry and stopped
    on exit (or `start()` / `stop()`); `url` is what `HF_ENDPOINT` names.

    `cdn`: LFS files are answered with a 302 to `cdn_url` (a second listener), as the Hub
    sends them to its CDN; with `cdn=False` they are served at their resolve URL.
    `page_size`, `expand_page_size`: tree entries per page (the Hub's 1000 and 50).

    `requests` lists `(method, path)` for every request seen, `log` the full `HubRequest`s,
    `fetched()` the files whose bytes were sent; `forget_requests()` empties them."""

    def __init__(
        self,
        repos: tuple[HubRepo, ...] = (),
        *,
        cdn: bool = True,
        page_size: int = 1000,
        expand_page_size: int = 50,
    ) -> None:
        self.cdn = cdn
        self.page_size = page_size
        self.expand_page_size = expand_page_size
        self._repos: dict[str, HubRepo] = {}
        self._cuts: dict[str, tuple[int, int]] = {}
        self._log: list[HubRequest] = []
        self._lock = threading.Lock()
        self._listeners: list[tuple[_Listener, threading.Thread]] = []
        self._url: str | None = None
        self._cdn_url: str | None = None
        for repo in repos:
            self.add(repo)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "HubServer":
        """Listen (in daemon threads) until `stop()`."""
        if self._listeners:
            return self
        for role in ("hub", "cdn") if self.cdn else ("hub",):
            listener = _Listener(self, role)
            thread = threading.Thread(
                target=listener.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            thread.start()
            self._listeners.append((listener, thread))
            host, port = listener.server_address[:2]
            if role == "hub":
                self._url = f"http://{host}:{port}"
            else:
                self._cdn_url = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        """Stop listening: later requests are refused (connection refused). Idempotent."""
        while self._listeners:
            listener, thread = self._listeners.pop()
            listener.shutdown()
            listener.server_close()
            thread.join(timeout=5)

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`, the endpoint (kept after `stop()`)."""
        if self._url is None:
            raise RuntimeError("the hub server has not been started")
        return self._url

    @property
    def cdn_url(self) -> str | None:
        """Where LFS files are redirected to (None with `cdn=False`)."""
        return self._cdn_url

    # ------------------------------------------------------------------ content
    def add(self, repo: HubRepo) -> HubRepo:
        """Serve `repo` (replacing a repo of the same id); returns it."""
        with self._lock:
            self._repos[repo.repo_id] = repo
        return repo

    def add_files(
        self, repo_id: str, files: Mapping[str, bytes | str], revision: str = "main", **repo: Any
    ) -> HubRepo:
        """Commit `files` (str is UTF-8 encoded) to `revision` of `repo_id`, on top of what the
        revision holds; the repo (made with the `HubRepo` fields in `repo`) and the revision
        are created if missing. Returns the repo."""
        encoded = {p: c.encode() if isinstance(c, str) else bytes(c) for p, c in files.items()}
        with self._lock:
            current = self._repos.get(repo_id)
            if current is None:
                current = self._repos[repo_id] = HubRepo(repo_id, {}, **repo)
            current.revisions[revision] = current.revisions.get(revision, {}) | encoded
        return current

    def repo(self, repo_id: str) -> HubRepo:
        """The repo served as `repo_id`."""
        with self._lock:
            return self._repos[repo_id]

    def cut_download(
        self, repo_id: str, filename: str, after_bytes: int, revision: str = "main", times: int = 1
    ) -> None:
        """Cut the next `times` GETs that send this file's bytes: each announces the full
        Content-Length but the connection closes after `after_bytes` bytes of the body (the
        client retries a cut download 5 times, resuming, before it gives up)."""
        snapshot = self.repo(repo_id).snapshot(revision)
        if snapshot is None or filename not in snapshot.files:
            raise KeyError(f"{repo_id}@{revision} has no file {filename!r}")
        size = len(snapshot.files[filename].content)
        if not 0 <= after_bytes < size:
            raise ValueError(f"after_bytes must be in [0, {size}), not {after_bytes}")
        with self._lock:
            self._cuts[snapshot.files[filename].sha256] = (after_bytes, times)

    # ------------------------------------------------------------------ what was asked
    @property
    def log(self) -> list[HubRequest]:
        """Every request seen so far, in order (a copy)."""
        with self._lock:
            return list(self._log)

    @property
    def requests(self) -> list[tuple[str, str]]:
        """`(method, path)` of every request seen so far, in order."""
        return [(r.method, r.path) for r in self.log]

    def fetched(self, repo_id: str | None = None) -> list[str]:
        """The paths in repo of the files whose bytes were sent (GET answered 200 or 206), in
        order, for `repo_id` or every repo."""
        return [
            r.file
            for r in self.log
            if r.method == "GET" and r.status in (200, 206) and r.file is not None
            if repo_id is None or r.repo_id == repo_id
        ]

    def forget_requests(self) -> None:
        """Empty `log` (and so `requests` and `fetched()`)."""
        with self._lock:
            self._log.clear()

    def _record(self, request: HubRequest) -> None:
        with self._lock:
            self._log.append(request)

    # ------------------------------------------------------------------ answers
    def _answer(self, request: HubRequest) -> _Response:
        segments = [urllib.parse.unquote(s) for s in request.path.split("/")[1:]]
        if request.origin == "cdn":
            return self._answer_cdn(request, segments)
        if request.method != "POST" and segments[:2] == ["api", "models"]:
            repo_id, rest = self._split_repo_id(segments[2:])
            request.repo_id = repo_id
            if not rest:
                return self._model_info(request, repo_id, None)
            if rest[0] == "revision" and len(rest) == 2:
                return self._model_info(request, repo_id, rest[1])
            if rest[0] == "tree" and len(rest) >= 2:
                return self._tree(request, repo_id, rest[1], "/".join(rest[2:]).strip("/"))
        elif request.method != "POST" and segments[0] != "api":
            repo_id, rest = self._split_repo_id(segments)
            if len(rest) >= 2 and rest[0] == "resolve":
                request.repo_id = repo_id
                return self._resolve(request, repo_id, rest[1], "/".join(rest[2:]))
        return _error(404, "NotFound", f"Sorry, we can't find the page at {request.path}.")

    def _split_repo_id(self, segments: list[str]) -> tuple[str, list[str]]:
        with self._lock:
            known = set(self._repos)
        if not segments or not segments[0]:
            return "", []
        if len(segments) >= 2 and f"{segments[0]}/{segments[1]}" in known:
            return f"{segments[0]}/{segments[1]}", segments[2:]
        if segments and (segments[0] in known or len(segments) < 2 or segments[1] in _SUBPATHS):
            return segments[0], segments[1:]
        return f"{segments[0]}/{segments[1]}", segments[2:]

    def _repo_for(self, request: HubRequest, repo_id: str, files: bool) -> HubRepo | _Response:
        """The repo, or the error a client without access gets (as the Hub answers it)."""
        authorization = request.header("Authorization")
        with self._lock:
            repo = self._repos.get(repo_id)
        if repo is None or (repo.private and not repo.allows(authorization)):
            message = "Repository not found"
            return _error(401 if authorization is None else 404, "RepoNotFound", message)
        if repo.gated and files and not repo.allows(authorization):
            if authorization is None:
                message = (
                    f"Access to model {repo_id} is restricted. You must have access to it and be"
                    " authenticated to access it. Please log in."
                )
                return _error(401, "GatedRepo", message)
            message = (
                f"Access to model {repo_id} is restricted and you are not in the authorized list."
                f" Visit {self.url}/{repo_id} to ask for access."
            )
            return _error(403, "GatedRepo", message)
        return repo

    def _snapshot_for(self, repo: HubRepo, revision: str) -> Snapshot | _Response:
        snapshot = repo.snapshot(revision)
        if snapshot is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return snapshot

    def _model_info(self, request: HubRequest, repo_id: str, revision: str | None) -> _Response:
        repo = self._repo_for(request, repo_id, files=False)
        if isinstance(repo, _Response):
            return repo
        snapshot = self._snapshot_for(repo, revision or "main")
        if isinstance(snapshot, _Response):
            return snapshot
        blobs = _true(request.query, "blobs")
        siblings = []
        for path in sorted(snapshot.files):
            sibling: dict[str, Any] = {"rfilename": path}
            b = snapshot.files[path]
            if blobs:
                sibling |= {"size": len(b.content), "blobId": b.oid}
                if b.lfs:
                    sibling["lfs"] = {
                        "sha256": b.sha256, "size": len(b.content), "pointerSize": b.pointer_size
                    }  # fmt: skip
            siblings.append(sibling)
        info = {
            "_id": snapshot.sha[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0] if "/" in repo_id else None,
            "sha": snapshot.sha,
            "lastModified": COMMIT_DATE,
            "createdAt": COMMIT_DATE,
            "private": repo.private,
            "gated": "auto" if repo.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "spaces": [],
            "usedStorage": sum(len(b.content) for b in snapshot.files.values()),
        }
        if "expand" in request.query:
            wanted = {"_id", "id", *request.query["expand"]}
            info = {k: v for k, v in info.items() if k in wanted}
        return _json(info)

    def _tree(self, request: HubRequest, repo_id: str, revision: str, folder: str) -> _Response:
        repo = self._repo_for(request, repo_id, files=False)
        if isinstance(repo, _Response):
            return repo
        snapshot = self._snapshot_for(repo, revision)
        if isinstance(snapshot, _Response):
            return snapshot
        prefix = f"{folder}/" if folder else ""
        inside = sorted(p for p in snapshot.files if p.startswith(prefix))
        if folder and not inside:
            return _error(404, "EntryNotFound", f"{folder} does not exist on {revision}")
        recursive, expand = _true(request.query, "recursive"), _true(request.query, "expand")
        folders: dict[str, list[str]] = {}
        for path in inside:
            parts = path[len(prefix) :].split("/")
            for depth in range(1, len(parts)):
                folders.setdefault(prefix + "/".join(parts[:depth]), []).append(path)
        entries: list[dict[str, Any]] = []
        for path in sorted([*inside, *folders]):
            if not recursive and "/" in path[len(prefix) :]:
                continue
            if path in folders:
                listing = "".join(f"{p}\0{snapshot.files[p].oid}\n" for p in folders[path])
                oid = hashlib.sha1(listing.encode()).hexdigest()
                entry: dict[str, Any] = {"type": "directory", "oid": oid, "size": 0, "path": path}
            else:
                b = snapshot.files[path]
                entry = {"type": "file", "oid": b.oid, "size": len(b.content), "path": path}
                if b.lfs:
                    entry["lfs"] = {
                        "oid": b.sha256, "size": len(b.content), "pointerSize": b.pointer_size
                    }  # fmt: skip
            if expand:
                entry["lastCommit"] = {"id": snapshot.sha, "title": "Upload", "date": COMMIT_DATE}
            entries.append(entry)
        size = self.expand_page_size if expand else self.page_size
        start = int(request.query.get("cursor", ["0"])[-1])
        page, headers = entries[start : start + size], {}
        if start + size < len(entries):
            query = {k: v[-1] for k, v in request.query.items()} | {"cursor": str(start + size)}
            link = f"{self.url}{request.path}?{urllib.parse.urlencode(query)}"
            headers["Link"] = f'<{link}>; rel="next"'
        return _json(page, **headers)

    def _resolve(self, request: HubRequest, repo_id: str, revision: str, path: str) -> _Response:
        repo = self._repo_for(request, repo_id, files=True)
        if isinstance(repo, _Response):
            return repo
        snapshot = self._snapshot_for(repo, revision)
        if isinstance(snapshot, _Response):
            return snapshot
        commit = {"X-Repo-Commit": snapshot.sha}
        b = snapshot.files.get(path)
        if b is None:
            return _error(404, "EntryNotFound", "Entry not found", **commit)
        request.file = path
        if b.lfs and self.cdn:
            query = urllib.parse.urlencode({"repo": repo_id, "filename": path})
            headers = {
                **commit,
                "Location": f"{self.cdn_url}/lfs/{b.sha256}?{query}",
                "ETag": f'"{b.oid}"',
                "X-Linked-Etag": f'"{b.sha256}"',
                "X-Linked-Size": str(len(b.content)),
                "Content-Length": "0",
            }
            return _Response(302, headers)
        return self._bytes(request, b, commit)

    def _answer_cdn(self, request: HubRequest, segments: list[str]) -> _Response:
        if request.method == "POST" or len(segments) != 2 or segments[0] != "lfs":
            return _error(404, "NotFound", "Not found")
        request.repo_id = request.query.get("repo", [None])[-1]
        request.file = request.query.get("filename", [None])[-1]
        with self._lock:
            repos = list(self._repos.values())
        for repo in repos:
            for name in list(repo.revisions):
                snapshot = repo.snapshot(name)
                for b in snapshot.files.values() if snapshot else ():
                    if b.sha256 == segments[1]:
                        return self._bytes(request, b, {})
        return _error(404, "NotFound", "No such object")

    def _bytes(self, request: HubRequest, b: Blob, headers: dict[str, str]) -> _Response:
        """The file's bytes, or the part a `Range: bytes=...` asks for (206), or 416."""
        size = len(b.content)
        head = {
            **headers,
            "ETag": f'"{b.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        status, start, stop = 200, 0, size
        asked = request.header("Range")
        if asked is not None and request.method == "GET":
            bounds = _parse_range(asked, size)
            if bounds is None:
                return _Response(
                    416, {**head, "Content-Range": f"bytes */{size}", "Content-Length": "0"}
                )
            status, (start, stop) = 206, bounds
            head["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        head["Content-Length"] = str(stop - start)
        cut = None
        if request.method == "GET":
            with self._lock:
                if b.sha256 in self._cuts:
                    cut, times = self._cuts.pop(b.sha256)
                    if times > 1:
                        self._cuts[b.sha256] = (cut, times - 1)
        return _Response(status, head, b.content[start:stop], cut)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """`(start, stop)` for a single `bytes=a-b`, `bytes=a-` or `bytes=-n`; None if it cannot be
    satisfied."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, _, last = spec.strip().partition("-")
    try:
        if not first:
            start, stop = max(size - int(last), 0), size
        else:
            start, stop = int(first), min(int(last) + 1, size) if last else size
    except ValueError:
        return None
    return (start, stop) if 0 <= start < stop else None


# ---------------------------------------------------------------------- pointing the client
def use_hub(monkeypatch: pytest.MonkeyPatch, url: str, home: Path) -> None:
    """Point the `huggingface_hub` (and transformers) this process has imported at the hub at
    `url`, online, with its home (caches, token file) in `home` and no token from the machine;
    `monkeypatch` undoes all of it.

    The client reads its settings when imported, so the environment (set too, for
    subprocesses) is not enough: this patches `constants` (`ENDPOINT`,
    `HUGGINGFACE_CO_URL_TEMPLATE`, `HF_URL_HOSTS`, the cache and token paths, `HF_HUB_OFFLINE`,
    `HF_HUB_DISABLE_TELEMETRY`, `HF_HUB_DISABLE_IMPLICIT_TOKEN`), the Hub origins `utils._http`
    trusts with the token, the endpoint of the module-level `HfApi` behind
    `huggingface_hub.model_info` and friends, the cache path `utils._cache_manager` copied,
    and transformers' shared `HfApi` (made again on first use); and it drops the client's
    pooled connections."""
    from huggingface_hub import constants, hf_api
    from huggingface_hub.utils import _cache_manager, _http

    home = Path(home)
    cache = home / "hub"
    for name in (
        "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_OIDC_ID_TOKEN",
        "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HUGGINGFACE_CO_STAGING", "HUGGINGFACE_HUB_CACHE",
        "HUGGINGFACE_ASSETS_CACHE", "HF_ASSETS_CACHE", "HF_XET_CACHE", "HF_TOKEN_PATH",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN", "XDG_CACHE_HOME",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    no_proxy = ",".join(filter(None, ["127.0.0.1,localhost", os.environ.get("NO_PROXY")]))
    env = dict(
        HF_ENDPOINT=url,
        HF_HOME=str(home),
        HF_HUB_CACHE=str(cache),
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_PROXY=no_proxy,
        no_proxy=no_proxy,
    )
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    settings = dict(
        ENDPOINT=url,
        HUGGINGFACE_CO_URL_TEMPLATE=url + "/{repo_id}/resolve/{revision}/{filename}",
        HF_URL_HOSTS=constants.HF_URL_HOSTS | {"127.0.0.1"},
        HF_HOME=str(home),
        HF_HUB_CACHE=str(cache),
        HUGGINGFACE_HUB_CACHE=str(cache),
        HF_ASSETS_CACHE=str(home / "assets"),
        HUGGINGFACE_ASSETS_CACHE=str(home / "assets"),
        HF_XET_CACHE=str(home / "xet"),
        HF_TOKEN_PATH=str(home / "token"),
        HF_STORED_TOKENS_PATH=str(home / "stored_tokens"),
        CHECK_FOR_UPDATE_DONE_PATH=str(home / ".check_for_update_done"),
        AGENT_HARNESSES_PATH=str(home / ".agent_harnesses.json"),
        HF_HUB_OFFLINE=False,
        HF_HUB_DISABLE_TELEMETRY=True,
        HF_HUB_DISABLE_IMPLICIT_TOKEN=False,
    )
    for name, value in settings.items():
        monkeypatch.setattr(constants, name, value, raising=False)
    monkeypatch.setattr(_http, "_HUB_ORIGINS", _http._HUB_ORIGINS | {_http._url_origin(url)})
    monkeypatch.setattr(hf_api.api, "endpoint", url)
    monkeypatch.setattr(_cache_manager, "HF_HUB_CACHE", str(cache))
    transformers_hub = sys.modules.get("transformers.utils.hub")
    if transformers_hub is not None:
        monkeypatch.setattr(transformers_hub, "_hf_api", None)
    _http.close_session()


def go_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch the client to offline mode (`HF_HUB_OFFLINE=1`, which it read at import): every
    request it would make raises `OfflineModeIsEnabled` and it answers from the cache."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def cache_folder(repo_id: str) -> Path:
    """The current cache's folder for model repo `repo_id` (`models--org--name`)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """A started `HubServer` (empty, with a CDN) the client is pointed at, with a fresh home
    (`tmp_path/hf-home`: the cache is `hf-home/hub`) and no token; all undone after the test."""
    from huggingface_hub.utils import _http

    with HubServer() as server:
        use_hub(monkeypatch, server.url, tmp_path / "hf-home")
        yield server
    _http.close_session()


# ---------------------------------------------------------------------- models
def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by its path relative to it (with `/`)."""
    folder = Path(folder)
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def serve_hf_model(
    server: HubServer,
    repo_id: str,
    model: Any,
    tokenizer: Any = None,
    revision: str = "main",
    save: Mapping[str, Any] | None = None,
    **repo: Any,
) -> HubRepo:
    """Serve what `model.save_pretrained(**save)` (safetensors, transformers' default) and
    `tokenizer.save_pretrained` write (either may be None), as `revision` of `repo_id` (made
    with the `HubRepo` fields in `repo` if new)."""
    with tempfile.TemporaryDirectory(prefix="hub-model-") as folder:
        if model is not None:
            model.save_pretrained(folder, **(save or {}))
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        return server.add_files(repo_id, folder_files(Path(folder)), revision, **repo)


def word_tokenizer() -> Any:
    """A transformers tokenizer of 50 whole words, `w0` ... `w48` and `<|endoftext|>` (49:
    BOS, EOS and unknown), split on white space: ids a test can read off the text."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(49)} | {"<|endoftext|>": 49}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )


# ---------------------------------------------------------------------- tiny causal LMs
# Random transformers models of 2 layers, width 16 and the 50 words of `word_tokenizer`,
# to serve under real names; `seed` draws other weights (another revision).
_TINY = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4)


def tiny_causal_lm(family: str, seed: int = 0) -> Any:
    """A tiny random `transformers` causal LM of `family` (`"gpt2"`, `"llama"` with
    grouped keys and values, or `"gpt_neox"` with half-rotary heads), in eval mode."""
    import torch
    import transformers

    configs = {
        "gpt2": lambda: transformers.GPT2Config(
            n_layer=2, n_embd=16, n_head=4, n_positions=64, vocab_size=50
        ),
        "llama": lambda: transformers.LlamaConfig(
            **_TINY, num_key_value_heads=2, vocab_size=50, max_position_embeddings=64
        ),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(
            **_TINY, rotary_pct=0.5, vocab_size=50, max_position_embeddings=64
        ),
    }
    if family not in configs:
        raise ValueError(f"no tiny model of family {family!r}; families: {sorted(configs)}")
    torch.manual_seed(seed)
    config = configs[family]()
    return transformers.AutoModelForCausalLM.from_config(config).eval()
