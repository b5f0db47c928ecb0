"""The service's OCI image: its size unpacked and as stored, its file count, and how long
its build took (``bash image/build.sh``: built now, or reused from the cache, then the
figure recorded when it was built). Needs root (debootstrap, chroot) for a build. Prints
one JSON object.

    python -m bench.image
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.oci import SERVICE_BUILD, build, read_image


def measure() -> dict[str, Any]:
    started = time.monotonic()
    archive, stderr = build(SERVICE_BUILD)
    seconds = time.monotonic() - started
    return {
        "built_now": "up to date" not in stderr,
        "this_call_seconds": round(seconds, 1),
        **figures(archive),
    }


def figures(archive: Path) -> dict[str, Any]:
    """The sizes of a built archive and the build time recorded beside it."""
    image = read_image(archive)
    recorded = json.loads(Path(f"{archive}.json").read_text())
    kinds = [e.kind for e in image.entries.values()]
    return {
        "image": image.ref,
        "archive": str(archive),
        "build_seconds": recorded["build_seconds"],
        "uncompressed_bytes": image.uncompressed,
        "uncompressed_mb": round(image.uncompressed / 1e6, 1),
        "uncompressed_mib": round(image.uncompressed / 2**20, 1),
        "compressed_bytes": sum(image.layer_sizes),
        "compressed_mb": round(sum(image.layer_sizes) / 1e6, 1),
        "archive_mb": round(archive.stat().st_size / 1e6, 1),
        "layers": len(image.layer_sizes),
        "files": kinds.count("file"),
        "symlinks": kinds.count("symlink"),
        "directories": kinds.count("dir"),
    }


def main(argv: Sequence[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print(json.dumps(measure(), indent=2))


if __name__ == "__main__":
    main()
