"""Reading the OCI archives image/build.sh and testenv/images/build.sh write (a tar of an
OCI layout: index.json, blobs/sha256/*), without any container tool."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
SERVICE_BUILD = REPO / "image" / "build.sh"
TEST_IMAGES_BUILD = REPO / "testenv" / "images" / "build.sh"


@dataclass(frozen=True)
class Entry:
    kind: str  # "file", "dir", "symlink", "other"
    size: int
    mode: int
    uid: int
    target: str = ""


@dataclass
class OciImage:
    """One single-platform image in an OCI archive."""

    path: Path
    index: dict[str, Any]
    manifest: dict[str, Any]
    config: dict[str, Any]
    layer_sizes: list[int]  # as stored (gzip)
    entries: dict[str, Entry] = field(default_factory=dict)  # "usr/bin/python3" -> Entry
    file_bytes: dict[str, bytes] = field(default_factory=dict)  # the files asked for

    @property
    def ref(self) -> str:
        annotations: dict[str, str] = self.index["manifests"][0].get("annotations", {})
        return annotations.get("io.containerd.image.name", "")

    @property
    def uncompressed(self) -> int:
        return sum(e.size for e in self.entries.values() if e.kind == "file")

    def files(self) -> list[str]:
        return [name for name, e in self.entries.items() if e.kind == "file"]


def _read(archive: tarfile.TarFile, name: str) -> bytes:
    member = archive.extractfile(name)
    assert member is not None, name
    return member.read()


def _blob(archive: tarfile.TarFile, digest: str) -> bytes:
    return _read(archive, f"./blobs/sha256/{digest.removeprefix('sha256:')}")


def read_image(path: Path, want: tuple[str, ...] = ()) -> OciImage:
    """The archive's index, manifest, config and every layer entry (paths without a leading
    "./" or "/"), with the contents of the files named in ``want``."""
    with tarfile.open(path) as archive:
        index = json.loads(_read(archive, "./index.json"))
        manifests = index["manifests"]
        assert len(manifests) == 1, f"{path}: {len(manifests)} manifests"
        manifest = json.loads(_blob(archive, manifests[0]["digest"]))
        config = json.loads(_blob(archive, manifest["config"]["digest"]))
        image = OciImage(path, index, manifest, config, [m["size"] for m in manifest["layers"]])
        for layer in manifest["layers"]:
            data = gzip.decompress(_blob(archive, layer["digest"]))
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for info in tar:
                    name = info.name.removeprefix("./").lstrip("/")
                    if name in ("", "."):
                        continue
                    kind = (
                        "file"
                        if info.isfile()
                        else "dir"
                        if info.isdir()
                        else "symlink"
                        if info.issym()
                        else "other"
                    )
                    image.entries[name] = Entry(kind, info.size, info.mode, info.uid, info.linkname)
                    if name in want and info.isfile():
                        extracted = tar.extractfile(info)
                        assert extracted is not None
                        image.file_bytes[name] = extracted.read()
    return image


def build(
    script: Path, *args: str, timeout: float = 1800, env: dict[str, str] | None = None
) -> tuple[Path, str]:
    """Run a build script (``env`` added to ours); the archive path (its last stdout line)
    and its stderr."""
    result = subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **env} if env else None,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{script.name} {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1]), result.stderr
