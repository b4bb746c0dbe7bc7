"""``gae view``: a run explorer in the browser. :mod:`.explorer` holds a run's files, their
footers and each step's figures (computed once, in the background, by ``gae diff``'s unit);
:mod:`.sample` computes one sample's tokens on demand through the same run description;
:mod:`.tokens` gives the tokens' text; :mod:`.server` serves the pages (the ``view`` extra:
Starlette and uvicorn, imported only when serving)."""

from gaecli.view.explorer import RunExplorer, open_run
from gaecli.view.server import bind, create_app, make_server, require_view, serve, serve_run, url_of

__all__ = [
    "RunExplorer",
    "bind",
    "create_app",
    "make_server",
    "open_run",
    "require_view",
    "serve",
    "serve_run",
    "url_of",
]
