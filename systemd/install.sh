#!/usr/bin/env bash
# Install streamd as a systemd service, or remove it. Run as root from a streamd checkout; running it again
# upgrades in place (a config already in /etc/streamd is never touched). What it writes and why:
# docs/service.md.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: sudo systemd/install.sh [options]
       sudo systemd/install.sh --uninstall [--purge]

Installs: system user "streamd" (no login), a venv at /opt/streamd (system Python) with streamd in it,
the bundled sample clip in /opt/streamd/share/streamd, /etc/streamd/streamd.yaml (root:streamd 0640,
only when absent), /var/lib/streamd and /var/cache/streamd, /etc/systemd/system/streamd.service,
/etc/logrotate.d/streamd; then enables and (re)starts streamd.service.

  --extras LIST      pip extras to install, comma-separated, or "none" (default: gpu,torch when an NVIDIA
                     driver is present, /dev/nvidiactl or nvidia-smi; otherwise none)
  --wheelhouse DIR   install offline: pip --no-index --find-links DIR (DIR holds every wheel needed,
                     including setuptools>=68 to build streamd; docs/service.md says how to make it)
  --package SPEC     what pip installs instead of this checkout (a wheel file, or "streamd" from DIR)
  --python PATH      the Python that makes the venv (default /usr/bin/python3); must be >= 3.10 and
                     readable by the service user (not under /root or a home folder)
  --config FILE      the config to install when /etc/streamd/streamd.yaml does not exist yet
                     (default: configs/service.yaml of this checkout)
  --no-start         install and enable, but do not start or restart the service
  --uninstall        stop and disable the service; remove the unit, the logrotate snippet and /opt/streamd.
                     Keeps /etc/streamd, /var/lib/streamd, /var/cache/streamd and the user
  --purge            with --uninstall: remove those as well
Environment: PIP_* variables (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, ...) reach pip.
EOF
}

PREFIX=/opt/streamd
SHARE=$PREFIX/share/streamd
ETC=/etc/streamd
CONFIG=$ETC/streamd.yaml
UNIT=/etc/systemd/system/streamd.service
LOGROTATE=/etc/logrotate.d/streamd
STATE=/var/lib/streamd
CACHE=/var/cache/streamd
USER_NAME=streamd
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(dirname "$HERE")

die() {
    echo "install.sh: $*" >&2
    exit 1
}
say() { echo "install.sh: $*"; }

extras=auto
wheelhouse=
package=
python=/usr/bin/python3
config_src=$SRC/configs/service.yaml
start=yes
action=install
purge=no
while [ $# -gt 0 ]; do
    case $1 in
        --extras) extras=${2:?--extras needs a value}; shift 2 ;;
        --wheelhouse) wheelhouse=${2:?--wheelhouse needs a folder}; shift 2 ;;
        --package) package=${2:?--package needs a value}; shift 2 ;;
        --python) python=${2:?--python needs a path}; shift 2 ;;
        --config) config_src=${2:?--config needs a file}; shift 2 ;;
        --no-start) start=no; shift ;;
        --uninstall) action=uninstall; shift ;;
        --purge) purge=yes; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done
[ "$purge" = yes ] && [ "$action" != uninstall ] && die "--purge goes with --uninstall"
[ "$(id -u)" -eq 0 ] || die "run as root (sudo $0 ...)"
command -v systemctl >/dev/null || die "systemctl not found: streamd's service needs systemd"
# Files made here are read by the service user: a strict root umask (027, 077) would lock it out (203/EXEC).
umask 022

uninstall() {
    if [ -e "$UNIT" ] || systemctl cat streamd.service >/dev/null 2>&1; then
        systemctl disable --now streamd.service 2>/dev/null || true
    fi
    rm -f "$UNIT" "$LOGROTATE"
    rm -rf "$PREFIX"
    if [ "$purge" = yes ]; then
        rm -rf "$ETC" "$STATE" "$CACHE" /etc/systemd/system/streamd.service.d
        if getent passwd "$USER_NAME" >/dev/null; then userdel "$USER_NAME"; fi
        if getent group "$USER_NAME" >/dev/null; then groupdel "$USER_NAME"; fi
    fi
    systemctl daemon-reload
    systemctl reset-failed streamd.service 2>/dev/null || true
    if [ "$purge" = yes ]; then
        say "removed streamd, its config, data, cache and user"
    else
        say "removed streamd; kept $ETC, $STATE, $CACHE and the user (--uninstall --purge removes them)"
    fi
}

if [ "$action" = uninstall ]; then
    uninstall
    exit 0
fi

# -- checks before anything changes ------------------------------------------------------------------------
[ -x "$python" ] || die "$python not found (--python PATH; Debian/Ubuntu: apt install python3 python3-venv)"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$python is older than Python 3.10"
"$python" -c 'import ensurepip, venv' 2>/dev/null ||
    die "$python cannot make a venv (Debian/Ubuntu: apt install python3-venv)"
