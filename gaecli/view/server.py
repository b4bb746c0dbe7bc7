"""The web server of ``gae view`` (the ``view`` extra: Starlette on uvicorn): the page and
its script and styles shipped in this package, and the JSON documents of a
:class:`gaecli.view.explorer.RunExplorer`. Requests name files by their index in the input
list; no part of a request reaches the file system."""

from __future__ import annotations

import errno
import json
import socket
import threading
from importlib import resources
from typing import Callable, Optional

from gaecli.errors import GAEError, GAEUsageError
from gaecli.stop import check_stop, stop_requested, wait_for_stop

INSTALL_HINT = "pip install 'gaecli[view]'"

STATIC_FILES = {
    "index.html": "text/html; charset=utf-8",
    "view.js": "text/javascript; charset=utf-8",
    "view.css": "text/css; charset=utf-8",
}
"""Every file the server sends, by name, with its type: read from the package once."""

SAMPLE_WAIT_SECONDS = 0.25
"""How long a sample request waits for the run's statistics before answering 'not ready'."""
CLOSE_SECONDS = 10.0
"""How long a stopped server waits for each background pass to reach its next batch."""
WATCH_SECONDS = 0.25
"""How often the stop watcher of :func:`serve` looks whether the serving has ended."""


def require_view() -> None:
    """Raise :class:`GAEUsageError` (exit 2) saying how to install the view extra when
    Starlette or uvicorn is missing."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise GAEUsageError(f"gae view needs the view extra (Starlette, uvicorn): {INSTALL_HINT}") from error


def _static() -> dict[str, tuple[bytes, str]]:
    folder = resources.files("gaecli.view") / "static"
    return {name: ((folder / name).read_bytes(), kind) for name, kind in STATIC_FILES.items()}


def _json(document, status: int = 200):
    from starlette.responses import Response

    body = json.dumps(document, allow_nan=False, default=str, separators=(",", ":"))
    return Response(body, status_code=status, media_type="application/json", headers={"Cache-Control": "no-store"})


def _answer(make: Callable[[], dict]):
    """``make()``'s document, or a one-line error: 404 for an index that names nothing, 422
    for input data that breaks the format."""
    try:
        return _json(make())
    except LookupError as error:
        return _json({"error": str(error.args[0] if error.args else error)}, 404)
    except (GAEError, ValueError) as error:
        return _json({"error": str(error).splitlines()[0]}, 422)


def _integer(text: Optional[str], default: int = 0) -> int:
    try:
        return default if text is None else int(text)
    except ValueError as error:
        raise LookupError(f"not a number: {text[:40]!r}") from error


def create_app(explorer):
    """The Starlette application serving ``explorer``: ``/`` the page, ``/static/NAME`` its
    files, ``/api/run``, ``/api/step/INDEX?side=K``, ``/api/sample/INDEX/ROW?old=KEY``."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    files = _static()

    def page(request):
        body, kind = files["index.html"]
        return Response(body, media_type=kind)

    def static(request):
        found = files.get(request.path_params["name"])
        if found is None:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(found[0], media_type=found[1])

    def run(request):
        return _answer(explorer.run_document)

    def step(request):
        index, side = request.path_params["index"], _integer(request.query_params.get("side"))
        return _answer(lambda: explorer.step_document(index, side, timeout=0.05))

    def sample(request):
        index, row = request.path_params["index"], request.path_params["row"]
        old = request.query_params.get("old")
        return _answer(lambda: explorer.sample_document(index, row, old, timeout=SAMPLE_WAIT_SECONDS))

    routes = [
        Route("/", page),
        Route("/static/{name}", static),
        Route("/api/run", run),
        Route("/api/step/{index:int}", step),
        Route("/api/sample/{index:int}/{row:int}", sample),
    ]
    return Starlette(routes=routes)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: a free port). Raises
    :class:`GAEUsageError` (exit 2) when the port is in use or the address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            message = f"port {port} on {host} is in use: give another --port, or --port 0 for a free one"
            raise GAEUsageError(message) from error
        raise GAEUsageError(f"cannot listen on {host}:{port} ({error.strerror or error})") from error
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def make_server(explorer):
    """A uvicorn server of ``explorer``'s application, its own logging off, stopping within a
    second of a signal (or of ``should_exit`` set from another thread)."""
    import uvicorn

    config = uvicorn.Config(
        create_app(explorer), log_level="warning", access_log=False, log_config=None, timeout_graceful_shutdown=1
    )
    return uvicorn.Server(config)


def serve(explorer, sock: socket.socket, on_ready: Optional[Callable[[str], None]] = None) -> None:
    """Serve ``explorer`` on the bound ``sock`` (:func:`bind`) until a signal stops it: the
    sample path warmed (:meth:`RunExplorer.warm`: its kernels loaded before the first
    request), the background figures started, ``on_ready(url)`` called once the socket
    listens, then uvicorn. On SIGINT uvicorn stops within a second and raises the signal
    again, so the caller's handler sees it. A signal that comes before uvicorn listens for
    signals (while it starts) goes to the command's handler, which may only request the stop
    (:mod:`gaecli.stop`, in an import): a watcher then tells the server to exit, and the stop
    requested raises KeyboardInterrupt here once it has."""
    server = make_server(explorer)
    explorer.warm()
    explorer.start()
    served = threading.Event()
    watcher = threading.Thread(target=_exit_on_stop_request, args=(server, served), name="gae-view-stop", daemon=True)
    watcher.start()
    try:
        if on_ready is not None and not stop_requested():
            on_ready(url_of(sock))
        server.run(sockets=[sock])
        check_stop()
    finally:
        served.set()
        explorer.close(CLOSE_SECONDS)


def _exit_on_stop_request(server, served: threading.Event) -> None:
    """Tell ``server`` to exit (within a second: it checks ``should_exit`` in its loop) once
    the process is asked to stop; end when the serving has (``served``)."""
    while not served.is_set():
        if wait_for_stop(WATCH_SECONDS):
            server.should_exit = True
            return


def serve_run(
    inputs: list,
    options,
    host: str,
    port: int,
    tokenizer: Optional[str] = None,
    tokens_col: Optional[str] = None,
    on_ready: Optional[Callable[[str, list[str]], None]] = None,
) -> None:
    """``gae view``: the run of ``inputs`` (:func:`gaecli.view.explorer.open_run`, with
    ``options``, a :class:`gaecli.diff.DiffOptions`) served on ``host``:``port`` until a signal
    stops it; ``on_ready(url, errors)`` hears the URL and the one-line error of every input
    that cannot be shown. Raises :class:`GAEUsageError` for a port in use, a tokenizer that
    cannot be loaded, no input."""
    from gaecli.view.explorer import open_run

    require_view()
    sock = bind(host, port)
    try:
        explorer = open_run(inputs, options, tokenizer, tokens_col)
        serve(explorer, sock, None if on_ready is None else lambda url: on_ready(url, explorer.errors))
    finally:
        sock.close()
