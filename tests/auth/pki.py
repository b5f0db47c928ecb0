"""Throwaway certificates (openssl, P-256) for the TLS tests: a CA, a server certificate for
127.0.0.1 and client certificates whose subject is the identity."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class CA:
    dir: Path
    name: str

    @property
    def cert(self) -> Path:
        return self.dir / f"{self.name}.crt"

    @classmethod
    def create(cls, directory: Path, name: str = "ca") -> CA:
        directory.mkdir(parents=True, exist_ok=True)
        ca = cls(directory, name)
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-days", "2", "-subj", f"/CN={name}",
                 "-keyout", str(directory / f"{name}.key"), "-out", str(ca.cert),
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
        return ca

    def issue(self, name: str, subject: str, extensions: str) -> KeyPair:
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        csr = self.dir / f"{name}.csr"
        ext = self.dir / f"{name}.ext"
        ext.write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n" + extensions
        )
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-subj", subject, "-keyout", str(pair.key), "-out", str(csr))  # fmt: skip
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.cert),
                 "-CAkey", str(self.dir / f"{self.name}.key"), "-CAcreateserial",
                 "-days", "2", "-out", str(pair.cert), "-extfile", str(ext))  # fmt: skip
        return pair

    def server(self, name: str = "server") -> KeyPair:
        return self.issue(
            name,
            "/CN=nodeledger",
            "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )

    def client(self, name: str, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        return self.issue(name, subject, "extendedKeyUsage=clientAuth\n")
