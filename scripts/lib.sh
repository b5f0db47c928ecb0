# shellcheck shell=bash
# Helpers shared by the repository's shell scripts (testenv/, image/, scripts/): sourced,
# never run. A script sources it by a path relative to itself, so that it works from any
# working directory, and names itself in LOG_TAG (default: the script's file name):
#
#   LOG_TAG=slurm-cluster
#   # shellcheck source=scripts/lib.sh
#   source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
#
# Only what several scripts need alike belongs here; anything else stays in its script.

log() { echo "${LOG_TAG:-${0##*/}}: $*" >&2; }   # log MESSAGE...: one tagged line on stderr

die() { log "$*"; exit 1; }                       # die MESSAGE...: log it, exit 1

# wait_for SECONDS WHAT CHECK...: run CHECK (a command and its arguments) every 0.2 s until
# it succeeds. After SECONDS, log "no WHAT after SECONDS s" and return 1: the caller decides
# whether that is fatal (`|| die ...`) or not (`|| true`, or a fallback).
wait_for() {
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || { log "no $what after $limit s"; return 1; }
    sleep 0.2
  done
}
