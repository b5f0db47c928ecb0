"""The OCI images: the service's (image/build.sh) and the test nodes' (testenv/images).

Builds them (root: debootstrap, chroot; cached after the first build, ~1 min warm when the
inputs changed, a second when not), then reads the archives as containerd would import
them: config, index annotations, the layer's files. The service image also runs: `nodeledger
serve` from its root filesystem mounted read-only, as 65532, answering /healthz.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import httpx
import pytest

from tests.support.net import free_port
from tests.support.oci import SERVICE_BUILD, TEST_IMAGES_BUILD, OciImage, build, read_image
from tests.support.realenv import REPO, unavailable, wait_until

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

PREFIX = "opt/nodeledger"
SITE = f"{PREFIX}/lib/python3.13/site-packages"
VERSION = tomllib.loads((Path(REPO) / "pyproject.toml").read_text())["project"]["version"]


def _need_root() -> None:
    if os.geteuid() != 0:
        unavailable("image build", "needs root (debootstrap, chroot, mounts)")
    for tool in ("chroot", "unshare", "mount"):
        if shutil.which(tool) is None:
            unavailable("image build", f"{tool} not found")


@pytest.fixture(scope="module")
def service_archive() -> Path:
    _need_root()
    env_image = os.environ.pop("IMAGE", None)  # the default reference, whatever the caller's
    try:
        archive, _ = build(SERVICE_BUILD)
    finally:
        if env_image is not None:
            os.environ["IMAGE"] = env_image
    return archive


@pytest.fixture(scope="module")
def service(service_archive: Path) -> OciImage:
    return read_image(service_archive, want=("etc/passwd",))


def test_config_runs_the_service_as_nonroot(service: OciImage) -> None:
    config = service.config["config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == [f"/{PREFIX}/bin/nodeledger"]
    assert config["Cmd"] == ["serve"]
    assert "8080/tcp" in config["ExposedPorts"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["HOME"] == "/tmp"
    assert env["PATH"].startswith(f"/{PREFIX}/bin:")
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", labels["org.opencontainers.image.revision"])
    assert service.config["architecture"] == "amd64"
    assert service.ref == f"registry.nodeledger.test/nodeledger:{VERSION}"
    annotations = service.index["manifests"][0]["annotations"]
    assert annotations["org.opencontainers.image.ref.name"] == VERSION


def test_layer_holds_the_entrypoint_and_users(service: OciImage) -> None:
    entries = service.entries
    assert entries[f"{PREFIX}/bin/nodeledger"].kind == "file"
    assert entries[f"{PREFIX}/bin/nodeledger"].mode & 0o111
    assert entries[f"{PREFIX}/bin/python3"].kind == "symlink"
    assert entries["usr/bin/python3.13"].kind == "file"
    assert entries["usr/lib/x86_64-linux-gnu/libsqlite3.so.0"].kind == "symlink"
    assert entries["etc/ssl/certs/ca-certificates.crt"].size > 100_000
    assert entries["data"].uid == 65532
    assert entries["tmp"].mode & 0o1777 == 0o1777
    passwd = service.file_bytes["etc/passwd"].decode()
    assert "nodeledger:x:65532:65532:" in passwd
    # Bytecode, because the root is read-only at run time.
    assert f"{SITE}/app/__pycache__/main.cpython-313.pyc" in entries
    assert "usr/lib/python3.13/__pycache__/ssl.cpython-313.pyc" in entries


def test_layer_has_no_packaging_tools_or_docs(service: OciImage) -> None:
    names = service.entries
    unwanted = [
        n
        for n in names
        if n.startswith(("usr/share/doc/", "usr/share/man/", "usr/share/info/", "var/lib/dpkg/"))
        or n.startswith(("usr/share/locale/", "etc/apt/", "var/lib/apt/"))
        or n in ("usr/bin/apt", "usr/bin/apt-get", "usr/bin/dpkg", "usr/bin/perl", "usr/bin/sh")
        or n.startswith((f"{SITE}/pip/", f"{SITE}/setuptools/"))
    ]
    assert unwanted == []
    # No proxy CA from the build machine: the bundle is Debian's.
    assert not any(n.startswith("usr/local/share/ca-certificates/") for n in names)


def _pins() -> dict[str, str]:
    text = (Path(REPO) / "image" / "requirements.txt").read_text()
    return {
        _normal(name): version
        for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", text, re.M)
    }


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def test_pins_cover_every_dependency_of_pyproject() -> None:
    """image/requirements.txt is regenerated when pyproject.toml's dependencies change."""
    project = tomllib.loads((Path(REPO) / "pyproject.toml").read_text())["project"]
    names = {
        _normal(re.split(r"[\[<>=!~; ]", dep, maxsplit=1)[0]) for dep in project["dependencies"]
    }
    missing = names - set(_pins())
    assert not missing, (
        f"not in image/requirements.txt: {missing}; bash image/build.sh requirements"
    )


