"""testenv/slurm/cluster.sh fetch-source: the upstream release a test cluster compiles comes
from the offline source dir, else the cache, else a shallow git clone of the pinned tag;
every tarball is checked against the hashes pinned in testenv/slurm/sources.lock before
anything is built from it. Against a local git repository standing in for SchedMD's (these
machines reach no code host), with a pin file of its own: no cluster, a second each."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.realenv import REPO
from tests.support.slurm_cluster import SCRIPT

VERSION = "26.05"
RELEASE = "26.05.3"
TAG = "slurm-26-05-3-1"
TARBALL = f"slurm-{RELEASE}.tar.gz"
CONFIGURE = b"#!/bin/sh\necho 'a stand-in for the configure in the release'\n"


def git(cwd: Path, *args: str) -> str:
    identity = ["-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    no_signing = ["-c", "commit.gpgSign=false", "-c", "tag.gpgSign=false"]
    done = subprocess.run(
        ["git", *identity, *no_signing, *args], cwd=cwd, check=True, capture_output=True
    )
    return done.stdout.decode().strip()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Upstream:
    """A repository with the release tag, and a later commit on its branch."""

    path: Path
    tagged: str
    later: str

    @property
    def url(self) -> str:
        return self.path.as_uri()  # file://: a path would make git ignore --depth

    def tar(self, commit: str) -> bytes:
        """The tarball's content as the pin describes it: git archive, top folder."""
        out = subprocess.run(
            ["git", "archive", "--format=tar", f"--prefix=slurm-{RELEASE}/", commit],
            cwd=self.path,
            check=True,
            capture_output=True,
        )
        return out.stdout

    def tarball(self, commit: str, level: str = "-9") -> bytes:
        gz = subprocess.run(
            ["gzip", level, "-n"], input=self.tar(commit), check=True, capture_output=True
        )
        return gz.stdout


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    path = tmp_path / "slurm.git"
    path.mkdir()
    git(path, "init", "-q", "-b", "master")
    (path / "configure").write_bytes(CONFIGURE)
    (path / "configure").chmod(0o755)
    git(path, "add", "configure")
    git(path, "commit", "-q", "-m", "Update META for 26.05.3")
    git(path, "tag", "-a", "-m", "Slurm 26.05.3", TAG)  # annotated, like SchedMD's
    tagged = git(path, "rev-parse", "HEAD")
    (path / "NEWS").write_text("after the release\n")
    git(path, "add", "NEWS")
    git(path, "commit", "-q", "-m", "Start 26.05.4")
    return Upstream(path, tagged, git(path, "rev-parse", "HEAD"))


