#!/bin/sh
# Installs Debian packages, as root: waits up to 10 minutes for another apt
# (an unattended upgrade, a second checkout's set-up) to let go of its locks,
# rather than failing on them; any other failure ends it at once.
set -u
for _ in $(seq 60); do
  if err=$(apt-get update -qq 2>&1); then
    exec apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@"
  fi
  case "$err" in
    *"Could not get lock"*) echo "apt is busy: waiting for its lock" >&2; sleep 10 ;;
    *) echo "$err" >&2; exit 100 ;;
  esac
done
echo "$err" >&2
exit 100
