#!/usr/bin/env bash
# Idempotent machine setup for remat: Debian packages, then the Python virtual
# environment (outside the repository), then nothing else. Each step checks
# first and skips what is already there, so a second run costs a few seconds.
#
#   REMAT_VENV   where the virtual environment lives (default ~/.cache/remat/venv)
set -euo pipefail

REMAT_VENV="${REMAT_VENV:-$HOME/.cache/remat/venv}"
APT_PACKAGES=(libgtest-dev libgmock-dev libbenchmark-dev libabsl-dev libsimdjson-dev nlohmann-json3-dev libcli11-dev
              ninja-build ccache cmake g++)
PY_REQUIREMENTS=(torch==2.14.1 torchvision==0.29.1 numpy pytest matplotlib transformers==5.24.0 accelerate==1.15.0)
SOLVER_REQUIREMENT="highspy==1.16.0"
# Libraries the ecosystem probe trains with (tests/python/ecosystem/third_party.py); opacus brings scipy.
ECOSYSTEM_REQUIREMENTS=(timm==1.0.31 peft==0.21.2 opacus==1.6.0 einops==0.8.2)

log() { printf '[setup] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

install_debian_packages() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "Debian packages present"
    return
  fi
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

install_virtualenv() {
  # The stamp records what was installed; if the list changes, pip runs again.
  local stamp="$REMAT_VENV/.remat-requirements"
  local wanted="${PY_REQUIREMENTS[*]}"
  if [ -x "$REMAT_VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
    log "virtual environment present: $REMAT_VENV"
    return
  fi
  log "creating virtual environment $REMAT_VENV (torch is large: a few minutes)"
  mkdir -p "$(dirname "$REMAT_VENV")"
  [ -x "$REMAT_VENV/bin/python" ] || python3 -m venv "$REMAT_VENV"
  "$REMAT_VENV/bin/python" -m pip install -q --upgrade pip
  "$REMAT_VENV/bin/python" -m pip install -q "${PY_REQUIREMENTS[@]}"
  echo "$wanted" > "$stamp"
}

# pip_install_unless_importable WHAT MODULES PACKAGE...: installs the packages into the venv unless `import MODULES`
# works there. For extras kept out of PY_REQUIREMENTS, so that adding one does not re-run the whole torch install on
# machines set up before it.
pip_install_unless_importable() {
  local what="$1" modules="$2"
  shift 2
  if "$REMAT_VENV/bin/python" -c "import $modules" 2>/dev/null; then
    log "$what present ($modules)"
    return
  fi
  log "installing $what: $*"
  "$REMAT_VENV/bin/python" -m pip install -q "$@"
}

install_solver() {
  # HiGHS (MIT), the MIP solver behind `remat-sim --planner checkmate` (tools/checkmate_ilp.py).
  pip_install_unless_importable "the MIP solver" highspy "$SOLVER_REQUIREMENT"
}

install_ecosystem_libraries() {
  pip_install_unless_importable "the ecosystem probe's libraries" "timm, peft, opacus, einops" \
    "${ECOSYSTEM_REQUIREMENTS[@]}"
}

link_python_package() {
  # A .pth file puts this checkout's integration/python on the venv's path, so `import remat` works in the venv
  # and finds the library in this checkout's build/. Rewritten only when it points elsewhere (another clone).
  local repo site pth
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  site="$("$REMAT_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  pth="$site/remat.pth"
  if [ -f "$pth" ] && [ "$(cat "$pth")" = "$repo/integration/python" ]; then
    return
  fi
  echo "$repo/integration/python" > "$pth"
  log "remat package linked into the venv from $repo/integration/python"
}

install_debian_packages
install_virtualenv
install_solver
install_ecosystem_libraries
link_python_package
log "done"
