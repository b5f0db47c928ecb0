"""The Debian packages a root needs at run time: ROOTS and everything they Depend or
Pre-Depend on (the first installed alternative), minus EXCLUDED. Reads
`dpkg-query -W -f='${Package}\\t${Pre-Depends}\\t${Depends}\\n'` on stdin; prints one
package a line.

    python3 image/closure.py "ROOT ..." "EXCLUDED ..." < dpkg-query-output
"""

from __future__ import annotations

import re
import sys


def parse(lines: list[str]) -> dict[str, list[list[str]]]:
    deps: dict[str, list[list[str]]] = {}
    for line in lines:
        package, pre, depends = line.rstrip("\n").split("\t")
        groups = []
        for group in f"{pre},{depends}".split(","):
            if group.strip():
                names = [re.sub(r"\(.*\)|:any|\s", "", a) for a in group.split("|")]
                groups.append(names)
        deps[package] = groups
    return deps


def closure(deps: dict[str, list[list[str]]], roots: list[str], excluded: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        package = todo.pop()
        if package in seen or package in excluded:
            continue
        if package not in deps:
            raise SystemExit(f"closure: {package} is not installed")
        seen.add(package)
        for group in deps[package]:
            installed = [name for name in group if name in deps]
            if installed:
                todo.append(installed[0])
    return seen


def main() -> None:
    roots, excluded = sys.argv[1].split(), set(sys.argv[2].split())
    print("\n".join(sorted(closure(parse(sys.stdin.readlines()), roots, excluded))))


if __name__ == "__main__":
    main()
