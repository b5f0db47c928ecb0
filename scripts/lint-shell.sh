#!/usr/bin/env bash
# make lint's check of every shell script of the repository with shellcheck: the files git
# knows that end in .sh or start with a sh/bash #! line. Sourced files are followed (-x), their
# `# shellcheck source=` paths written from the repository's root, where this runs.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
LOG_TAG=lint-shell
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

command -v shellcheck >/dev/null || die "shellcheck is not installed (scripts/install-system-deps.sh)"
scripts=()
shebang='^#!(/usr/bin/env |/bin/|/usr/bin/)(ba)?sh( |$)'
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue   # deleted in the work tree, not yet in the index
  first=""
  IFS= read -r first <"$f" || true
  if [[ $f == *.sh || $first =~ $shebang ]]; then scripts+=("$f"); fi
done < <(git ls-files -z --cached --others --exclude-standard)
[ "${#scripts[@]}" -gt 0 ] || die "no shell scripts found (not a git work tree?)"
shellcheck -x "${scripts[@]}"
echo "shellcheck: ${#scripts[@]} scripts clean"
