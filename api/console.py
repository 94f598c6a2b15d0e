"""`/ui`: the web console, static files shipped in the package (api/console_files/).

No build step and nothing fetched from elsewhere: plain HTML, CSS and
JavaScript that talk to the API of the node that served them.  The files hold
no data, so they are served without a token; every API call the console makes
carries the bearer token the operator typed in (kept in sessionStorage).
"""

from pathlib import Path

from aiohttp import web

from .errors import ApiError

FILES = Path(__file__).parent / "console_files"
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
# Only its own files run; it talks to its node and, to move after a failover,
# probes the other nodes; no page may frame it (its buttons change the cluster).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self' http: https:; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def root(request: web.Request) -> web.Response:
    raise web.HTTPFound("/ui/")


async def asset(request: web.Request) -> web.FileResponse:
    name = request.match_info.get("name") or "index.html"
    path = FILES / name
    # only the files shipped here, by plain name: no path leaves the directory
    if "/" in name or name.startswith(".") or path.suffix not in CONTENT_TYPES or not path.is_file():
        raise ApiError("not_found", f"the console has no file {name!r}")
    return web.FileResponse(path, headers={"Content-Type": CONTENT_TYPES[path.suffix],
                                           "Cache-Control": "no-cache", **SECURITY_HEADERS})
