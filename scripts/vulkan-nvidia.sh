#!/usr/bin/env bash
# Vulkan on a headless NVIDIA machine (shared/notes/vulkan.md): the driver's ICD file names
# libGLX_nvidia.so.0, which fails without a display, and there is no Vulkan loader.
#   scripts/vulkan-nvidia.sh stage      (here) copies Debian's loader into .gpu/vk/
#   source scripts/vulkan-nvidia.sh env (there) points the loader at an ICD file that
#                                       names libEGL_nvidia.so.0 instead
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-env} in
  stage)
    loader=$(ls /usr/lib/x86_64-linux-gnu/libvulkan.so.1.* 2>/dev/null | head -1)
    [ -n "$loader" ] || { echo "no libvulkan.so.1 here: run scripts/install-vulkan.sh" >&2; exit 1; }
    mkdir -p "$root/.gpu/vk" && cp "$loader" "$root/.gpu/vk/libvulkan.so.1"
    echo "staged $loader" ;;
  env)
    icd=/tmp/evk-vk/nvidia_egl_icd.json
    mkdir -p /tmp/evk-vk
    src=/usr/share/vulkan/icd.d/nvidia_icd.json
    if [ -f "$src" ]; then
      sed 's/libGLX_nvidia\.so\.0/libEGL_nvidia.so.0/' "$src" > "$icd"
    else
      echo '{"file_format_version":"1.0.1","ICD":{"library_path":"libEGL_nvidia.so.0","api_version":"1.4.0"}}' > "$icd"
    fi
    export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd
    if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1 '; then
      export LD_LIBRARY_PATH="$root/.gpu/vk${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi ;;
esac
