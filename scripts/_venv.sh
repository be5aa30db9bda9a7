# Sourced by scripts/demo, scripts/test, scripts/bench: make .venv exist and hold
# the project (editable) with the extras named in SEMQ_EXTRAS. Re-installs only
# when pyproject.toml changed since the last install: the stamp holds its
# SHA-256 (a modification time can be older than the stamp after a checkout
# or a copy that keeps times, and then a new dependency would be missed).
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
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "[setup] installing semq[$EXTRAS] into $VENV (first run takes a minute)" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$EXTRAS]" >&2
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
