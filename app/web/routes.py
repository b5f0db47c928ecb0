"""Serves the page and its two assets. The routes are open: the page holds no data, and the
API calls it makes carry the permission checks (a 401 shows as a message on the page)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from app.core.errors import NodeledgerError

STATIC = Path(__file__).parent / "static"
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
HEADERS = {
    # Everything comes from this origin; nothing inline runs, nothing may frame the page.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate on every load (ETag), so an upgraded service never runs a stale script.
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


class NoSuchAsset(NodeledgerError):
    code = "asset_not_found"
    http_status = 404


@router.get("/")
async def page() -> FileResponse:
    return FileResponse(
        STATIC / "index.html", media_type="text/html; charset=utf-8", headers=HEADERS
    )


@router.get("/ui/{asset}")
async def asset(asset: str) -> FileResponse:
    media_type = ASSETS.get(asset)
    if media_type is None:
        raise NoSuchAsset("no such asset")
    return FileResponse(STATIC / asset, media_type=media_type, headers=HEADERS)