def test_python_packages_are_the_pinned_ones(service: OciImage) -> None:
    installed = {}
    for name in service.entries:
        match = re.fullmatch(rf"{re.escape(SITE)}/([^/]+)-([^/-]+)\.dist-info", name)
        if match:
            installed[_normal(match[1])] = match[2]
    assert installed.pop("nodeledger") == VERSION
    assert installed == _pins()


def test_service_never_imports_kubernetes_aio() -> None:
    """The image compiles no bytecode for kubernetes.aio (image/build.sh): worth it only
    while the service uses the synchronous client."""
    offenders = [
        str(path)
        for path in (Path(REPO) / "app").rglob("*.py")
        if re.search(r"kubernetes\.aio|from kubernetes import aio", path.read_text())
    ]
    assert offenders == []


@pytest.fixture
def read_only_root(service_archive: Path, tmp_path: Path) -> tuple[Path, Path]:
    rootfs = Path(f"{service_archive}.rootfs")
    if not rootfs.is_dir():
        pytest.fail(f"{rootfs} missing: image/build.sh keeps it beside the archive")
    data = tmp_path / "data"
    tmp = tmp_path / "tmp"
    for d in (data, tmp):
        d.mkdir()
        os.chown(d, 65532, 65532)
    return rootfs, tmp_path


def test_serves_from_a_read_only_root_as_nonroot(read_only_root: tuple[Path, Path]) -> None:
    rootfs, scratch = read_only_root
    port = free_port()
    # A private mount namespace: the root bound read-only, /data and /tmp writable binds.
    script = f"""
set -eu
mount --bind {rootfs} {rootfs}
mount -o remount,bind,ro {rootfs}
mount --bind {scratch}/data {rootfs}/data
mount --bind {scratch}/tmp {rootfs}/tmp
exec chroot --userspec=65532:65532 {rootfs} /{PREFIX}/bin/nodeledger serve --port {port}
"""
    env = {
        "HOME": "/tmp",
        "PATH": f"/{PREFIX}/bin:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "NODELEDGER_DATABASE_URL": "sqlite:////data/nodeledger.db",
    }
    log = scratch / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
    try:

        def healthy() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout=60, interval=0.3, what="/healthz from the image")
        assert httpx.get(f"http://127.0.0.1:{port}/v1/nodes", timeout=5).json() == []
        assert (scratch / "data" / "nodeledger.db").stat().st_uid == 65532
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "Traceback" not in log.read_text()


@pytest.fixture(scope="module")
def pause() -> OciImage:
    _need_root()
    return read_image(build(TEST_IMAGES_BUILD, "pause")[0])


def test_pause_image(pause: OciImage) -> None:
    assert pause.ref == "registry.nodeledger.test/pause:3.10"
    assert pause.config["config"]["Entrypoint"] == ["/pause"]
    assert pause.entries["pause"].kind == "file"
    assert pause.uncompressed < 2_000_000


def test_busybox_image_has_a_shell() -> None:
    _need_root()
    image = read_image(build(TEST_IMAGES_BUILD, "busybox")[0])
    assert image.ref == "registry.nodeledger.test/busybox:1.35"
    assert image.entries["bin/busybox"].kind == "file"
    for applet in ("bin/sh", "bin/sleep", "bin/echo", "bin/cat"):
        assert image.entries[applet].kind == "symlink", applet


def test_static_image_holds_one_binary(tmp_path: Path) -> None:
    _need_root()
    if shutil.which("gcc") is None:
        unavailable("gcc", "not found")
    binary = tmp_path / "hello"
    source = tmp_path / "hello.c"
    source.write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-static", "-Os", "-o", str(binary), str(source)], check=True)
    ref = "registry.nodeledger.test/hello:v0"
    image = read_image(build(TEST_IMAGES_BUILD, "static", str(binary), ref)[0])
    assert image.ref == ref
    assert image.config["config"]["Entrypoint"] == ["/usr/local/bin/hello"]
    assert image.config["config"]["User"] == "65532:65532"
    assert image.entries["usr/local/bin/hello"].kind == "file"
    assert image.entries["etc/ssl/certs/ca-certificates.crt"].size > 100_000
