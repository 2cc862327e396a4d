"""The explorer's HTTP server: a Starlette app over a :class:`~msprobe.view._data.ViewData`.

:func:`serve` given a ``loader`` (what ``msprobe view`` does) prints its URL and serves the page as soon
as the set-up has run a second, while the rest is built in a thread: until the view's data is ready
the API answers ``202 {"loading": true, "stage", "elapsed_s", "stages"}`` (accepted, not yet done) and the page shows that
progress (the terminal shows each stage as it begins); a set-up that fails stops the server with its
one-line error.

Every request needs the access token (``?token=`` once, then a same-site cookie, or the
``X-Msprobe-Token`` header); every response carries a Content-Security-Policy without inline
script. Endpoints take cells, record and row names as query values and look them up in the
tables: no request names a file, so nothing outside the given roots can be read.
"""
from __future__ import annotations

import csv
import hmac
import io
import os
import secrets
import socket
import threading
import time
from typing import Any, Optional

from msprobe.errors import ConfigError, MissingDependencyError, MsprobeError
from msprobe.format.stats import NORM
from msprobe.view._data import FILTERS, ROW_FIELDS, NotYet, ViewData, json_safe
from msprobe.view.links import register, unregister

__all__ = ["make_app", "serve", "STATIC_DIR", "CSP", "free_port", "static_asset"]

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
COOKIE = "msprobe_view_token"
_STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8",
           "LICENSES.txt": "text/plain; charset=utf-8"}
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>msprobe view</title><link rel="icon" href="data:,"><link rel="stylesheet" href="static/app.css"></head>
<body><div id="app"></div><script src="static/app.js"></script></body></html>
"""


def static_asset(name: str) -> str:
    """The text of a built front-end asset (``app.js``, ``app.css``); a typed error when missing."""
    path = os.path.join(STATIC_DIR, name)
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise MissingDependencyError(f"the explorer's page asset {name} is missing from {STATIC_DIR} "
                                     f"(a broken install; rebuild with: cd frontend && npm ci && npm run build)") \
            from exc


def _starlette() -> Any:
    try:
        import starlette  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError("msprobe view needs starlette and uvicorn: pip install 'msprobe-lake[view]'") \
            from exc


def _int(value: Any, name: str, default: Optional[int] = None) -> int:
    if value is None or value == "":
        if default is None:
            raise ConfigError(f"missing {name}")
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an integer, not {value!r}") from None


class Pending:
    """A server's view data while it is being built: the stages begun (name, seconds since the
    start), the data once ready, or the set-up's error."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.stages: list = []
        self.data: Optional[ViewData] = None
        self.first: Optional[ViewData] = None  # a first look, served until the data is ready
        self.error: Optional[str] = None

    def stage(self, name: str) -> None:
        self.stages.append([name, round(time.monotonic() - self.t0, 1)])

    def state(self) -> dict:
        return {"loading": self.data is None, "stage": self.stages[-1][0] if self.stages else "starting",
                "elapsed_s": round(time.monotonic() - self.t0, 1), "stages": list(self.stages), "error": self.error}

    def current(self) -> Optional[ViewData]:
        """What is served now: the data once ready, else the first look (or None)."""
        return self.data if self.data is not None else self.first


class _Late:
    """The view data of a :class:`Pending` (its attributes, once loaded)."""

    def __init__(self, pending: Pending) -> None:
        self._pending = pending

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pending.current(), name)


