#!/usr/bin/env bash
# Installs Kiln as a systemd service (as root):
#   scripts/install-service.sh [--prefix /usr/local] [--no-start]
# Builds if needed, installs the binary to <prefix>/bin/kiln, the model server that serves framework
# images to <prefix>/lib/kiln/kiln-model-server, the training toolkit and model server workers to
# <prefix>/lib/kiln/python (where the binary looks for it), the unit to
# /etc/systemd/system/kiln.service, a default /etc/kiln/config.json (kept when present), then
# enables and starts the unit. The data dir is /var/lib/kiln. Re-running upgrades in place: the
# server restarts and adopts running jobs and endpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=/usr/local
start=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --no-start) start=0; shift ;;
    *) echo "usage: $0 [--prefix DIR] [--no-start]" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" != 0 ]; then echo "install-service: run as root (sudo $0)" >&2; exit 1; fi

if [ ! -x build/src/cli/kiln ]; then
  scripts/install-deps.sh
  scripts/build.sh
fi
install -D -m 0755 build/src/cli/kiln "$prefix/bin/kiln"
install -D -m 0755 build/src/modelserver/kiln-model-server "$prefix/lib/kiln/kiln-model-server"
# The TorchScript backend's plugin (built when libtorch-dev is installed) goes beside the program.
if [ -e build/src/modelserver/libkiln_torchscript.so ]; then
  install -D -m 0644 build/src/modelserver/libkiln_torchscript.so "$prefix/lib/kiln/libkiln_torchscript.so"
fi
rm -rf "$prefix/lib/kiln/python"
mkdir -p "$prefix/lib/kiln"
cp -r python "$prefix/lib/kiln/python"
install -D -m 0644 README.md "$prefix/share/doc/kiln/README.md"
if [ ! -e /etc/kiln/config.json ]; then
  install -d -m 0755 /etc/kiln
  printf '{\n  "listen": "127.0.0.1:5456",\n  "data_dir": "/var/lib/kiln"\n}\n' >/etc/kiln/config.json
fi
sed -e "s|/usr/local/|$prefix/|g" scripts/systemd/kiln.service >/etc/systemd/system/kiln.service
chmod 0644 /etc/systemd/system/kiln.service

if [ ! -d /run/systemd/system ]; then
  echo "install-service: installed; systemd is not running here, so the unit was not started."
  exit 0
fi
systemctl daemon-reload
if [ "$start" = 1 ]; then
  systemctl enable kiln.service
  systemctl restart kiln.service
  systemctl --no-pager status kiln.service | head -5
  echo "Logs: journalctl -u kiln -f    Clients: eval \"\$($prefix/bin/kiln env --data-dir /var/lib/kiln)\""
fi