case $(readlink -f "$python") in
    /root/* | /home/*) die "$python lives under /root or /home, which the service user cannot read; use the system Python (--python /usr/bin/python3)" ;;
esac
[ -f "$HERE/streamd.service" ] || die "$HERE/streamd.service missing: run the script from a streamd checkout"
if [ -z "$package" ]; then
    [ -f "$SRC/pyproject.toml" ] || die "$SRC is not a streamd source tree (--package SPEC installs something else)"
fi
[ -e "$CONFIG" ] || [ -f "$config_src" ] || die "config to install not found: $config_src"
[ -z "$wheelhouse" ] || [ -d "$wheelhouse" ] || die "wheelhouse $wheelhouse is not a folder"
if [ "$extras" = auto ]; then
    if [ -e /dev/nvidiactl ] || command -v nvidia-smi >/dev/null; then extras=gpu,torch; else extras=none; fi
fi

# -- user and folders --------------------------------------------------------------------------------------
if ! getent passwd "$USER_NAME" >/dev/null; then
    nologin=$(command -v nologin || echo /usr/sbin/nologin)
    group_opt=(--user-group)
    if getent group "$USER_NAME" >/dev/null; then group_opt=(--gid "$USER_NAME"); fi
    useradd --system "${group_opt[@]}" --home-dir "$STATE" --no-create-home --shell "$nologin" \
        --comment "streamd video analytics" "$USER_NAME"
    say "created system user $USER_NAME"
fi
# GPU device nodes may be group-owned by video or render (driver option NVreg_DeviceFileGID).
for group in video render; do
    if getent group "$group" >/dev/null && ! id -nG "$USER_NAME" | tr ' ' '\n' | grep -qx "$group"; then
        usermod -a -G "$group" "$USER_NAME"
    fi
done
# Also made by systemd at start (StateDirectory=, CacheDirectory=); made here so that `streamd check` passes
# before the first start and logrotate has its folder.
install -d -o "$USER_NAME" -g "$USER_NAME" -m 0750 "$STATE" "$CACHE"
install -d -o root -g "$USER_NAME" -m 0750 "$ETC"

# -- the venv and streamd in it ----------------------------------------------------------------------------
want=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
have=$("$PREFIX/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
if [ "$have" != "$want" ]; then
    # a venv of another Python (or none): make it afresh
    "$python" -m venv --clear "$PREFIX"
    say "created venv $PREFIX (Python $want)"
fi
pip_opts=(--disable-pip-version-check --no-input)
[ -n "$wheelhouse" ] && pip_opts+=(--no-index --find-links "$(readlink -f "$wheelhouse")")
suffix=
[ "$extras" != none ] && suffix="[$extras]"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "$package" ]; then
    target=$package$suffix
else
    # Build from a copy: pip builds in the source folder, which would leave root-owned build files in the
    # operator's checkout. A git checkout copies what git knows (tracked or not ignored): no venvs, caches.
    if git -c safe.directory='*' -C "$SRC" rev-parse --git-dir >/dev/null 2>&1; then
        (cd "$SRC" && git -c safe.directory='*' ls-files -z --cached --others --exclude-standard |
            while IFS= read -r -d '' f; do
                if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
            done | tar --null -T - -cf -) | tar -C "$work" -xf -
    else
        tar -C "$SRC" --exclude=./.venv --exclude=./.git --exclude=./build --exclude=./dist -cf - . |
            tar -C "$work" -xf -
    fi
    target=$work$suffix
fi
say "pip install $target${wheelhouse:+ (offline, from $wheelhouse)}"
"$PREFIX/bin/pip" install "${pip_opts[@]}" "$target"
"$PREFIX/bin/streamd" --version >/dev/null || die "$PREFIX/bin/streamd does not run"

# The bundled clip at a path that does not change with the Python version: the example config streams it
# (relative paths in /etc/streamd would resolve from /etc/streamd).
rm -rf "$SHARE"
install -d "$SHARE/samples"
samples=$("$PREFIX/bin/python" -c 'from streamd.resources import bundled_path; print(bundled_path("samples"))')
cp "$samples/vtest.mp4" "$samples/LICENSE" "$SHARE/samples/"
if [ -f "$SRC/docs/service.md" ]; then cp "$SRC/docs/service.md" "$SHARE/service.md"; fi
chmod -R a+rX "$SHARE"

# -- config, unit, logrotate -------------------------------------------------------------------------------
if [ -e "$CONFIG" ]; then
    say "keeping the existing $CONFIG"
else
    install -o root -g "$USER_NAME" -m 0640 "$config_src" "$CONFIG"
    say "installed $CONFIG from $config_src (edit it, then: systemctl reload streamd)"
fi
install -m 0644 "$HERE/streamd.service" "$UNIT"
install -m 0644 "$HERE/streamd.logrotate" "$LOGROTATE"
systemctl daemon-reload

# The same check the unit runs before each start, as the service user, so a problem shows here.
if ! runuser -u "$USER_NAME" -- "$PREFIX/bin/streamd" check "$CONFIG"; then
    die "$CONFIG is not valid for the service (above); fix it, then run this script again or: systemctl start streamd"
fi

systemctl enable streamd.service
if [ "$start" = no ]; then
    say "installed and enabled; not started (--no-start): systemctl start streamd"
    exit 0
fi
# Type=notify: returns once the daemon is READY (or failed); a running one is restarted on the new code.
if ! systemctl restart streamd.service; then
    systemctl status --no-pager --lines=20 streamd.service >&2 || true
    die "streamd.service did not start (journalctl -u streamd)"
fi
say "streamd is running: systemctl status streamd; journalctl -u streamd -f; output in $STATE"