def make_app(given: Optional[ViewData], token: str, pending: Optional[Pending] = None) -> Any:
    """The ASGI app serving ``given`` (or, None, the data ``pending`` holds once it is built); every
    request must present ``token``."""
    _starlette()
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route

    class SafeJSON(JSONResponse):
        def render(self, content: Any) -> bytes:  # NaN / Inf as strings: JSON has neither
            return super().render(json_safe(content))

    def authorized(request: Request) -> bool:
        for given in (request.query_params.get("token"), request.headers.get("x-msprobe-token"),
                      request.cookies.get(COOKIE)):
            if given and hmac.compare_digest(given.encode("utf-8", "replace"), token.encode()):
                return True
        return False

    def secure(resp: Response) -> Response:
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        resp.headers["X-Frame-Options"] = "DENY"
        resp.headers["Cache-Control"] = "no-store"
        return resp

    if given is None and pending is None:
        raise ConfigError("make_app needs the view data or a pending set-up")
    data: Any = given if given is not None else _Late(pending)  # type: ignore[arg-type]

    def loading() -> Optional[dict]:
        return pending.state() if pending is not None and pending.current() is None else None

    def guarded(handler: Any, api: bool = True) -> Any:
        async def endpoint(request: Request) -> Response:
            if not authorized(request):
                return secure(PlainTextResponse("a valid token is needed (the URL msprobe view printed)",
                                                status_code=403))
            waiting = loading() if api else None
            if waiting is not None:  # the page asks again until the view is built
                return secure(JSONResponse(waiting, status_code=500 if waiting["error"] else 202))
            try:  # the tables' queries run in worker threads: a slow one holds up no other request
                resp = await run_in_threadpool(handler, request)
            except NotYet as exc:  # accepted, not done: a first look is served while the view is built
                state = pending.state() if pending is not None else {"stages": [], "elapsed_s": 0}
                return secure(JSONResponse(dict(state, loading=True, stage=str(exc), error=None), status_code=202))
            except (ConfigError, KeyError) as exc:
                msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
                return secure(JSONResponse({"error": f"not found or invalid: {msg}"}, status_code=400))
            except MsprobeError as exc:
                return secure(JSONResponse({"error": str(exc)}, status_code=500))
            return secure(resp)
        return endpoint

    def arg(request: Request, name: str, default: Any = None) -> Any:
        return request.query_params.get(name, default)

    def filters(request: Request) -> dict:
        picked = {key: arg(request, key, allowed[0]) for key, allowed in FILTERS.items()}
        picked["q"] = arg(request, "q", "")
        return picked

    def page(request: Request) -> Response:
        resp = Response(_PAGE, media_type="text/html; charset=utf-8")
        if request.query_params.get("token"):
            resp.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
        return resp

    def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return PlainTextResponse("not found", status_code=404)
        return Response(static_asset(name), media_type=_STATIC[name])

    # the tables do not change once loaded: the two answers every page load starts with are encoded
    # once, here (a lake's 10,240 cells are megabytes of JSON), once for a first look and once for the
    # whole view
    first_answers: dict = {}

    def first(name: str) -> bytes:
        key = (name, id(pending.current()) if pending is not None else 0)
        if key not in first_answers:
            first_answers[key] = SafeJSON(data.meta() if name == "meta" else data.overview()).body
        return first_answers[key]

    if pending is None:
        first("meta"), first("overview")

    def meta(request: Request) -> Response:
        return Response(first("meta"), media_type="application/json")

    def overview(request: Request) -> Response:
        return Response(first("overview"), media_type="application/json")

    def progress(request: Request) -> Response:
        """The set-up's stages while a first look is served (``loading`` false once the view is whole)."""
        return SafeJSON(pending.state() if pending is not None else {"loading": False, "stages": []})

    def rows(request: Request) -> Response:
        cell = _int(arg(request, "cell"), "cell")
        return SafeJSON(data.rows(cell, _int(arg(request, "begin"), "begin", 0),
                                      _int(arg(request, "end"), "end", 100), filters(request)))

    def export_csv(request: Request) -> Response:
        cell = _int(arg(request, "cell"), "cell")
        picked = filters(request)
        data.rows(cell, 0, 0, picked)  # checks the filters before the stream starts

        def lines() -> Any:
            buf = io.StringIO()
            writer = csv.writer(buf)
            writer.writerow(ROW_FIELDS)
            for row in data.iter_csv_rows(cell, picked):
                writer.writerow([_csv_cell(row[key]) for key in ROW_FIELDS])
                if buf.tell() > 1 << 16:
                    yield buf.getvalue()
                    buf.seek(0)
                    buf.truncate()
            yield buf.getvalue()
        return StreamingResponse(lines(), media_type="text/csv; charset=utf-8",
                                 headers={"Content-Disposition": f'attachment; filename="msprobe_rows_{cell}.csv"'})

    def tree(request: Request) -> Response:
        cell = _int(arg(request, "cell"), "cell")
        model = data.tree(cell, arg(request, "side") or "target")
        out = model.kids(arg(request, "node") or None, _int(arg(request, "begin"), "begin", 0),
                     _int(arg(request, "end"), "end", 500))
        if not arg(request, "node"):
            out["bench_only"] = model.bench_only[:200]
        return SafeJSON(out)

    def tree_path(request: Request) -> Response:
        cell = _int(arg(request, "cell"), "cell")
        name = arg(request, "record") or ""
        model = data.tree(cell, arg(request, "side") or "target")
        if name not in model.nodes:
            raise ConfigError(f"no record {name!r} in the tree")
        return SafeJSON({"path": model.path(name)})

    def search(request: Request) -> Response:
        cell = _int(arg(request, "cell"), "cell")
        return SafeJSON({"hits": data.search(cell, arg(request, "q") or "")})

    def record(request: Request) -> Response:
        cell = _int(arg(request, "cell"), "cell")
        return SafeJSON(data.record(cell, arg(request, "record") or ""))

    def cluster(request: Request) -> Response:
        cell = _int(arg(request, "cell"), "cell")
        begin = _int(arg(request, "lane_begin"), "lane_begin", 0)
        return SafeJSON(data.cluster(cell, begin, _int(arg(request, "lane_end"), "lane_end", begin + 16)))

    def trend(request: Request) -> Response:
        return SafeJSON(data.trend(arg(request, "name") or "", arg(request, "stat") or NORM.column))

    def tensor(request: Request) -> Response:
        from msprobe.view._tensor import tensor_view

        cell = _int(arg(request, "cell"), "cell")
        return SafeJSON(tensor_view(data, cell, arg(request, "name") or "", arg(request, "side") or "target"))

    routes = [Route("/", guarded(page, False)), Route("/static/{name}", guarded(static, False)),
              Route("/api/meta", guarded(meta)), Route("/api/overview", guarded(overview)),
              Route("/api/progress", guarded(progress)),
              Route("/api/rows", guarded(rows)), Route("/api/export.csv", guarded(export_csv)),
              Route("/api/tree", guarded(tree)), Route("/api/tree_path", guarded(tree_path)),
              Route("/api/search", guarded(search)), Route("/api/record", guarded(record)),
              Route("/api/trend", guarded(trend)), Route("/api/cluster", guarded(cluster)), Route("/api/tensor", guarded(tensor))]
    return Starlette(routes=routes)


