# Sourced by scripts/demo, scripts/test, scripts/bench: make .venv exist and hold
# the project (editable) with the extras named in SEMQ_EXTRAS. Re-installs only
# when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
EXTRAS="${SEMQ_EXTRAS:-test}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.semq-installed-$EXTRAS"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
  echo "[setup] installing semq[$EXTRAS] into $VENV (first run takes a minute)" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$EXTRAS]" >&2
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
