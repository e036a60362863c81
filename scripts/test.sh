#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh machine, then run lint, types and tests.
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n==> %s\n' "$*"; }

# PostgreSQL: the storage tests run against it (required under CI=true).
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    say "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi

# Debian's Chromium for the real-browser dashboard tests (Playwright drives it; no downloads).
if ! command -v chromium >/dev/null 2>&1; then
    say "installing Debian chromium"
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
fi

# The suite's own environment (NOISESCOPE_TEST_VENV, default .venv-test), never the README's
# .venv: reinstalling the package there (editable) moves the files a running `noisescope up`
# serves from, and every dashboard page then fails on a missing app.py.
venv="${NOISESCOPE_TEST_VENV:-.venv-test}"
if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv"
    python3 -m venv "$venv"
fi
# shellcheck disable=SC1090,SC1091
. "$venv/bin/activate"
say "installing noisescope into $venv (client + server + dev tools, CPU torch 2.13.0)"
python -m pip install -q --upgrade pip
# --no-compile: byte-compiling every installed file (torch's and transformers' thousands) took
# a minute; the suite imports a fraction of them, compiled once on first import instead, so the
# bytecode must be written even where the environment says not to.
python -m pip install -q --no-compile torch==2.13.0 -e ./client -e '.[dev]'
unset PYTHONDONTWRITEBYTECODE

# Every process the suite starts carries this mark in its environment (not a NOISESCOPE_ name:
# tests hand their subprocesses an environment without those); on exit (an interrupt
# included) the ones still alive are stopped by id: servers and dashboards start in sessions of
# their own, which a Ctrl-C to the suite does not reach.
export TEST_SH_SESSION="$$-$(date +%s%N)"
stop_children() {
    local pid mark="TEST_SH_SESSION=$TEST_SH_SESSION"
    for environ in /proc/[0-9]*/environ; do
        pid="${environ#/proc/}"
        pid="${pid%/environ}"
        [ "$pid" = "$$" ] && continue
        # (a process that ended meanwhile, or another user's, cannot be read: not ours)
        if { tr '\0' '\n' <"$environ"; } 2>/dev/null | grep -qx "$mark"; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
}

say "ruff"
ruff check .
ruff format --check .
# mypy runs beside pytest: the test workers leave about a third of the CPU idle (waiting on
# servers, subprocesses and the browser), which hides most of mypy's minute.
mypy_log="$(mktemp)"
trap 'stop_children; rm -f "$mypy_log"' EXIT
trap 'exit 130' INT TERM
mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
say "pytest (mypy --strict runs beside it)"
# One worker more than there are cores, each taking whole files (a module's fixtures are made
# once): a worker waits on servers, subprocesses and the browser about a third of the time,
# so on 2 cores 3 workers finish the suite about 15% sooner than 2. Files with slow tests go
# first (tests/conftest.py), so no long file runs alone at the end. Arguments after these
# win (-n 0: one process).
workers=$(( $(nproc) + 1 ))
status=0
python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@" || status=$?
say "mypy --strict"
wait "$mypy_pid" || status=$?
cat "$mypy_log"
exit "$status"