def _csv_cell(value: Any) -> Any:
    """A CSV cell that a spreadsheet will not run as a formula (names are attacker-written)."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return "" if value is None else value


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _warm(data: ViewData, stage: Any, trees: bool = True) -> None:
    """What every first page asks for, read once before the page does: the first cell's list and trees."""
    first = data.overview()["first_cell"]
    stage("the first cell's list")
    data.rows(first if first is not None else 0, 0, 200, {})  # the page's first list, read once from disk
    if not trees:
        return
    stage("the first cell's model trees")
    try:  # the trees of the cell the page opens first: no page request waits on them
        data.tree(first if first is not None else 0)
    except (MsprobeError, OSError):
        pass  # asked for again (and its error shown) when the tree view opens


def serve(data: Optional[ViewData] = None, *, host: str = "127.0.0.1", port: Optional[int] = None,
          token: Optional[str] = None, announce: Any = print, loader: Any = None, progress: Any = None,
          grace_s: float = 1.0, until: Optional[threading.Event] = None, linger_s: float = 2.0) -> None:
    """Serve ``data`` until interrupted; ``announce`` gets the lines to show (URL, ssh hint).

    With ``loader`` instead (called with a stage callback, it returns the view data), the set-up runs
    in a thread: a set-up that fails within ``grace_s`` raises its error before any URL is printed;
    else the URL is printed at once, the page shows the set-up's progress until the data is ready,
    ``progress`` gets each stage's line (the terminal), and a set-up that fails later stops the server
    ``linger_s`` later (an open page shows the error) and raises it. The loaded data is closed when the server stops. ``until``: an event that
    stops the server when set (serving from a thread); else it runs until interrupted."""
    import importlib.util

    for name in ("starlette", "uvicorn"):  # found, not imported: the set-up starts first (a first look in seconds)
        if importlib.util.find_spec(name) is None:
            raise MissingDependencyError(f"msprobe view needs {name}: pip install 'msprobe-lake[view]'")
    if (data is None) == (loader is None):
        raise ConfigError("serve needs the view data or a loader, not both")
    token = token or secrets.token_urlsafe(24)
    sock = listening_socket(host, port)  # bound and listening before the URL is printed
    port = int(sock.getsockname()[1])
    pending: Optional[Pending] = None
    failure: list = []
    server: Any = None
    if loader is None:
        app = make_app(data, token)
        _warm(data, lambda name: None)  # type: ignore[arg-type]
    else:
        pending = Pending()
        say = progress or (lambda line: None)

        def stage(name: str) -> None:
            pending.stage(name)
            say(f"msprobe view: {name} ({pending.stages[-1][1]:.1f} s)")

        def look(first: ViewData) -> None:  # a first look, served while the rest is built (its trees
            _warm(first, lambda name: None, trees=False)  # when asked for: they cost seconds at 150,000 nodes)
            pending.first = first
            say(f"msprobe view: first look ready in {time.monotonic() - pending.t0:.1f} s "
                f"({(first.first_look or {}).get('note', '')})")

        def build() -> None:
            try:
                loaded = loader(stage, look) if getattr(loader, "first_look", False) else loader(stage)
                _warm(loaded, stage)
                pending.data = loaded
                say(f"msprobe view: ready in {time.monotonic() - pending.t0:.1f} s")
            except BaseException as exc:  # noqa: BLE001 - the set-up's error ends the server, raised below
                failure.append(exc)
                pending.error = str(exc)
                time.sleep(linger_s)  # an open page asks again within half a second: it shows the error
                if server is not None:
                    server.should_exit = True

        worker = threading.Thread(target=build, name="msprobe-view-setup", daemon=True)
        worker.start()
        app = make_app(None, token, pending)  # imports the web stack while the set-up runs
        worker.join(max(grace_s - (time.monotonic() - pending.t0), 0.0))
        if failure:
            sock.close()
            raise failure[0]
    import uvicorn

    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    announce(f"msprobe view: http://{shown}:{port}/?token={token}")
    announce(f"  from another machine: ssh -L {port}:127.0.0.1:{port} {socket.gethostname()}  "
             f"then open http://127.0.0.1:{port}/?token={token}")
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
    if failure:  # failed between the grace period and now
        server.should_exit = True
    if until is not None:
        def stop() -> None:
            until.wait()
            server.should_exit = True
        threading.Thread(target=stop, name="msprobe-view-stop", daemon=True).start()
    # other commands (compare, lake nan) print links to this server's views while it runs
    entry = register(f"http://{shown}:{port}/?token={token}",
                     [data.target, data.bench] if data is not None else getattr(loader, "paths", ()))
    try:  # a connection made as soon as the URL shows waits in the backlog until the server accepts it
        server.run(sockets=[sock])
    finally:
        unregister(entry)
        sock.close()
        if pending is not None:
            for loaded in (pending.first, pending.data):  # the first look's tables lie in the data's folder
                if loaded is not None:
                    loaded.close()
    if failure:
        raise failure[0]


def listening_socket(host: str, port: Optional[int]) -> socket.socket:
    """A TCP socket bound to ``host:port`` (a free port when None) and listening: a client that opens
    the printed URL at once is queued, never refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port or 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock
