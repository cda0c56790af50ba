#!/usr/bin/env bash
# Installs everything Kiln needs to build, run and test on Debian 12, by package name.
# Idempotent: packages already present are left alone. Run as root (or with sudo available).
#   scripts/install-deps.sh          build + run dependencies
#   scripts/install-deps.sh --test   also the test clients (boto3, awscli, pytest, a browser, ...)
# The web console (ui/) is built by npm: node and npm are installed from Debian (node 18, npm 9)
# unless an `npm` is already on PATH (e.g. NodeSource's nodejs, which bundles npm and conflicts
# with Debian's npm package), so it is checked with `command -v`, not dpkg.
set -euo pipefail

want_test=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    *) echo "usage: $0 [--test]" >&2; exit 2 ;;
  esac
done

build_pkgs=(
  build-essential cmake pkg-config git ca-certificates
  lld                                      # the linker (CMake uses it when installed: links ~9x faster than ld.bfd)
  libboost-dev libboost-system-dev         # Beast/Asio: HTTP server and client
  libboost-stacktrace1.74-dev              # symbolised backtraces in the crash report (libbacktrace)
  nlohmann-json3-dev                       # JSON codec for the AWS JSON protocols
  libsqlite3-dev                           # durable state
  libssl-dev                               # SHA-256/HMAC/MD5 for SigV4 and ETags
  libspdlog-dev libfmt-dev                 # structured logging
  libcli11-dev                             # command-line parsing
  libcurl4-openssl-dev                     # the s3 ObjectStore backend's HTTP client
  zlib1g-dev                               # CRC32 checksums
  libpugixml-dev                           # XML parsing for S3 request bodies
  libpcre2-dev                             # model patterns and MetricDefinitions regexes (Perl syntax)
  libarchive-dev                           # model.tar.gz / sourcedir.tar.gz (tar + gzip), streamed
  libnl-3-dev libnl-route-3-dev            # per-instance networks: bridges, veths, addresses, routes (rtnetlink)
  libnftables-dev                          # per-instance networks: each server's nftables table (isolation, NAT)
  python3                                  # the default training environment (script mode)
  libtorch-dev                             # kiln-model-server's native TorchScript backend (optional: built when present)
  libssh-dev                               # the remote-access agent's SSH-2 server (src/access/): key exchange, channels, sftp messages
  libgtest-dev libgmock-dev libbenchmark-dev
)
test_pkgs=(
  python3 python3-boto3 python3-botocore python3-pytest python3-requests awscli
  curl procps
  python3-torch python3-numpy              # the real PyTorch training jobs of the integration tests
  openmpi-bin python3-mpi4py               # MPI training jobs (mpirun through Kiln's kiln_rsh.py agent): test_toolkit_mpi.py, test_distributed_training.py
  nginx-light wrk                          # bench/serving_bench.py: the reference proxy and the load generator
  python3-sklearn                          # tests/integration/test_sdk.py: the SKLearn estimator's job
  python3-flask gunicorn                   # bench/model_server_bench.py: the gunicorn + Flask reference server
  python3-cbor2                            # CloudWatch RPC v2 CBOR tests (raw CBOR requests)
  clang                                    # scripts/test.sh: the sanitizer build, with -Wthread-safety
  clang-format                             # scripts/check-format.sh: the C++ layout (.clang-format)
  nftables iproute2                        # runtime_process_test: inspects the networks' rules (nft) and links (ip)
  podman crun netavark catatonit           # the container runtime's tests: Podman's Docker-compatible API (scripts/podman-setup.sh)
  iptables                                 # netavark (Podman's network backend) sets container networks up with it; only "Suggested", and without it every container start fails "netavark: No such file or directory"
  docker-registry                          # a registry on loopback for the container runtime's pull tests (test_container_registry.py)
  openssh-client python3-pexpect           # access_test, test_remote_access.py: OpenSSH's ssh/sftp/scp and an interactive terminal (pexpect) against the agent
  python3-debugpy                          # test_remote_access.py: the training script's debugpy attached through an ssh -L forward
  slurm-wlm slurm-client munge             # the Slurm runtime's tests: a real cluster on this host (scripts/slurm-setup.sh, test_slurm.py)
  chromium chromium-driver python3-selenium  # the web console's browser tests (test_console.py) and bench/console_bench.py
)
# bench/remote_access_bench.py also compares scp against a local sshd (Debian openssh-server); it is
# not installed here (its package starts a system sshd): `apt-get install openssh-server` by hand.
# The SageMaker Python SDK bundle (tests/integration/test_sdk.py) lists the Debian packages it
# imports beside its sources: ../shared/clients/sagemaker-python-sdk/ next to the repository.
sdk_pkgs_file="$(cd "$(dirname "$0")/.." && pwd)/../shared/clients/sagemaker-python-sdk/debian-packages.txt"
if [ -r "$sdk_pkgs_file" ]; then
  while read -r p; do
    case "$p" in ''|'#'*) ;; *) test_pkgs+=("$p") ;; esac
  done < "$sdk_pkgs_file"
fi

pkgs=("${build_pkgs[@]}")
# The console's build (scripts/build.sh: npm ci, npm run build in ui/). nodejs first, npm only if
# that nodejs did not bring one: where NodeSource's apt source is configured, its nodejs (bundling
# npm, "Conflicts: npm") is the candidate and asking for both at once fails.
want_npm=0
if ! command -v npm >/dev/null 2>&1; then pkgs+=(nodejs); want_npm=1; fi
if [ "$want_test" = 1 ]; then pkgs+=("${test_pkgs[@]}"); fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

updated=0
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
else
  $SUDO apt-get update -qq
  updated=1
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ "$want_npm" = 1 ] && ! command -v npm >/dev/null 2>&1; then
  # Debian's nodejs: npm is a package of its own.
  if [ "$updated" = 0 ]; then $SUDO apt-get update -qq; fi
  $SUDO apt-get install -y -qq --no-install-recommends npm
fi
echo "install-deps: done"
