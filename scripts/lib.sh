# Shared by scripts/demo and scripts/test (sourced, not run): Debian packages and the
# project's virtual environment. Everything fails loudly: a missing tool stops the run
# with a message saying which package provides it.

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}

# apt_install PACKAGE...: install Debian packages (apt-get update first), as root or
# through sudo. Only called for what is missing, so a prepared machine needs no network.
# APT_OPTS adds apt-get options (e.g. --no-install-recommends).
apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    if ! command -v apt-get >/dev/null; then
        echo "fiomon: need the Debian packages $*, and this is no Debian system: install them" >&2
        exit 1
    fi
    echo "fiomon: installing $* (apt-get)"
    $sudo apt-get update -qq
    # shellcheck disable=SC2086 -- APT_OPTS is a list of options
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq ${APT_OPTS:-} "$@" >/dev/null
}

# need_tools TOOL:PACKAGE...: install the packages of the tools not found, then check
# that every tool is there. mosquitto lives in /usr/sbin, outside a user's PATH.
need_tools() {
    local missing=() pair tool
    for pair in "$@"; do
        tool=${pair%%:*}
        command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || missing+=("${pair#*:}")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        # shellcheck disable=SC2046 -- one word per package, deduplicated
        apt_install $(printf '%s\n' "${missing[@]}" | sort -u)
    fi
    for pair in "$@"; do
        tool=${pair%%:*}
        command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || {
            echo "fiomon: $tool is still missing after installing ${pair#*:}" >&2
            exit 1
        }
    done
}

# make_venv: $VENV with the interpreter $PY (3.11 or later). Debian splits ensurepip
# out of python3 into python3-venv, so a fresh machine needs that package first.
make_venv() {
    command -v "$PY" >/dev/null || apt_install python3
    "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
        echo "fiomon: $PY is $("$PY" --version 2>&1); fiomon needs Python 3.11 or later" >&2
        exit 1
    }
    if [ ! -x "$VENV/bin/python" ]; then
        "$PY" -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv
        "$PY" -m venv "$VENV"
    fi
}
