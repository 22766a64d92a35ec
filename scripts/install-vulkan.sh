#!/usr/bin/env bash
# A Vulkan loader and a driver for the Vulkan backend's tests: Debian's libvulkan1 and
# Mesa's lavapipe (Vulkan compute on the CPU) where no Vulkan loader and device are here.
# Idempotent: does nothing where `libvulkan.so.1` and an ICD are present.
set -euo pipefail
have_loader() { ldconfig -p 2>/dev/null | grep 'libvulkan\.so\.1' >/dev/null; }  # no -q: SIGPIPE + pipefail
have_icd() { ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1 || ls /etc/vulkan/icd.d/*.json >/dev/null 2>&1; }
if have_loader && have_icd; then
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "install-vulkan: need root (or sudo) for apt-get" >&2; exit 1; }
  sudo=sudo
fi
pkgs="libvulkan1 mesa-vulkan-drivers"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -q --no-install-recommends $pkgs >/dev/null 2>&1 ||
  { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends $pkgs >/dev/null; }
have_loader && have_icd || { echo "install-vulkan: $pkgs installed but no loader/ICD found" >&2; exit 1; }