def closed_port_url() -> str:
    """A URL on loopback nobody answers: the port was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/slurm.git"


@dataclass
class Env:
    """A temp cache, a temp offline source dir and a pin file for cluster.sh."""

    root: Path
    upstream: Upstream
    commit: str
    sha256: str
    tar_sha256: str

    @property
    def cache(self) -> Path:
        return self.root / "cache" / "slurm-src"

    @property
    def src(self) -> Path:
        return self.root / "src"

    def fetch_source(self, url: str) -> subprocess.CompletedProcess[str]:
        return self.cluster_sh("fetch-source", url)

    def cluster_sh(self, command: str, url: str, **more: str) -> subprocess.CompletedProcess[str]:
        lock = self.root / "sources.lock"
        lock.write_text(
            "# release tag commit sha256 tar_sha256\n"
            f"{RELEASE} {TAG} {self.commit} {self.sha256} {self.tar_sha256}\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("NODELEDGER_")}
        env |= {
            "NODELEDGER_SLURM_VERSION": VERSION,
            "NODELEDGER_CACHE": str(self.root / "cache"),
            "NODELEDGER_SLURM_SRC_DIR": str(self.src),
            "NODELEDGER_SLURM_SOURCES_LOCK": str(lock),
            "NODELEDGER_SLURM_GIT_URL": url,
            **more,
        }
        return subprocess.run(
            ["bash", str(SCRIPT), command],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def leftovers(self) -> list[str]:
        """What the cache holds besides its lock files."""
        if not self.cache.exists():
            return []
        return sorted(p.name for p in self.cache.iterdir() if not p.name.endswith(".lock"))


@pytest.fixture
def env(tmp_path: Path, upstream: Upstream) -> Env:
    (tmp_path / "src").mkdir()
    tagged = upstream.tagged
    return Env(
        tmp_path, upstream, tagged, sha256(upstream.tarball(tagged)), sha256(upstream.tar(tagged))
    )


def members(tarball: Path) -> dict[str, bytes]:
    """Every entry of the tarball: a file's content, a folder's b"/"."""
    found: dict[str, bytes] = {}
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            content = tar.extractfile(member)
            found[member.name] = b"/" if content is None else content.read()
    return found


def test_fetches_the_pinned_tag_into_the_cache(env: Env) -> None:
    done = env.fetch_source(env.upstream.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(env.cache / TARBALL)
    tarball = env.cache / TARBALL
    # The tagged commit, not the branch head; the offline tarballs' layout and bytes.
    assert members(tarball) == {f"slurm-{RELEASE}": b"/", f"slurm-{RELEASE}/configure": CONFIGURE}
    assert sha256(tarball.read_bytes()) == env.sha256
    assert f"fetching tag {TAG} from {env.upstream.url}" in done.stderr
    assert env.leftovers() == [TARBALL]  # the clone is gone


def test_cache_hit_fetches_nothing(env: Env) -> None:
    first = env.fetch_source(env.upstream.url)
    assert first.returncode == 0, first.stderr
    stamp = (env.cache / TARBALL).stat().st_mtime_ns
    again = env.fetch_source(closed_port_url())  # would fail if it tried
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == str(env.cache / TARBALL)
    assert "fetching" not in again.stderr
    assert (env.cache / TARBALL).stat().st_mtime_ns == stamp


def test_the_offline_source_dir_comes_first(env: Env) -> None:
    (env.src / TARBALL).write_bytes(env.upstream.tarball(env.upstream.tagged))
    done = env.fetch_source(closed_port_url())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(env.src / TARBALL)
    assert env.leftovers() == []


def test_another_gzip_of_the_same_content_is_accepted(env: Env) -> None:
    recompressed = env.upstream.tarball(env.upstream.tagged, level="-1")
    assert sha256(recompressed) != env.sha256
    (env.src / TARBALL).write_bytes(recompressed)
    done = env.fetch_source(closed_port_url())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(env.src / TARBALL)


@pytest.mark.parametrize("where", ["src", "cache"])
def test_a_tarball_of_other_content_is_refused(env: Env, where: str) -> None:
    place = env.src if where == "src" else env.cache
    place.mkdir(parents=True, exist_ok=True)
    other = env.upstream.tarball(env.upstream.later)
    (place / TARBALL).write_bytes(other)
    done = env.fetch_source(env.upstream.url)  # reachable: refusing must not mean refetching
    assert done.returncode != 0
    assert done.stdout == ""
    assert f"Slurm {RELEASE}: refused {place / TARBALL}" in done.stderr
    assert f"expected sha256 {env.sha256}" in done.stderr
    assert f"found    sha256 {sha256(other)}" in done.stderr
    assert "fetching" not in done.stderr
    assert env.leftovers() == ([TARBALL] if where == "cache" else [])


@pytest.mark.skipif(shutil.which("debootstrap") is None, reason="no debootstrap")
def test_a_build_refuses_before_any_work(env: Env) -> None:
    """`cluster.sh source` (stage one of a build) checks the tarball before debootstrap."""
    other = env.upstream.tarball(env.upstream.later)
    (env.src / TARBALL).write_bytes(other)
    # Were the check skipped, debootstrap would fail at once on this mirror, not build.
    done = env.cluster_sh("source", closed_port_url(), NODELEDGER_DEBIAN_MIRROR=closed_port_url())
    assert done.returncode != 0
    assert f"Slurm {RELEASE}: refused {env.src / TARBALL}" in done.stderr
    assert f"found    sha256 {sha256(other)}" in done.stderr
    assert "debootstrap" not in done.stderr
    assert list((env.root / "cache").glob(f"slurm-{VERSION}-*")) == []  # no chroot begun


def test_a_tag_on_another_commit_is_refused(env: Env) -> None:
    env.commit = env.upstream.later  # as if the tag had been moved since it was pinned
    done = env.fetch_source(env.upstream.url)
    assert done.returncode != 0
    assert done.stdout == ""
    assert f"Slurm {RELEASE}: refused tag {TAG} of {env.upstream.url}" in done.stderr
    assert f"expected commit {env.upstream.later}" in done.stderr
    assert f"found    commit {env.upstream.tagged}" in done.stderr
    assert env.leftovers() == []  # nothing cached, the clone removed


def test_a_fetched_tarball_of_another_hash_is_refused(env: Env) -> None:
    env.sha256 = env.tar_sha256 = sha256(b"some other release")
    done = env.fetch_source(env.upstream.url)
    assert done.returncode != 0
    assert f"Slurm {RELEASE}: refused" in done.stderr
    assert f"expected sha256 {env.sha256}" in done.stderr
    found = sha256(env.upstream.tarball(env.upstream.tagged))
    assert f"found    sha256 {found}" in done.stderr
    assert env.leftovers() == []


@pytest.mark.parametrize("unreachable", ["closed port", "no such repository"])
def test_without_network_it_says_how_to_run_offline(env: Env, unreachable: str) -> None:
    url = closed_port_url() if unreachable == "closed port" else str(env.root / "nowhere.git")
    done = env.fetch_source(url)
    assert done.returncode != 0
    assert done.stdout == ""
    err = done.stderr
    # What was tried ...
    assert f"looked for {TARBALL} in NODELEDGER_SLURM_SRC_DIR ({env.src})" in err
    assert f"git clone --depth 1 --branch {TAG} {url}" in err
    assert "fatal:" in err  # git's own reason
    # ... and how to do without: which variable, which file, which hash.
    assert f"To run offline, put {TARBALL} into the directory NODELEDGER_SLURM_SRC_DIR" in err
    assert f"sha256 {env.sha256}" in err
    assert f"NODELEDGER_SLURM_VERSION={VERSION} bash testenv/slurm/cluster.sh fetch-source" in err
    assert f"git archive --format=tar --prefix=slurm-{RELEASE}/ {TAG} | gzip -9n" in err
    assert "NODELEDGER_SLURM_GIT_URL" in err
    assert env.leftovers() == []


def shared_sources() -> Path:
    return Path(
        os.environ.get("NODELEDGER_SLURM_SRC_DIR", Path(REPO).parent / "shared" / "slurm-src")
    )


@pytest.mark.skipif(
    not (shared_sources() / "SHA256SUMS").exists(), reason="no offline Slurm sources here"
)
def test_the_pins_accept_the_offline_tarballs(tmp_path: Path) -> None:
    """The repository's own pins against the offline copy (../shared/slurm-src)."""
    lock = (Path(REPO) / "testenv" / "slurm" / "sources.lock").read_text()
    pinned = {
        f"slurm-{line.split()[0]}.tar.gz": line.split()[3]
        for line in lock.splitlines()
        if line.strip() and not line.startswith("#")
    }
    sums = {
        name: digest
        for digest, name in (
            line.split() for line in (shared_sources() / "SHA256SUMS").read_text().splitlines()
        )
    }
    assert pinned == sums
    for version, release in [("25.11", "25.11.7"), ("26.05", "26.05.3")]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NODELEDGER_")}
        env |= {
            "NODELEDGER_SLURM_VERSION": version,
            "NODELEDGER_CACHE": str(tmp_path),
            "NODELEDGER_SLURM_SRC_DIR": str(shared_sources()),
            "NODELEDGER_SLURM_GIT_URL": closed_port_url(),
        }
        done = subprocess.run(
            ["bash", str(SCRIPT), "fetch-source"], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(shared_sources() / f"slurm-{release}.tar.gz")
        with tarfile.open(done.stdout.strip()) as tar:
            assert f"slurm-{release}/configure" in tar.getnames()
    assert list(tmp_path.iterdir()) == []  # nothing fetched, nothing cached
